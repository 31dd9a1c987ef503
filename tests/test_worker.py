"""The model thread and the per-viewer live streams, headless (no Gradio)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hermes.engine import MAX_QUESTION_CHARS, QuestionError
from hermes.video import VideoError
from hermes.worker import (
    Busy,
    JobCancelled,
    LiveStream,
    ModelWorker,
    Priority,
    StreamRegistry,
    StreamSettings,
)

SMALL = StreamSettings(budget=400, chunk_frames=2, fps=0.5)


def wait_for(predicate, timeout: float = 30.0, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.fixture
def worker():
    w = ModelWorker()
    yield w
    w.stop()


@pytest.fixture
def stream(worker, llava_lm):
    s = LiveStream(worker, llava_lm, SMALL, key="s")
    yield s
    s.close()


def streamed(stream: LiveStream, clip: Path, **kw) -> LiveStream:
    """Stream a whole clip as fast as the model goes and wait for the last chunk."""
    stream.start_file(clip, speed="max", **kw)
    assert wait_for(lambda: stream.status().state == "finished" and not stream.status().queued_chunks, 60)
    assert stream.worker.wait_idle(stream.key, 60)
    return stream


# -- ModelWorker ----------------------------------------------------------------------------


def test_questions_go_ahead_of_queued_chunks(worker):
    started, gate, order = threading.Event(), threading.Event(), []
    worker.submit(lambda: (started.set(), gate.wait(5), order.append("in flight")), Priority.CHUNK, "a")
    assert started.wait(5)
    for name in ("chunk 1", "chunk 2"):
        worker.submit(lambda n=name: order.append(n), Priority.CHUNK, "a")
    question = worker.submit(lambda: order.append("question"), Priority.QUESTION, "a")
    time.sleep(0.05)
    gate.set()
    assert worker.wait_idle(timeout=5)
    # The question waited for the chunk in flight only, not for the queued ones.
    assert order == ["in flight", "question", "chunk 1", "chunk 2"]
    assert question.wait_ms is not None and question.wait_ms >= 40


def test_a_failing_job_is_reported_and_the_worker_carries_on(worker):
    errors, done = [], threading.Event()

    def boom():
        raise RuntimeError("bad chunk")

    worker.submit(boom, owner="a", on_error=errors.append)
    worker.submit(done.set, owner="b")
    assert done.wait(5)
    assert [str(e) for e in errors] == ["bad chunk"]
    assert worker.errors == 1 and worker.alive


def test_cancel_drops_only_that_owners_queued_jobs(worker):
    gate, ran, errors = threading.Event(), [], []
    worker.submit(lambda: gate.wait(5), owner="x")
    worker.submit(lambda: ran.append("a"), owner="a", on_error=errors.append)
    worker.submit(lambda: ran.append("b"), owner="b")
    assert worker.cancel("a") == 1
    gate.set()
    assert worker.wait_idle(timeout=5)
    assert ran == ["b"]
    assert len(errors) == 1 and isinstance(errors[0], JobCancelled)


# -- LiveStream ------------------------------------------------------------------------------


def test_stream_a_file_then_ask_with_streamed_answer(stream, clips):
    streamed(stream, clips["short"])  # 8 s at 0.5 fps: 2 chunks of 2 frames
    view = stream.view()
    assert view.frames_seen == 4 and view.chunks == 2
    assert len(view.frame_tokens) == 4 and view.frame_image is not None and max(view.frame_image.shape) <= 360
    snap = view.snapshots["hermes"]
    assert all((layer.stream_ids >= 0).sum() <= SMALL.budget + 1 for layer in snap.layers)
    assert len(view.history) == 2 and view.history[-1].frames_seen == 4

    events = list(stream.ask("What colour is the square?", max_new_tokens=6).events())
    assert len(events) >= 2, "the answer streams token by token"
    assert all(e.error is None for e in events)
    last = events[-1]
    assert last.done and last.ttft_ms > 0 and last.wait_ms >= 0
    assert last.frames_seen == 4 and 0 < last.frames_in_memory <= 4
    texts = [e.text for e in events]
    assert texts == sorted(texts, key=len)  # each update extends the text
    answers = stream.view().answers
    assert len(answers) == 1 and answers[0].ttft_ms == last.ttft_ms
    metrics = stream.metrics()
    json.dumps(metrics)  # plain data, for the API
    assert metrics["frames_seen"] == 4 and metrics["answers"][0]["wait_ms"] == last.wait_ms


def test_bad_questions_get_clear_messages(stream, clips):
    with pytest.raises(QuestionError, match="empty"):
        stream.ask("   ")
    with pytest.raises(QuestionError, match=f"{MAX_QUESTION_CHARS:,}"):
        stream.ask("why? " * 4000)
    [event] = list(stream.ask("Anything there?").events())
    assert event.error and "No video yet" in event.error


def test_bad_files_are_refused_and_the_stream_stays_usable(stream, clips, tmp_path):
    for name, content, reason in [("empty.mp4", b"", "empty"), ("notes.mp4", b"hello", "not a video")]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(VideoError, match=name) as info:
            stream.start_file(bad)
        assert reason in str(info.value)
    streamed(stream, clips["short"])
    assert stream.view().frames_seen == 4


def test_pause_resume_and_stop_flush_what_was_read(stream, clips):
    stream.start_file(clips["short"], speed="4x")  # one frame every 0.5 s
    assert wait_for(lambda: stream.status().frames_read >= 1, 10)
    stream.pause()
    read = stream.status().frames_read
    time.sleep(0.8)
    assert stream.status().state == "paused" and stream.status().frames_read == read
    stream.resume()
    assert wait_for(lambda: stream.status().frames_read > read, 5)
    stream.stop()
    assert stream.worker.wait_idle(stream.key, 30)
    status = stream.status()
    assert status.state == "stopped" and status.frames_read < 4
    assert stream.view().frames_seen == status.frames_read  # the partial chunk was flushed


def test_compare_mode_runs_two_memories_on_one_stream(stream, clips):
    streamed(stream, clips["short"], settings=StreamSettings(budget=400, chunk_frames=2, fps=0.5, compare=True))
    view = stream.view()
    assert set(view.snapshots) == {"hermes", "fifo"}
    assert view.frames_in_memory["fifo"] <= view.frames_in_memory["hermes"]
    done = [e for e in stream.ask("What happened?", max_new_tokens=3).events() if e.done]
    assert [e.policy for e in done] == ["hermes", "fifo"]
    assert {a.policy for a in stream.view().answers} == {"hermes", "fifo"}


def test_reset_applies_settings_and_fails_pending_questions(worker, stream, clips):
    streamed(stream, clips["short"])
    gate = threading.Event()
    worker.submit(lambda: gate.wait(5), Priority.CONTROL, "other")
    ticket = stream.ask("Still there?")
    stream.reset(StreamSettings(policy="fifo", budget=500, chunk_frames=2, fps=0.5))
    gate.set()
    [event] = list(ticket.events())
    assert "reset" in event.error
    assert worker.wait_idle(timeout=10)
    view = stream.view()
    assert view.frames_seen == 0 and list(view.snapshots) == ["fifo"] and view.snapshots["fifo"].budget == 500
    assert stream.chat_messages() == []


def test_a_failing_stream_does_not_hurt_the_others(worker, llava_lm, clips, monkeypatch):
    broken = LiveStream(worker, llava_lm, SMALL, key="broken")
    healthy = LiveStream(worker, llava_lm, SMALL, key="healthy")
    try:

        def boom(gen, chunk):
            raise RuntimeError("out of memory")

        monkeypatch.setattr(broken, "_ingest", boom)
        broken.start_file(clips["short"], speed="max")
        assert wait_for(lambda: broken.status().state == "error", 30)
        assert "out of memory" in broken.status().error
        assert any("out of memory" in n for n in broken.pop_notices())
        streamed(healthy, clips["short"])
        assert healthy.view().frames_seen == 4 and healthy.status().error is None and not healthy.pop_notices()
        assert worker.alive
    finally:
        broken.close()
        healthy.close()


def test_a_failing_answer_reports_an_error_and_the_stream_goes_on(stream, clips, monkeypatch):
    streamed(stream, clips["short"])

    def boom(question, max_new_tokens):
        raise RuntimeError("CUDA out of memory")
        yield

    with monkeypatch.context() as m:
        m.setattr(stream._sessions["hermes"], "ask_stream", boom)
        [event] = list(stream.ask("What now?").events())
    assert "CUDA out of memory" in event.error and stream.worker.alive
    assert list(stream.ask("And now?", max_new_tokens=2).events())[-1].done


def test_webcam_frames_of_any_size_make_chunks(stream, clips):
    streamed(stream, clips["short"])  # a finished file stream gives way to the webcam
    settings = StreamSettings(budget=400, chunk_frames=2, fps=20.0)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(120, 160), (240, 320), (120, 160), (90, 160)]):
        stream.push_frame(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), settings if i == 0 else None)
        time.sleep(0.06)  # slower than 20 fps: no frame thinned away
    assert stream.status().source == "webcam"
    assert stream.worker.wait_idle(stream.key, 30)
    assert stream.view().frames_seen == 4 and stream.status().frames_read == 4


# -- StreamRegistry --------------------------------------------------------------------------


def test_registry_isolates_sessions_admits_and_frees(llava_lm, clips):
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=1)
    try:
        a, b = registry.get("a"), registry.get("b")
        assert a is not b and registry.get("a") is a and len(registry) == 2
        a.start_file(clips["short"], speed="1x")  # still running for a while
        with pytest.raises(Busy, match="Try again"):
            b.start_file(clips["short"])
        a.add_message({"role": "user", "content": "mine"})
        assert b.chat_messages() == [] and b.view().frames_seen == 0
        assert registry.close("a") and a.closed and len(registry) == 1
        assert registry.worker.wait_idle("a", 10)
        streamed(b, clips["short"])  # a's slot is free again
        assert registry.get("b", create=False) is b and registry.get("zzz", create=False) is None
    finally:
        registry.shutdown()
    assert not registry.worker.alive
