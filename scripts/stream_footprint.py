"""What a live stream holds in host memory besides its KV cache, measured on a real stream.

A headless LiveStream (the app's settings: 1 fps, 4-frame chunks, budget 1,024) takes webcam-like
frames with a standing question and a few questions, then every structure it keeps is measured
object by object (numpy arrays by their bytes, Python objects by sys.getsizeof, recursively): the
bytes per item, the most items kept, and so the most it can hold however long the stream runs.

    python scripts/stream_footprint.py [--model tiny-24] [--chunks 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from hermes.models.loading import load_video_lm
from hermes.runtime.settings import StreamSettings
from hermes.serving import chat as chat_module
from hermes.serving import view as view_module
from hermes.serving.live import LiveStream
from hermes.serving.worker import ModelWorker, Priority


def deep_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes an object holds: arrays by their data, containers and dataclasses by their parts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes + sys.getsizeof(obj)
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_bytes(k, seen) + deep_bytes(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_bytes(x, seen) for x in obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        size += sum(deep_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    return size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-24", help="the app's offline model by default")
    p.add_argument("--chunks", type=int, default=40)
    args = p.parse_args(argv)
    lm = load_video_lm(args.model)
    worker = ModelWorker()
    stream = LiveStream(worker, lm, StreamSettings(watch_threshold=0.05), key="probe")
    stream.watch("Is something moving?")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(8)]
    for i in range(4 * args.chunks):
        while worker.backlog("probe", Priority.CHUNK) >= 2:
            worker.wait_backlog("probe", Priority.CHUNK, 2, 1.0)
        stream.push_frame(frames[i % len(frames)], t=float(i))
        if i % 40 == 39:
            ticket = stream.ask("What is happening?")
            stream.chat.add({"role": "user", "content": ticket.question})
            events = list(ticket.events())
            stream.chat.add({"role": "assistant", "content": events[-1].update.text})
    worker.wait_idle("probe", 300)
    view = stream.view()
    alerts = list(view.alerts)
    rows = [
        ("chunk metrics (performance plot)", view.history, view_module.HISTORY_LIMIT),
        ("standing-question checks", view.watch_history, view_module.WATCH_LIMIT),
        ("answers (timings)", view.answers, view_module.ANSWER_LIMIT),
        ("alerts, with their frames", tuple(alerts), view_module.ALERT_LIMIT),
        (
            "chat messages (text)",
            [m for m in stream.chat.messages() if isinstance(m["content"], str)],
            chat_module.MAX_MESSAGES,
        ),
    ]
    print(f"model {args.model}, {view.chunks} chunks, {view.frames_seen} frames; settings {stream.settings}")
    print("| kept | items now | bytes per item | most items | most bytes |")
    print("|---|---:|---:|---:|---:|")
    for name, items, limit in rows:
        per = deep_bytes(items) / max(1, len(items))
        print(f"| {name} | {len(items)} | {per:,.0f} | {limit:,} | {per * limit / 2**20:,.2f} MiB |")
    fixed = {
        "memory snapshots (the maps)": view.snapshots,
        "last attention record (the profiles)": view.attention,
        "tokens per frame (runs)": view.frame_tokens,
        "the frame shown": view.frame_image,
    }
    for name, obj in fixed.items():
        print(f"| {name} | - | - | - | {deep_bytes(obj) / 2**20:,.2f} MiB |")
    print(f"KV cache: {sum(s.cache_bytes for s in view.snapshots.values()) / 2**20:,.2f} MiB")
    stream.close()
    worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
