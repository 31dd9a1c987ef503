"""Answers on their way from the model thread to a viewer: events and tickets.

The model thread decodes an answer token by token and puts each update on the question's
`AnswerTicket`; whoever asked (a Gradio handler, a test) reads them from `events()`. Nothing here
touches the model.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass

from hermes.engine.session import AnswerUpdate
from hermes.serving.worker import is_out_of_memory

ANSWER_TIMEOUT_S = 300.0


@dataclass
class AnswerEvent:
    """One update of one policy's answer; `error` set (and text empty) when the question failed,
    `interrupted` (with `done`) when a reset or a closed tab cut the answer short. The last event
    of a finished answer is also its record in the stream's view."""

    policy: str
    question: str = ""
    text: str = ""
    done: bool = False
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    wait_ms: float = 0.0
    frames_seen: int = 0
    frames_in_memory: int = 0
    tokens: int = 0
    stream_time_s: float = 0.0
    error: str | None = None
    interrupted: bool = False

    @classmethod
    def from_update(cls, policy: str, update: AnswerUpdate, wait_ms: float) -> AnswerEvent:
        return cls(
            policy=policy,
            question=update.question,
            text=update.text,
            done=update.done,
            ttft_ms=update.ttft_ms,
            tpot_ms=update.tpot_ms,
            wait_ms=wait_ms,
            frames_seen=update.frames_seen,
            frames_in_memory=update.frames_in_memory,
            tokens=update.tokens,
            stream_time_s=update.at_s,
        )


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
        self._queue.put(AnswerEvent(policy="", done=True, error=message))

    def close(self) -> None:
        self._queue.put(None)

    def events(self, timeout: float = ANSWER_TIMEOUT_S) -> Iterator[AnswerEvent]:
        """Yield the answer's updates until it is complete (or failed)."""
        while True:
            try:
                event = self._queue.get(timeout=timeout)
            except queue.Empty:
                yield AnswerEvent(
                    policy="", done=True, error=f"No answer after {timeout:.0f} s: the server is overloaded."
                )
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
