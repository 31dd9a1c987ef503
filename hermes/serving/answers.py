"""Answers on their way from the model thread to a viewer: the batch, events and tickets.

Every viewer's question is a job of one `AnswerBatch` on the model thread: questions asked at
about the same moment are decoded together, one forward pass per token for all of them
(`hermes.engine.batch`). Each update goes to the question's `AnswerTicket` as soon as it is
decoded; whoever asked (a Gradio handler, a test) reads them from `events()`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from hermes.engine.batch import BatchDecoder, BatchRow
from hermes.engine.methods import PolicySpec
from hermes.engine.session import MAX_NEW_TOKENS, AnswerUpdate, QuestionError, StreamingSession
from hermes.models.base import VideoLM
from hermes.serving.admission import gpu_margin
from hermes.serving.jobs import Job, JobCancelled
from hermes.serving.worker import is_out_of_memory

ANSWER_TIMEOUT_S = 300.0


class TooManyQuestions(QuestionError):
    """A viewer asked while as many of its questions as it may have are in flight: refused before
    anything of it is queued (the page checks this before the question waits for an answer slot)."""


@dataclass(frozen=True)
class AnswerEvent:
    """One update of one policy's answer as its viewer receives it: the engine's `AnswerUpdate` as
    it is, and beside it what serving adds: the policy, the wait for the chunk in flight, and an
    `error` (no update: the question failed) or `interrupted` (a reset or a closed tab cut the
    answer short). The last event of a finished answer is also its record in the stream's view."""

    policy: PolicySpec | None
    update: AnswerUpdate | None = None
    wait_ms: float = 0.0
    error: str | None = None
    interrupted: bool = False

    @property
    def done(self) -> bool:
        """Whether no event of this answer follows: it finished, failed or was cut short."""
        return self.update is None or self.update.done or self.interrupted

    def to_dict(self) -> dict:
        """Plain data for the API: the update's fields, and serving's beside them."""
        update = asdict(self.update) if self.update is not None else {}
        extra = {"wait_ms": self.wait_ms, "error": self.error, "interrupted": self.interrupted}
        return {"policy": self.policy, **update, **extra, "done": self.done}


class AnswerTicket:
    """The answer to one question, streamed from the model thread to whoever reads `events()`."""

    def __init__(self, question: str, generation: int = 0) -> None:
        self.question = question
        self.generation = generation  # the stream's generation when asked: a reset makes it stale
        self.enqueued_at = time.monotonic()
        self._queue: queue.Queue[AnswerEvent | None] = queue.Queue()

    def put(self, event: AnswerEvent) -> None:
        self._queue.put(event)

    def fail(self, message: str) -> None:
        self._queue.put(AnswerEvent(None, error=message))

    def close(self) -> None:
        self._queue.put(None)

    def fail_job(self, exc: BaseException) -> None:
        """The question's job did not run: dropped before its turn (a reset), or its batch failed
        (the worker logs it and frees memory)."""
        if isinstance(exc, JobCancelled):
            self.fail("The stream was reset before this question's turn: ask again.")
        else:
            self.fail(job_error_message(exc, "while answering"))
        self.close()

    def events(self, timeout: float = ANSWER_TIMEOUT_S) -> Iterator[AnswerEvent]:
        """Yield the answer's updates until it is complete (or failed)."""
        while True:
            try:
                event = self._queue.get(timeout=timeout)
            except queue.Empty:
                yield AnswerEvent(None, error=f"No answer after {timeout:.0f} s: the server is overloaded.")
                return
            if event is None:
                return
            yield event


def job_error_message(exc: BaseException, where: str, advice: str = "") -> str:
    """What a viewer is told when a model job fails: out of memory gets advice, a bug its type."""
    if is_out_of_memory(exc):
        return (
            f"Out of memory {where}: lower the budget |M| or the chunk size, or turn off Compare, "
            "then press Reset. Other viewers are not affected."
        )
    return f"The model failed {where} ({type(exc).__name__}: {exc}).{advice}"


@dataclass(eq=False)
class AnswerRequest:
    """One question, as its stream hands it to the batch: the sessions that answer it (one per
    policy, in order), where each update goes, and what to do at the end.

    `emit(policy, update)` returns False when the answer must stop (its stream was reset or closed);
    `finish()` runs once, when every policy's answer is done or stopped.
    """

    question: str
    sessions: dict[PolicySpec, StreamingSession]
    emit: Callable[[PolicySpec, AnswerUpdate], bool]
    finish: Callable[[], None]
    max_new_tokens: int = MAX_NEW_TOKENS

    @classmethod
    def for_ticket(
        cls,
        ticket: AnswerTicket,
        sessions: dict[PolicySpec, StreamingSession],
        max_new_tokens: int,
        still_current: Callable[[], bool],
        on_done: Callable[[list[AnswerEvent]], None],
    ) -> AnswerRequest:
        """The request that streams each update to `ticket` as an `AnswerEvent`, stops (marked
        interrupted) once `still_current()` is False, and hands the finished answers to `on_done`."""
        wait_ms = (time.monotonic() - ticket.enqueued_at) * 1000.0
        records: list[AnswerEvent] = []

        def emit(policy: PolicySpec, update: AnswerUpdate) -> bool:
            current = still_current()  # reset or closed while decoding: stop here
            event = AnswerEvent(policy, update, wait_ms, interrupted=not current)
            ticket.put(event)
            if current and update.done:
                records.append(event)
            return current

        def finish() -> None:
            ticket.close()
            if records:
                on_done(records)

        return cls(ticket.question, sessions, emit, finish, max_new_tokens)


def batch_memory_cap(device: torch.device) -> int | None:
    """Bytes the answer batch may copy memories into. On a GPU, half the margin that admission
    control keeps free beside the caches (the other half stays for the step's activations); more
    questions wait for answers to end. Elsewhere no cap: the copies are at most the caches admitted."""
    if device.type != "cuda":
        return None
    return gpu_margin(torch.cuda.get_device_properties(device).total_memory) // 2


class AnswerBatch:
    """The questions of every stream on one model, answered together on the model thread.

    A `hermes.serving.worker.Batch`: a job joins with a callable that returns its `AnswerRequest`
    (or None when there is nothing to answer, having told the viewer why); each policy of the
    request is one row of the engine's `BatchDecoder`, whose copies of the memories stay within
    `batch_memory_cap`.
    """

    def __init__(self, lm: VideoLM) -> None:
        self.decoder = BatchDecoder(lm, batch_memory_cap(lm.device))
        self._requests: dict[Job, AnswerRequest] = {}
        self._rows: dict[Job, list[BatchRow]] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def join(self, job: Job) -> bool:
        request = job.fn()
        if request is None:
            return False
        rows = []
        try:
            for policy, session in request.sessions.items():
                if not session.policy.question.batchable:
                    # A question-time step that brings in its own tokens per question (rekv's frames):
                    # the answer cannot share the batch's copies; it is decoded alone, at once, here.
                    for update in session.ask_stream(request.question, request.max_new_tokens):
                        if not request.emit(policy, update):
                            break
                    continue
                rows.append(self.decoder.add(session, request.question, request.max_new_tokens, (job, policy)))
        except Exception:
            for row in rows:
                self.decoder.drop(row)
            raise
        self._requests[job], self._rows[job] = request, rows
        return True

    def step(self) -> list[Job]:
        stopped: list[Job] = []
        for row, update in self.decoder.step():
            job, policy = row.tag
            if job in stopped:
                continue
            if not self._requests[job].emit(policy, update):
                stopped.append(job)
        finished = stopped + [job for job, rows in self._rows.items() if job not in stopped and not self._live(rows)]
        for job in finished:
            for row in self._rows.pop(job):
                self.decoder.drop(row)
            self._requests.pop(job).finish()
        return finished

    def _live(self, rows: list[BatchRow]) -> bool:
        """Whether any of `rows` is still decoding (or waiting to join)."""
        return any(row in self.decoder.rows or row in self.decoder.joining for row in rows)

    def abort(self) -> list[Job]:
        self.decoder.clear()
        jobs = list(self._requests)
        self._requests.clear()
        self._rows.clear()
        return jobs
