"""`python -m hermes stream`: play a video file or a folder of frames, or watch a network stream (RTSP, RTMP,
SRT, HLS, MJPEG, MP4 over HTTP), as a live stream and answer questions at given times (`hermes.runtime`)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from hermes.cli.memory import (
    Checkpoints,
    add_memory_file_options,
    check_memory_file_options,
    model_for,
    resumed_session,
    start_time,
)
from hermes.cli.options import add_memory_options, config_from_args, local_model_help, model_options


def add_stream_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("stream", help="stream a video file or a network stream and answer questions at given times")
    p.add_argument(
        "video", help="a video file, a folder of frame images, or a stream's URL (rtsp, rtsps, rtmp, srt, http, https)"
    )
    p.add_argument(
        "--folder-fps",
        type=float,
        default=None,
        metavar="FPS",
        help="the rate a folder of frames was recorded at (default: one image per frame at --fps)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this much stream time (a network stream runs until Ctrl-C otherwise)",
    )
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


def stream_settings(args: argparse.Namespace, default_fps: float | None = None):
    """What --policy, --param and the memory options ask for, as the one record of a stream's
    settings (`StreamSettings`: the app's controls, its API and a memory file build the same), checked
    once before the video opens or the model loads, then with the model's `default_fps`."""
    from hermes.memory.config import HermesConfig
    from hermes.runtime.settings import StreamSettings

    config = config_from_args(args, default_fps or HermesConfig.fps)
    return StreamSettings(
        policy=args.policy,
        params=tuple(args.param),
        budget=config.budget,
        chunk_frames=config.chunk_frames,
        fps=config.fps,
        reindex=config.reindex,
        host_cap_mb=args.host_cap_mb,
    )


def _session(args: argparse.Namespace, settings, memory=None):
    """A new session of `settings`' policy, or, with --load-memory, the saved one (`memory`, the
    file already read)."""
    from hermes.engine.session import StreamingSession
    from hermes.models.loading import load_video_lm, requested_model
    from hermes.serving.admission import host_memory_cap

    placement = model_options(args)
    lm = load_video_lm(requested_model(args.model, placement.get("device")), **placement)
    host_cap = host_memory_cap(settings.host_cap_mb)
    if memory is not None:
        return resumed_session(args, memory, lm, host_cap)
    settings = stream_settings(args, lm.default_fps)
    return StreamingSession(lm, settings.config(), policy=settings.policy, host_cap_bytes=host_cap)


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
    from hermes.runtime.driver import parse_ask, replay

    questions = [parse_ask(a) for a in args.ask]
    _check_watches(args)
    settings = stream_settings(args)
    memory = check_memory_file_options(args)  # a bad memory file fails before the model loads too
    if memory is not None:
        model_for(args, memory)
    source = _open_source(args)  # a bad file, or a stream that does not open, fails before the model loads
    session = _session(args, settings, memory)
    if memory is None or args.watch_threshold != 0.5:  # a resumed stream keeps its saved threshold otherwise
        session.standing.set_threshold(args.watch_threshold)
    session.standing.answer_tokens = args.max_new_tokens
    for question in args.watch:
        if question.strip() not in session.standing.questions:
            session.standing.add(question)
    saver = Checkpoints(session, args.save_memory, None if args.save_every is None else 60 * args.save_every)
    if session.lm.random_weights and not args.json:
        print("note: random weights: answers are noise, the memory dynamics are real", file=sys.stderr)
    bar = tqdm(
        total=source.total(session.config.fps),
        initial=session.frames_seen,
        unit="frame",
        disable=args.json,
        file=sys.stderr,
    )
    end = None if args.duration is None else start_time(session) + args.duration
    frames = source.frames(start_time(session), session.config.fps, lambda note: _print_note(args, note, bar))
    if end is not None:
        frames = itertools.takewhile(lambda frame: frame.t <= end, frames)
    frames = itertools.takewhile(lambda frame: not source.stop_requested.is_set(), frames)
    try:
        with _ctrl_c_ends(source.stop_requested):
            _print_events(
                args,
                replay(session, frames, questions, speed=args.speed, max_new_tokens=args.max_new_tokens),
                bar,
                saver,
            )
        if source.stop_requested.is_set():
            _print_note(args, {"event": "stopped", "note": "interrupted"}, bar)
    except StreamBound as bound:  # a bound of the policy (rekv's host memory): the stream stops, with the reason
        _print_note(args, {"event": "stopped", "note": str(bound)}, bar)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once; what was read stays, and is saved
        _print_note(args, {"event": "stopped", "note": "interrupted"}, bar)
    finally:
        source.close()
    bar.close()
    if note := source.closing_note():
        print(note, file=sys.stderr)
    if args.watch and not args.json and session.chunks_seen:
        print(session.watch_cost.summary(), file=sys.stderr)
    saver.save()  # what was read, a damaged file's good part too
    source.raise_damage()
    return 0


@contextlib.contextmanager
def _ctrl_c_ends(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C asks the stream to end at its next frame (set `stop`) instead of raising in the middle
    of whatever the main thread holds (a lock, a half-updated memory); a second Ctrl-C raises
    KeyboardInterrupt as usual. Off the main thread, where signals cannot be caught, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def press(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, press)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _open_source(args: argparse.Namespace):
    from hermes.runtime.sources import open_source

    settings = stream_settings(args)
    return open_source(args.video, settings.fps, settings.chunk_frames, args.folder_fps)


def _print_note(args: argparse.Namespace, note: dict, bar: Any) -> None:
    """Say what happened to the source (frames skipped, the stream dropped or back, stopped)."""
    if args.json:
        print(json.dumps(note), flush=True)
    else:
        bar.clear()
        print(f"\n{note['event']}: {note['note']}" if note.get("note") else f"\n{note['event']}", flush=True)


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
