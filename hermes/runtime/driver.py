"""Stream a video file through a session as if live, asking questions when the stream reaches them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from hermes.engine.session import AnswerUpdate, ChunkReport, StreamingSession
from hermes.runtime.readers import PlayClock
from hermes.video.chunking import Chunker
from hermes.video.decoding import Frame

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class TimedQuestion:
    """A question asked when the stream reaches `at_s` seconds."""

    at_s: float
    question: str


def parse_ask(spec: str) -> TimedQuestion:
    """Parse "SECONDS:QUESTION" (for example "12.5:What is the man holding?")."""
    at, sep, question = spec.partition(":")
    try:
        seconds = float(at)
    except ValueError:
        seconds = -1.0
    if not sep or seconds < 0:
        raise ValueError(f"--ask wants SECONDS:QUESTION, for example '2:What is happening?'; got {spec!r}")
    if not question.strip():
        raise ValueError(f"the question is empty in --ask {spec!r}")
    return TimedQuestion(seconds, question.strip())


def play(
    session: StreamingSession,
    frames: Iterable[Frame],
    items: Iterable[T],
    when: Callable[[T], float | None],
    *,
    speed: float | None = None,
    stop_when_done: bool = False,
) -> Iterator[ChunkReport | T]:
    """Feed frames chunk by chunk and hand back each item once the stream has passed its time.

    Before an item is yielded, the frames seen so far are ingested (the partial chunk is flushed),
    so that whatever the caller does with it sees the stream up to that moment. Items without a
    time, or past the end, come after the last frame. Every ChunkReport is yielded too. `speed`
    paces the stream against the wall clock (1.0 = real time); `stop_when_done` stops decoding
    once no item is left.
    """
    pending = sorted(items, key=lambda it: (when(it) is None, when(it) or 0.0))
    chunker = Chunker(session.config.chunk_frames)
    # A stream loaded from its memory file numbers its frames on from where it stopped.
    chunker.next_index = session.frames_seen
    clock = PlayClock(lambda: speed)  # the live readers' clock: a frame is due at its time, from the first

    def flush() -> Iterator[ChunkReport]:
        tail = chunker.flush()  # the engine pads a chunk to the model's frame multiple itself
        if tail is not None:
            yield session.ingest(tail)

    def due(frame: Frame) -> bool:
        at = when(pending[0]) if pending else None
        # An item is due once a later frame arrives, but never before the first frame.
        return at is not None and frame.t > at and session.frames_seen + chunker.pending > 0

    for frame in frames:
        while due(frame):
            yield from flush()
            yield pending.pop(0)
        if stop_when_done and not pending:
            return
        if speed:
            if not clock.started:  # a resumed stream's first frame is due at once, not at its stream time
                clock.start(frame.t)
            time.sleep(clock.wait_s(frame.t))
        chunk = chunker.push(frame)
        if chunk is not None:
            yield session.ingest(chunk)
    yield from flush()
    yield from pending


def replay(
    session: StreamingSession,
    frames: Iterable[Frame],
    questions: Iterable[TimedQuestion] = (),
    *,
    speed: float | None = None,
    max_new_tokens: int = 64,
) -> Iterator[ChunkReport | AnswerUpdate]:
    """Stream frames and answer each question when the stream reaches its time, yielding every
    ChunkReport and every AnswerUpdate (the last one of an answer has done=True)."""
    for event in play(session, frames, questions, lambda q: q.at_s, speed=speed):
        if isinstance(event, TimedQuestion):
            yield from session.ask_stream(event.question, max_new_tokens)
        else:
            yield event
