"""The background thread that owns the model: one job queue, one job at a time.

One `ModelWorker` thread makes every model call of the app: chunk prefills and compressions,
building memories, and questions. Questions go ahead of queued chunks, so that a question waits
for at most the chunk in flight. A job that raises (out of memory included) is reported to its
owner and the thread carries on with the others. The streams it serves live in `hermes.serving.live`,
the registry of all viewers' streams with admission control in `hermes.serving.registry`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

import torch

from hermes.engine.metrics import free_cached_memory

log = logging.getLogger(__name__)


class Priority(IntEnum):
    """Job order in the worker queue: lower runs first; FIFO within a priority."""

    CONTROL = 0  # build or drop a stream's memories: before that stream's other jobs
    QUESTION = 1  # ahead of queued chunks
    CHUNK = 2


class JobCancelled(Exception):
    """Given to a job's `on_error` when the job was dropped from the queue before it ran."""


@dataclass(eq=False)
class Job:
    """A callable queued for the model thread, on behalf of `owner` (a stream's key)."""

    fn: Callable[[], object]
    priority: Priority
    owner: str
    on_error: Callable[[BaseException], None] | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def wait_ms(self) -> float | None:
        """Time from submission to the start of the run: the wait for the job in flight."""
        return None if self.started_at is None else (self.started_at - self.enqueued_at) * 1000.0


class ModelWorker:
    """One daemon thread that runs jobs from a priority queue, one at a time.

    A job that raises is logged and reported to its `on_error`; the thread carries on with the
    next job, so one stream's failure never stops the others.
    """

    def __init__(self, name: str = "hermes-model") -> None:
        self.name = name
        self.errors = 0
        self._heap: list[tuple[int, int, Job]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._current: Job | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        fn: Callable[[], object],
        priority: Priority = Priority.CHUNK,
        owner: str = "",
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Job:
        """Queue `fn`; it runs on the model thread after every job of a lower priority value."""
        job = Job(fn, Priority(priority), owner, on_error)
        with self._cond:
            if self._stopped:
                raise RuntimeError("the model worker has been stopped")
            heapq.heappush(self._heap, (job.priority, next(self._seq), job))
            if self._thread is None or not self._thread.is_alive():
                # First job, or (defensively) a thread that died: start a fresh one.
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job

    def cancel(self, owner: str) -> int:
        """Drop the queued (not yet running) jobs of `owner`; returns how many."""
        with self._cond:
            dropped = [job for _, _, job in self._heap if job.owner == owner]
            if dropped:
                self._heap = [entry for entry in self._heap if entry[2].owner != owner]
                heapq.heapify(self._heap)
                self._cond.notify_all()
        for job in dropped:
            self._report(job, JobCancelled())
            job.done.set()
        return len(dropped)

    def backlog(self, owner: str, priority: Priority | None = None) -> int:
        """Jobs of `owner` (of one priority, if given) queued or running."""
        with self._cond:
            return self._backlog(owner, priority)

    def _backlog(self, owner: str, priority: Priority | None) -> int:
        jobs = [job for _, _, job in self._heap]
        if self._current is not None:
            jobs.append(self._current)
        return sum(1 for j in jobs if j.owner == owner and (priority is None or j.priority == priority))

    def wait_backlog(self, owner: str, priority: Priority | None, below: int, timeout: float) -> bool:
        """Wait until `backlog(owner, priority) < below`; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._backlog(owner, priority) < below, timeout)

    def wait_idle(self, owner: str | None = None, timeout: float = 60.0) -> bool:
        """Wait until nothing of `owner` (of anyone, if None) is queued or running."""
        with self._cond:

            def idle() -> bool:
                if owner is None:
                    return not self._heap and self._current is None
                return self._backlog(owner, None) == 0

            return self._cond.wait_for(idle, timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Drop queued jobs, let the running one finish, and end the thread."""
        with self._cond:
            self._stopped = True
            dropped = [job for _, _, job in self._heap]
            self._heap = []
            self._cond.notify_all()
        for job in dropped:
            self._report(job, JobCancelled())
            job.done.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._heap or self._stopped)
                if not self._heap:
                    return
                job = heapq.heappop(self._heap)[2]
                self._current = job
                job.started_at = time.monotonic()
            oom = False
            try:
                job.fn()
            except Exception as exc:  # MemoryError and torch's OutOfMemoryError included
                self.errors += 1
                oom = is_out_of_memory(exc)
                if oom:
                    log.error("job of %r ran out of memory: %s", job.owner, exc)
                else:
                    log.exception("job of %r failed", job.owner)
                self._report(job, exc)
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()
                job.done.set()
            if oom:
                # Outside the except block the traceback (and the tensors its frames hold) is gone,
                # so this really frees what the failed job allocated before the next job runs.
                free_cached_memory()

    @staticmethod
    def _report(job: Job, exc: BaseException) -> None:
        if job.on_error is None:
            return
        try:
            job.on_error(exc)
        except Exception:
            log.exception("on_error of a job of %r failed", job.owner)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` means an allocation failed (CPU or GPU), as opposed to a bug."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    # The CPU allocator raises a plain RuntimeError ("DefaultCPUAllocator: not enough memory").
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "not enough memory" in text)
