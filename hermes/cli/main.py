"""Command line: python -m hermes {stream, build-tiny, bench, eval}."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hermes.cli.commands_extra import add_bench_parser, add_eval_parser
from hermes.memory.config import HermesConfig


def _add_memory_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="hub id, local folder, 'tiny' or 'tiny-qwen' (default: $HERMES_MODEL or the LLaVA-OV 0.5B checkpoint)",
    )
    p.add_argument("--policy", choices=["hermes", "fifo", "full"], default="hermes")
    p.add_argument("--budget", type=int, default=HermesConfig.budget, help="video tokens kept per layer, |M|")
    p.add_argument("--chunk-frames", type=int, default=HermesConfig.chunk_frames)
    p.add_argument("--fps", type=float, default=None, help="sampling rate (default: 0.5 LLaVA-OV, 1 Qwen2.5-VL)")
    p.add_argument("--reindex", choices=["lazy", "eager"], default="lazy")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")


def _session(args: argparse.Namespace, reindex: str | None = None):
    import os

    from hermes.engine.session import StreamingSession
    from hermes.models.loading import DEFAULT_MODEL, load_video_lm

    config = HermesConfig(  # checked before the model loads
        budget=args.budget,
        chunk_frames=args.chunk_frames,
        fps=HermesConfig.fps if args.fps is None else args.fps,
        reindex=reindex or args.reindex,
    )
    lm = load_video_lm(args.model or os.environ.get("HERMES_MODEL") or DEFAULT_MODEL, device=args.device)
    config = config.with_(fps=lm.default_fps if args.fps is None else args.fps)
    return StreamingSession(lm, config, policy=args.policy)


def cmd_stream(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from hermes.engine.session import AnswerUpdate
    from hermes.serving.replay import parse_ask, replay
    from hermes.video.decoding import iter_frames, probe

    questions = [parse_ask(a) for a in args.ask]
    info = probe(args.video)
    session = _session(args)
    fps = session.config.fps
    lm = session.lm
    if lm.random_weights and not args.json:
        print("note: random weights: answers are noise, the memory dynamics are real", file=sys.stderr)
    bar = tqdm(total=max(1, int(info.duration * fps) + 1), unit="frame", disable=args.json, file=sys.stderr)
    shown = 0
    for event in replay(
        session, iter_frames(args.video, fps), questions, speed=args.speed, max_new_tokens=args.max_new_tokens
    ):
        if isinstance(event, AnswerUpdate):
            if args.json:
                if event.done:
                    print(
                        json.dumps(
                            {
                                "event": "answer",
                                "at_s": event.at_s,
                                "question": event.question,
                                "text": event.text,
                                "ttft_ms": event.ttft_ms,
                                "tpot_ms": event.tpot_ms,
                                "frames_seen": event.frames_seen,
                                "frames_in_memory": event.frames_in_memory,
                                "tokens": event.tokens,
                                "top_logprobs": [[t, lp] for t, lp in event.top_logprobs],
                            }
                        ),
                        flush=True,
                    )
                continue
            if shown == 0:
                bar.clear()
                print(f"\n[{event.at_s:6.1f}s] Q: {event.question}\n         A: ", end="", flush=True)
            print(event.text[shown:], end="", flush=True)
            shown = len(event.text)
            if event.done:
                tpot = f"{event.tpot_ms:.1f} ms" if event.tpot_ms else "-"
                print(
                    f"\n         (TTFT {event.ttft_ms:.1f} ms, TPOT {tpot}, {event.frames_in_memory} of "
                    f"{event.frames_seen} frames in memory)",
                    flush=True,
                )
                shown = 0
        else:
            bar.update(event.frames_seen - bar.n)
            if args.json:
                print(
                    json.dumps(
                        {
                            "event": "chunk",
                            "chunk": event.chunk_index,
                            "frames_seen": event.frames_seen,
                            "stream_time_s": event.stream_time_s,
                            "tokens": event.tokens,
                            "video_tokens_per_layer": event.video_tokens_per_layer,
                            "cache_bytes": event.cache_bytes,
                            "prefill_ms": event.prefill_ms,
                            "compress_ms": event.compress_ms,
                            "evicted": event.evicted,
                        }
                    ),
                    flush=True,
                )
    bar.close()
    return 0


def cmd_build_tiny(args: argparse.Namespace) -> int:
    from hermes.models.tiny import build_tiny

    out = build_tiny(args.arch, args.out, num_layers=args.layers, seed=args.seed)
    print(f"wrote a random-weight {args.arch} checkpoint with {args.layers} layers to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hermes", description="HERMES Live: streaming video memory")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stream", help="stream a video file and answer questions at given times")
    p.add_argument("video")
    _add_memory_options(p)
    p.add_argument(
        "--ask",
        action="append",
        default=[],
        metavar="SECONDS:QUESTION",
        help="ask QUESTION once the stream reaches SECONDS (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a transcript")
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help="pace against the wall clock (1 = real time); default: as fast as the model goes",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.set_defaults(func=cmd_stream)

    p = sub.add_parser("build-tiny", help="write a tiny random-weight checkpoint of a supported architecture")
    p.add_argument("--arch", choices=["llava_onevision", "qwen2_5_vl"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_build_tiny)

    add_bench_parser(sub)
    add_eval_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; user errors print one clear line and exit with status 2."""
    from hermes.engine.session import QuestionError
    from hermes.models.loading import ModelLoadError
    from hermes.video.decoding import VideoError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (VideoError, ModelLoadError, QuestionError, ValueError) as exc:
        if args.command == "stream" and args.json:
            print(json.dumps({"event": "error", "message": str(exc)}), flush=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
