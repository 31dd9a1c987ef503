"""`python -m hermes toyworld {make, train, bench, compare, samples}`: the toy world, its model and its memory
benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hermes.cli.options import add_param_option, parse_params


def add_toyworld_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "toyworld",
        help="the toy world: make clips, train the toy model, run the memory benchmark",
        description="A synthetic world of shapes that appear, move, change colour and leave; a small "
        "LLaVA-OneVision trained on it here; and a benchmark that scores every memory policy on questions about "
        "the present, the past and the future of held-out clips (docs/toyworld.md).",
    )
    toy = p.add_subparsers(dest="toy_command", required=True)

    make = toy.add_parser("make", help="write clips (MP4 and events) with questions in OVO-Bench's layout")
    make.add_argument("--out", required=True, help="folder to write into")
    make.add_argument("--clips", type=int, default=12)
    make.add_argument("--seed0", type=int, default=0, help="clip i has seed SEED0 + i")
    make.set_defaults(func=cmd_make)

    train = toy.add_parser("train", help="train the toy model with the recorded settings (about an hour on 2 cores)")
    train.add_argument("--out", required=True, help="checkpoint folder to write")
    train.add_argument("--heldout", default=None, help="held-out set scored at the end (default: the world's)")
    train.add_argument("--clips", type=int, default=None, help="score only the first N held-out clips")
    add_world_option(train)
    train.add_argument(
        "--from",
        dest="start",
        default=None,
        help="world v2: a checkpoint of the recipe's stages (its training.json says so) to run only the polish on",
    )
    train.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: fastest on a busy machine)"
    )
    train.set_defaults(func=cmd_train)

    samples = toy.add_parser(
        "samples", help="write the app's toy clips with suggested questions (where HERMES and FIFO answer apart)"
    )
    samples.add_argument("--out", default=None, help="folder to write into (default: the app's, for the world)")
    samples.add_argument("--model", default=None, help="the world's trained toy model (default) or a checkpoint folder")
    samples.add_argument("--clips", type=int, default=3, help="samples to keep")
    add_world_option(samples)
    samples.set_defaults(func=cmd_samples)

    _add_bench_and_layers(toy)
    compare = toy.add_parser(
        "compare", help="two bench runs' answers, paired by question: the difference with its interval over clips"
    )
    compare.add_argument("base", help="a bench run's JSON (--out)")
    compare.add_argument("other", help="another run's JSON, on the same clips (a variant: --param)")
    compare.set_defaults(func=cmd_compare)
    return p


def _add_bench_and_layers(toy: argparse._SubParsersAction) -> None:
    """The `bench` and `layers` subcommands, which read a world's model and held-out set."""
    bench = toy.add_parser("bench", help="score every memory policy on the held-out clips, at three budgets")
    bench.add_argument("--model", default=None, help="the world's trained toy model (default) or a checkpoint folder")
    bench.add_argument("--heldout", default=None, help="a held-out set (default: the world's)")
    add_world_option(bench)
    bench.add_argument("--policies", default=None, help="comma-separated (default: every policy, and hermes+dtd)")
    bench.add_argument(
        "--budgets", default=None, help="comma-separated video tokens per layer (default: 1/8, 1/4, 1/2 of a stream)"
    )
    bench.add_argument("--clips", type=int, default=None, help="only the first N clips, for a quick look")
    bench.add_argument("--out", default="results-toyworld.json", help="every answer and the summary, as JSON")
    bench.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: the toy model's matrices are small)"
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress lines")
    add_param_option(bench)
    bench.set_defaults(func=cmd_bench)

    layers = toy.add_parser(
        "layers",
        help="the layer-wise analysis: per layer, how much a question's attention lifts the newest frame "
        "and the evidence over their share of the tokens (full cache)",
    )
    layers.add_argument("--model", default=None, help="the world's trained toy model (default) or a checkpoint folder")
    layers.add_argument("--heldout", default=None, help="a held-out set (default: the world's)")
    add_world_option(layers)
    layers.add_argument("--clips", type=int, default=None, help="only the first N clips")
    layers.add_argument("--svg", default=None, help="also draw the lifts per layer into this SVG file")
    layers.add_argument(
        "--card",
        action="store_true",
        help="also write the lifts into the model folder's card (hermes.json): the app's attention panel shows them",
    )
    layers.add_argument("--no-progress", action="store_true", help="no progress lines")
    layers.set_defaults(func=cmd_layers)


def add_world_option(parser: argparse.ArgumentParser) -> None:
    """`--world v1|v2`: which toy world's model and held-out set are the defaults."""
    parser.add_argument(
        "--world",
        choices=("v1", "v2"),
        default="v1",
        help="v1: one object at a time (the easy world); v2: two or three at once, 64-step clips (docs/toyworld.md)",
    )


def _world_defaults(args: argparse.Namespace) -> None:
    """Fill --model and --heldout, where not given, with the chosen world's."""
    from hermes.toyworld.worlds import WORLDS

    world = WORLDS[args.world]
    args.model = args.model or world.model
    args.heldout = args.heldout or str(world.heldout)


def cmd_make(args: argparse.Namespace) -> int:
    from hermes.toyworld.heldout import HeldOutSpec, build

    if args.clips < 1:
        raise ValueError("--clips must be at least 1")
    out = build(args.out, HeldOutSpec(seed0=args.seed0, clips=args.clips))
    print(f"wrote {args.clips} clips with their events and questions to {out}")
    return 0


def cmd_samples(args: argparse.Namespace) -> int:
    from hermes.models.loading import load_video_lm, set_threads
    from hermes.toyworld.samples import build_samples
    from hermes.toyworld.worlds import WORLDS

    if args.clips < 1:
        raise ValueError("--clips must be at least 1")
    world = WORLDS[args.world]
    lm = load_video_lm(args.model or world.model, dtype="fp32")
    if not lm.card.stream:
        raise ValueError(f"{lm.source}: its card (hermes.json) has no stream settings to stream the samples at")
    set_threads(1)
    out = build_samples(args.out or world.samples, lm, lm.card.stream, keep=args.clips, world=args.world)
    print(f"wrote {args.clips} sample clips with their suggested questions to {out}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from hermes.toyworld.recipe import train_and_score
    from hermes.toyworld.worlds import WORLDS

    if args.threads < 1:
        raise ValueError("--threads must be at least 1")
    world = WORLDS[args.world]
    heldout = args.heldout or str(world.heldout)
    log = lambda line: print(line, flush=True)  # noqa: E731
    report = train_and_score(args.out, heldout, args.threads, log, world.spec(), args.clips, args.start)
    print(json.dumps(report["heldout"], indent=1))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from hermes.engine.methods import parse_policies
    from hermes.memory.config import HermesConfig
    from hermes.models.loading import load_video_lm, set_threads
    from hermes.toyworld import bench
    from hermes.toyworld.diagnostics import render_held

    if args.threads < 1:
        raise ValueError("--threads must be at least 1")
    if args.clips is not None and args.clips < 1:
        raise ValueError("--clips must be at least 1")
    _world_defaults(args)
    names = bench.benchmark_policies() if args.policies is None else [n.strip() for n in args.policies.split(",")]
    params = parse_params(args.param)
    policies = list(parse_policies([n for n in names if n], HermesConfig(), params))
    held = bench.load_heldout(args.heldout)
    lm = load_video_lm(args.model, dtype="fp32")
    set_threads(args.threads)
    budgets = bench.default_budgets(lm, held) if args.budgets is None else _ints(args.budgets, "--budgets")
    budgets = bench.check_budgets(lm, budgets)
    progress = None if args.no_progress else bench.log_stderr
    results = bench.run(lm, held, policies, budgets, videos=args.clips, progress=progress)
    summaries = {key: bench.summarize(held, answers) for key, answers in results.items()}
    settings = {
        "model": args.model,
        "heldout": args.heldout,
        "policies": [str(p) for p in policies],
        "params": params,
        "budgets": budgets,
        "stream_tokens": bench.stream_tokens(lm, held),
        "clips": args.clips,
    }
    bench.write_results(args.out, held, results, summaries, settings)
    print(bench.render_table(held, summaries, bench.stream_tokens(lm, held)), flush=True)
    answers = [{"policy": p, "budget": b, **r} for (p, b), a in results.items() for r in a.questions]
    print("\nWhat each memory held when asked, per layer (layer 0 first):\n" + render_held(answers), flush=True)
    if tasks := bench.render_tasks(results):
        print("\nBy task, and by answer where a task has two:\n" + tasks, flush=True)
    if wordings := bench.render_wordings(results):
        print("\nBy wording (held-out wordings were never trained on):\n" + wordings, flush=True)
    check = bench.forgetting_check(summaries, budgets, bench.stream_tokens(lm, held), bench.chance(held))
    print(check or "check (memory matters): needs fifo and full in the run", flush=True)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_layers(args: argparse.Namespace) -> int:
    from hermes.memory.config import HermesConfig
    from hermes.memory.tiers import TierMap
    from hermes.models.loading import load_video_lm, set_threads
    from hermes.toyworld import bench, layers

    if args.clips is not None and args.clips < 1:
        raise ValueError("--clips must be at least 1")
    _world_defaults(args)
    held = bench.load_heldout(args.heldout)
    lm = load_video_lm(args.model, dtype="fp32")
    set_threads(1)
    rows = layers.layer_lifts(lm, held, args.clips, None if args.no_progress else bench.log_stderr)
    summary = layers.summarize_lifts(rows)
    tiers = [t.value for t in TierMap.for_config(lm.kv_layers, HermesConfig()).tiers]
    print(f"Lift per layer of a question's attention ({len(rows)} questions, full cache, {args.model}):")
    print(layers.render_lifts(summary, tiers), flush=True)
    if args.svg:
        Path(args.svg).write_text(layers.lifts_svg(summary, f"Where a question looks, per layer ({args.model})"))
        print(f"wrote {args.svg}", file=sys.stderr)
    if args.card:
        print(f"wrote {write_lifts(args.model, summary)}", file=sys.stderr)
    return 0


def write_lifts(model: str, summary: dict[str, list[float]]) -> Path:
    """The lifts per layer into the card of `model`'s folder (an alias or a path), the rest of it kept."""
    import dataclasses

    from hermes.models.card import ModelCard
    from hermes.models.loading import resolve

    folder, _ = resolve(model)
    if not Path(folder).is_dir():
        raise ValueError(f"--card writes into a model folder; {model!r} is not one")
    lifts = {name: [round(v, 2) for v in values] for name, values in summary.items()}
    return dataclasses.replace(ModelCard.read(folder), layers=lifts).write(folder)


def cmd_compare(args: argparse.Namespace) -> int:
    from hermes.toyworld import bench

    base, other = (json.loads(Path(path).read_text()) for path in (args.base, args.other))
    print(f"base: {args.base} {base['settings'].get('params') or '(defaults)'}")
    print(f"other: {args.other} {other['settings'].get('params') or '(defaults)'}")
    print(bench.render_comparison(bench.compare_runs(base["answers"], other["answers"])), flush=True)
    return 0


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} wants comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{option} is empty")
    return values
