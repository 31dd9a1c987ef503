"""Fair and safe under load, measured against the launched app: memory returned, fair turns, cheap refusals.

Serves the app in this process on 127.0.0.1 (a tiny random-weight model by default) and drives it
with `gradio_client`, as viewers and scripts do. Three measurements, each printed with its target
and met/missed:

1. memory returned: rounds of N clients that each stream a clip, ask, and close. The process's RSS
   after the first round is the warmed-up level; after each later round, once every stream is
   closed, RSS must be back within MARGIN_MB of it. `--no-trim` runs the same without handing the
   C heap's free pages back (`hermes.engine.metrics.trim_host_memory`), to show what that does.
2. fair turns: a viewer streams a long clip and asks, alone, then while another client floods the
   server with questions. Its first-token latency (the wait for the model thread plus the
   prefill, as the server measures it) with the flood must stay within TTFT_FACTOR of alone, and
   its chunks must keep going in.
3. cheap refusals: with every slot taken, 10 parallel starts of a one-frame 8000 x 8000 file are all
   refused, and the process's memory grows by less than REFUSAL_MB.

    python scripts/fair_load.py                   # tiny model, 4 rounds of 4 clients
    python scripts/fair_load.py --model tiny-24 --rounds 4 --clients 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from hermes.engine import metrics as engine_metrics
from hermes.models.loading import load_video_lm, set_threads
from hermes.serving import StreamRegistry, StreamSettings
from hermes.video.clips import make_clip
from ui import build_app, launch_options

MB = 2**20
MARGIN_MB = 150.0  # RSS after a round with every client gone, above the warmed-up level
TTFT_FACTOR = 3.0  # a viewer's first-token latency beside a flood of questions, against alone
REFUSAL_MB = 100.0  # memory growth for 10 refused starts of a huge-frame file
SETTINGS = StreamSettings(budget=512, chunk_frames=4, fps=1.0)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def wait(predicate, timeout: float, step: float = 0.2):
    """Poll `predicate` until it is truthy (returned) or `timeout` seconds pass (None)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(step)
    return None


def serve(lm, max_streams: int, lease_s: float) -> tuple[str, object, StreamRegistry]:
    registry = StreamRegistry(lm, settings=SETTINGS, max_streams=max_streams, lease_s=lease_s)
    demo = build_app(lm, registry=registry)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    return demo.local_url, demo, registry


def settled(registry: StreamRegistry) -> float:
    """RSS once every stream is closed and the model thread is idle."""
    wait(lambda: len(registry) == 0, 60)
    registry.worker.wait_idle(timeout=60)
    time.sleep(1.0)
    return rss_mb()


def start(client: Client, clip: Path, pace: str) -> None:
    """Start `clip`, trying again while the server says other starts are being prepared (at most 2 at once)."""
    for _ in range(100):
        try:
            client.predict(handle_file(str(clip)), pace, api_name="/start_file")
            return
        except AppError as exc:
            if "being prepared" not in str(exc):
                raise
            time.sleep(0.2)
    raise RuntimeError("the server kept preparing other starts")


def viewer_round(url: str, clip: Path) -> None:
    """One client: stream `clip` as fast as the model goes, ask about it, and leave."""
    client = Client(url, verbose=False)
    try:
        start(client, clip, "max")
        wait(lambda: client.predict(api_name="/metrics")["state"] == "finished", 120)
        client.predict("What happens in the video?", api_name="/ask")
    finally:
        client.close()


def memory_rounds(url: str, registry: StreamRegistry, clip: Path, rounds: int, clients: int) -> dict:
    """RSS after each round of `clients` viewers, the first being the warm-up."""
    after = []
    for _ in range(rounds + 1):
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda _: viewer_round(url, clip), range(clients)))
        after.append(settled(registry))
    warm, later = after[0], after[1:]
    return {"warm_mb": warm, "after_rounds_mb": later, "worst_above_warm_mb": max(later) - warm}


def first_token_ms(client: Client) -> float:
    """Ask and wait for the whole answer; the server's wait for the model thread plus the first token."""
    client.predict("What is there now?", api_name="/ask")
    answer = client.predict(api_name="/metrics")["answers"][-1]
    return answer["wait_ms"] + answer["ttft_ms"]


def fair_turns(url: str, long_clip: Path, asks: int) -> dict:
    """A viewer's first-token latency alone and beside a flood of questions; its chunks meanwhile."""
    viewer, flood = Client(url, verbose=False), Client(url, verbose=False)
    try:
        flood.predict(handle_file(str(long_clip)), "max", api_name="/start_file")
        wait(lambda: flood.predict(api_name="/metrics")["chunks"] >= 2, 120)
        flood.predict(api_name="/stop")
        viewer.predict(handle_file(str(long_clip)), "1x", api_name="/start_file")
        wait(lambda: viewer.predict(api_name="/metrics")["chunks"] >= 1, 120)
        alone = [first_token_ms(viewer) for _ in range(asks)]
        stop = threading.Event()

        def flooding() -> None:
            while not stop.is_set():
                jobs = [flood.submit("Describe everything in detail.", api_name="/ask") for _ in range(8)]
                for job in jobs:
                    job.result()

        thread = threading.Thread(target=flooding, daemon=True)
        chunks_before = viewer.predict(api_name="/metrics")["chunks"]
        t0 = time.monotonic()
        thread.start()
        time.sleep(2.0)  # the flood is under way
        beside = [first_token_ms(viewer) for _ in range(asks)]
        chunks = viewer.predict(api_name="/metrics")["chunks"] - chunks_before
        seconds = time.monotonic() - t0
        stop.set()
        thread.join(120)
    finally:
        viewer.close()
        flood.close()
    return {
        "alone_ms": statistics.median(alone),
        "beside_flood_ms": statistics.median(beside),
        "factor": statistics.median(beside) / statistics.median(alone),
        "viewer_chunks_during_flood": chunks,
        "flood_seconds": seconds,
    }


def cheap_refusals(url: str, registry: StreamRegistry, long_clip: Path, huge: Path) -> dict:
    """With every slot taken, 10 parallel starts of a huge-frame file: replies and memory growth."""
    settled(registry)  # the earlier clients' streams are closed
    holders = [Client(url, verbose=False) for _ in range(registry.max_streams)]
    try:
        for client in holders:
            start(client, long_clip, "1x")
        before = rss_mb()

        def start_huge(_: int) -> str:
            client = Client(url, verbose=False)
            try:
                client.predict(handle_file(str(huge)), "1x", api_name="/start_file")
                return "started"
            except AppError as exc:
                return str(exc)
            finally:
                client.close()

        with ThreadPoolExecutor(10) as pool:
            replies = list(pool.map(start_huge, range(10)))
        grown = rss_mb() - before
    finally:
        for client in holders:
            client.close()
    busy = sum("Busy" in r for r in replies)
    return {"refused_busy": busy, "starts": len(replies), "grown_mb": grown}


def report(name: str, value: float, target: float, unit: str, higher_is_worse: bool = True) -> str:
    met = value <= target if higher_is_worse else value >= target
    bound = f"{'<=' if higher_is_worse else '>='} {target:g}"
    return f"{name}: {value:,.2f} {unit} (target {bound}) {'met' if met else 'missed'}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--asks", type=int, default=3)
    p.add_argument("--no-trim", action="store_true", help="keep the C heap's free pages (to compare)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    if args.no_trim:
        engine_metrics.trim_host_memory = lambda: False  # the free pages stay in the arenas
    root = Path(tempfile.mkdtemp(prefix="fair-load-"))
    clip = make_clip(root / "clip.mp4", 12.0, fps=4, size=(320, 240))
    long_clip = make_clip(root / "long.mp4", 600.0, fps=1, size=(64, 64))
    huge = make_clip(root / "huge.mp4", 0.04, fps=25, size=(8000, 8000))
    lm = load_video_lm(args.model, dtype=args.dtype)
    url, demo, registry = serve(lm, max_streams=args.clients, lease_s=60.0)
    try:
        memory = memory_rounds(url, registry, clip, args.rounds, args.clients)
        print(json.dumps({"memory": memory}), flush=True)
        turns = fair_turns(url, long_clip, args.asks)
        print(json.dumps({"turns": turns}), flush=True)
        refusals = cheap_refusals(url, registry, long_clip, huge)
    finally:
        demo.close()
        registry.shutdown()
    results = {"model": args.model, "trim": not args.no_trim, "memory": memory, "turns": turns, "refusals": refusals}
    print(json.dumps(results, indent=2))
    print(report("RSS above the warmed-up level after the worst round", memory["worst_above_warm_mb"], MARGIN_MB, "MB"))
    print(report("first-token latency beside a flood / alone", turns["factor"], TTFT_FACTOR, "x"))
    print(report("the viewer's chunks taken in during the flood", turns["viewer_chunks_during_flood"], 1, "", False))
    print(report("huge-frame starts refused as Busy, of 10", refusals["refused_busy"], 10, "", False))
    print(report("memory grown by 10 refused starts", refusals["grown_mb"], REFUSAL_MB, "MB"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
