"""Stream a video file through a session as if live, asking questions when the stream reaches them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hermes.engine import AnswerUpdate, ChunkReport, StreamingSession
from hermes.video import Chunker, Frame


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


def replay(
    session: StreamingSession,
    frames: Iterable[Frame],
    questions: Iterable[TimedQuestion] = (),
    *,
    speed: float | None = None,
    max_new_tokens: int = 64,
) -> Iterator[ChunkReport | AnswerUpdate]:
    """Feed frames chunk by chunk; at each question's time, ingest the frames seen so far and
    answer from the memory. Yields every ChunkReport and every AnswerUpdate (the last one of an
    answer has done=True). `speed` paces the stream against the wall clock (1.0 = real time)."""
    pending = sorted(questions)
    chunker = Chunker(session.config.chunk_frames)
    pad = session.lm.frame_multiple
    start = time.monotonic()

    def flush() -> Iterator[ChunkReport]:
        tail = chunker.flush(pad_to=pad)
        if tail is not None:
            yield session.ingest(tail)

    for frame in frames:
        while pending and frame.t > pending[0].at_s:
            yield from flush()
            yield from session.ask_stream(pending.pop(0).question, max_new_tokens)
        if speed:
            time.sleep(max(0.0, start + frame.t / speed - time.monotonic()))
        chunk = chunker.push(frame)
        if chunk is not None:
            yield session.ingest(chunk)
    yield from flush()
    for q in pending:
        yield from session.ask_stream(q.question, max_new_tokens)
