"""Fair and safe under load: streams on leases, admission before work, fair turns, strict API input.

Leases: a stream whose viewer is not heard from for the lease is closed, whatever it is doing, and
its slot and memory go to others. Admission: a refused start decodes nothing, starts being prepared
are bounded, and frames too large are refused from the header. No assertion here is on wall-clock
time: waits are bounded by `wait_for`, orders and counts are asserted.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import httpx
import numpy as np
import psutil
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

import hermes.runtime.readers as sources_module
import hermes.serving.live as live_module
import hermes.serving.starts as starts_module
from hermes.engine.metrics import trim_host_memory
from hermes.serving import Busy, QuestionError, StreamState, VideoError
from hermes.serving.asking import MAX_QUESTIONS_IN_FLIGHT
from hermes.serving.jobs import Priority
from hermes.serving.registry import StreamRegistry
from hermes.serving.worker import STEPS_PER_TURN, ModelWorker
from hermes.video.clips import make_clip
from tests.helpers import SMALL, wait_for
from tests.test_app import serve
from tests.test_worker import Countdown
from ui.callbacks import Callbacks

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

MB = 2**20


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """'long': 10 minutes of 64 x 64 video (a stream that outlasts any test); 'huge': one 8000 x 8000 frame."""
    root = tmp_path_factory.mktemp("fair")
    long = make_clip(root / "long.mp4", 600.0, fps=1, size=(64, 64))
    huge = make_clip(root / "huge.mp4", 0.04, fps=25, size=(8000, 8000))
    return {"long": long, "huge": huge}


def rest_start(url: str, video: Path, pace: str = "1x") -> str:
    """Start a stream as a bare HTTP client does, through Gradio's REST route, with no session of
    its own and no heartbeat; the event's last message."""
    with httpx.Client(base_url=url, timeout=60) as http:
        with video.open("rb") as f:
            path = http.post("/gradio_api/upload", files={"files": (video.name, f, "video/mp4")}).json()[0]
        file = {"path": path, "meta": {"_type": "gradio.FileData"}}
        # A bare client sends every input: the settings as the API's schema gives their defaults.
        params = http.get("/gradio_api/info").json()["named_endpoints"]["/start_file"]["parameters"]
        data = [file, pace, *(p["parameter_default"] for p in params[2:])]
        event = http.post("/gradio_api/call/start_file", json={"data": data}).json()["event_id"]
        last = ""
        with http.stream("GET", f"/gradio_api/call/start_file/{event}") as events:
            for line in events.iter_lines():
                if line.startswith("event:"):
                    last = line
                elif line.startswith("data:") and last in ("event: complete", "event: error"):
                    return f"{last} {line}"
    return last


# -- leases ------------------------------------------------------------------------------------


def test_silent_rest_starts_lapse_and_a_fifth_viewer_gets_in(llava_lm, videos):
    url, demo, registry = serve(llava_lm, SMALL, max_streams=4, lease_s=4.0)
    fifth = Client(url, verbose=False)
    try:
        replies = [rest_start(url, videos["long"]) for _ in range(4)]
        assert all(r.startswith("event: complete") and "Streaming" in r for r in replies), replies

        def admitted() -> bool:
            try:
                fifth.predict(handle_file(str(videos["long"])), "1x", api_name="/start_file")
            except AppError as exc:
                assert "Busy" in str(exc)
                return False
            return True

        # The four go silent (nobody polls them), so their leases run out and the fifth gets a slot.
        assert wait_for(admitted, 60, step=0.5), "the silent streams still hold every slot"
        assert registry.lapsed >= 1

        def all_four_lapsed() -> bool:
            assert fifth.predict(api_name="/keepalive") == {"state": "streaming", "lease_s": 4.0}
            return registry.lapsed == 4

        assert wait_for(all_four_lapsed, 60, step=0.5)  # while the fifth, keeping alive, streams on
        assert len(registry) == 1 and fifth.predict(api_name="/metrics")["state"] == "streaming"
    finally:
        fifth.close()
        demo.close()
        registry.shutdown()


def test_paused_and_quiet_webcam_streams_lapse_while_a_polling_viewer_keeps_its_stream(llava_lm, videos, monkeypatch):
    monkeypatch.setattr(sources_module, "SILENCE_S", 0.2)  # the webcam falls quiet at once
    registry = StreamRegistry(llava_lm, settings=SMALL, lease_s=2.0)
    registry.lease_s = 1e6  # nobody lapses while the streams are set up, however slow the machine
    try:
        paused, camera, poller = (registry.get(k) for k in ("paused", "camera", "poller"))
        paused.start_file(videos["long"], speed="1x")
        registry.get("paused").pause()
        assert paused.status().state is StreamState.PAUSED
        registry.get("camera").push_frame(np.zeros((64, 64, 3), dtype=np.uint8))
        assert wait_for(lambda: camera.status().state is StreamState.WAITING, 30)  # the camera went quiet
        poller.start_file(videos["long"], speed="1x")
        assert registry.reserved_bytes() == 3 * paused.reserved_bytes > 0
        assert paused.status().state is StreamState.PAUSED and camera.status().state is StreamState.WAITING
        registry.lease_s = 2.0  # from now on, only the poller is heard from

        def lapsed_while_polling() -> bool:
            assert registry.get("poller") is poller  # polling renews its lease
            return registry.lapsed == 2

        assert wait_for(lapsed_while_polling, 30)
        assert paused.closed and camera.closed and paused.reserved_bytes == camera.reserved_bytes == 0
        assert poller.status().state is StreamState.STREAMING and not poller.closed
        assert registry.reserved_bytes() == poller.reserved_bytes and len(registry) == 1
        assert registry.worker.wait_idle("paused", 10) and not paused.feed.source.thread.is_alive()
        # The camera's page wakes up: its timer's next tick says why the stream is gone, once.
        callbacks = Callbacks(registry)
        callbacks.live = SimpleNamespace(status="status")
        page = SimpleNamespace(session_hash="camera")
        assert "stopped after 2 s without a sign" in callbacks.tick(page)["status"]
        assert callbacks.tick(page) == gr.skip()
        # The paused stream's viewer comes back: a fresh stream that says why the old one is gone.
        back = registry.get("paused")
        assert back is not paused and back.status().state is not StreamState.PAUSED
        notices = back.pop_notices()
        assert len(notices) == 1 and "stopped after 2 s without a sign" in notices[0]
        assert "stopped after 2 s" in back.status().note
    finally:
        registry.shutdown()


# -- admission before work -----------------------------------------------------------------------


def test_starts_while_every_slot_is_taken_are_refused_before_decoding(llava_lm, videos, monkeypatch):
    decoded = []
    check_start = starts_module.check_start
    monkeypatch.setattr(starts_module, "check_start", lambda *a, **k: decoded.append(a) or check_start(*a, **k))
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=1)
    try:
        registry.get("holder").start_file(videos["long"], speed="1x")
        assert len(decoded) == 1
        rss = psutil.Process().memory_info().rss

        def start(i: int) -> str:
            try:
                registry.get(f"viewer{i}").start_file(videos["huge"])
            except Busy as exc:
                return str(exc)
            return "started"

        with ThreadPoolExecutor(10) as pool:
            replies = list(pool.map(start, range(10)))
        grown = psutil.Process().memory_info().rss - rss
        assert all(r.startswith("Busy: this server runs at most 1 stream") for r in replies), replies
        assert len(decoded) == 1  # nothing of the huge file was decoded
        assert grown < 100 * MB, f"memory grew by {grown / MB:.0f} MB for ten refused starts"
        assert registry.reserved_bytes() == registry.get("holder").reserved_bytes
    finally:
        registry.shutdown()


def test_a_frame_too_large_is_refused_from_the_header_and_the_slot_is_given_back(llava_lm, videos):
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=1)
    try:
        stream = registry.get("a")
        with pytest.raises(VideoError, match=r"'huge\.mp4': its frames are 8000x8000 \(64\.0 megapixels\)"):
            stream.start_file(videos["huge"])
        assert stream.reserved_bytes == 0 and stream.status().state is not StreamState.STREAMING
        registry.get("b").start_file(videos["long"], speed="1x")  # the one slot is free
    finally:
        registry.shutdown()


def test_starts_being_prepared_at_once_are_bounded(llava_lm, videos, monkeypatch):
    inside, release = threading.Event(), threading.Event()
    check_start = starts_module.check_start

    def slow_check(*args, **kwargs):
        inside.set()
        assert release.wait(30)
        return check_start(*args, **kwargs)

    monkeypatch.setattr(starts_module, "check_start", slow_check)
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=4, max_preparing=1)
    try:
        first = threading.Thread(target=registry.get("a").start_file, args=(videos["long"], "1x"))
        first.start()
        assert inside.wait(30)
        with pytest.raises(Busy, match=r"Busy: 1 start\(s\) are being prepared"):
            registry.get("b").start_file(videos["long"])
        assert registry.get("b").reserved_bytes == 0
        release.set()
        first.join(30)
        assert registry.get("a").status().state is StreamState.STREAMING
        registry.get("b").start_file(videos["long"], speed="1x")  # its turn now
    finally:
        release.set()
        registry.shutdown()


# -- fair turns on the model thread ------------------------------------------------------------


def test_a_flood_of_answers_takes_turns_with_another_streams_chunks(worker):
    batch, order = Countdown(), []
    batch.on_step = lambda n: order.append("step")
    gate, busy = threading.Event(), threading.Event()
    worker.submit(lambda: busy.set() or gate.wait(5), Priority.CHUNK, "x")
    assert busy.wait(5)
    for _ in range(4):  # the flooding viewer's long answers, all decoded together
        worker.submit(lambda: 3 * STEPS_PER_TURN, Priority.QUESTION, "flood", batch=batch)
    for i in range(3):  # and the other viewer's chunks, queued meanwhile
        worker.submit(lambda i=i: order.append(f"chunk {i}"), Priority.CHUNK, "viewer")
    gate.set()
    assert worker.wait_idle(timeout=10)
    turn = ["step"] * STEPS_PER_TURN
    # The answers came first (they wait for the job in flight only), then a chunk after each turn of them.
    assert order == [*turn, "chunk 0", *turn, "chunk 1", *turn, "chunk 2"]


def test_a_question_of_a_quiet_viewer_waits_for_one_turn_of_each_participant(worker):
    batch, order = Countdown(), []
    batch.on_step = lambda n: order.append(f"step {'+'.join(batch.steps[-1])}")
    gate, busy = threading.Event(), threading.Event()
    worker.submit(lambda: busy.set() or gate.wait(5), Priority.CHUNK, "x")
    assert busy.wait(5)
    worker.submit(lambda: 100, Priority.QUESTION, "flood", batch=batch)

    def chunk_a() -> None:  # the quiet viewer asks while a's chunk runs: b and the answers are waiting
        order.append("a")
        worker.submit(lambda: 1, Priority.QUESTION, "quiet", batch=batch)

    worker.submit(chunk_a, Priority.CHUNK, "a")
    worker.submit(lambda: order.append("b"), Priority.CHUNK, "b")
    gate.set()
    assert worker.wait_idle(timeout=10)
    turn = ["step flood"] * STEPS_PER_TURN
    # The round: a turn of answers, a's chunk, b's chunk, then the answers with the quiet viewer's
    # question joined, however many tokens the flood still has to decode.
    assert order[: STEPS_PER_TURN + 3] == [*turn, "a", "b", "step flood+quiet"]


def test_one_viewer_flooding_questions_neither_fills_the_batch_nor_stops_another_streams_chunks(llava_lm, videos):
    registry = StreamRegistry(llava_lm, settings=SMALL)
    try:
        flood, viewer = registry.get("flood"), registry.get("viewer")
        flood.start_file(videos["long"], speed="max")
        assert wait_for(lambda: flood.view().chunks > 0, 60)
        flood.stop()  # it has seen some video, and asks about it
        viewer.start_file(videos["long"], speed="max")
        assert wait_for(lambda: viewer.view().chunks > 0, 60)
        log: list[str] = []
        ingest = viewer._memories.ingest
        viewer._memories.ingest = lambda gen, chunk, **kw: log.append("chunk") or ingest(gen, chunk, **kw)
        tickets = [flood.ask("What happens?", max_new_tokens=64) for _ in range(MAX_QUESTIONS_IN_FLIGHT)]
        with pytest.raises(QuestionError, match="Wait for your previous answer: at most 2 questions"):
            flood.ask("And now?")
        for ticket in tickets:
            original = ticket.put
            ticket.put = lambda event, put=original: log.append("token") or put(event)
        mine = viewer.ask("What is there?")
        assert all(event.error is None for event in mine.events())
        for ticket in tickets:
            events = list(ticket.events())
            assert events[-1].error is None, events[-1].error
            assert events[-1].update.done and len(events) > 2 * STEPS_PER_TURN
        first, last = log.index("token"), len(log) - log[::-1].index("token")
        # The viewer's chunks went in between the flood's tokens, not after them.
        assert log[first:last].count("chunk") >= 2, log
    finally:
        registry.shutdown()


def test_a_question_is_limited_in_the_models_tokens(llava_lm):
    registry = StreamRegistry(llava_lm, settings=SMALL)
    try:
        stream = registry.get("a")
        question = "🦜" * 1000  # within the character limit, but four tokens each
        tokens = int(llava_lm.encode(question).shape[-1])
        assert tokens == 4000
        with pytest.raises(QuestionError, match=rf"is {tokens:,} tokens long for this model; the limit is 512 tokens"):
            stream.ask(question)
        assert registry.worker.backlog("a") <= 1  # nothing but the memories' build was queued
    finally:
        registry.shutdown()


# -- inputs as the API documents them ------------------------------------------------------------


@pytest.fixture(scope="module")
def app(llava_lm):
    url, demo, registry = serve(llava_lm, SMALL, max_streams=1)
    yield url, registry
    demo.close()
    registry.shutdown()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("compare", "false", r"Invalid settings: compare takes true or false; got 'false'"),
        ("compare_policies", "hermes", r"Invalid settings: compare_policies takes a list of names.*; got 'hermes'"),
        ("budget", "abc", r"Invalid settings: budget takes a number from 128 to 10240; got 'abc'"),
        ("budget", 500.5, r"Invalid settings: budget takes a whole number; got 500.5"),
        ("fps", "1", r"Invalid settings: fps takes a number from 0.25 to 4; got '1'"),
        ("guidance_history", "no", r"Invalid settings: guidance_history takes true or false; got 'no'"),
    ],
)
def test_api_settings_are_parsed_strictly_with_the_field_named(app, videos, capfd, field, value, message):
    client = Client(app[0], verbose=False)
    try:
        capfd.readouterr()
        with pytest.raises(AppError, match=message):
            client.predict(handle_file(str(videos["long"])), "1x", api_name="/start_file", **{field: value})
        assert "Traceback" not in capfd.readouterr().err  # a refusal is one line of the log, not a traceback
        assert client.predict(api_name="/metrics")["state"] != "streaming"
    finally:
        client.close()


def test_a_files_length_is_in_the_status_line_and_metrics_and_busy_is_one_line(app, videos, capfd, caplog):
    first, second = Client(app[0], verbose=False), Client(app[0], verbose=False)
    try:
        status = first.predict(handle_file(str(videos["long"])), "1x", api_name="/start_file")[0]
        assert "long.mp4 · 1x · 10:00 long" in status
        assert first.predict(api_name="/metrics")["duration_s"] == pytest.approx(600.0, abs=1.0)
        capfd.readouterr()
        caplog.set_level(logging.INFO, logger="ui.callbacks")
        with pytest.raises(AppError, match="Busy: this server runs at most 1 stream"):
            second.predict(handle_file(str(videos["long"])), "1x", api_name="/start_file")
        assert "Traceback" not in capfd.readouterr().err
        assert any(r.getMessage().startswith("refused: Busy: this server") for r in caplog.records)
    finally:
        first.close()
        second.close()


# -- memory returned -----------------------------------------------------------------------------


def test_a_closed_stream_hands_its_freed_pages_back(llava_lm, videos, monkeypatch):
    freed = []

    def free() -> None:  # other tests' model threads may still be closing streams: count this one's
        if threading.current_thread().name == "pages-test":
            freed.append(len(registry))

    monkeypatch.setattr(live_module, "free_cached_memory", free)
    registry = StreamRegistry(llava_lm, ModelWorker("pages-test"), settings=SMALL)
    try:
        registry.get("a").start_file(videos["long"], speed="max")
        assert registry.close("a") and registry.worker.wait_idle("a", 30)
        # On the model thread, after the memories were dropped (the stream already gone from the registry).
        assert freed == [0]
        assert trim_host_memory()  # glibc's malloc_trim on this machine
    finally:
        registry.shutdown()
