"""Streams across a Ray cluster (hermes.cluster) on `ray.cluster_utils.Cluster`: a head and two
engine nodes on this machine, every one on loopback 127.0.0.2 (Ray would swap 127.0.0.1 for the
machine's own address), token authentication on with a token of the test's own, one CPU each, the
tiny model. Streams are placed on both engines; a second driver finds a stream by its key and asks
it; removing a stream's node moves it to the other engine from its last checkpoint, bit for bit,
its video going on and its questions answered. The module stops only the nodes it started.

ray is in the lock (requirements.txt), so CI has it: without it these tests fail, never skip.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Before ray is imported: a process reads its authentication mode once, when ray loads. The token is
# the test session's own; every node, worker and second driver started from here inherits it.
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)}
os.environ.update(AUTH)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from hermes.cli.cluster import print_status  # noqa: E402
from hermes.cluster import (  # noqa: E402
    EngineConfig,
    RemoteRegistry,
    RemoteStream,
    checkpoint_key,
    directory,
    ensure_cluster,
    memory_digest,
    tear_down,
)
from hermes.cluster.launch import NAMESPACE  # noqa: E402
from hermes.cluster.records import CHECKPOINTS, short_id  # noqa: E402
from hermes.serving import CheckpointStore, StreamSettings  # noqa: E402
from tests.browsers import app_served  # noqa: E402
from tests.helpers import SMALL, wait_for  # noqa: E402
from tests.test_app import free_port  # noqa: E402

LOOPBACK = "127.0.0.2"
QUESTION = "What did you see at the start?"
PER_FRAME = StreamSettings(budget=400, chunk_frames=1, fps=1)  # the short clip in 8 chunks, 1 s each


@dataclass
class Running:
    """The test's cluster: the Cluster, its engine nodes, the engines' names, the state folder, the
    namespace and the environment a second driver needs."""

    cluster: Cluster
    nodes: list
    engines: list[str]
    state: Path
    namespace: str
    env: dict[str, str]

    def owner(self, key: str) -> str:
        return ray.get(directory().lookup.remote(key))

    def engines_status(self) -> dict:
        return ray.get(directory().status.remote())


@pytest.fixture(scope="module")
def cluster(llava_lm, tmp_path_factory):  # llava_lm: the tiny model built once, before the engines load it
    # The nodes' workers import hermes from this checkout.
    env = AUTH | {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    saved = os.environ.get("PYTHONPATH")
    os.environ.update(env)
    head = {"num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False}
    c = Cluster(initialize_head=True, head_node_args=head)
    try:
        nodes = [c.add_node(num_cpus=1, node_ip_address=LOOPBACK, resources={"hermes_engine": 1}) for _ in range(2)]
        # The cluster is the test's own (its own control store): app.py --ray joins its default namespace.
        namespace = NAMESPACE
        ray.init(address=c.address, namespace=namespace, log_to_driver=False)
        state = tmp_path_factory.mktemp("state")
        config = EngineConfig(str(state), model="tiny", dtype="fp32", max_streams=3, lease_s=600, every_chunks=1)
        engines = ensure_cluster(config, every_s=0.5, max_misses=3, verify=True)
        yield Running(c, nodes, engines, state, namespace, env | {"RAY_ADDRESS": c.address})
        tear_down(engines)
    finally:
        ray.shutdown()
        c.shutdown()
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)


@pytest.fixture(scope="module")
def registry(cluster):
    return RemoteRegistry()


def finished(stream: RemoteStream, frames: int, timeout: float = 90.0) -> bool:
    """Whether the stream finished with `frames` frames seen within `timeout` seconds."""
    return wait_for(
        lambda: (
            stream.status().state == "finished"
            and not stream.status().queued_chunks
            and stream.view().frames_seen == frames
        ),
        timeout,
        0.2,
    )


def answer(stream: RemoteStream) -> str:
    """The finished answer's text (8 tokens), every event free of errors."""
    events = list(stream.ask(QUESTION, max_new_tokens=8).events())
    assert events and all(e.error is None for e in events), [e.error for e in events]
    assert events[-1].done and events[-1].update is not None
    return events[-1].update.text


def test_an_address_with_no_cluster_is_one_line_not_minutes_of_retries(tmp_path):
    """Ray retries an unreachable head for minutes; the page and the CLI say so at once and stop."""
    closed = free_port()  # nothing listens there
    runs = {
        "app.py": [sys.executable, "app.py", "--ray", f"127.0.0.1:{closed}", "--state-dir", str(tmp_path)],
        "cluster": [sys.executable, "-m", "hermes", "cluster", "--address", f"127.0.0.1:{closed}", "status"],
        "malformed": [sys.executable, "-m", "hermes", "cluster", "--address", "headnode", "status"],
    }
    for name, argv in runs.items():  # the timeout: Ray's own retries outlast it
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (name, done.stderr[-2000:])
        (line,) = done.stderr.strip().splitlines()
        wanted = "host:port or auto" if name == "malformed" else f"no Ray cluster answers at 127.0.0.1:{closed}"
        assert wanted in line, (name, line)


def test_every_node_listens_on_loopback_with_token_auth(cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 3
    assert {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_streams_are_placed_on_two_engines_and_answered(cluster, registry, clips):
    first, second = registry.get("viewer-a"), registry.get("viewer-b")
    for stream in (first, second):
        stream.start_file(clips["short"], "max", SMALL)
    assert finished(first, 4) and finished(second, 4)
    assert {cluster.owner("viewer-a"), cluster.owner("viewer-b")} == set(cluster.engines)
    engines = cluster.engines_status()["engines"]
    assert all(e["alive"] and len(e["streams"]) == 1 for e in engines.values()), engines
    assert answer(first)
    assert registry.get("nobody", create=False) is None


SECOND_DRIVER = """
import json, sys
import ray
from hermes.cluster import RemoteRegistry
ray.init(address="auto", namespace=sys.argv[1], log_to_driver=False)
stream = RemoteRegistry().get("viewer-a", create=False)
events = list(stream.ask(sys.argv[2], max_new_tokens=8).events())
found = {"frames": stream.view().frames_seen, "text": events[-1].update.text}
print(json.dumps(found | {"errors": [e.error for e in events]}))
"""


def test_a_second_driver_finds_a_stream_by_its_key_and_asks_it(cluster, registry):
    env = os.environ | cluster.env
    out = subprocess.run(
        [sys.executable, "-c", SECOND_DRIVER, cluster.namespace, QUESTION],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["errors"] == [None] * len(found["errors"])
    assert found["frames"] == 4
    assert found["text"] == answer(registry.get("viewer-a"))  # the same memory, asked the same


def test_draining_an_engine_moves_its_streams_away_without_loss(cluster, registry, capsys):
    gone = cluster.owner("viewer-b")
    stream = registry.get("viewer-b")
    frames, text = stream.view().frames_seen, answer(stream)
    moves = ray.get(directory().drain.remote(gone))
    try:
        assert [m.key for m in moves] == ["viewer-b"] and moves[0].to_engine != gone and moves[0].lost_s == 0.0
        assert cluster.owner("viewer-b") == moves[0].to_engine
        assert wait_for(lambda: stream.view().frames_seen == frames, 30, 0.2)
        assert answer(stream) == text  # the same memory, drained and loaded elsewhere
        print_status(cluster.engines_status(), as_json=False)
        listed = capsys.readouterr().out
        assert f"{gone}  draining" in listed and f"moved {short_id('viewer-b')}: {gone} -> " in listed
        assert "viewer-b" not in listed  # streams are listed by a hash of their key, never by the key
    finally:
        ray.get(directory().undrain.remote(gone))


def test_a_network_stream_drained_away_reconnects_on_its_new_engine(cluster, registry):
    """A moved network stream reconnects into its moved memory, under the URL policy it was started
    with, its frames numbered on from the checkpoint's."""
    from hermes.serving import UrlPolicy
    from tests.network_servers import mjpeg_camera

    stream = registry.get("viewer-net")
    with mjpeg_camera() as url:
        stream.start_url(url, UrlPolicy.parse("127.0.0.1"), PER_FRAME)
        assert wait_for(lambda: stream.view().frames_seen >= 2, 60, 0.2)
        gone = cluster.owner("viewer-net")
        try:
            move = next(m for m in ray.get(directory().drain.remote(gone)) if m.key == "viewer-net")
            assert move.to_engine != gone
            assert "its stream reconnected and goes on" in move.note
            seen = stream.view().frames_seen
            assert wait_for(lambda: stream.view().frames_seen >= seen + 2, 60, 0.2), "the stream did not go on"
            assert stream.status().state == "streaming"
        finally:
            ray.get(directory().undrain.remote(gone))
            registry.close("viewer-net")


def test_the_page_serves_a_stream_of_the_cluster(cluster, registry, clips):
    """app.py --ray's page (build_app over the cluster's registry), through gradio_client: a file
    uploaded (as bytes, kept in the shared state folder) streams on an engine, and is asked."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client, handle_file

    from ui import build_app, launch_options

    demo = build_app(registry.lm, registry=registry, load_error=registry.load_error)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    try:
        client = Client(demo.local_url, verbose=False)
        status, chat = client.predict(handle_file(str(clips["short"])), "max", api_name="/start_file")
        assert "short.mp4" in status and chat == []
        assert wait_for(lambda: client.predict(api_name="/metrics")["state"] == "finished", 90, 0.5)
        job = client.submit("What is it?", api_name="/ask")
        final = job.result()[0]
        assert [m["role"] for m in final] == ["user", "assistant"] and "TTFT" in str(final[-1]["content"])
        uploads = list((cluster.state / "uploads").rglob("short.mp4"))
        assert len(uploads) == 1 and uploads[0].read_bytes() == clips["short"].read_bytes()
    finally:
        demo.close()


def test_removing_an_engines_node_moves_its_stream_from_its_last_checkpoint(cluster, registry, clips):
    stream = registry.get("viewer-c")
    stream.start_file(clips["short"], "1x", PER_FRAME)
    assert wait_for(lambda: stream.view().frames_seen >= 3, 60, 0.1)
    stream.pause()
    assert wait_for(lambda: stream.status().state == "paused" and not stream.status().queued_chunks, 30, 0.1)
    time.sleep(0.5)  # a chunk's checkpoint is written in its own job, before the queue counts it done
    seen = stream.view().frames_seen
    checkpoint = CheckpointStore(cluster.state / CHECKPOINTS).path(checkpoint_key("viewer-c"))
    digest = memory_digest(checkpoint)

    gone = cluster.owner("viewer-c")
    health = cluster.engines_status()["engines"][gone]
    node = next(n for n in cluster.nodes if n.node_id == health["node"])
    died = time.monotonic()
    cluster.cluster.remove_node(node)

    def moved():
        return next((m for m in cluster.engines_status()["moves"] if m.key == "viewer-c"), None)

    move = wait_for(moved, 60, 0.2)
    assert move is not None, "the stream did not move"
    assert move.from_engine == gone and move.to_engine != gone and cluster.owner("viewer-c") == move.to_engine
    assert move.digest == digest  # the memory after the move is the last checkpoint's, bit for bit
    assert move.lost_s == 0.0  # paused at its checkpoint: nothing was streamed after it
    assert wait_for(lambda: stream.view().frames_seen > seen, 60, 0.1), "the video did not go on"
    print(f"\nengine gone to the moved stream's next chunk: {time.monotonic() - died:.1f} s")
    status = stream.status()
    assert f"moved from engine {gone}" in status.note and "lost 0 s of video" in status.note
    assert finished(stream, 8)  # the file went on from where the checkpoint stopped, to its end
    assert answer(stream)
    # The other engine's streams are untouched; the removed engine's finished stream moved too.
    assert {cluster.owner(k) for k in ("viewer-a", "viewer-b", "viewer-c")} == {move.to_engine}
    assert registry.get("viewer-a").view().frames_seen == 4 and answer(registry.get("viewer-a"))


def front_end(cluster: Running, port: int, log: Path):
    """`python app.py --ray` on the test's cluster, a driver of its own serving on `port`, until the block ends."""
    args = ["--ray", cluster.cluster.address, "--state-dir", str(cluster.state), "--model", "tiny", "--dtype", "fp32"]
    return app_served(args, port, log, cluster.env)


def wait_status(page, condition: str, timeout: float = 90_000) -> None:
    """Wait until the page's status line `s` meets the JavaScript `condition`; fail showing it."""
    from playwright.sync_api import TimeoutError as PageTimeout

    script = f"() => {{ const s = (document.querySelector('#status') || {{}}).innerText || ''; return {condition}; }}"
    try:
        page.wait_for_function(script, timeout=timeout)
    except PageTimeout:
        shown = page.evaluate("() => (document.querySelector('#status') || {}).innerText")
        pytest.fail(f"the status never met {condition}: it says {shown!r}")


def test_the_page_says_its_stream_moved_answers_again_and_outlives_its_front_end(cluster, registry, browser, tmp_path):
    """A real browser on `python app.py --ray`: stream the sample, ask; the engine's node is removed,
    and the page says the stream moved and answers again; app.py restarts, and the reopened page
    finds its stream by the key its browser keeps."""
    from tests.test_browser_persist import answer_to, open_in

    for key in ("viewer-a", "viewer-b", "viewer-c"):  # room on the engine that will be left
        registry.close(key)
    # A node joins: the engine of the node removed before restarts on it (a detached actor).
    cluster.nodes.append(cluster.cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK, resources={"hermes_engine": 1}))
    engines = lambda: cluster.engines_status()["engines"].values()  # noqa: E731
    assert wait_for(lambda: all(e["alive"] for e in engines()) and len(engines()) == 2, 120, 0.5)

    others = {k for e in engines() for k in e["streams"]}  # the earlier page's stream, left to lapse
    port, log = free_port(), tmp_path / "front.log"
    viewer = browser.new_context(viewport={"width": 1400, "height": 1100})
    with front_end(cluster, port, log) as url:
        page, errors = open_in(viewer, url)
        page.wait_for_function("() => window.localStorage.getItem('hermes-viewer') !== null")
        page.get_by_label("max", exact=True).check()
        page.click("#start-sample")
        wait_status(page, "/Finished/.test(s)")
        before = answer_to(page)
        assert before
        (key,) = {k for e in engines() for k in e["streams"]} - others  # the browser's key, never shown by the page
        gone = cluster.owner(key)
        node = next(n for n in cluster.nodes if n.node_id == cluster.engines_status()["engines"][gone]["node"])
        cluster.cluster.remove_node(node)
        wait_status(page, f"s.includes('moved from engine {gone}')", 120_000)
        assert cluster.owner(key) != gone
        assert answer_to(page) == before  # the memory of the last checkpoint, asked the same
        assert errors == [], f"browser console errors: {errors}"

    with front_end(cluster, port, log) as url:  # the front end restarted: the same address, a new driver
        page, errors = open_in(viewer, url)
        wait_status(page, "/14 seen by the model/.test(s)")
        assert answer_to(page) == before
        assert errors == [], f"browser console errors: {errors}"
    viewer.close()
