"""The background thread that owns the model: one job queue, one job (or one batch) at a time.

One `ModelWorker` thread makes every model call of the app: chunk prefills and compressions,
building memories, and questions. Whose turn it is comes from `hermes.serving.turns`: control jobs
first, then every stream's chunks and the answer batch round-robin, so that no viewer starves
another. Jobs submitted to a `Batch` (questions: `hermes.serving.answers`) run together: the
batch's turn takes every queued job of that batch along and steps all of them, taking in the jobs
of that batch that arrive meanwhile at its next step, for STEPS_PER_TURN steps while others wait
(unless a control job is waiting: then it finishes what it holds, takes nothing more in, and
lets that run). A job that raises (out of memory included) is reported to its owner and the
thread carries on with the others. The streams it serves live in `hermes.serving.live`, the
registry of all viewers' streams with admission control in `hermes.serving.registry`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from hermes.engine.metrics import free_cached_memory
from hermes.serving.jobs import Batch, Job, JobCancelled, Priority
from hermes.serving.turns import Turns

log = logging.getLogger(__name__)

# Steps (answer tokens, for every question in the batch) an answer batch takes per turn while other
# participants wait: about the time of one chunk's prefill on the small models.
STEPS_PER_TURN = 8


class ModelWorker:
    """One daemon thread that runs jobs from a priority queue, one at a time.

    A job that raises is logged and reported to its `on_error`; the thread carries on with the
    next job, so one stream's failure never stops the others. Jobs of a `Batch` run together.
    """

    def __init__(self, name: str = "hermes-model") -> None:
        self.name = name
        self.errors = 0
        self.largest_batch = 0  # the most jobs a batch has held at once
        self._turns = Turns(Priority.CONTROL)
        self._cond = threading.Condition()
        self._running: list[Job] = []
        self._batches: dict[object, Batch] = {}
        self._stopped = False
        self._thread: threading.Thread | None = None

    def batch(self, key: object, make: Callable[[], Batch]) -> Batch:
        """The batch shared by every job submitted with `key` (e.g. one per model), made on first use."""
        with self._cond:
            if key not in self._batches:
                self._batches[key] = make()
            return self._batches[key]

    def submit(
        self,
        fn: Callable[[], object],
        priority: Priority = Priority.CHUNK,
        owner: str = "",
        on_error: Callable[[BaseException], None] | None = None,
        batch: Batch | None = None,
    ) -> Job:
        """Queue `fn`; it runs on the model thread in its owner's turn (a control job: first), after
        the owner's jobs of a lower priority value.

        With `batch`, the job joins that batch when its turn comes, together with the batch's other
        queued jobs, and is done when the batch says so."""
        job = Job(fn, Priority(priority), owner, on_error, batch)
        with self._cond:
            if self._stopped:
                raise RuntimeError("the model worker has been stopped")
            self._turns.push(job)
            if self._thread is None or not self._thread.is_alive():
                # First job, or (defensively) a thread that died: start a fresh one.
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job

    def cancel(self, owner: str) -> int:
        """Drop the queued (not yet running) jobs of `owner`; returns how many."""
        with self._cond:
            dropped = self._turns.remove(lambda job: job.owner == owner)
            if dropped:
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
        jobs = [*self._turns.jobs(), *self._running]
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
                    return not self._turns and not self._running
                return self._backlog(owner, None) == 0

            return self._cond.wait_for(idle, timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Drop queued jobs, let the running one finish, and end the thread."""
        with self._cond:
            self._stopped = True
            dropped = self._turns.remove(lambda job: True)
            self._cond.notify_all()
        for job in dropped:
            self._report(job, JobCancelled())
            job.done.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._turns or self._stopped)
                turn = self._turns.next()
                if turn is None:
                    return
                if isinstance(turn, Job):
                    self._start(turn)
            if not isinstance(turn, Job):
                self._batch_turn(turn)
                continue
            oom = False
            try:
                turn.fn()
            except Exception as exc:  # MemoryError and torch's OutOfMemoryError included
                oom = self._failed([turn], exc)
            finally:
                self._finish(turn)
            if oom:
                # Outside the except block the traceback (and the tensors its frames hold) is gone,
                # so this really frees what the failed job allocated before the next job runs.
                free_cached_memory()

    def _batch_turn(self, batch: Batch) -> None:
        """Step `batch`, taking in its jobs as they arrive, until it holds nothing or, after
        STEPS_PER_TURN steps, another participant waits; then hand the turn on."""
        with self._cond:
            joining = self._take(batch)
        steps = 0
        while joining or len(batch):
            oom = self._join(batch, joining)
            self.largest_batch = max(self.largest_batch, len(batch))
            if len(batch):
                steps += 1
                try:
                    finished = batch.step()
                except Exception as exc:
                    finished = batch.abort()
                    oom = self._failed(finished, exc) or oom
                for job in finished:
                    self._finish(job)
            if oom:
                free_cached_memory()
            with self._cond:
                # A waiting control job (a reset, a closed tab) stops the batch from taking more in.
                control = self._turns.control_waiting()
                if not control and steps >= STEPS_PER_TURN and self._turns.others_waiting():
                    break  # the questions that came meanwhile join at the batch's next turn
                joining = [] if control else self._take(batch)
        with self._cond:
            self._turns.release(batch, answering=len(batch) > 0)
            self._cond.notify_all()

    def _join(self, batch: Batch, joining: list[Job]) -> bool:
        """Let `joining` into `batch` (a job with nothing to do is done at once); whether one ran out of memory."""
        oom = False
        for job in joining:
            try:
                running = batch.join(job)
            except Exception as exc:
                oom = self._failed([job], exc) or oom
                running = False
            if not running:
                self._finish(job)
        return oom

    def _take(self, batch: Batch) -> list[Job]:
        """Take the queued jobs of `batch`, in queue order, as started (lock held)."""
        taken = self._turns.take(batch)
        for job in taken:
            self._start(job)
        return taken

    def _start(self, job: Job) -> None:
        """The job is running from now (lock held)."""
        job.started_at = time.monotonic()
        self._running.append(job)

    def _finish(self, job: Job) -> None:
        with self._cond:
            self._running.remove(job)
            self._cond.notify_all()
        job.done.set()

    def _failed(self, jobs: list[Job], exc: Exception) -> bool:
        """Count, log and report a failure that ended `jobs`; whether it was out of memory."""
        self.errors += 1
        owners = ", ".join(sorted({repr(job.owner) for job in jobs}))
        oom = is_out_of_memory(exc)
        if oom:
            log.error("job of %s ran out of memory: %s", owners, exc)
        else:
            log.exception("job of %s failed", owners)
        for job in jobs:
            self._report(job, exc)
        return oom

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
