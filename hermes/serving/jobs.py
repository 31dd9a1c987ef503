"""What the model thread runs: a job, its priority within a stream's turn, and the batches that
run jobs together (`hermes.serving.worker` runs them, `hermes.serving.turns` orders them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol


class Priority(IntEnum):
    """Job order within a stream's turn (control jobs go before anyone's turn): lower runs first;
    FIFO within a priority."""

    CONTROL = 0  # build or drop a stream's memories: before that stream's other jobs
    QUESTION = 1  # ahead of queued chunks
    CHUNK = 2


class JobCancelled(Exception):
    """Given to a job's `on_error` when the job was dropped from the queue before it ran."""


class Batch(Protocol):
    """Jobs that the model thread runs together, one step at a time for all of them.

    `join` takes a job in (it calls the job's `fn` to learn what to do) and says whether the job
    is still running; `step` advances every job held and returns those that finished; `abort`
    drops them all after a step failed, returning them; `len` is the number of jobs held.
    """

    def join(self, job: Job) -> bool: ...

    def step(self) -> list[Job]: ...

    def abort(self) -> list[Job]: ...

    def __len__(self) -> int: ...


@dataclass(eq=False)
class Job:
    """A callable queued for the model thread, on behalf of `owner` (a stream's key); with a
    `batch`, the callable is what the batch calls when the job joins it."""

    fn: Callable[[], object]
    priority: Priority
    owner: str
    on_error: Callable[[BaseException], None] | None = None
    batch: Batch | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def wait_ms(self) -> float | None:
        """Time from submission to the start of the run: the wait for the job in flight."""
        return None if self.started_at is None else (self.started_at - self.enqueued_at) * 1000.0
