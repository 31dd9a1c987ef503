"""A viewer's live stream fed by a real network stream on loopback (RTSP from GStreamer's server, live
HLS from FFmpeg over HTTP) into the tiny model: answers, a budget held, drops and reconnects with
the memory kept, a slow model skipping to the live edge, and one clear error for what cannot open."""

from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np
import pytest

from hermes.engine.methods import PolicySpec
from hermes.runtime.settings import StreamSettings
from hermes.serving.jobs import Priority
from hermes.serving.live import LiveStream
from hermes.serving.state import StreamState
from hermes.video.network import StreamError
from hermes.video.urls import UrlPolicy, UrlRefused
from tests.helpers import assert_same_memory, memory_state, wait_for
from tests.network_servers import free_port, http_folder, live_hls, rtsp_server
from ui.figures import retained_map_figure

HERMES = PolicySpec("hermes")

pytestmark = pytest.mark.timeout(180)

# A chunk a second (2 frames at 2 fps); the budget fills after a few chunks.
LIVE = StreamSettings(budget=200, chunk_frames=2, fps=2.0)
LOOPBACK = UrlPolicy.parse("127.0.0.1")


@pytest.fixture
def stream(worker, llava_lm):
    s = LiveStream(worker, llava_lm, LIVE, key="net")
    yield s
    s.close()


def chunks_reach(stream: LiveStream, n: int, timeout: float = 60) -> bool:
    return wait_for(lambda: stream.view().chunks >= n, timeout)


def cache_bytes(stream: LiveStream) -> int:
    return stream.view().snapshots[HERMES].cache_bytes


def answered(stream: LiveStream, question: str) -> str:
    events = list(stream.ask(question, max_new_tokens=4).events())
    assert events and all(e.error is None for e in events) and events[-1].done
    return events[-1].update.text


@pytest.mark.parametrize("kind", ["rtsp", "hls"])
def test_a_network_stream_is_answered_from_a_memory_held_at_its_budget(stream, kind, tmp_path):
    server = rtsp_server() if kind == "rtsp" else live_hls(tmp_path / "hls")
    with server as served:
        url = served.url if kind == "rtsp" else served
        assert stream.start_url(url, LOOPBACK) == url
        assert stream.status().state is StreamState.STREAMING
        assert chunks_reach(stream, 8)
        held = cache_bytes(stream)
        assert chunks_reach(stream, 11)
        answered(stream, "What is moving?")
        stream.stop()
    view = stream.view()
    assert cache_bytes(stream) == held  # the budget holds: the cache stays the same size
    assert all((layer.stream_ids >= 0).sum() <= LIVE.budget + 1 for layer in view.snapshots[HERMES].layers)
    times = [r.stream_time_s for r in view.history]
    assert times == sorted(times) and times[-1] >= 10 * LIVE.chunk_frames / LIVE.fps - 1
    metrics = stream.metrics()
    json.dumps(metrics)
    assert metrics["network"]["url"] == url and metrics["network"]["latency_s"] >= 0


def test_a_dropped_stream_keeps_its_memory_and_goes_on_when_the_server_returns(stream, worker):
    with rtsp_server() as server:
        stream.start_url(server.url, LOOPBACK, backoff_s=(0.2, 0.5))
        assert chunks_reach(stream, 3)
        server.stop()
        assert wait_for(lambda: stream.status().state is StreamState.RECONNECTING, 20)
        assert any("dropped" in n for n in stream.pop_notices())
        # Every frame read before the drop reaches the memory (the partial chunk too), then nothing moves.
        assert wait_for(lambda: stream.status().frames_read == stream.view().frames_seen, 30)
        assert worker.wait_idle(stream.key, 30)
        session = stream._memories.sessions[HERMES]
        before, chunks = memory_state(session.memory), stream.view().chunks
        threading.Event().wait(2.0)  # down for a while: the memory waits, untouched
        assert_same_memory(before, session.memory)
        assert stream.view().chunks == chunks and stream.status().state is StreamState.RECONNECTING
        answered(stream, "What did you see?")  # questions still work meanwhile
        server.start()
        assert wait_for(lambda: stream.status().state is StreamState.STREAMING, 30)
        assert chunks_reach(stream, chunks + 2)
        assert any("back" in n for n in stream.pop_notices())
    gap_end = stream.view().history[chunks - 1].stream_time_s + 2.0
    assert stream.view().history[chunks].stream_time_s >= gap_end  # stream time went on across the gap
    numbers = stream.status().network
    assert numbers.reconnects >= 1 and numbers.gaps and "dropped at" in numbers.gaps[-1]
    # The retained-token map marks the hole where the memory saw nothing.
    frames_before = stream.view().history[chunks - 1].frames_seen
    gaps = stream.view().gaps  # (a machine under load may add holes where the model skipped)
    assert any(frame == frames_before and seconds >= 2.0 for frame, seconds in gaps), (frames_before, gaps)
    marks = [a.text for a in retained_map_figure(stream.view()).layout.annotations]
    assert sum("s gap" in text for text in marks) == len(gaps)


def test_stop_ends_a_stream_at_once_even_while_it_reconnects(stream):
    with rtsp_server() as server:
        stream.start_url(server.url, LOOPBACK, backoff_s=(30.0,))
        assert chunks_reach(stream, 1)
        server.stop()
        assert wait_for(lambda: stream.status().state is StreamState.RECONNECTING, 20)
        source = stream.feed.network
        stream.stop()  # in the middle of a 30 s wait before the next attempt
        assert stream.status().state in (StreamState.STOPPED, StreamState.FINISHING)
        source.reader.join(5)
        assert not source.thread.is_alive() and not source.reader.thread.is_alive()


def test_a_slow_model_skips_to_the_live_edge(stream, worker):
    with rtsp_server() as server:
        stream.start_url(server.url, LOOPBACK)
        assert chunks_reach(stream, 1)
        gate = threading.Event()
        worker.submit(lambda: gate.wait(60), Priority.CHUNK, stream.key)  # the model is busy for 20 s
        threading.Event().wait(20.0)
        gate.set()
        seen = stream.view().chunks
        assert chunks_reach(stream, seen + 4)
        status, view = stream.status(), stream.view()
    assert status.network.skipped_s >= 15.0 and status.dropped_frames >= 30
    # However long the model was busy, its picture is behind the live edge by no more than the chunk
    # being cut, the chunk in the model and the model's time for it (twice, with a second to spare).
    chunk_s = LIVE.chunk_frames / LIVE.fps
    model_s = max(np.diff([r.wall_s for r in view.history[-4:]]))  # per chunk, as this machine goes now
    bound = 2 * chunk_s + 2 * model_s + 1.0
    assert status.position_s - view.stream_time_s <= bound < 20.0


def test_what_cannot_be_opened_gets_one_clear_error_and_the_running_stream_goes_on(stream, worker, llava_lm, tmp_path):
    (tmp_path / "page.html").write_text("<html><body>no video here</body></html>")
    with rtsp_server() as server, http_folder(tmp_path) as base:
        stream.start_url(server.url, LOOPBACK)
        assert chunks_reach(stream, 2)
        for url, policy, error, reason in [
            (f"rtsp://ann:s3cret@127.0.0.1:{free_port()}/cam", LOOPBACK, StreamError, "connection refused"),
            (f"{base}/page.html", LOOPBACK, StreamError, "not a video stream"),
            (server.url, UrlPolicy(), UrlRefused, "--allow-urls"),
            (server.url, UrlPolicy.parse(""), UrlRefused, "private or local"),
            ("file:///etc/passwd", LOOPBACK, UrlRefused, "scheme 'file'"),
        ]:
            with pytest.raises(error, match=reason) as failed:
                stream.start_url(url, policy)
            assert "s3cret" not in str(failed.value)
            assert stream.status().state is StreamState.STREAMING  # the running stream goes on
        chunks = stream.view().chunks
        assert chunks_reach(stream, chunks + 1)
        other = LiveStream(worker, llava_lm, LIVE, key="other")  # and the server takes other streams
        try:
            with pytest.raises(StreamError, match="not a video stream"):
                other.start_url(f"{base}/page.html", LOOPBACK)
            other.start_url(server.url, LOOPBACK)
            assert chunks_reach(other, 1)
        finally:
            other.close()


def test_credentials_never_reach_the_page_or_the_metrics(stream):
    with rtsp_server(credentials="ann:s3cret") as server:
        shown = stream.start_url(server.url, LOOPBACK)
        assert chunks_reach(stream, 1)
        status, metrics = stream.status(), json.dumps(stream.metrics())
    assert shown == server.url.replace("ann:s3cret", "***") and status.source == shown
    assert "s3cret" not in metrics and "ann" not in metrics


def test_compare_and_standing_questions_on_a_network_stream(worker, llava_lm):
    settings = dataclasses.replace(LIVE, compare=True, compare_policies=("hermes", "fifo"))
    stream = LiveStream(worker, llava_lm, settings, key="compare")
    try:
        with rtsp_server() as server:
            stream.start_url(server.url, LOOPBACK)
            assert stream.watch("Is a ball moving?") == ["Is a ball moving?"]
            assert chunks_reach(stream, 4)
            stream.stop()
        view = stream.view()
        assert {p.name for p in view.snapshots} == {"hermes", "fifo"}  # two memories side by side, on one stream
        checked = {(p.policy, p.check.question) for p in view.watch_history}
        assert checked == {(HERMES, "Is a ball moving?"), (PolicySpec("fifo"), "Is a ball moving?")}
    finally:
        stream.close()
