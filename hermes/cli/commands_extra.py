"""The `bench` and `eval` subcommands of `python -m hermes`, registered on the main parser's subparsers."""

from __future__ import annotations

import argparse
import json
import re
import sys

from hermes.memory.config import HermesConfig

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20}
_UNITS |= {"g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


EVAL_MAX_QUESTION_CHARS = 8000


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


def _set_threads(threads: int | None, device) -> None:
    import torch

    # One thread by default on a CPU: on a 2-vCPU VM, two OpenMP threads made the TTFT of the tiny
    # model jump between 25 and 440 ms, against a steady 8-12 ms with one.
    if threads is None:
        threads = 1 if device.type == "cpu" else 0
    if threads > 0:
        torch.set_num_threads(threads)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the efficiency benchmark and print its table and headline ratios."""
    from hermes.bench import (
        CPU_FULL_MAX_FRAMES,
        BenchSettings,
        load_bench_model,
        render_markdown,
        run_bench,
        write_html,
        write_json,
    )

    if args.threads is not None and args.threads < 0:
        raise ValueError("--threads must be 0 (torch's default) or more")
    # Every option is checked before the model loads, which takes minutes for the 7B ones.
    settings = BenchSettings(
        policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
        frames=parse_ints(args.frames, "--frames"),
        config=HermesConfig(
            budget=args.budget,
            chunk_frames=args.chunk_frames,
            fps=HermesConfig.fps if args.fps is None else args.fps,
            reindex=args.reindex,
        ),
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        frame_size=args.frame_size,
        memory_cap=parse_bytes(args.memory_cap),
        full_max_frames=args.full_max_frames or None,
    )
    lm = load_bench_model(args.model, device=args.device, allow_cpu_7b=args.allow_cpu_7b)
    _set_threads(args.threads, lm.device)
    settings.config = settings.config.with_(fps=lm.default_fps if args.fps is None else args.fps)
    if args.full_max_frames is None and lm.device.type == "cpu":
        settings.full_max_frames = CPU_FULL_MAX_FRAMES
    if lm.random_weights:
        print("note: random weights: answers are noise, the timings and memory are real", file=sys.stderr)
    result = run_bench(lm, settings, progress=not args.no_progress)
    print(render_markdown(result), flush=True)
    if args.json:
        print(f"wrote {write_json(result, args.json)}", file=sys.stderr)
    if args.html:
        print(f"wrote {write_html(result, args.html)}", file=sys.stderr)
    return 0


def add_bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `bench`: TTFT, TPOT, prefill/compression cost and memory against frames streamed."""
    from hermes.bench import DEFAULT_FRAMES, DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODEL, DEFAULT_POLICIES, DEFAULT_REPEATS

    p = sub.add_parser(
        "bench",
        help="efficiency benchmark (the paper's Table 3 and Figure 4): TTFT and memory against frames streamed",
        description="Stream synthetic frames through each policy and measure, at each frame count, TTFT and TPOT "
        "(median, min, max over the repeats), prefill and compression ms per chunk, cache bytes and peak memory.",
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="'tiny', 'tiny-qwen', a checkpoint, or the random-weight 7B architectures "
        "'llava-ov-7b-random' / 'qwen2.5-vl-7b-random' (GPU) (default: %(default)s)",
    )
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated (default: %(default)s)")
    p.add_argument(
        "--frames",
        default=",".join(map(str, DEFAULT_FRAMES)),
        help="frame counts to measure at, comma-separated (default: %(default)s)",
    )
    p.add_argument("--budget", type=int, default=HermesConfig.budget, help="video tokens kept per layer, |M|")
    p.add_argument("--chunk-frames", type=int, default=HermesConfig.chunk_frames)
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="times each question is asked per point")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens decoded, for TPOT")
    p.add_argument("--fps", type=float, default=None, help="timestamps of the synthetic frames (default: the model's)")
    p.add_argument("--reindex", choices=["lazy", "eager"], default="lazy")
    p.add_argument("--frame-size", type=int, default=384, help="square frame side in pixels (384: 196 tokens/frame)")
    p.add_argument(
        "--memory-cap",
        default="auto",
        help="bytes the cache and one chunk's prefill may take on top of the model before full stops as "
        "'out of memory' (e.g. 8GB; auto: 90%% of free GPU memory, or half the available RAM on a CPU)",
    )
    p.add_argument(
        "--full-max-frames",
        type=int,
        default=None,
        help="stop full after this many frames (default: 512 on a CPU, where more only adds minutes of "
        "quadratic prefill; no limit on a GPU; 0: no limit)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on a CPU; 0: torch's own)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--allow-cpu-7b", action="store_true", help="let the random 7B models run on a CPU anyway")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every measurement to FILE")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a Plotly figure to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)
    return p


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a model on a benchmark's annotation file and print per-task accuracy."""
    from pathlib import Path

    from hermes.engine.session import StreamingSession
    from hermes.eval.formats import BENCHES
    from hermes.eval.harness import EvalSettings, render_summary, run_eval
    from hermes.models.loading import load_video_lm

    spec = BENCHES[args.bench]
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    if args.max_new_tokens < 0:
        raise ValueError("--max-new-tokens must be 0 (score only) or more")
    if not Path(args.videos).is_dir():
        raise ValueError(f"--videos {args.videos} is not a folder")
    items, problems = spec.load(args.annotations)
    if not items and not problems:
        raise ValueError(f"{args.annotations} holds no questions")
    config = HermesConfig(  # checked before the model loads
        budget=args.budget,
        chunk_frames=args.chunk_frames,
        fps=HermesConfig.fps if args.fps is None else args.fps,
        reindex=args.reindex or spec.reindex,
    )
    lm = load_video_lm(args.model, device=args.device)
    _set_threads(args.threads, lm.device)
    config = config.with_(fps=lm.default_fps if args.fps is None else args.fps)
    if lm.random_weights:
        print("note: random weights: answers are noise, accuracy is chance level", file=sys.stderr)
    out = Path(args.out or f"results-{args.bench}.jsonl")
    # Benchmark prompts carry every option, so they run longer than a chat question.
    session = StreamingSession(lm, config, policy=args.policy, max_question_chars=EVAL_MAX_QUESTION_CHARS)
    settings = EvalSettings(max_new_tokens=args.max_new_tokens, limit=args.limit)
    summary = run_eval(lm, spec, items, problems, session, args.videos, out, settings, progress=not args.no_progress)
    summary["settings"] = {
        "bench": args.bench,
        "model": args.model,
        "policy": args.policy,
        "limit": args.limit,
        **config.to_dict(),
    }
    summary_path = out.with_name(out.stem + ".summary.json")
    summary_path.write_text(json.dumps(summary, indent=2))
    title = (
        f"{spec.name}: {args.model}, policy {args.policy}, budget {config.budget}, "
        f"{config.chunk_frames}-frame chunks at {config.fps:g} fps, {config.reindex} re-indexing"
    )
    print(render_summary(summary, title), flush=True)
    print(f"wrote {out} and {summary_path}", file=sys.stderr)
    return 0


def add_eval_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `eval`: multiple-choice accuracy on StreamingBench, OVO-Bench, Video-MME or MVBench."""
    from hermes.eval.formats import BENCHES
    from hermes.models.loading import DEFAULT_MODEL

    p = sub.add_parser(
        "eval",
        help="accuracy on a benchmark's annotation file (StreamingBench, OVO-Bench, Video-MME, MVBench)",
        description="Stream each video up to each question's time (streaming benchmarks) or to its end (offline "
        "ones), and score the option letter with the highest first-token log-probability. Results are appended "
        "per question to --out, so a run resumes where it stopped.",
    )
    p.add_argument("--bench", choices=sorted(BENCHES), required=True)
    p.add_argument(
        "--annotations",
        required=True,
        help="the benchmark's annotation JSON (MVBench: one task file, or the folder of them)",
    )
    p.add_argument("--videos", required=True, help="folder the annotations' video paths are relative to")
    p.add_argument("--out", default=None, help="results, one JSON line per question (default: results-BENCH.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="only the first N questions, for a quick look")
    p.add_argument("--model", default=DEFAULT_MODEL, help="hub id, local folder, 'tiny' or 'tiny-qwen'")
    p.add_argument("--policy", choices=["hermes", "fifo", "full"], default="hermes")
    p.add_argument("--budget", type=int, default=HermesConfig.budget, help="video tokens kept per layer, |M|")
    p.add_argument("--chunk-frames", type=int, default=HermesConfig.chunk_frames)
    p.add_argument("--fps", type=float, default=None, help="sampling rate (default: 0.5 LLaVA-OV, 1 Qwen2.5-VL)")
    p.add_argument(
        "--reindex",
        choices=["lazy", "eager"],
        default=None,
        help="default as in the paper: lazy for streamingbench and ovobench, eager for videomme and mvbench",
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="generated text per question (0: score only)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on a CPU; 0: torch's own)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)
    return p
