"""Streams across a local Ray cluster, measured: `python scripts/cluster_bench.py` prints met or missed for

- time to first token through a front end (a Ray driver, hermes.cluster's RemoteStream) against the
  same stream served in this process (an `Engine` without Ray): at most 10 ms more, median;
- placement: N streams over K engines, no engine over its cap while another has room;
- a move: the time from an engine's node removed to its stream's next chunk on another (at most
  30 s), and the memory after the move equal to the last checkpoint's, bit for bit.

Every node listens on loopback 127.0.0.2 with token authentication (a token of the run's own); the
script stops only the nodes it started. The tiny model, on the CPU.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})  # before ray loads
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from hermes.cluster import (  # noqa: E402
    EngineConfig,
    RemoteRegistry,
    checkpoint_key,
    directory,
    ensure_cluster,
    memory_digest,
    tear_down,
)
from hermes.cluster.engine import Engine  # noqa: E402
from hermes.serving import CheckpointStore, StreamSettings  # noqa: E402
from hermes.video.clips import make_clip  # noqa: E402

LOOPBACK = "127.0.0.2"
SMALL = StreamSettings(budget=400, chunk_frames=2, fps=0.5)
PER_FRAME = StreamSettings(budget=400, chunk_frames=1, fps=1)
QUESTION = "What did you see at the start?"


def line(met: bool, what: str) -> None:
    print(f"{'met   ' if met else 'missed'}  {what}", flush=True)


def until(predicate, timeout: float, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(step)
    return predicate()


def local_ttft(state: Path, clip: Path, questions: int) -> list[float]:
    """First-token times (ms) of a stream served in this process, asked `questions` times."""
    engine = Engine("local", str(state), model="tiny", dtype="fp32")
    engine.start_file("v", str(clip), clip.name, "max", SMALL)
    until(lambda: engine.read("v")[0].state == "finished", 120)
    engine.stream("v").worker.wait_idle("v", 60)
    times = []
    for _ in range(questions):
        began = time.perf_counter()
        answer = engine.ask("v", QUESTION, 8)
        next(answer)  # the question as queued
        next(answer)  # its first token
        times.append((time.perf_counter() - began) * 1000)
        for _ in answer:
            pass
    engine.registry.shutdown()
    return times


def remote_ttft(stream, questions: int) -> list[float]:
    times = []
    for _ in range(questions):
        began = time.perf_counter()
        events = stream.ask(QUESTION, 8).events()
        next(events)
        times.append((time.perf_counter() - began) * 1000)
        for _ in events:
            pass
    return times


def placement(registry, clip: Path, streams: int, max_streams: int) -> bool:
    keys = [f"bench-{i}" for i in range(streams)]
    for key in keys:
        registry.get(key).start_file(clip, "max", SMALL)
    until(lambda: all(registry.get(k).status().state == "finished" for k in keys), 180, 0.2)
    held = {name: len(e["streams"]) for name, e in ray.get(directory().status.remote())["engines"].items()}
    over = any(n > max_streams for n in held.values())
    unbalanced = max(held.values()) - min(held.values()) > 1
    line(not over and not unbalanced, f"placement: {streams} streams over {len(held)} engines: {held}")
    return not over and not unbalanced


def move(cluster: Cluster, nodes: list, registry, clip: Path, state: Path) -> None:
    stream = registry.get("bench-move")
    stream.start_file(clip, "1x", PER_FRAME)
    until(lambda: stream.view().frames_seen >= 3, 60)
    stream.pause()
    until(lambda: stream.status().state == "paused" and not stream.status().queued_chunks, 30)
    time.sleep(0.5)
    seen = stream.view().frames_seen
    digest = memory_digest(CheckpointStore(state / "checkpoints").path(checkpoint_key("bench-move")))
    status = ray.get(directory().status.remote())
    owner = ray.get(directory().lookup.remote("bench-move"))
    node = next(n for n in nodes if n.node_id == status["engines"][owner]["node"])
    died = time.monotonic()
    cluster.remove_node(node)
    until(lambda: stream.view().frames_seen > seen, 120, 0.05)
    took = time.monotonic() - died
    line(took <= 30.0, f"an engine's node removed to its moved stream's next chunk: {took:.1f} s (at most 30 s)")
    moves = [m for m in ray.get(directory().status.remote())["moves"] if m.key == "bench-move"]
    same = bool(moves) and moves[0].digest == digest
    line(same, f"memory after the move equals the last checkpoint's, bit for bit ({digest[:12]})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--questions", type=int, default=15)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="hermes-cluster-bench-"))
    clip = make_clip(work / "clip.mp4", 8.0, fps=4, size=(160, 120))
    local = local_ttft(work / "local", clip, args.questions)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": LOOPBACK})
    try:
        nodes = [
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK, resources={"hermes_engine": 1})
            for _ in range(args.engines)
        ]
        ray.init(address=cluster.address, namespace=f"bench-{secrets.token_hex(4)}", log_to_driver=False)
        most = -(-(args.streams + 1) // args.engines)
        config = EngineConfig(str(work / "state"), model="tiny", dtype="fp32", max_streams=most, every_chunks=1)
        engines = ensure_cluster(config, every_s=0.5, verify=True)
        registry = RemoteRegistry()
        placement(registry, clip, args.streams, most)
        remote = remote_ttft(registry.get("bench-0"), args.questions)
        there, here = statistics.median(remote), statistics.median(local)
        line(
            there - here <= 10.0,
            f"time to first token through a front end {there:.1f} ms against {here:.1f} ms served locally, "
            f"median of {args.questions}: {there - here:+.1f} ms (at most +10)",
        )
        move(cluster, nodes, registry, clip, work / "state")
        tear_down(engines)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
