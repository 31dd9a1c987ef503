"""The states a live stream goes through, what each one means for its source, and the moves between them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

# Notices a viewer has not been shown yet (an API client may never ask): the latest are kept.
NOTICES_KEPT = 20
WEBCAM_SILENT = (
    "The webcam stopped sending frames, so the stream stopped: everything it showed is in memory, and "
    "questions still work. Record again to go on."
)


class StreamState(str, Enum):
    """Where a live stream is: the value is what the status line and the API show."""

    STARTING = "starting"  # the memories are being built
    IDLE = "idle"  # memories ready, no source yet
    STREAMING = "streaming"
    PAUSED = "paused"
    WAITING = "waiting for the webcam"  # the camera stopped sending frames; the next one goes on
    RECONNECTING = "reconnecting"  # a network stream dropped; its memory waits while it is reopened
    FINISHING = "finishing"  # the source ended; chunks are still on their way to the model
    FINISHED = "finished"  # the file was read to its end
    STOPPED = "stopped"  # by the viewer, or by the stream itself at a bound (the note says why)
    ERROR = "error"
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value

    @property
    def takes_frames(self) -> bool:
        """Whether a source is feeding the stream now (paused included: it resumes where it was)."""
        return self in (StreamState.STREAMING, StreamState.PAUSED, StreamState.WAITING, StreamState.RECONNECTING)

    @property
    def runs(self) -> bool:
        """Whether the stream still has work under way: a source feeding it, or chunks draining."""
        return self.takes_frames or self is StreamState.FINISHING


@dataclass
class Lifecycle:
    """A stream's state machine: its state, the generation (bumped by every reset and by close, so
    that older jobs and writes are stale), and why it stopped by itself.

    Not locked: its owner (a `LiveStream`) holds its own lock around every call, together with
    whatever the transition does to the source.
    """

    generation: int = 0
    state: StreamState = StreamState.STARTING
    error: str | None = None
    note: str | None = None  # why the stream stopped by itself, when it was not an error
    memory_failed: bool = False  # a model job failed: the memories may be half-updated
    started: float = field(default_factory=time.monotonic)
    notices: list[str] = field(default_factory=list)  # for the viewer, each shown once

    def restart(self) -> int:
        """A new generation, starting (its memories are being built); returns it."""
        self.generation += 1
        self.state, self.error, self.note, self.memory_failed = StreamState.STARTING, None, None, False
        self.started = time.monotonic()
        self.notices = []
        return self.generation

    def current(self, generation: int) -> bool:
        return generation == self.generation

    def ready(self, generation: int) -> None:
        """The memories of `generation` are built: starting becomes idle."""
        if self.current(generation) and self.state is StreamState.STARTING:
            self.state = StreamState.IDLE

    def pause(self) -> bool:
        """Streaming becomes paused; whether it did."""
        if self.state is not StreamState.STREAMING:
            return False
        self.state = StreamState.PAUSED
        return True

    def resume(self) -> bool:
        """Paused becomes streaming; whether it did."""
        if self.state is not StreamState.PAUSED:
            return False
        self.state = StreamState.STREAMING
        return True

    def stop(self) -> None:
        """The viewer stopped the source."""
        if self.state.takes_frames:
            self.state = StreamState.STOPPED

    def silence(self, generation: int) -> None:
        """The webcam of `generation` stopped sending frames (the viewer stopped recording)."""
        if self.current(generation) and self.state is StreamState.STREAMING:
            self.state = StreamState.WAITING
            self.note = WEBCAM_SILENT

    def frames_again(self, generation: int) -> None:
        """The webcam of `generation` sends frames again: the stream goes on where it was."""
        if self.current(generation) and self.state is StreamState.WAITING:
            self.state, self.note = StreamState.STREAMING, None

    def lost(self, generation: int, note: str) -> None:
        """The network stream of `generation` dropped and is being reopened: say so, once."""
        if self.current(generation) and self.state is StreamState.STREAMING:
            self.state, self.note = StreamState.RECONNECTING, note
            self.notices.append(note)
            del self.notices[:-NOTICES_KEPT]

    def back(self, generation: int) -> None:
        """The network stream of `generation` is back: the stream goes on where its time is."""
        if self.current(generation) and self.state is StreamState.RECONNECTING:
            self.state, self.note = StreamState.STREAMING, None
            self.notices.append("The stream is back: it goes on, with its memory and chat as they were.")
            del self.notices[:-NOTICES_KEPT]

    def end(self, generation: int) -> None:
        """The source of `generation` ran out (the file ended)."""
        if self.current(generation) and self.state.takes_frames:
            self.state = StreamState.FINISHED

    def halt(self, generation: int, state: StreamState, message: str, *, error: bool, memory_failed: bool) -> bool:
        """The stream of `generation` stops by itself (an error, or a bound reached), saying why;
        whether it did (a bound reached after the source ended changes nothing)."""
        if not self.current(generation) or (not error and not self.state.takes_frames):
            return False
        self.state = state
        if error:
            self.error = message
        else:
            self.note = message
        self.memory_failed = self.memory_failed or memory_failed
        self.notices.append(message)
        del self.notices[:-NOTICES_KEPT]
        return True

    def inform(self, message: str) -> None:
        """A note for the viewer that is no error (shown once, and in the status line until a restart)."""
        self.note = message
        self.notices.append(message)
        del self.notices[:-NOTICES_KEPT]

    def close(self) -> None:
        self.generation += 1  # an answer being decoded stops at its next token
        self.state = StreamState.CLOSED

    def pop_notices(self) -> list[str]:
        out, self.notices = self.notices, []
        return out
