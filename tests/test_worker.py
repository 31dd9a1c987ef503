"""The model thread and the per-viewer live streams, headless (no Gradio)."""

from __future__ import annotations

import dataclasses
import gc
import json
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hermes.engine.session import MAX_QUESTION_CHARS, QuestionError, StreamingSession
from hermes.memory.config import HermesConfig
from hermes.serving.admission import Busy, cache_bytes_for, default_memory_cap, full_slot_limit, prefix_len
from hermes.serving.answers import batch_memory_cap
from hermes.serving.live import LiveStream
from hermes.serving.registry import StreamRegistry
from hermes.serving.settings import StreamSettings
from hermes.serving.worker import JobCancelled, ModelWorker, Priority, is_out_of_memory
from hermes.video.chunking import Chunker
from hermes.video.decoding import VideoError
from tests.helpers import hold_answers

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


class Countdown:
    """A Batch for testing the scheduler alone: a job joins with `fn()` steps to go (0: done at
    once); each step records the owners it held, then runs `on_step(step number)`."""

    def __init__(self) -> None:
        self.jobs: dict = {}
        self.steps: list[list[str]] = []
        self.on_step = lambda n: None

    def __len__(self) -> int:
        return len(self.jobs)

    def join(self, job) -> bool:
        steps = job.fn()
        if steps:
            self.jobs[job] = steps
        return bool(steps)

    def step(self) -> list:
        self.steps.append(sorted(job.owner for job in self.jobs))
        self.on_step(len(self.steps))
        for job in self.jobs:
            self.jobs[job] -= 1
        done = [job for job, left in self.jobs.items() if not left]
        for job in done:
            del self.jobs[job]
        return done

    def abort(self) -> list:
        jobs = list(self.jobs)
        self.jobs.clear()
        return jobs


def test_batched_jobs_run_together_and_late_ones_join_at_the_next_step(worker):
    batch, order = Countdown(), []
    gate, busy = threading.Event(), threading.Event()
    worker.submit(lambda: busy.set() or gate.wait(5), Priority.CHUNK, "x")
    # The model thread must be inside x before the questions come: else a, asked first, would
    # jump ahead of x (questions before chunks) and run alone before b is even asked.
    assert busy.wait(5)
    a = worker.submit(lambda: 3, Priority.QUESTION, "a", batch=batch)
    worker.submit(lambda: order.append("chunk"), Priority.CHUNK, "c")
    b = worker.submit(lambda: 1, Priority.QUESTION, "b", batch=batch)
    worker.submit(lambda: 0, Priority.QUESTION, "nothing to do", batch=batch)
    batch.on_step = lambda n: n == 1 and worker.submit(lambda: 1, Priority.QUESTION, "d", batch=batch)
    assert worker.backlog("a") == 1
    gate.set()
    assert worker.wait_idle(timeout=5)
    # a and b were queued together; d, asked during the first step, joined at the second.
    assert batch.steps == [["a", "b"], ["a", "d"], ["a"]]
    assert worker.largest_batch == 2 and order == ["chunk"] and a.done.is_set() and b.done.is_set()


def test_a_waiting_control_job_stops_the_batch_taking_more_in(worker):
    batch, order = Countdown(), []

    def on_step(n: int) -> None:
        if n == 1:
            worker.submit(lambda: order.append("reset"), Priority.CONTROL, "b")
            worker.submit(lambda: order.append("question") or 1, Priority.QUESTION, "b", batch=batch)

    batch.on_step = on_step
    worker.submit(lambda: 2, Priority.QUESTION, "a", batch=batch)
    assert worker.wait_idle(timeout=5)
    # The batch finished what it held, the reset ran, then the question that came with it.
    assert batch.steps == [["a"], ["a"], ["b"]] and order == ["reset", "question"]


def test_a_failing_batch_step_fails_every_job_in_it_and_the_worker_goes_on(worker):
    batch, errors = Countdown(), []

    def on_step(n: int) -> None:
        if n == 2:
            raise MemoryError()

    batch.on_step = on_step
    # Both questions must be waiting before the model thread is free, or a could reach its failing
    # step before b is asked, and b would then run alone, unharmed.
    gate, busy = threading.Event(), threading.Event()
    worker.submit(lambda: busy.set() or gate.wait(5), Priority.CHUNK, "x")
    assert busy.wait(5)
    for owner in ("a", "b"):
        worker.submit(lambda: 5, Priority.QUESTION, owner, on_error=errors.append, batch=batch)
    gate.set()
    assert worker.wait_idle(timeout=5)
    assert batch.steps[:2] == [["a", "b"], ["a", "b"]]
    assert len(errors) == 2 and all(isinstance(e, MemoryError) for e in errors)
    assert worker.errors == 1 and worker.alive and len(batch) == 0
    batch.on_step = lambda n: None
    worker.submit(lambda: 1, Priority.QUESTION, "c", batch=batch)
    assert worker.wait_idle(timeout=5) and batch.steps[-1] == ["c"]


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
            alone = s._memories.sessions["hermes"].ask(f"What is in stream {i}?", max_new_tokens=10)
            assert (events[-1].text, events[-1].tokens) == (alone.text, alone.tokens)
            assert s.view().answers[-1].text == alone.text
    finally:
        for s in streams:
            s.close()


def test_a_question_joins_an_answer_being_decoded(worker, llava_lm, clips):
    a, b = (LiveStream(worker, llava_lm, SMALL, key=k) for k in ("a", "b"))
    try:
        streamed(a, clips["short"])
        streamed(b, clips["short"])
        with hold_answers(a._memories.sessions["hermes"]) as (first, gate):
            ticket_a = a.ask("What colour is the square?", max_new_tokens=12)
            assert first.wait(10)
            ticket_b = b.ask("And the background?", max_new_tokens=4)
            assert wait_for(lambda: worker.backlog("b", Priority.QUESTION) == 1)
            gate.set()
            events_a, events_b = list(ticket_a.events()), list(ticket_b.events())
        assert worker.largest_batch == 2  # b joined a's batch; it did not wait for a's 12 tokens
        assert events_a[-1].tokens == 12 and events_b[-1].tokens == 4
        assert events_a[-1].text == a._memories.sessions["hermes"].ask("What colour is the square?", 12).text
        assert events_b[-1].text == b._memories.sessions["hermes"].ask("And the background?", 4).text
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


def test_compare_mode_runs_two_memories_on_one_stream(stream, llava_lm, clips):
    settings = StreamSettings(budget=400, chunk_frames=2, fps=0.5, compare=True)
    streamed(stream, clips["short"], settings=settings)
    view = stream.view()
    assert set(view.snapshots) == {"hermes", "fifo"}
    assert view.frames_in_memory["fifo"] <= view.frames_in_memory["hermes"]
    # The budget line of each policy: the bytes its cache holds at |M| (hermes: one slot more, the summary).
    one = {p: cache_bytes_for(llava_lm, dataclasses.replace(settings, policy=p, compare=False)) for p in view.snapshots}
    assert view.budget_bytes == one and one["hermes"] > one["fifo"]
    assert view.snapshots["fifo"].cache_bytes == one["fifo"]  # 4 frames, 786 tokens: past the budget
    # The guidance attention of hermes' last compression, one record per layer; fifo runs no guidance.
    assert list(view.attention) == ["hermes"] and len(view.attention["hermes"]) == llava_lm.num_layers
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


def test_out_of_memory_is_recognised():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"))
    assert not is_out_of_memory(RuntimeError("shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # only allocation errors


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
    assert events[0].text and events[0].error is None  # the first token reached the viewer
    event = events[-1]
    assert message in event.error and stream.worker.alive and stream.worker.errors == 1
    assert stream.status().error is None  # the memory was not touched: the stream goes on
    assert list(stream.ask("And now?", max_new_tokens=2).events())[-1].done


def test_reset_in_the_middle_of_an_answer_interrupts_it_cleanly(stream, clips):
    streamed(stream, clips["short"])
    with hold_answers(stream._memories.sessions["hermes"]) as (first, gate):
        ticket = stream.ask("What colour is the square?", max_new_tokens=50)
        events = ticket.events()
        assert next(events).text and first.wait(10)
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
    with hold_answers(stream._memories.sessions["hermes"]) as (first, gate):
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
    assert view.snapshots["full"].cache_bytes <= cache_bytes_for(llava_lm, settings)
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


# -- StreamRegistry --------------------------------------------------------------------------


def test_registry_isolates_sessions_admits_and_frees(llava_lm, clips):
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=1)
    try:
        a, b = registry.get("a"), registry.get("b")
        assert a is not b and registry.get("a") is a and len(registry) == 2
        a.start_file(clips["short"], speed="1x")  # still running for a while
        with pytest.raises(Busy, match="Try again"):
            b.start_file(clips["short"])
        a.chat.add({"role": "user", "content": "mine"})
        assert b.chat.messages() == [] and b.view().frames_seen == 0
        assert registry.close("a") and a.closed and len(registry) == 1
        assert registry.worker.wait_idle("a", 10)
        streamed(b, clips["short"])  # a's slot is free again
        assert registry.get("b", create=False) is b and registry.get("zzz", create=False) is None
    finally:
        registry.shutdown()
    assert not registry.worker.alive


# -- admission control ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [StreamSettings(policy="hermes"), StreamSettings(policy="fifo"), StreamSettings(reindex="eager", compare=True)],
    ids=["hermes", "fifo", "compare-eager"],
)
def test_cache_bytes_for_is_exactly_what_a_stream_holds_past_its_budget(lm, settings):
    # Budgets of one to two chunks' tokens (LLaVA-OV: 393 a chunk of 2 frames; Qwen2.5-VL: 70).
    budget = 500 if lm.arch == "llava_onevision" else 100
    settings = dataclasses.replace(settings, budget=budget, chunk_frames=2)
    sessions = [StreamingSession(lm, settings.config(), policy=p) for p in settings.policies]
    chunker = Chunker(2)
    rng = np.random.default_rng(0)
    sizes = []
    for i in range(8):  # 4 chunks: every memory is past its budget from the second on
        chunk = chunker.push(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8), t=float(i))
        if chunk is not None:
            reports = [s.ingest(chunk) for s in sessions]
            sizes.append(sum(r.cache_bytes for r in reports))
    assert sizes[-1] == sizes[-2] == sizes[-3] == cache_bytes_for(lm, settings)
    assert sizes[0] < sizes[-1]  # before the budget is reached the caches are smaller


def test_full_policy_reserves_its_bound(llava_lm):
    settings = StreamSettings(policy="full")
    limit = full_slot_limit(llava_lm, settings.config())
    assert limit == llava_lm.max_positions - HermesConfig().position_margin - prefix_len(llava_lm)
    per_token = cache_bytes_for(llava_lm, StreamSettings(policy="fifo", budget=2)) - cache_bytes_for(
        llava_lm, StreamSettings(policy="fifo", budget=1)
    )
    assert cache_bytes_for(llava_lm, settings) == (prefix_len(llava_lm) + limit) * per_token


def test_default_memory_cap(monkeypatch):
    mb = 2**20
    monkeypatch.delenv("HERMES_MEMORY_CAP_MB", raising=False)
    assert default_memory_cap(torch.device("cpu"), 12.5) == int(12.5 * mb)
    assert 0 < default_memory_cap(torch.device("cpu")) <= 4096 * mb
    monkeypatch.setenv("HERMES_MEMORY_CAP_MB", "300")
    assert default_memory_cap(torch.device("cpu")) == 300 * mb
    with pytest.raises(ValueError, match="positive"):
        default_memory_cap(torch.device("cpu"), 0)
    # On a GPU: the free memory less a margin of 10% of the card, and at least 2 GiB.
    monkeypatch.delenv("HERMES_MEMORY_CAP_MB")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60_000 * mb, 80_000 * mb))
    assert default_memory_cap(torch.device("cuda")) == 52_000 * mb
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10_000 * mb, 16_000 * mb))
    assert default_memory_cap(torch.device("cuda")) == 7_952 * mb


def test_the_answer_batch_copies_memories_within_half_the_gpu_margin(monkeypatch):
    mb = 2**20
    assert batch_memory_cap(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80_000 * mb))
    assert batch_memory_cap(torch.device("cuda")) == 4_000 * mb  # 10% of the card, halved
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=16_000 * mb))
    assert batch_memory_cap(torch.device("cuda")) == 1_024 * mb  # at least 2 GiB of margin, halved


def test_admission_reserves_cache_memory_and_refuses_when_it_is_short(llava_lm, clips):
    need = cache_bytes_for(llava_lm, SMALL)
    registry = StreamRegistry(llava_lm, settings=SMALL, memory_cap_bytes=int(2.5 * need))
    try:
        a, b, c = (registry.get(k) for k in "abc")
        streamed(a, clips["short"])  # finished, but it still holds its memory (it can be asked)
        b.start_file(clips["short"], speed="1x")
        assert a.reserved_bytes == b.reserved_bytes == need and registry.reserved_bytes() == 2 * need
        with pytest.raises(Busy, match=r"Busy: the other streams hold .* MB .* Try again in a minute") as info:
            c.start_file(clips["short"])
        assert f"needs {need / 2**20:,.1f} MB" in str(info.value) and c.reserved_bytes == 0
        with pytest.raises(Busy, match="more than this server gives one stream"):
            c.start_file(clips["short"], settings=StreamSettings(policy="full"))
        with pytest.raises(Busy, match="Busy"):  # a webcam is admitted the same way
            c.push_frame(np.zeros((120, 160, 3), dtype=np.uint8))
        a.reset()  # gives its memory back
        assert a.reserved_bytes == 0 and registry.reserved_bytes() == need
        c.start_file(clips["short"], speed="1x")
        registry.close("b")  # a closed tab gives its memory back too
        assert registry.reserved_bytes() == need
        a.start_file(clips["short"], speed="max")  # restarting takes only what is free
    finally:
        registry.shutdown()


def test_closing_a_tab_mid_stream_frees_its_memory_and_reader(llava_lm, clips):
    registry = StreamRegistry(llava_lm, settings=SMALL)
    try:
        stream = registry.get("tab")
        stream.start_file(clips["short"], speed="1x")  # 8 s of video: still streaming below
        assert wait_for(lambda: stream.view().frames_seen > 0, 30)
        reader, memory = stream._feed.thread, weakref.ref(stream._memories.sessions["hermes"].memory)
        assert reader.is_alive() and registry.reserved_bytes() > 0 and stream.status().state == "streaming"
        assert registry.close("tab")
        assert not reader.is_alive() and stream.status().state == "closed"
        assert registry.worker.wait_idle("tab", 10)
        gc.collect()
        assert memory() is None, "the closed stream's cache tensors are still referenced"
        assert len(registry) == 0 and registry.reserved_bytes() == 0 and registry.worker.alive
        with pytest.raises(RuntimeError, match="closed"):
            stream.ask("Anyone?")
    finally:
        registry.shutdown()
