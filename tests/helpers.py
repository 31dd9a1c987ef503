"""Helpers shared by several test files."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from hermes.engine.session import StreamingSession


@contextlib.contextmanager
def hold_answers(session: StreamingSession) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold `session`'s answers after their first token until the gate opens (at the latest on exit)."""
    first, gate = threading.Event(), threading.Event()
    real = session.ask_stream

    def held(question, max_new_tokens):
        for i, update in enumerate(real(question, max_new_tokens)):
            yield update
            if i == 0:
                first.set()
                gate.wait(10)

    session.ask_stream = held
    try:
        yield first, gate
    finally:
        gate.set()  # never leave the model thread waiting, even when the test fails
        del session.ask_stream
