"""One viewer's live stream, headless (no Gradio): sources, questions, faults, resets, webcam frames."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest
import torch

from hermes.engine.methods import PolicySpec
from hermes.engine.session import MAX_QUESTION_CHARS, QuestionError, StreamingSession
from hermes.memory.config import HermesConfig
from hermes.runtime.settings import StreamSettings
from hermes.serving.admission import cache_bytes_for, full_slot_limit, prefix_len
from hermes.serving.jobs import Priority
from hermes.serving.live import LiveStream
from hermes.video.decoding import VideoError
from tests.helpers import SMALL, hold_answers, streamed, wait_for

HERMES = PolicySpec("hermes")
FIFO = PolicySpec("fifo")
FULL = PolicySpec("full")


@pytest.fixture
def stream(worker, llava_lm):
    s = LiveStream(worker, llava_lm, SMALL, key="s")
    yield s
    s.close()


def test_stream_a_file_then_ask_with_streamed_answer(stream, clips):
    streamed(stream, clips["short"])  # 8 s at 0.5 fps: 2 chunks of 2 frames
    view = stream.view()
    assert view.frames_seen == 4 and view.chunks == 2
    assert len(view.frame_tokens) == 4 and view.frame_image is not None and max(view.frame_image.shape) <= 360
    snap = view.snapshots[HERMES]
    assert all((layer.stream_ids >= 0).sum() <= SMALL.budget + 1 for layer in snap.layers)
    assert len(view.history) == 2 and view.history[-1].frames_seen == 4

    events = list(stream.ask("What colour is the square?", max_new_tokens=6).events())
    assert len(events) >= 2, "the answer streams token by token"
    assert all(e.error is None for e in events)
    last = events[-1]
    assert last.done and last.update.ttft_ms > 0 and last.wait_ms >= 0
    assert last.update.frames_seen == 4 and 0 < last.update.frames_in_memory <= 4
    texts = [e.update.text for e in events]
    assert texts == sorted(texts, key=len)  # each update extends the text
    answers = stream.view().answers
    assert len(answers) == 1 and answers[0].update.ttft_ms == last.update.ttft_ms
    metrics = stream.metrics()
    json.dumps(metrics)  # plain data, for the API
    assert metrics["frames_seen"] == 4 and metrics["answers"][0]["wait_ms"] == last.wait_ms


def test_questions_of_several_streams_are_answered_in_one_batch(worker, llava_lm, clips):
    streams = [LiveStream(worker, llava_lm, SMALL, key=k) for k in ("s1", "s2", "s3")]
    try:
        for s in streams:
            streamed(s, clips["short"])
        gate = threading.Event()
        worker.submit(lambda: gate.wait(5), Priority.CHUNK, "x")  # the model thread is busy...
        tickets = [s.ask(f"What is in stream {i}?", max_new_tokens=10) for i, s in enumerate(streams)]
        gate.set()  # ...so all three questions are waiting when it is free
        answers = [list(t.events()) for t in tickets]
        assert worker.wait_idle(timeout=30) and worker.largest_batch == 3 and worker.errors == 0
        for i, (s, events) in enumerate(zip(streams, answers, strict=True)):
            assert all(e.error is None for e in events) and len(events) >= 2
            alone = s._memories.sessions[HERMES].ask(f"What is in stream {i}?", max_new_tokens=10)
            assert (events[-1].update.text, events[-1].update.tokens) == (alone.text, alone.tokens)
            assert s.view().answers[-1].update.text == alone.text
    finally:
        for s in streams:
            s.close()


def test_a_question_joins_an_answer_being_decoded(worker, llava_lm, clips):
    a, b = (LiveStream(worker, llava_lm, SMALL, key=k) for k in ("a", "b"))
    try:
        streamed(a, clips["short"])
        streamed(b, clips["short"])
        with hold_answers(a._memories.sessions[HERMES]) as (first, gate):
            ticket_a = a.ask("What colour is the square?", max_new_tokens=12)
            assert first.wait(10)
            ticket_b = b.ask("And the background?", max_new_tokens=4)
            assert wait_for(lambda: worker.backlog("b", Priority.QUESTION) == 1)
            gate.set()
            events_a, events_b = list(ticket_a.events()), list(ticket_b.events())
        assert worker.largest_batch == 2  # b joined a's batch; it did not wait for a's 12 tokens
        assert events_a[-1].update.tokens == 12 and events_b[-1].update.tokens == 4
        assert events_a[-1].update.text == a._memories.sessions[HERMES].ask("What colour is the square?", 12).text
        assert events_b[-1].update.text == b._memories.sessions[HERMES].ask("And the background?", 4).text
    finally:
        a.close()
        b.close()


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


def test_the_metrics_never_show_a_finished_stream_behind_its_frames(worker, stream, clips, monkeypatch):
    gate = threading.Event()
    worker.submit(lambda: gate.wait(30), Priority.CHUNK, "other")  # the model thread is busy...
    stream.start_file(clips["short"], speed="max")  # ...so both chunks wait in the queue
    assert wait_for(lambda: stream.status().state == "finishing")
    real_status = stream.status

    def status_once_the_chunks_landed():
        # The worst moment for a reader: the chunks land between its reads of the view and the status.
        gate.set()
        assert worker.wait_idle(stream.key, 60)
        return real_status()

    monkeypatch.setattr(stream, "status", status_once_the_chunks_landed)
    metrics = stream.metrics()
    assert (metrics["state"], metrics["queued_chunks"], metrics["frames_seen"]) == ("finished", 0, 4)


def test_compare_mode_runs_two_memories_on_one_stream(stream, llava_lm, clips):
    settings = StreamSettings(budget=400, chunk_frames=2, fps=0.5, compare=True)
    streamed(stream, clips["short"], settings=settings)
    view = stream.view()
    assert {p.name for p in view.snapshots} == {"hermes", "fifo"}
    assert view.frames_in_memory[FIFO] <= view.frames_in_memory[HERMES]
    # The budget line of each policy: the bytes its cache holds at |M| (hermes: one slot more, the summary).
    one = {p: cache_bytes_for(llava_lm, dataclasses.replace(settings, policy=p, compare=False)) for p in view.snapshots}
    assert view.budget_bytes == one and one[HERMES] > one[FIFO]
    assert view.snapshots[FIFO].cache_bytes == one[FIFO]  # 4 frames, 786 tokens: past the budget
    # The guidance attention of hermes' last compression, one record per layer; fifo runs no guidance.
    assert list(view.attention) == [HERMES] and len(view.attention[HERMES]) == llava_lm.num_layers
    done = [e for e in stream.ask("What happened?", max_new_tokens=3).events() if e.done]
    assert [e.policy.name for e in done] == ["hermes", "fifo"]
    assert {a.policy.name for a in stream.view().answers} == {"hermes", "fifo"}


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
    assert view.frames_seen == 0 and list(view.snapshots) == [FIFO] and view.snapshots[FIFO].budget == 500
    assert stream.chat.messages() == []


def fail_ingest_of(monkeypatch, victim: LiveStream, exc: BaseException) -> None:
    """Make every chunk of `victim` (only) raise `exc` inside the model job."""
    real = StreamingSession.ingest

    def ingest(session, chunk):
        if session in victim._memories.sessions.values():
            raise exc
        return real(session, chunk)

    monkeypatch.setattr(StreamingSession, "ingest", ingest)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (RuntimeError("injected fault: bad frame"), "injected fault: bad frame"),
        (MemoryError(), "Out of memory on this stream: lower the budget"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "Out of memory"),
    ],
    ids=["bug", "cpu-oom", "gpu-oom"],
)
def test_a_fault_in_one_stream_spares_the_others(worker, llava_lm, clips, monkeypatch, fault, message):
    broken = LiveStream(worker, llava_lm, SMALL, key="broken")
    healthy = LiveStream(worker, llava_lm, SMALL, key="healthy")
    try:
        with monkeypatch.context() as m:
            fail_ingest_of(m, broken, fault)
            broken.start_file(clips["short"], speed="max")
            streamed(healthy, clips["short"])
            assert wait_for(lambda: broken.status().state == "error", 30)
            assert worker.wait_idle("broken", 30)
            # The faulty stream says what happened, in its status, as a notice, and to its questions.
            assert message in broken.status().error
            assert any(message in n for n in broken.pop_notices())
            [event] = list(broken.ask("What happened?").events())
            assert message in event.error
            # The other stream got all its frames and its answers; the model thread lives on.
            assert healthy.view().frames_seen == 4 and healthy.status().error is None and not healthy.pop_notices()
            assert list(healthy.ask("And you?", max_new_tokens=2).events())[-1].done
            assert worker.alive and worker.errors == 1  # the failed stream's other chunks were skipped
        broken.reset()  # the faulty session starts over
        streamed(broken, clips["short"])
        assert broken.view().frames_seen == 4 and broken.status().error is None
    finally:
        broken.close()
        healthy.close()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (RuntimeError("injected fault"), "The model failed while answering (RuntimeError: injected fault)"),
        (torch.OutOfMemoryError("CUDA out of memory"), "Out of memory while answering: lower the budget"),
    ],
    ids=["bug", "oom"],
)
def test_a_failing_answer_reports_an_error_and_the_stream_goes_on(stream, llava_lm, clips, monkeypatch, fault, message):
    streamed(stream, clips["short"])
    real, calls = llava_lm.model.forward, []

    def fails_second(*args, **kwargs):  # the question's prefill runs, the first decoding step fails
        calls.append(1)
        if len(calls) == 2:
            raise fault
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(llava_lm.model, "forward", fails_second)
        events = list(stream.ask("What now?").events())
    assert events[0].update.text and events[0].error is None  # the first token reached the viewer
    event = events[-1]
    assert message in event.error and stream.worker.alive and stream.worker.errors == 1
    assert stream.status().error is None  # the memory was not touched: the stream goes on
    assert list(stream.ask("And now?", max_new_tokens=2).events())[-1].done


def test_reset_in_the_middle_of_an_answer_interrupts_it_cleanly(stream, clips):
    streamed(stream, clips["short"])
    with hold_answers(stream._memories.sessions[HERMES]) as (first, gate):
        ticket = stream.ask("What colour is the square?", max_new_tokens=50)
        events = ticket.events()
        assert next(events).update.text and first.wait(10)
        stream.reset()
        gate.set()
        rest = list(events)
    assert len(rest) == 1 and rest[0].interrupted and rest[0].done and rest[0].error is None
    assert stream.worker.wait_idle(stream.key, 10) and stream.worker.errors == 0
    assert stream.view().answers == () and stream.chat.messages() == []
    # A chat write of the old answer lands nowhere after the reset.
    assert stream.chat.add({"role": "assistant", "content": "late"}, ticket.generation) == -1
    streamed(stream, clips["short"])  # and the session starts again
    assert list(stream.ask("Again?", max_new_tokens=2).events())[-1].done


def test_stop_in_the_middle_of_an_answer_lets_it_finish(stream, clips):
    stream.start_file(clips["short"], speed="1x")
    assert wait_for(lambda: stream.view().frames_seen > 0, 30)
    with hold_answers(stream._memories.sessions[HERMES]) as (first, gate):
        ticket = stream.ask("What colour is the square?", max_new_tokens=8)
        assert first.wait(10)
        stream.stop()
        gate.set()
        events = list(ticket.events())
    assert events[-1].done and not events[-1].interrupted and all(e.error is None for e in events)
    assert stream.worker.wait_idle(stream.key, 10) and stream.status().state == "stopped"
    assert len(stream.view().answers) == 1
    streamed(stream, clips["short"])  # the session starts again
    assert stream.view().frames_seen == 4


def test_full_policy_stops_at_its_bound_with_a_note(stream, llava_lm, clips):
    # Positions for 1,000 video tokens after the prefix and the question margin: two 393-token chunks fit.
    config = HermesConfig()
    settings = StreamSettings(
        policy="full", chunk_frames=2, fps=1.0, max_positions=prefix_len(llava_lm) + config.position_margin + 1000
    )
    assert full_slot_limit(llava_lm, settings.config()) == 1000
    stream.start_file(clips["short"], speed="max", settings=settings)  # 8 frames: 4 chunks
    assert wait_for(lambda: stream.status().state == "stopped", 30) and stream.worker.wait_idle(stream.key, 30)
    status, view = stream.status(), stream.view()
    assert view.frames_seen == 4 and status.error is None
    assert "full cache reached its bound (1,000 video tokens per layer" in status.note
    assert any("bound" in n for n in stream.pop_notices())
    assert view.snapshots[FULL].cache_bytes <= cache_bytes_for(llava_lm, settings)
    assert list(stream.ask("Still there?", max_new_tokens=2).events())[-1].done  # questions still work


def test_bad_webcam_frames_are_refused_with_a_reason(stream):
    settings = StreamSettings(budget=400, chunk_frames=2, fps=20.0)
    with pytest.raises(ValueError, match=r"integer frames must be in \[0, 255\]"):
        stream.push_frame(np.full((120, 160, 3), 1000, dtype=np.int32), settings)
    with pytest.raises(ValueError, match="frame must have shape"):
        stream.push_frame(np.zeros((120, 160, 7), dtype=np.uint8))
    with pytest.raises(ValueError, match="numpy array"):
        stream.push_frame("not a frame")
    for _ in range(2):  # the stream carries on with good frames
        stream.push_frame(np.zeros((120, 160, 3), dtype=np.uint8))
        time.sleep(0.06)
    assert stream.worker.wait_idle(stream.key, 30) and stream.view().frames_seen == 2


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


def test_the_chat_version_changes_with_every_write_that_lands():
    """The page's timer resends the chat when its version moved (an answer's last update may
    otherwise lose the race against an older copy of the chat); a stale write moves nothing."""
    from hermes.serving.chat import Chat

    chat = Chat()
    seen = [chat.version]
    at = chat.add({"role": "assistant", "content": "an answer so far"}, 0)
    seen.append(chat.version)
    chat.set(at, {"role": "assistant", "content": "the answer, with its TTFT"}, 0)
    seen.append(chat.version)
    chat.clear(1)
    seen.append(chat.version)
    assert len(set(seen)) == 4
    assert chat.add({"role": "assistant", "content": "late"}, 0) == -1 and chat.version == seen[-1]
    chat.set(at, {"role": "assistant", "content": "late"}, 0)
    assert chat.version == seen[-1]
