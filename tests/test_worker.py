"""The model thread: jobs by priority, failures that spare the others, batches that step together."""

from __future__ import annotations

import threading
import time

import torch

from hermes.serving.jobs import JobCancelled, Priority
from hermes.serving.worker import is_out_of_memory


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


def test_out_of_memory_is_recognised():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"))
    assert not is_out_of_memory(RuntimeError("shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # only allocation errors
