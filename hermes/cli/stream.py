"""`python -m hermes stream`: play a video file as a live stream and answer questions at given times."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from hermes.cli.memory import (
    Checkpoints,
    add_memory_file_options,
    check_memory_file_options,
    model_for,
    resumed_session,
    start_time,
)
from hermes.cli.options import add_memory_options, config_from_args, local_model_help, model_options, parse_params


def add_stream_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("stream", help="stream a video file and answer questions at given times")
    p.add_argument("video")
    add_memory_options(
        p,
        model_help=f"{local_model_help()} (default: $HERMES_MODEL, else LLaVA-OV 0.5B on a GPU, Qwen3.5-0.8B on a CPU)",
    )
    p.add_argument(
        "--ask",
        action="append",
        default=[],
        metavar="SECONDS:QUESTION",
        help="ask QUESTION once the stream reaches SECONDS (repeatable)",
    )
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="QUESTION",
        help="a yes/no standing question asked after every chunk; alerts when p(yes) rises above the "
        "threshold (repeatable, at most 4)",
    )
    p.add_argument("--watch-threshold", type=float, default=0.5, help="p(yes) above which a standing question fires")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a transcript")
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help="pace against the wall clock (1 = real time); default: as fast as the model goes",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--host-cap-mb",
        type=float,
        default=None,
        help="host memory a retrieval policy (rekv) may keep every frame in; the stream stops there "
        "(default: what admission control allows on the CPU)",
    )
    add_memory_file_options(p)
    p.set_defaults(func=cmd_stream)
    return p


def parsed_policy(args: argparse.Namespace):
    """--policy with its --param, parsed and checked (before the video opens or the model loads)."""
    from hermes.engine.methods import parse_policies

    return parse_policies([args.policy], config_from_args(args), parse_params(args.param))[0]


def _session(args: argparse.Namespace, policy, memory=None):
    """A new session of `policy` (parsed), or, with --load-memory, the saved one (`memory`, the
    file already read)."""
    from hermes.engine.session import StreamingSession
    from hermes.models.loading import load_video_lm, requested_model
    from hermes.serving.admission import host_memory_cap

    placement = model_options(args)
    lm = load_video_lm(requested_model(args.model, placement.get("device")), **placement)
    config = config_from_args(args, lm.default_fps)
    host_cap = host_memory_cap(args.host_cap_mb)
    if memory is not None:
        return resumed_session(args, memory, lm, host_cap)
    return StreamingSession(lm, config, policy=policy, host_cap_bytes=host_cap)


def _answer_json(event, alert: bool = False) -> str:
    return json.dumps(
        {
            "event": "answer",
            "alert": alert,  # the answer of a standing question that fired
            "at_s": event.at_s,
            "question": event.question,
            "text": event.text,
            "ttft_ms": event.ttft_ms,
            "tpot_ms": event.tpot_ms,
            "frames_seen": event.frames_seen,
            "frames_in_memory": event.frames_in_memory,
            "tokens": event.tokens,
            "top_logprobs": [[t, lp] for t, lp in event.top_logprobs],
            # A retrieval policy's TTFT splits into retrieval (search and host-to-device copy) and
            # the forward; its device memory peaks at the window plus the frames brought back.
            "retrieval_ms": event.retrieval_ms,
            "forward_ms": None if event.retrieval_ms is None else event.ttft_ms - event.retrieval_ms,
            "retrieved_tokens": event.retrieved_tokens,
            "cache_bytes": event.cache_bytes,
            "device_peak_bytes": event.cache_bytes + event.retrieved_bytes,
            "host_bytes": event.host_bytes,
        }
    )


def _chunk_json(event) -> str:
    return json.dumps(
        {
            "event": "chunk",
            "chunk": event.chunk_index,
            "frames_seen": event.frames_seen,
            "stream_time_s": event.stream_time_s,
            "tokens": event.tokens,
            "dropped": event.dropped,  # by the policy's input filter (+dtd), before the prefill
            "video_tokens_per_layer": event.video_tokens_per_layer,
            "cache_bytes": event.cache_bytes,
            "host_bytes": event.host_bytes,
            "prefill_ms": event.prefill_ms,
            "compress_ms": event.compress_ms,
            "guidance_ms": event.guidance_ms,
            "reindex_ms": event.reindex_ms,
            "reindexed": event.reindexed,
            "evicted": event.evicted,
        }
    )


def _watch_json(check, prefill_ms: float) -> str:
    return json.dumps(
        {
            "event": "watch",
            "at_s": check.at_s,
            "question": check.question,
            "p_yes": check.p_yes,
            "fired": check.fired,
            "check_ms": check.check_ms,
            "check_over_prefill": check.check_ms / prefill_ms if prefill_ms > 0 else None,
        }
    )


def _check_watches(args: argparse.Namespace) -> None:
    """Refuse bad standing questions and thresholds before the model loads."""
    from hermes.engine.session import MAX_QUESTION_CHARS
    from hermes.engine.watch import check_threshold, validate_standing

    check_threshold(args.watch_threshold)
    watching: list[str] = []
    for question in args.watch:
        watching.append(validate_standing(question, watching, MAX_QUESTION_CHARS))


def cmd_stream(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from hermes.engine.session import StreamBound
    from hermes.serving.replay import parse_ask, replay
    from hermes.video.decoding import UntilDamage, check_start, iter_frames

    questions = [parse_ask(a) for a in args.ask]
    _check_watches(args)
    policy = parsed_policy(args)
    memory = check_memory_file_options(args)  # a bad memory file fails before the model loads too
    if memory is not None:
        model_for(args, memory)
    info = check_start(args.video, config_from_args(args).fps)  # a bad file fails before the model loads
    session = _session(args, policy, memory)
    if memory is None or args.watch_threshold != 0.5:  # a resumed stream keeps its saved threshold otherwise
        session.standing.set_threshold(args.watch_threshold)
    session.standing.answer_tokens = args.max_new_tokens
    for question in args.watch:
        if question.strip() not in session.standing.questions:
            session.standing.add(question)
    fps = session.config.fps
    saver = Checkpoints(session, args.save_memory, None if args.save_every is None else 60 * args.save_every)
    if session.lm.random_weights and not args.json:
        print("note: random weights: answers are noise, the memory dynamics are real", file=sys.stderr)
    total = max(1, int(info.duration * fps) + 1)
    bar = tqdm(total=total, initial=session.frames_seen, unit="frame", disable=args.json, file=sys.stderr)
    # A frame that cannot be decoded is skipped, and said; a file that decodes no further streams to
    # its last good frame, the questions are answered from what was read, and its error ends the command.
    # A resumed stream goes on with the frames after those its memory has seen.
    frames = UntilDamage(
        iter_frames(args.video, fps, start=start_time(session)), on_skip=lambda skipped: _print_skip(args, skipped, bar)
    )
    try:
        _print_events(
            args, replay(session, frames, questions, speed=args.speed, max_new_tokens=args.max_new_tokens), bar, saver
        )
    except StreamBound as bound:  # a bound of the policy (rekv's host memory): the stream stops, with the reason
        bar.clear()
        print(json.dumps({"event": "stopped", "note": str(bound)}) if args.json else f"\nstopped: {bound}", flush=True)
    bar.close()
    if args.watch and not args.json and session.chunks_seen:
        print(session.watch_cost.summary(), file=sys.stderr)
    saver.save()  # what was read, a damaged file's good part too
    if frames.damage is not None:
        raise frames.damage
    return 0


def _print_skip(args: argparse.Namespace, skipped: Any, bar: Any) -> None:
    """Say that frames of the file could not be decoded (the stream goes on at the next one)."""
    if args.json:
        note = {"event": "skipped", "at_s": skipped.at_s, "frames": skipped.frames, "note": str(skipped)}
        print(json.dumps(note), flush=True)
    else:
        bar.clear()
        print(f"\nskipped: {skipped}", flush=True)


def _print_events(args: argparse.Namespace, events: Iterable, bar: Any, saver: Checkpoints) -> None:
    """Print the chunk, watch and answer events of a stream as they come; checkpoint between chunks."""
    from hermes.engine.session import AnswerUpdate

    shown = 0
    for event in events:
        if not isinstance(event, AnswerUpdate):
            saver.tick()
            bar.update(event.frames_seen - bar.n)
            if args.json:
                print(_chunk_json(event), flush=True)
                for check in event.watches:
                    print(_watch_json(check, event.prefill_ms), flush=True)
                for alert in event.alerts:
                    print(_answer_json(alert, alert=True), flush=True)
            else:
                for check, alert in zip([c for c in event.watches if c.fired], event.alerts, strict=True):
                    bar.clear()
                    print(
                        f"\n[{check.at_s:6.1f}s] ALERT (p(yes) {check.p_yes:.2f}): {check.question}\n"
                        f"         A: {alert.text}",
                        flush=True,
                    )
        elif args.json:
            if event.done:
                print(_answer_json(event), flush=True)
        else:
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
