"""The launched app under bad input, faults, resets, closed tabs and admission control.

Every check goes through `gradio_client` against the running app, as a viewer or script would;
faults are injected into one session's engine calls on the server side.
"""

from __future__ import annotations

import gc
import os
import re
import time
import weakref
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from hermes.engine.methods import PolicySpec
from hermes.engine.session import StreamingSession
from hermes.serving import DEFAULT_MAX_PREPARING, LiveStream, StreamSettings
from hermes.serving.admission import cache_bytes_for
from hermes.video.clips import make_clip
from tests.corpus import DAMAGED, DAMAGED_AFTER_S, DAMAGED_AT_S, DAMAGED_TO_THE_END, REFUSED, STREAMED, Clip
from tests.helpers import hold_answers, streamed, wait_for
from tests.test_app import serve, text_of
from ui.callbacks import Callbacks, LiveOutputs, status_text
from ui.layout import ASK_CONCURRENCY, DEFAULT_CONCURRENCY, QUEUE_MAX_SIZE

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# Chunks of 4 frames at 1 fps: a 2-second clip is shorter than one chunk.
SETTINGS = StreamSettings(budget=400, chunk_frames=4, fps=1.0)
UPLOAD_LIMIT = "5mb"


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("videos")
    good = make_clip(root / "good.mp4", 5.0, fps=4, size=(160, 120))
    data = bytearray(good.read_bytes())
    mdat = data.find(b"mdat")  # make_clip writes the index first: damage the frame data after it
    flipped = bytearray(data)
    for k in range(mdat + 8, len(flipped), 7):
        flipped[k] ^= 0xFF
    files = {
        "good": good,
        "one_frame": make_clip(root / "one_frame.mp4", 0.1, fps=10, size=(160, 120)),
        "shorter_than_a_chunk": make_clip(root / "shorter_than_a_chunk.mp4", 2.0, fps=10, size=(160, 120)),
        "huge_4k": make_clip(root / "huge_4k.mp4", 2.0, fps=5, size=(3840, 2160)),
        "zero_frames": make_clip(root / "zero_frames.mp4", 0.0),
        "long": make_clip(root / "long.mp4", 12.0, fps=4, size=(160, 120)),
    }
    for name, content in {
        "empty.mp4": b"",
        "notes.mp4": b"this is not a video\n" * 50,
        "notes.txt": b"this is not a video\n",
        "truncated.mp4": bytes(data[: len(data) // 2]),
        "damaged.mp4": bytes(flipped),
        "too_big.mp4": bytes(6 * 2**20),
    }.items():
        (root / name).write_bytes(content)
        files[name] = root / name
    return files


@pytest.fixture(scope="module")
def app(llava_lm):
    url, demo, registry = serve(llava_lm, SETTINGS, max_file_size=UPLOAD_LIMIT)
    yield url, demo, registry
    demo.close()
    registry.shutdown()


@pytest.fixture
def client(app):
    c = Client(app[0], verbose=False)
    yield c
    c.close()


def stream_of(registry, client: Client) -> LiveStream:
    """The server-side stream of a gradio_client session."""
    stream = registry.get(client.session_hash, create=False)
    assert stream is not None, "the session has no stream yet"
    return stream


def start(client: Client, video: Path, pace: str = "max") -> str:
    return client.predict(handle_file(str(video)), pace, api_name="/start_file")[0]


def finished(client: Client, frames: int, timeout: float = 60.0) -> dict:
    """Wait until the session's stream is done with `frames` frames; returns its metrics."""

    def done():
        m = client.predict(api_name="/metrics")
        return m if m["state"] in ("finished", "stopped") and not m["queued_chunks"] else None

    metrics = wait_for(done, timeout)
    assert metrics, "the stream did not finish"
    assert metrics["frames_seen"] == frames and metrics["error"] is None
    return metrics


def ask(client: Client, question: str = "What is there?") -> list[dict]:
    return client.predict(question, api_name="/ask")[0]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("damaged.mp4", r"Cannot read video 'damaged\.mp4': the first frame cannot be decoded"),
        ("notes.mp4", r"'notes\.mp4'.*not a video file"),
        ("notes.txt", r"Invalid file type.*video"),
        ("empty.mp4", r"'empty\.mp4'.*empty \(0 bytes\)"),
        ("zero_frames", r"'zero_frames\.mp4': no video stream$"),
    ],
)
def test_bad_files_get_a_clear_message_and_the_session_carries_on(app, client, videos, name, message):
    with pytest.raises(AppError, match=message):
        start(client, videos[name])
    start(client, videos["one_frame"])  # the same session streams on
    finished(client, 1)


def test_uploads_over_the_size_limit_are_refused(client, videos):
    with pytest.raises(ValueError, match="exceeds the maximum file size"):
        start(client, videos["too_big.mp4"])


@pytest.mark.parametrize(
    ("name", "frames"),
    [("one_frame", 1), ("shorter_than_a_chunk", 2), ("huge_4k", 2), ("truncated.mp4", 3)],
)
def test_awkward_videos_stream_and_answer(app, client, videos, name, frames):
    assert videos[name].name in start(client, videos[name])
    metrics = finished(client, frames)
    assert metrics["chunks"] == 1
    chat = ask(client)
    assert "TTFT" in text_of(chat[-1]) and f"of {frames} frames in memory" in text_of(chat[-1])


def test_other_sessions_keep_streaming_while_one_misbehaves(app, videos):
    url, _, registry = app
    good, bad = Client(url, verbose=False), Client(url, verbose=False)
    try:
        start(good, videos["good"], pace="2x")  # 5 frames over 2.5 s, while the other session errs
        bad_inputs = ("empty.mp4", "notes.mp4", "damaged.mp4", "zero_frames")
        for name in bad_inputs:
            with pytest.raises(AppError):
                start(bad, videos[name])
        assert "No video yet" in text_of(ask(bad)[-1])
        assert "limit is 1,000 characters" in text_of(ask(bad, "x" * 20_000)[-1])
        finished(good, 5)
        assert "TTFT" in text_of(ask(good)[-1]) and registry.worker.alive
    finally:
        good.close()
        bad.close()


@pytest.fixture(scope="module")
def corpus_client(app):
    c = Client(app[0], verbose=False)
    yield c
    c.close()


@pytest.fixture
def viewer(corpus_client):
    """One session for the corpus (each Start begins the stream afresh), reset after each test so that
    it holds no cache memory while the admission tests run."""
    yield corpus_client
    corpus_client.predict(api_name="/reset")


@pytest.mark.parametrize("clip", STREAMED, ids=lambda clip: clip.name)
def test_every_kind_of_video_streams_through_the_api(viewer, corpus, clip: Clip):
    assert clip.name in start(viewer, corpus[clip.name])  # the upload box takes it, Start says Streaming
    finished(viewer, clip.frames)


@pytest.mark.parametrize("clip", REFUSED, ids=lambda clip: clip.name)
def test_files_without_a_readable_video_are_refused_at_start(client, corpus, clip: Clip):
    with pytest.raises(AppError, match=f"^{re.escape(f'Cannot read video {clip.name!r}: {clip.refused}')}$"):
        start(client, corpus[clip.name])
    assert client.predict(api_name="/metrics")["reserved_bytes"] == 0  # a fresh session: nothing was reserved


def test_a_file_that_decodes_no_further_streams_to_its_last_good_frame_and_is_asked_about(viewer, corpus):
    start(viewer, corpus[DAMAGED_TO_THE_END.name])
    metrics = wait_for(lambda: (m := viewer.predict(api_name="/metrics"))["state"] == "error" and m)
    good = DAMAGED_AFTER_S + 1  # frames at 0, 1, ... 4 s, the partial last chunk included
    metrics = wait_for(lambda: (m := viewer.predict(api_name="/metrics"))["frames_seen"] == good and m)
    assert metrics, "the frames before the damage did not all reach the model"
    assert metrics["error"] == (
        f"'{DAMAGED_TO_THE_END.name}' is damaged after 0:0{DAMAGED_AFTER_S}: the stream stopped at the last good "
        "frame, and what was read stays in memory."
    )
    assert f"of {good} frames in memory" in text_of(ask(viewer)[-1])


def test_a_damaged_frame_is_skipped_and_the_status_says_so(app, viewer, corpus):
    start(viewer, corpus[DAMAGED.name])
    metrics = finished(viewer, 7)  # 8 s at 1 fps, less the frame at 5 s
    assert metrics["skipped_frames"] == 1
    status = status_text(stream_of(app[2], viewer))
    assert f"⚠️ 1 frame could not be decoded at 0:0{DAMAGED_AT_S}" in status and "7 frames read" in status


@pytest.mark.parametrize("question", ["", "   \n "])
def test_an_empty_question_is_an_error_the_client_sees(viewer, question):
    with pytest.raises(AppError, match=r"^The question is empty: type something to ask about the video\.$"):
        viewer.predict(question, api_name="/ask")


# -- sessions and admission control ---------------------------------------------------------


def test_busy_when_cache_memory_is_short_until_a_stream_resets(app, videos, monkeypatch):
    url, _, registry = app
    need = cache_bytes_for(registry.lm, SETTINGS)
    assert wait_for(lambda: registry.reserved_bytes() == 0, 15)  # earlier tests' sessions are gone
    monkeypatch.setattr(registry, "memory_cap_bytes", int(1.5 * need))
    first, second = Client(url, verbose=False), Client(url, verbose=False)
    try:
        start(first, videos["long"], pace="1x")
        with pytest.raises(AppError, match=r"Busy: the other streams hold .* MB .* Try again in a minute"):
            start(second, videos["good"])
        assert first.predict(api_name="/metrics")["reserved_bytes"] == need
        first.predict(api_name="/reset")  # gives its memory back
        assert first.predict(api_name="/metrics")["reserved_bytes"] == 0
        start(second, videos["good"])
        finished(second, 5)
    finally:
        first.close()
        second.close()


def test_gradio_concurrency_and_queue_limits_are_explicit(app):
    _, demo, _ = app
    limits = {fn.api_name or fn.name: (fn.concurrency_limit, fn.concurrency_id) for fn in demo.fns.values()}
    assert limits["ask"] == (ASK_CONCURRENCY, "ask")
    asks = [fn for fn in demo.fns.values() if fn.name == "ask"]
    assert len(asks) == 2 and {fn.concurrency_id for fn in asks} == {"ask"}  # button and Enter share it
    # Starts decode a file's first frames: as many at once as the registry prepares, the rest queue.
    assert limits["start_file"] == limits["start_sample"] == (DEFAULT_MAX_PREPARING, "start")
    quick = ["pause", "stop", "reset", "metrics", "tick", "webcam_frame", "set_speed"]
    assert all(limits[name][0] is None for name in quick), limits
    assert demo._queue.max_size == QUEUE_MAX_SIZE
    assert demo._queue.default_concurrency_limit == DEFAULT_CONCURRENCY


# -- faults -----------------------------------------------------------------------------------


def test_a_fault_in_one_session_shows_there_and_spares_the_others(app, videos, monkeypatch):
    url, _, registry = app
    faulty, healthy = Client(url, verbose=False), Client(url, verbose=False)
    try:
        faulty.predict(api_name="/metrics")  # creates the session's stream
        victim = stream_of(registry, faulty)
        real = StreamingSession.ingest

        def ingest(session, chunk):
            if session in victim._memories.sessions.values():
                raise MemoryError("injected")
            return real(session, chunk)

        monkeypatch.setattr(StreamingSession, "ingest", ingest)
        start(faulty, videos["good"])
        start(healthy, videos["good"])
        metrics = wait_for(lambda: (m := faulty.predict(api_name="/metrics"))["state"] == "error" and m)
        assert "Out of memory on this stream: lower the budget" in metrics["error"]
        assert "Out of memory on this stream" in text_of(ask(faulty)[-1])  # in the chat too
        finished(healthy, 5)
        assert "TTFT" in text_of(ask(healthy)[-1]) and registry.worker.alive
        monkeypatch.undo()
        faulty.predict(api_name="/reset")  # the faulty session starts over
        start(faulty, videos["good"])
        finished(faulty, 5)
    finally:
        faulty.close()
        healthy.close()


def test_out_of_memory_while_answering_is_a_chat_message(app, client, videos, monkeypatch):
    start(client, videos["one_frame"])
    finished(client, 1)
    session = stream_of(app[2], client)._memories.sessions[PolicySpec("hermes")]

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    with monkeypatch.context() as m:
        m.setattr(session.memory, "kv", oom)  # copying the memory into the answer batch fails
        assert "Out of memory while answering: lower the budget" in text_of(ask(client)[-1])
    assert "TTFT" in text_of(ask(client)[-1])  # the next question is answered


# -- stop, reset and close in the middle of things ------------------------------------------


def test_reset_in_the_middle_of_an_answer(app, client, videos):
    start(client, videos["one_frame"])
    finished(client, 1)
    with hold_answers(stream_of(app[2], client)._memories.sessions[PolicySpec("hermes")]) as (first, gate):
        job = client.submit("What is there?", api_name="/ask")
        assert first.wait(30)
        chat = client.predict(api_name="/reset")[1]
        gate.set()
        final_chat = job.result(timeout=30)[0]
    assert chat == [] and final_chat == [] and job.status().success  # ended cleanly, nothing left over
    # Cut at the next token: the question, its first token and the interruption; not 64 tokens.
    assert len(job.outputs()) <= 4, len(job.outputs())
    assert client.predict(api_name="/metrics")["answers"] == []
    start(client, videos["one_frame"])  # the session starts again
    finished(client, 1)
    assert [m["role"] for m in ask(client)] == ["user", "assistant"]


def test_stop_in_the_middle_of_an_answer(app, client, videos):
    start(client, videos["long"], pace="1x")
    wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] > 0)
    with hold_answers(stream_of(app[2], client)._memories.sessions[PolicySpec("hermes")]) as (first, gate):
        job = client.submit("What is there?", api_name="/ask")
        assert first.wait(30)
        status = client.predict(api_name="/stop")
        gate.set()
        final_chat = job.result(timeout=30)[0]
    # The frames read so far are still on their way to the model ("Finishing"), then "Stopped".
    assert status.startswith(("**Finishing**", "**Stopped**")), status
    assert "TTFT" in text_of(final_chat[-1])  # the answer finished
    metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["state"] == "stopped" and m)
    assert metrics and len(metrics["answers"]) == 1 and metrics["error"] is None
    start(client, videos["one_frame"])  # and the session starts again
    finished(client, 1)


def test_a_tab_closed_mid_stream_frees_its_stream(app, videos):
    url, _, registry = app
    client = Client(url, verbose=False)
    start(client, videos["long"], pace="1x")  # 12 s: still streaming when the tab goes
    assert wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] > 0)
    stream = stream_of(registry, client)
    reader, memory = stream.feed.source.thread, weakref.ref(stream._memories.sessions[PolicySpec("hermes")].memory)
    assert reader.is_alive() and stream.reserved_bytes > 0
    client.close()  # its heartbeat stops, as when a tab closes: the unload handler runs

    def freed() -> bool:
        gc.collect()
        return memory() is None

    assert wait_for(lambda: registry.get(client.session_hash, create=False) is None, 15)
    assert wait_for(lambda: stream.closed and stream.reserved_bytes == 0, 10)
    assert wait_for(lambda: not reader.is_alive(), 10), "the reader thread is still running"
    assert wait_for(freed, 10), "the closed stream's cache is still in memory"


def test_the_timer_leaves_the_chat_to_an_answer_streaming_into_it(app, videos, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # where the frame panel's image is written
    registry = app[2]
    callbacks = Callbacks(registry)
    callbacks.live = LiveOutputs(**{f.name: f.name for f in fields(LiveOutputs)})
    request = SimpleNamespace(session_hash="asker")
    stream = streamed(registry.get("asker"), videos["good"])
    try:
        assert "frame" in callbacks.tick(request)  # the timer draws what the stream did
        answer = callbacks.ask("What is there?", request)
        chat, _ = next(answer)
        assert chat[-1]["content"] == "What is there?"
        # While the answer streams, the timer does not send the chat: an older copy of its own that
        # reached the page after the answer's last update would take the finished answer back.
        assert "chat" not in callbacks.tick(request)
        *_, (chat, _) = answer
        assert "TTFT" in text_of(chat[-1])
        # The answer's last update was the chat as it is: the timer has nothing to send again...
        assert "chat" not in callbacks.tick(request)
        # ...until the chat changes.
        stream.chat.add({"role": "assistant", "content": "a later line"})
        assert callbacks.tick(request)["chat"][-1]["content"] == "a later line"
    finally:
        registry.close("asker")


# -- webcam ---------------------------------------------------------------------------------


def test_webcam_frames_of_any_size_and_bad_frames(app):
    registry = app[2]
    callbacks = Callbacks(registry)
    request = SimpleNamespace(session_hash="webcam-viewer")
    # The Settings controls' values, as the page hands them over (a slider's floats included).
    settings = {"policy": "hermes", "budget": 400.0, "chunk_frames": 2.0, "fps": 4.0, "reindex": "lazy"}
    settings |= {"compare": False, "compare_policies": ["hermes", "fifo"], "watch_threshold": 0.5}
    rng = np.random.default_rng(0)
    for h, w in [(480, 640), (720, 1280), (240, 320), (1080, 720)]:
        callbacks.webcam_frame(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), request, **settings)
        time.sleep(0.3)  # slower than 4 fps: no frame is thinned away
    with pytest.raises(gr.Error, match="frame must have shape"):
        callbacks.webcam_frame(np.zeros((8, 8, 5), dtype=np.uint8), request, **settings)
    stream = registry.get("webcam-viewer", create=False)
    assert registry.worker.wait_idle("webcam-viewer", 30)
    assert stream.view().frames_seen == 4 and stream.status().source == "webcam" and stream.status().error is None
    registry.close("webcam-viewer")
