"""Helpers shared by several test files."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from hermes.engine.batch import BatchDecoder
from hermes.engine.session import StreamingSession


@contextlib.contextmanager
def hold_answers(session: StreamingSession) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold `session`'s answers after their first token until the gate opens (at the latest on exit).

    Answers decode in the model thread's batch: once a row of `session` has its first token (and
    the viewer has it), the thread waits before the batch's next step."""
    first, gate = threading.Event(), threading.Event()
    real = BatchDecoder.step

    def held(decoder: BatchDecoder):
        if not first.is_set() and any(row.session is session and row.tokens for row in decoder.rows):
            first.set()
            gate.wait(10)
        return real(decoder)

    BatchDecoder.step = held
    try:
        yield first, gate
    finally:
        gate.set()  # never leave the model thread waiting, even when the test fails
        BatchDecoder.step = real
