"""`python -m hermes bench`: TTFT, TPOT, prefill/compression cost and memory against frames streamed."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hermes.cli.options import (
    add_memory_options,
    add_param_option,
    add_run_options,
    check_run_options,
    config_from_args,
    model_options,
    parse_params,
)

if TYPE_CHECKING:
    from hermes.bench import BenchResult, BenchSettings

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20}
_UNITS |= {"g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int | None:
    """'8GB', '512MiB', '1e9' or 'auto' (None) as a number of bytes."""
    text = text.strip().lower()
    if text == "auto":
        return None
    match = re.fullmatch(r"([0-9.e+]+)\s*([a-z]*)", text)
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"--memory-cap wants a size such as 8GB, 512MiB or auto; got {text!r}")
    try:
        value = float(match.group(1)) * _UNITS[match.group(2)]
    except ValueError:
        raise ValueError(f"--memory-cap wants a size such as 8GB, 512MiB or auto; got {text!r}") from None
    if value <= 0:
        raise ValueError("--memory-cap must be positive")
    return int(value)


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    """'16,64,256' as (16, 64, 256)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{option} wants comma-separated whole numbers, for example 16,64,256; got {text!r}") from None
    if not values:
        raise ValueError(f"{option} is empty")
    return values


def add_bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `bench` subcommand: the models, what each point measures, the limits and the files."""
    from hermes.bench import DEFAULT_BENCH_MODEL
    from hermes.models.loading import tiny_names
    from hermes.models.random7b import CPU_MAX_BILLIONS, RANDOM_MODELS

    p = sub.add_parser(
        "bench",
        help="efficiency benchmark (the paper's Table 3 and Figure 4): TTFT and memory against frames streamed",
        description="Stream synthetic frames through each policy and measure, at each frame count, TTFT and TPOT "
        "(median, min, max over the repeats), prefill and compression ms per chunk, cache bytes and peak memory.",
    )
    add_memory_options(
        p,
        model_default=DEFAULT_BENCH_MODEL,
        model_help=f"{tiny_names(chr(39))}, a checkpoint, or a random-weight real architecture, "
        f"{', '.join(map(repr, RANDOM_MODELS))} (those over {CPU_MAX_BILLIONS:g}B parameters want a GPU); several, "
        "comma-separated, run one after the other with the same settings and are compared at the end "
        "(default: %(default)s)",
        policy=False,
        fps_help="timestamps of the synthetic frames (default: the model's)",
    )
    _add_workload_options(p)
    _add_limit_options(p)
    p.add_argument("--json", default=None, metavar="FILE", help="also write every measurement to FILE")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a Plotly figure to FILE")
    add_run_options(p)
    p.set_defaults(func=cmd_bench)
    return p


def _add_workload_options(p: argparse.ArgumentParser) -> None:
    """What is measured: the policies and their parameters, the frames, and each point's questions."""
    from hermes.bench import DEFAULT_FRAMES, DEFAULT_MAX_NEW_TOKENS, DEFAULT_POLICIES, DEFAULT_REPEATS
    from hermes.engine.methods import policy_names

    p.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, from {', '.join(policy_names())} (default: %(default)s)",
    )
    add_param_option(p)
    p.add_argument(
        "--static-frames",
        action="store_true",
        help="every synthetic frame the same picture (what +dtd drops) instead of random ones",
    )
    p.add_argument(
        "--frames",
        default=",".join(map(str, DEFAULT_FRAMES)),
        help="frame counts to measure at, comma-separated (default: %(default)s)",
    )
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="times each question is asked per point")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens decoded, for TPOT")
    p.add_argument("--frame-size", type=int, default=384, help="square frame side in pixels (384: 196 tokens/frame)")


def _add_limit_options(p: argparse.ArgumentParser) -> None:
    """How far a run may go: the memory cap, full's frame limit, and the 7B models on a CPU."""
    p.add_argument(
        "--memory-cap",
        default="auto",
        help="bytes the cache and one chunk's prefill may take on top of the model before full stops as "
        "'out of memory' (e.g. 8GB; auto: the app's cache cap: $HERMES_MEMORY_CAP_MB, else the free GPU memory "
        "less 10%% of the card (at least 2 GiB), or on a CPU 4 GiB or half the available RAM if less)",
    )
    p.add_argument(
        "--full-max-frames",
        type=int,
        default=None,
        help="stop full after this many frames (default: 512 on a CPU, where more only adds minutes of "
        "quadratic prefill; no limit on a GPU; 0: no limit)",
    )
    p.add_argument("--allow-cpu-7b", action="store_true", help="let the random 7B models run on a CPU anyway")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the efficiency benchmark and print its table and headline ratios."""
    from hermes.bench import BenchSettings, render_comparison

    names = [m.strip() for m in args.model.split(",") if m.strip()]
    if not names:
        raise ValueError("--model is empty")
    check_run_options(args)
    # Every option is checked before the model loads, which takes minutes for the 7B ones.
    settings = BenchSettings(
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
        frames=parse_ints(args.frames, "--frames"),
        config=config_from_args(args),
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        frame_size=args.frame_size,
        memory_cap=parse_bytes(args.memory_cap),
        full_max_frames=args.full_max_frames or None,
        params=parse_params(args.param),
        static=args.static_frames,
    )
    results = []
    for name in names:
        # With several models, each one's JSON and HTML go to FILE with the model's name before the suffix.
        tag = name if len(names) > 1 else None
        results.append(_bench_one(name, settings, args, tag))
        print(flush=True)
    if len(results) > 1:
        print("Models side by side (this run, same settings):", flush=True)
        print(render_comparison(results), flush=True)
    return 0


def _named(path: str | None, tag: str | None) -> str | None:
    """`path`, or with several models `path` with `tag` (a model name) before its suffix."""
    if path is None or tag is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{re.sub(r'[^A-Za-z0-9._-]+', '_', tag)}{p.suffix}"))


def _bench_one(name: str, settings: BenchSettings, args: argparse.Namespace, tag: str | None) -> BenchResult:
    """Load `name`, run the benchmark on it, print its table and write its files."""
    from hermes.bench import CPU_FULL_MAX_FRAMES, load_bench_model, render_markdown, run_bench, write_html, write_json
    from hermes.models.loading import set_threads

    lm = load_bench_model(name, allow_cpu_7b=args.allow_cpu_7b, **model_options(args))
    set_threads(args.threads)
    settings = replace(settings, config=config_from_args(args, lm.default_fps))
    if args.full_max_frames is None and lm.device.type == "cpu":
        settings.full_max_frames = CPU_FULL_MAX_FRAMES
    if lm.random_weights:
        print("note: random weights: answers are noise, the timings and memory are real", file=sys.stderr)
    result = run_bench(lm, settings, progress=not args.no_progress)
    print(render_markdown(result), flush=True)
    if args.json:
        print(f"wrote {write_json(result, _named(args.json, tag))}", file=sys.stderr)
    if args.html:
        print(f"wrote {write_html(result, _named(args.html, tag))}", file=sys.stderr)
    return result
