"""A node killed with SIGKILL: nodes started by `ray start` in subprocesses (one after another: two
at once collide on a port), all on loopback 127.0.0.2 with token authentication, each under a temp
folder of the test's own; the raylet of a stream's engine is killed, and the stream moves to the
other engine from its last checkpoint, bit for bit, goes on and answers. The test stops only the
processes it started, found by that folder (never `ray stop`, which stops every Ray process here)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

# isort: off
# First: tests/test_cluster.py sets the token before ray is imported (a process reads its
# authentication mode once), the same for both modules in one session.
from tests.test_cluster import AUTH, LOOPBACK, PER_FRAME, ROOT, answer, finished
import ray

# isort: on

from hermes.cluster import (
    EngineConfig,
    RemoteRegistry,
    checkpoint_key,
    directory,
    ensure_cluster,
    memory_digest,
    tear_down,
)
from hermes.cluster.records import CHECKPOINTS
from hermes.serving import CheckpointStore
from tests.helpers import wait_for


def ours(folder: str) -> list[psutil.Process]:
    """The processes of the nodes under `folder`: their command line or an open file names it (never
    this process, the driver, whose own files may lie there)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.pid == os.getpid():
            continue
        try:
            named = any(folder in arg for arg in p.info["cmdline"] or [])
            if named or any(f.path.startswith(folder) for f in p.open_files()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop(folder: str) -> None:
    """Stop the processes under `folder` (SIGTERM, then SIGKILL for any left after 10 s)."""
    procs = ours(folder)
    for p in procs:
        p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture
def nodes(llava_lm, tmp_path):
    folder = tempfile.mkdtemp(prefix="hr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    env = os.environ | AUTH | {"PYTHONPATH": str(ROOT)}
    common = ["--node-ip-address", LOOPBACK, "--num-cpus", "1", "--temp-dir", folder, "--disable-usage-stats"]
    head = ["ray", "start", "--head", "--port", str(port), "--include-dashboard=false", *common]
    engine_node = ["ray", "start", "--address", f"{LOOPBACK}:{port}", "--resources", json.dumps({"hermes_engine": 1})]
    try:
        for command in (head, [*engine_node, *common], [*engine_node, *common]):  # one after another
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
        ray.init(address=f"{LOOPBACK}:{port}", namespace="hermes-raylet-test", log_to_driver=False)
        yield folder, tmp_path / "state"
    finally:
        ray.shutdown()
        stop(folder)


def raylet_of(folder: str, node_id: str) -> psutil.Process:
    return next(p for p in ours(folder) if p.name() == "raylet" and f"--node_id={node_id}" in p.cmdline())


def test_a_raylet_killed_moves_its_stream_from_its_last_checkpoint(nodes, clips):
    folder, state = nodes
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {LOOPBACK}
    config = EngineConfig(str(state), model="tiny", dtype="fp32", max_streams=3, lease_s=600, every_chunks=1)
    engines = ensure_cluster(config, every_s=0.5, max_misses=3, verify=True)
    try:
        stream = RemoteRegistry().get("viewer-k")
        stream.start_file(clips["short"], "1x", PER_FRAME)
        assert wait_for(lambda: stream.view().frames_seen >= 3, 60, 0.1)
        stream.pause()
        assert wait_for(lambda: stream.status().state == "paused" and not stream.status().queued_chunks, 30, 0.1)
        time.sleep(0.5)  # a chunk's checkpoint is written in its own job
        seen = stream.view().frames_seen
        digest = memory_digest(CheckpointStore(Path(state) / CHECKPOINTS).path(checkpoint_key("viewer-k")))
        gone = ray.get(directory().lookup.remote("viewer-k"))
        status = ray.get(directory().status.remote())
        node = status["engines"][gone]["node"]
        head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"])
        assert status["node"] == head != node  # the directory lives on the head, away from the engine
        killed = time.monotonic()
        raylet_of(folder, node).send_signal(signal.SIGKILL)

        def moved():
            return next((m for m in ray.get(directory().status.remote())["moves"] if m.key == "viewer-k"), None)

        move = wait_for(moved, 90, 0.2)
        assert move is not None and move.from_engine == gone and move.to_engine != gone
        assert move.digest == digest and move.lost_s == 0.0
        assert wait_for(lambda: stream.view().frames_seen > seen, 60, 0.1), "the video did not go on"
        print(f"\nraylet killed to the moved stream's next chunk: {time.monotonic() - killed:.1f} s")
        assert f"moved from engine {gone}" in stream.status().note
        assert finished(stream, 8)
        assert answer(stream)
    finally:
        tear_down(engines)
