"""Fair and safe under load, measured against the launched app: memory returned, fair turns, cheap refusals.

Serves the app (`python app.py`, a tiny random-weight model by default) in a process of its own on
127.0.0.1, reads that process's memory, and drives it with `gradio_client`, as viewers and scripts
do. Four measurements, each printed with its target and met/missed:

1. memory returned: rounds of N clients that each stream a clip, ask, and close. The process's RSS
   after the first round is the warmed-up level; after each later round, once every stream is
   closed, RSS must be back within MARGIN_MB of it. `--no-trim` runs the same with a server that
   keeps the C heap's free pages (`hermes.engine.metrics.trim_host_memory` off), to show what it does.
2. fair turns: a viewer streams a long clip and asks, alone, then while another client floods the
   server with questions. Its time to the first token of an answer, as its client sees it, with
   the flood must stay within TTFT_FACTOR of alone, and its chunks must keep going in.
3. cheap refusals: with every slot taken, 10 parallel starts of a one-frame 8000 x 8000 file are all
   refused, and the process's memory grows by less than REFUSAL_MB.
4. flood: a viewer asks alone, then while one other client asks from FLOOD_THREADS threads at once,
   each asking again as soon as it is answered or refused (past its 2 questions in flight, every
   one is refused). The refusals must be cheap: the viewer's time to first token beside the flood
   must stay within FLOOD_FACTOR of alone, the median and the worst of its questions.

    python scripts/fair_load.py                   # tiny model, 4 rounds of 4 clients, every case
    python scripts/fair_load.py --cases flood     # one case (memory, turns, refusals, flood)
    python scripts/fair_load.py --model tiny-24 --rounds 4 --clients 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError, ValidationError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # for the server, which inherits it

from hermes.video.clips import make_clip  # noqa: E402

MB = 2**20
MARGIN_MB = 150.0  # RSS after a round with every client gone, above the warmed-up level
TTFT_FACTOR = 3.0  # a viewer's time to the first token beside a flood of questions, against alone
REFUSAL_MB = 100.0  # memory growth for 10 refused starts of a huge-frame file
FLOOD_THREADS = 8  # one client asking from this many threads at once
FLOOD_FACTOR = 1.5  # a viewer's time to the first token beside that flood, against alone
CASES = ("memory", "turns", "refusals", "flood")
SETTLE_S = 5.0  # after the last client closed: its heartbeat's end closes its stream
# The server, with the C heap trimming turned off (for --no-trim).
NO_TRIM = "import hermes.engine.metrics as m; m.trim_host_memory = lambda: False; "
SERVER = "import runpy, sys; sys.argv = ['app.py', *sys.argv[1:]]; runpy.run_path('app.py', run_name='__main__')"


def wait(predicate, timeout: float, step: float = 0.2):
    """Poll `predicate` until it is truthy (returned) or `timeout` seconds pass (None)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(step)
    return None


def serve(model: str, dtype: str, clients: int, trim: bool) -> tuple[str, subprocess.Popen]:
    """`python app.py` on a free port, in a process of its own; its URL once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = SERVER if trim else NO_TRIM + SERVER
    args = ["--model", model, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, "-c", code, *args, "--max-sessions", str(clients)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            Client(url, verbose=False).close()
            return True
        except Exception:
            return False

    if not wait(up, 300, step=1.0):
        server.kill()
        raise RuntimeError("the app did not come up")
    return url, server


def rss_mb(server: subprocess.Popen) -> float:
    return psutil.Process(server.pid).memory_info().rss / MB


def settled(server: subprocess.Popen) -> float:
    """The server's RSS once the clients that just closed have had their streams closed."""
    time.sleep(SETTLE_S)
    return rss_mb(server)


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


def memory_rounds(url: str, server: subprocess.Popen, clip: Path, rounds: int, clients: int) -> dict:
    """The server's RSS after each round of `clients` viewers, the first being the warm-up."""
    after = []
    for _ in range(rounds + 1):
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda _: viewer_round(url, clip), range(clients)))
        after.append(settled(server))
    warm, later = after[0], after[1:]
    return {"warm_mb": warm, "after_rounds_mb": later, "worst_above_warm_mb": max(later) - warm}


def first_token_ms(client: Client) -> float:
    """Ask, and the time until the client sees the answer's first token; waits for the whole answer."""
    t0 = time.monotonic()
    first = None
    job = client.submit("What is there now?", api_name="/ask")
    for chat, _ in job:
        if first is None and len(chat) >= 2 and chat[-1]["role"] == "assistant":
            first = (time.monotonic() - t0) * 1000.0
    job.result()
    return first if first is not None else (time.monotonic() - t0) * 1000.0


def viewer_alone(viewer: Client, flood: Client, long_clip: Path, asks: int) -> list[float]:
    """The flooding client's stream started and stopped (its memory built), the viewer's streaming at
    1x; the viewer's times to first token for `asks` questions asked alone, after one to warm up."""
    start(flood, long_clip, "max")
    wait(lambda: flood.predict(api_name="/metrics")["chunks"] >= 2, 120)
    flood.predict(api_name="/stop")
    start(viewer, long_clip, "1x")
    wait(lambda: viewer.predict(api_name="/metrics")["chunks"] >= 1, 120)
    first_token_ms(viewer)  # warm-up
    return [first_token_ms(viewer) for _ in range(asks)]


def fair_turns(url: str, long_clip: Path, asks: int) -> dict:
    """A viewer's time to first token alone and beside a flood of questions; its chunks meanwhile."""
    viewer, flood = Client(url, verbose=False), Client(url, verbose=False)
    try:
        alone = viewer_alone(viewer, flood, long_clip, asks)
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


def flood_from_threads(url: str, long_clip: Path, asks: int) -> dict:
    """A viewer's time to first token alone and while one other client asks from FLOOD_THREADS
    threads, each asking again as soon as it is answered or refused."""
    viewer, flood = Client(url, verbose=False), Client(url, verbose=False)
    counts = {"answered": 0, "refused": 0}
    stop = threading.Event()

    def asking() -> None:
        while not stop.is_set():
            try:
                flood.predict("Describe everything in detail.", api_name="/ask")
                counts["answered"] += 1
            except (ValidationError, AppError):  # past its questions in flight
                counts["refused"] += 1

    try:
        alone = viewer_alone(viewer, flood, long_clip, asks)
        threads = [threading.Thread(target=asking, daemon=True) for _ in range(FLOOD_THREADS)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)  # the flood is under way
        beside = [first_token_ms(viewer) for _ in range(asks)]
        stop.set()
        for thread in threads:
            thread.join(120)
    finally:
        viewer.close()
        flood.close()
    base = statistics.median(alone)
    return {
        "alone_ms": base,
        "beside_flood_ms": statistics.median(beside),
        "factor": statistics.median(beside) / base,
        "worst_factor": max(beside) / base,
        "flood_answered": counts["answered"],
        "flood_refused": counts["refused"],
    }


def cheap_refusals(url: str, server: subprocess.Popen, clients: int, long_clip: Path, huge: Path) -> dict:
    """With every slot taken, 10 parallel starts of a huge-frame file: replies and memory growth."""
    settled(server)  # the earlier clients' streams are closed
    holders = [Client(url, verbose=False) for _ in range(clients)]
    try:
        for client in holders:
            start(client, long_clip, "1x")
        before = rss_mb(server)

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
        grown = rss_mb(server) - before
    finally:
        for client in holders:
            client.close()
    busy = sum("Busy" in r for r in replies)
    return {"refused_busy": busy, "starts": len(replies), "grown_mb": grown}


def report(name: str, value: float, target: float, unit: str, higher_is_worse: bool = True) -> str:
    met = value <= target if higher_is_worse else value >= target
    bound = f"{'<=' if higher_is_worse else '>='} {target:g}"
    return f"{name}: {value:,.2f} {unit} (target {bound}) {'met' if met else 'missed'}"


def run_cases(args: argparse.Namespace, url: str, server: subprocess.Popen, clips: dict[str, Path]) -> dict:
    """The chosen cases against the served app, each printed as it ends."""
    cases = {
        "memory": lambda: memory_rounds(url, server, clips["clip"], args.rounds, args.clients),
        "turns": lambda: fair_turns(url, clips["long"], args.asks),
        "flood": lambda: flood_from_threads(url, clips["long"], args.asks),
        "refusals": lambda: cheap_refusals(url, server, args.clients, clips["long"], clips["huge"]),
    }
    results = {}
    for name in (c for c in CASES if c in args.cases):
        results[name] = cases[name]()
        print(json.dumps({name: results[name]}), flush=True)
    return results


def print_reports(results: dict) -> None:
    """Each measurement of the cases that ran, against its target."""
    if memory := results.get("memory"):
        worst = memory["worst_above_warm_mb"]
        print(report("RSS above the warmed-up level after the worst round", worst, MARGIN_MB, "MB"))
    if turns := results.get("turns"):
        print(report("time to first token beside a flood / alone", turns["factor"], TTFT_FACTOR, "x"))
        chunks = turns["viewer_chunks_during_flood"]
        print(report("the viewer's chunks taken in during the flood", chunks, 1, "", False))
    if flood := results.get("flood"):
        threads = f"one client asking from {FLOOD_THREADS} threads"
        print(report(f"time to first token beside {threads} / alone, median", flood["factor"], FLOOD_FACTOR, "x"))
        print(report(f"time to first token beside {threads} / alone, worst", flood["worst_factor"], FLOOD_FACTOR, "x"))
    if refusals := results.get("refusals"):
        print(report("huge-frame starts refused as Busy, of 10", refusals["refused_busy"], 10, "", False))
        print(report("memory grown by 10 refused starts", refusals["grown_mb"], REFUSAL_MB, "MB"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--asks", type=int, default=5)
    p.add_argument("--cases", type=lambda v: v.split(","), default=list(CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--no-trim", action="store_true", help="a server that keeps the C heap's free pages (to compare)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if unknown := set(args.cases) - set(CASES):
        p.error(f"unknown cases: {', '.join(sorted(unknown))} (choose from {', '.join(CASES)})")
    root = Path(tempfile.mkdtemp(prefix="fair-load-"))
    clips = {
        "clip": make_clip(root / "clip.mp4", 12.0, fps=4, size=(320, 240)),
        "long": make_clip(root / "long.mp4", 600.0, fps=1, size=(64, 64)),
        "huge": make_clip(root / "huge.mp4", 0.04, fps=25, size=(8000, 8000)),
    }
    url, server = serve(args.model, args.dtype, args.clients, trim=not args.no_trim)
    try:
        results = run_cases(args, url, server, clips)
    finally:
        server.terminate()
        server.wait(30)
    results = {"model": args.model, "trim": not args.no_trim, **results}
    print(json.dumps(results, indent=2))
    print_reports(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
