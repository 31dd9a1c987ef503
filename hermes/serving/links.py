"""What a live stream's sources and model-thread jobs report to, one generation at a time.

A source of generation n hands its chunks to `SourceLinks.hooks(n)`: each becomes an ingest job of
the stream on the model thread, under the stream's backlog limit; what the source says about itself
(it ended, failed, fell silent, dropped, came back) moves the stream's lifecycle under the stream's
lock, and a failed job halts the generation it belongs to. A generation that a reset has replaced
changes nothing: the lifecycle and the jobs check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hermes.engine.chunk import Chunk
from hermes.runtime.feed import Feed, FeedHooks
from hermes.serving.answers import job_error_message
from hermes.serving.jobs import JobCancelled, Priority
from hermes.serving.memories import StreamMemories
from hermes.serving.state import Lifecycle, StreamState
from hermes.serving.worker import ModelWorker

# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it. A
# network stream waits until none is (its next chunk is then the newest frames).
MAX_CHUNK_BACKLOG = 2


def dropped_note(reason: str) -> str:
    """What the viewer is told when a network stream drops."""
    return f"The stream dropped ({reason}); reconnecting. The memory and the chat are kept."


class Linked(Protocol):
    """What the links need of their stream (a `LiveStream`)."""

    worker: ModelWorker
    key: str
    life: Lifecycle
    feed: Feed

    def locked(self, move: Callable, *args: object) -> object:
        """`move(*args)` under the stream's lock."""

    def halt(self, gen: int, state: StreamState, message: str, *, error: bool, memory_failed: bool = False) -> None:
        """Stop the source of generation `gen` by itself, saying why."""

    def ended(self, gen: int) -> None:
        """The source of generation `gen` reached its end."""


class SourceLinks:
    """One stream's side of its sources and jobs (the module's docstring says what each does)."""

    def __init__(self, stream: Linked, memories: StreamMemories) -> None:
        self.stream = stream
        self._memories = memories  # touched in jobs on the model thread only

    def hooks(self, gen: int) -> FeedHooks:
        """What the source of generation `gen` reports to, and asks of, the stream."""
        stream, worker, key, life = self.stream, self.stream.worker, self.stream.key, self.stream.life
        return FeedHooks(
            on_chunk=lambda chunk: self.submit_chunk(gen, chunk),
            wait_room=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, MAX_CHUNK_BACKLOG, timeout),
            has_room=lambda: worker.backlog(key, Priority.CHUNK) < MAX_CHUNK_BACKLOG,
            wait_idle=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, 1, timeout),
            on_end=lambda: stream.ended(gen),
            on_error=lambda message: stream.halt(gen, StreamState.ERROR, message, error=True),
            on_silence=lambda: stream.locked(life.silence, gen),
            on_frames=lambda: stream.locked(life.frames_again, gen),
            on_drop=lambda reason: stream.locked(life.lost, gen, dropped_note(reason)),
            on_back=lambda: stream.locked(life.back, gen),
        )

    def submit_chunk(self, gen: int, chunk: Chunk) -> None:
        """Queue `chunk` of generation `gen` for the model thread."""
        self.stream.worker.submit(
            lambda: self._memories.ingest(gen, chunk, landed=self.stream.feed.landed),
            Priority.CHUNK,
            self.stream.key,
            lambda exc: self.job_failed(gen, exc),
        )

    def job_failed(self, gen: int, exc: BaseException) -> None:
        """A job of generation `gen` failed: the stream halts with the reason, unless it was cancelled
        (a job of an older generation, before a reset, failing must not stop the new stream)."""
        if not isinstance(exc, JobCancelled):
            message = job_error_message(exc, "on this stream", " Press Reset to start over.")
            self.stream.halt(gen, StreamState.ERROR, message, error=True, memory_failed=True)
