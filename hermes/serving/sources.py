"""Where a live stream's frames come from: a video file read at a pace, or webcam frames.

A source cuts frames into chunks and hands each to its `on_chunk` callback; whoever consumes them
says through `has_room` whether it can take another. A file waits for room (the stream falls
behind the wall clock instead of piling up memory); a webcam cannot wait, so it drops the chunk.
No model here: the consumer decides what a chunk becomes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.video.chunking import Chunker
from hermes.video.decoding import UntilDamage, VideoError, VideoFile

log = logging.getLogger(__name__)

ROOM_POLL_S = 0.1  # how often a waiting reader looks at its stop and pause signals


class Source(Protocol):
    """What a stream asks of its source, whatever it is."""

    frames_read: int
    dropped_frames: int

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self, flush: bool) -> None:
        """Take no more frames; with `flush` the frames of the partial chunk still go out."""

    def join(self, timeout: float = 10.0) -> None:
        """Wait until the source has stopped (unless called from its own thread)."""


class PlayClock:
    """Seconds of playing time: wall time since `start`, less the time spent paused."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._paused_at: float | None = None
        self._paused_s = 0.0

    def start(self) -> None:
        self._started = time.monotonic()

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_s += time.monotonic() - self._paused_at
            self._paused_at = None

    def elapsed(self) -> float:
        if self._started is None:
            return 0.0
        now = self._paused_at if self._paused_at is not None else time.monotonic()
        return now - self._started - self._paused_s


class FileSource:
    """A video file read by its own thread, paced at `speed()` times real time (None: no pacing).

    `has_room(timeout)` waits up to `timeout` seconds for the consumer to have room for a chunk.
    When the file ends, the last partial chunk goes out, then `on_end()` is called; a file that
    cannot be decoded calls `on_error(message)` instead, and a file damaged further in, after its
    last good frame has gone out.
    """

    def __init__(
        self,
        path: Path,
        chunk_frames: int,
        fps: float,
        speed: Callable[[], float | None],
        *,
        on_chunk: Callable[[Chunk], None],
        has_room: Callable[[float], bool],
        on_end: Callable[[], None],
        on_error: Callable[[str], None],
        name: str = "read",
    ) -> None:
        self.path = Path(path)
        self.speed = speed  # asked at every frame: a new pace applies at once
        self.frames_read = 0
        self.dropped_frames = 0  # a file waits for room instead
        self._chunker = Chunker(chunk_frames)
        self._fps = fps
        self._on_chunk, self._has_room, self._on_end, self._on_error = on_chunk, has_room, on_end, on_error
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._flush = True
        self._clock = PlayClock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._clock.start()
        self.thread.start()

    def pause(self) -> None:
        """Hold the reading (the stream's clock stops too)."""
        self._clock.pause()
        self._resume.clear()

    def resume(self) -> None:
        self._clock.resume()
        self._resume.set()

    def position_s(self) -> float | None:
        """Where in the video a viewer would be now, playing it at its speed; None unpaced."""
        speed = self.speed()
        return None if not speed else self._clock.elapsed() * speed

    def stop(self, flush: bool) -> None:
        self._flush = flush
        self._stop.set()
        self._resume.set()

    def join(self, timeout: float = 10.0) -> None:
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _run(self) -> None:
        try:
            with VideoFile(self.path) as video:
                prev_t: float | None = None
                frames = UntilDamage(video.frames(self._fps))  # a damaged file ends at its last good frame
                for frame in frames:
                    speed = self.speed()
                    due = time.monotonic() + (frame.t - prev_t) / speed if prev_t is not None and speed else 0.0
                    if not self._wait(due):  # also where a paused stream waits
                        break
                    prev_t = frame.t
                    chunk = self._chunker.push(frame)
                    self.frames_read += 1
                    if chunk is not None and not self._deliver(chunk):
                        break
        except VideoError as exc:
            self._on_error(str(exc))
            return
        except Exception as exc:  # keep the process alive whatever the decoder does
            log.exception("reading %s failed", self.path)
            self._on_error(f"Reading {self.path.name} failed: {exc}")
            return
        if self._flush or not self._stop.is_set():
            tail = self._chunker.flush()
            if tail is not None:
                self._on_chunk(tail)
        if frames.damage is not None:  # after the frames before it went out
            self._on_error(str(frames.damage))
        elif not self._stop.is_set():
            # Only now, with the last chunk handed on: "ended" with nothing queued means done.
            self._on_end()

    def _wait(self, until: float) -> bool:
        """Sleep until the monotonic time `until`, longer while paused; False once stopped."""
        while not self._stop.is_set():
            if not self._resume.is_set():
                paused_at = time.monotonic()
                self._resume.wait(ROOM_POLL_S)
                until += time.monotonic() - paused_at  # pausing shifts the stream's clock
                continue
            left = until - time.monotonic()
            if left <= 0:
                return True
            self._stop.wait(min(left, ROOM_POLL_S))
        return False

    def _deliver(self, chunk: Chunk) -> bool:
        """Hand a chunk on once there is room; False if stopped while waiting."""
        while not self._has_room(ROOM_POLL_S):
            if self._stop.is_set():
                return False
        self._on_chunk(chunk)
        return True


class WebcamSource:
    """Webcam frames, thinned to `fps` and cut into chunks; a chunk that finds no room is dropped.

    `push` is called from whatever thread receives the frames; `stop` may come from any other.
    """

    def __init__(
        self, chunk_frames: int, fps: float, *, on_chunk: Callable[[Chunk], None], has_room: Callable[[], bool]
    ) -> None:
        self.frames_read = 0
        self.dropped_frames = 0
        self.last_frame_at = 0.0
        self._first_frame_at: float | None = None
        self._chunker = Chunker(chunk_frames, fps=fps)
        self._on_chunk, self._has_room = on_chunk, has_room
        self._lock = threading.Lock()
        self._stopped = False
        self._paused = False

    def position_s(self) -> float | None:
        """The stream time of the newest frame the camera sent (its clock starts at the first)."""
        return None if self._first_frame_at is None else self.last_frame_at - self._first_frame_at

    def pause(self) -> None:
        """Ignore frames until `resume` (a live source cannot wait)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def push(self, image: np.ndarray) -> None:
        """Take one frame (ValueError, with the reason, for a frame that is not an RGB image)."""
        with self._lock:
            if self._stopped or self._paused:
                return
            self.last_frame_at = time.monotonic()
            if self._first_frame_at is None:
                self._first_frame_at = self.last_frame_at
            chunk = self._chunker.push(image)
            self.frames_read = self._chunker.next_index + self._chunker.pending
        if chunk is None:
            return
        if not self._has_room():
            self.dropped_frames += chunk.num_frames
            return
        self._on_chunk(chunk)

    def stop(self, flush: bool) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            tail = self._chunker.flush() if flush else None
        if tail is not None:
            self._on_chunk(tail)

    def join(self, timeout: float = 10.0) -> None:
        """Nothing to wait for: frames come in on the caller's thread."""
