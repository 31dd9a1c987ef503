"""`python -m hermes eval`: multiple-choice accuracy on StreamingBench, OVO-Bench, Video-MME or MVBench."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from hermes.cli.options import (
    add_memory_options,
    add_run_options,
    check_run_options,
    config_from_args,
    model_options,
    parse_params,
)

if TYPE_CHECKING:
    from hermes.engine.methods import PolicySpec


def add_eval_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from hermes.eval.formats import BENCHES
    from hermes.models.loading import DEFAULT_MODEL

    p = sub.add_parser(
        "eval",
        help="accuracy on a benchmark's annotation file (StreamingBench, OVO-Bench, Video-MME, MVBench)",
        description="Stream each video up to each question's time (streaming benchmarks) or to its end (offline "
        "ones), ask it with the benchmark's own prompt, and score the answer two ways: the generated text by the "
        "benchmark's own rule (what papers report), and the option letter with the highest first-token "
        "log-probability. Results are appended "
        "per question to --out, so a run resumes where it stopped. Under a launcher (accelerate launch "
        "--num_processes N -m hermes eval ..., or torchrun --nproc_per_node N -m hermes eval ...), each process "
        "streams its share of the videos into its own part file, and the last one to finish merges them.",
    )
    p.add_argument("--bench", choices=sorted(BENCHES), required=True)
    p.add_argument(
        "--annotations",
        required=True,
        help="the benchmark's annotation file: JSON, JSON lines or (Video-MME) Parquet; StreamingBench: its real, "
        "omni, SQA or proactive file; MVBench: one task file, or the folder of them",
    )
    p.add_argument("--videos", required=True, help="folder the annotations' video paths are relative to")
    p.add_argument("--out", default=None, help="results, one JSON line per question (default: results-BENCH.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="only the first N questions, for a quick look")
    add_memory_options(
        p,
        model_default=DEFAULT_MODEL,
        reindex_default=None,
        reindex_help="default as in the paper: lazy for streamingbench and ovobench, eager for videomme and mvbench",
    )
    p.add_argument(
        "--policies",
        default=None,
        help="several policies, comma-separated (e.g. hermes,fifo,streammem): each gets its own memory, every "
        "video is decoded once, and one accuracy table has a column per policy (results-BENCH.POLICY.jsonl); "
        "instead of --policy",
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="generated text per question (0: score only)")
    add_run_options(p)
    p.set_defaults(func=cmd_eval)
    return p


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a model on a benchmark's annotation file and print per-task accuracy."""
    from pathlib import Path

    from hermes.engine.session import StreamingSession
    from hermes.eval.formats import BENCHES
    from hermes.eval.harness import EvalSettings, run_eval
    from hermes.eval.policies import PolicyGroup
    from hermes.eval.shard import Shard
    from hermes.models.loading import load_video_lm, set_threads

    spec = BENCHES[args.bench]
    items, problems, policies = _checked(args, spec)  # before the model loads
    shard = Shard.from_env()  # RANK and WORLD_SIZE from torchrun or accelerate launch
    placement = model_options(args)
    if shard.sharded and placement["device"] is None and placement["device_map"] is None:
        placement["device"] = shard.local_device()  # one GPU per process, when there are GPUs
    lm = load_video_lm(args.model, **placement)
    set_threads(args.threads)
    config = config_from_args(args, lm.default_fps, default_reindex=spec.reindex)
    if lm.random_weights:
        print("note: random weights: answers are noise, accuracy is chance level", file=sys.stderr)
    out = Path(args.out or f"results-{args.bench}.jsonl")
    settings = EvalSettings(max_new_tokens=args.max_new_tokens, limit=args.limit)
    sessions = {
        name: StreamingSession(lm, config, policy=name, max_question_chars=settings.max_question_chars)
        for name in policies
    }
    if args.policies is not None:
        summaries = run_eval(
            lm, spec, items, problems, PolicyGroup(sessions), args.videos, out, settings, not args.no_progress, shard
        )
        return _report_policies(args, spec, config, out, summaries)
    session = sessions[policies[0]]
    summary = run_eval(
        lm, spec, items, problems, session, args.videos, out, settings, progress=not args.no_progress, shard=shard
    )
    if summary is None:
        print(
            f"shard {shard.rank} of {shard.world} done: {shard.part(out)}; the last shard to finish merges "
            f"the parts into {out} and writes the summary",
            file=sys.stderr,
        )
        return 0
    return _report_policy(args, spec, config, out, summary)


def _checked(args: argparse.Namespace, spec):
    """The benchmark file's questions and problems, and the policies parsed (with --param), once
    every option is checked: ValueError for a bad one."""
    from pathlib import Path

    from hermes.engine.methods import parse_policies

    check_run_options(args)
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    if args.max_new_tokens < 0:
        raise ValueError("--max-new-tokens must be 0 (score only) or more")
    if not Path(args.videos).is_dir():
        raise ValueError(f"--videos {args.videos} is not a folder")
    items, problems = spec.load(args.annotations)
    if not items and not problems:
        raise ValueError(f"{args.annotations} holds no questions")
    names = [n.strip() for n in (args.policies or args.policy).split(",") if n.strip()]
    config = config_from_args(args, default_reindex=spec.reindex)
    return items, problems, parse_policies(names, config, parse_params(args.param))


def _report_policy(args: argparse.Namespace, spec, config, out, summary: dict) -> int:
    """Write the summary beside the results and print the accuracy table and the official scores."""
    from hermes.eval.summary import official_scores, render_official, render_summary

    summary["settings"] = {
        "bench": args.bench,
        "model": args.model,
        "policy": args.policy,
        "limit": args.limit,
        **config.to_dict(),
    }
    summary["official"] = official_scores(args.bench, summary)  # the benchmark's own aggregate
    summary_path = out.with_name(out.stem + ".summary.json")
    summary_path.write_text(json.dumps(summary, indent=2))
    title = (
        f"{spec.name}: {args.model}, policy {args.policy}, budget {config.budget}, "
        f"{config.chunk_frames}-frame chunks at {config.fps:g} fps, {config.reindex} re-indexing"
    )
    print(render_summary(summary, title), flush=True)
    print("\n" + render_official(args.bench, summary["official"]), flush=True)
    print(f"wrote {out} and {summary_path}", file=sys.stderr)
    return 0


def _report_policies(args: argparse.Namespace, spec, config, out, summaries: dict[PolicySpec, dict]) -> int:
    """Write each policy's summary beside its results and print one table, a column per policy."""
    from hermes.eval.policies import policy_out, render_policy_table
    from hermes.eval.summary import official_scores

    for name, summary in summaries.items():
        summary["settings"] = {"bench": args.bench, "model": args.model, "policy": name.name, "limit": args.limit}
        summary["settings"]["params"] = dict(name.params)
        summary["settings"] |= config.to_dict()
        summary["official"] = official_scores(args.bench, summary)
        path = policy_out(out, name)
        path.with_name(path.stem + ".summary.json").write_text(json.dumps(summary, indent=2))
    title = (
        f"{spec.name}: {args.model}, policies {', '.join(map(str, summaries))}, budget {config.budget}, "
        f"{config.chunk_frames}-frame chunks at {config.fps:g} fps, {config.reindex} re-indexing"
    )
    print(render_policy_table(summaries, title), flush=True)
    print(f"wrote {', '.join(str(policy_out(out, n)) for n in summaries)} and their summaries", file=sys.stderr)
    return 0
