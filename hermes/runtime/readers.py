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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.video.chunking import Chunker
from hermes.video.decoding import Frame, UntilDamage, VideoError, VideoFile
from hermes.video.errors import Skipped
from hermes.video.frames_folder import iter_folder_frames

log = logging.getLogger(__name__)

ROOM_POLL_S = 0.1  # how often a waiting reader looks at its stop and pause signals
# A webcam that sends nothing for this long has stopped recording (the page sends no stop event).
SILENCE_S = 3.0


class Source(Protocol):
    """What a stream asks of its source, whatever it is."""

    frames_read: int
    dropped_frames: int
    skipped: list[Skipped]  # frames of a file that could not be decoded (a webcam's list stays empty)

    def start(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self, flush: bool) -> None:
        """Take no more frames; with `flush` the frames of the partial chunk still go out."""

    def join(self, timeout: float = 10.0) -> None:
        """Wait until the source has stopped (unless called from its own thread)."""


class PlayClock:
    """Where in the video a viewer would be: seconds of video played since `start`, advancing at the
    pace `speed()` (times real time; None: unpaced), standing still while paused.

    Frames are due by this clock, not one after the other: decoding a frame takes time, and a
    reader that waited the frame interval after each decode would add that time up and play 1x
    slower than real time. Unpaced, the clock follows the frames read (`seen`), so that a pace set
    later continues from there.
    """

    def __init__(self, speed: Callable[[], float | None], now: Callable[[], float] = time.monotonic) -> None:
        self._speed, self._now = speed, now
        self._lock = threading.Lock()  # the reader thread and the viewer's controls both move it
        self._position = 0.0
        self._at: float | None = None  # wall time of the last update; None before start
        self._pace: float | None = None  # the pace since the last update
        self._paused = False

    @property
    def started(self) -> bool:
        with self._lock:
            return self._at is not None

    def start(self, at: float = 0.0) -> None:
        """Start playing from `at` s of the video."""
        with self._lock:
            self._at, self._pace, self._position = self._now(), self._speed(), at

    def _advance(self) -> float | None:
        """Bring the position up to now at the pace read at the last update (lock held), and read
        the pace again: a new pace counts from the moment it is first seen. The pace now."""
        now = self._now()
        if self._at is not None:
            if not self._paused and self._pace:
                self._position += (now - self._at) * self._pace
            self._at = now
        self._pace = self._speed()
        return self._pace

    def pause(self) -> None:
        with self._lock:
            self._advance()
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._advance()
            self._paused = False

    def position(self) -> float | None:
        """Seconds of video played by now; None when unpaced."""
        with self._lock:
            return self._position if self._advance() else None

    def seen(self, t: float) -> None:
        """A frame at `t` s was read: an unpaced clock moves up to it (a paced one is there already)."""
        with self._lock:
            self._advance()
            self._position = max(self._position, t)

    def wait_s(self, t: float) -> float:
        """Seconds of wall time until the frame at `t` s is due (0: now; unpaced: never waits)."""
        with self._lock:
            speed = self._advance()
            return 0.0 if not speed or self._position >= t else (t - self._position) / speed


class FileSource:
    """A video file (or a folder of frame images) read by its own thread, paced at `speed()` times
    real time (None: no pacing).

    `has_room(timeout)` waits up to `timeout` seconds for the consumer to have room for a chunk.
    When the file ends, the last partial chunk goes out, then `on_end()` is called; a file that
    cannot be decoded calls `on_error(message)` instead, and a file that decodes no further, after
    its last good frame has gone out. Frames that cannot be decoded on the way are skipped and
    listed in `skipped`.
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
        start_s: float = 0.0,
        first_frame: int = 0,
    ) -> None:
        self.path = Path(path)
        self.start_s = start_s  # read from here on (a stream resumed from a memory file goes on after its frames)
        self.speed = speed  # asked at every frame: a new pace applies at once
        self.frames_read = 0
        self.dropped_frames = 0  # a file waits for room instead
        self.skipped: list[Skipped] = []
        self._chunker = Chunker(chunk_frames)
        self._chunker.next_index = first_frame
        self._fps = fps
        self._on_chunk, self._has_room, self._on_end, self._on_error = on_chunk, has_room, on_end, on_error
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._flush = True
        self._clock = PlayClock(speed)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._clock.start(self.start_s)
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
        return self._clock.position()

    def stop(self, flush: bool) -> None:
        self._flush = flush
        self._stop.set()
        self._resume.set()

    def join(self, timeout: float = 10.0) -> None:
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _run(self) -> None:
        try:
            with self._opened() as decoded:
                # A file that decodes no further ends at its last good frame; damaged frames are skipped.
                frames = UntilDamage(decoded, on_skip=self.skipped.append)
                for frame in frames:
                    if not self._wait(frame.t):  # also where a paused stream waits
                        break
                    self._clock.seen(frame.t)
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

    @contextmanager
    def _opened(self) -> Iterator[Iterator[Frame]]:
        """The frames from `start_s` on at the stream's fps: a video file's, or a folder's images (one
        image per frame at that fps, as the command line's folder without --folder-fps)."""
        if self.path.is_dir():
            yield iter_folder_frames(self.path, self._fps, self._fps, start=self.start_s)
            return
        with VideoFile(self.path) as video:
            yield video.frames(self._fps, start=self.start_s)

    def _wait(self, t: float) -> bool:
        """Sleep until the frame at `t` s is due on the play clock, longer while paused; False once
        stopped."""
        while not self._stop.is_set():
            if not self._resume.is_set():
                self._resume.wait(ROOM_POLL_S)
                continue
            left = self._clock.wait_s(t)
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

    `push` is called from whatever thread receives the frames; `stop` may come from any other. The
    page says nothing when the viewer stops recording, so silence says it: once no frame has come
    for `silence_s`, the frames of the partial chunk go out (what the camera showed reaches the
    model) and `on_silence()` is called; the next frame calls `on_frames()` and the stream goes on.
    """

    def __init__(
        self,
        chunk_frames: int,
        fps: float,
        *,
        on_chunk: Callable[[Chunk], None],
        has_room: Callable[[], bool],
        on_silence: Callable[[], None] = lambda: None,
        on_frames: Callable[[], None] = lambda: None,
        silence_s: float | None = None,
        start_s: float = 0.0,
        first_frame: int = 0,
    ) -> None:
        # A webcam going on into a loaded memory: its stream time and frame numbers go on from there.
        self.start_s = start_s
        self.frames_read = 0
        self.dropped_frames = 0
        self.skipped: list[Skipped] = []
        self.last_frame_at = time.monotonic()
        self._first_frame_at: float | None = None
        self._chunker = Chunker(chunk_frames, fps=fps)
        self._chunker.next_index = first_frame
        self._first_index = first_frame
        self._on_chunk, self._has_room = on_chunk, has_room
        self._on_silence, self._on_frames = on_silence, on_frames
        self._silence_s = SILENCE_S if silence_s is None else silence_s
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._paused = False
        self._silent = False
        self.thread = threading.Thread(target=self._listen, name="webcam-silence", daemon=True)
        self.thread.start()

    def start(self) -> None:
        """Nothing to start: frames come in as they are pushed."""

    def position_s(self) -> float | None:
        """The stream time of the newest frame the camera sent (its clock starts at the first)."""
        return None if self._first_frame_at is None else self.start_s + self.last_frame_at - self._first_frame_at

    def pause(self) -> None:
        """Ignore frames until `resume` (a live source cannot wait)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def push(self, image: np.ndarray, t: float | None = None) -> None:
        """Take one frame, captured `t` seconds into the stream (default: now, by the wall clock);
        ValueError, with the reason, for a frame that is not an RGB image."""
        with self._lock:
            if self._stopped.is_set() or self._paused:
                return
            self.last_frame_at = time.monotonic()
            if self._first_frame_at is None:
                self._first_frame_at = self.last_frame_at
            if t is None:
                t = self.last_frame_at - self._first_frame_at
            chunk = self._chunker.push(image, self.start_s + t)
            self.frames_read = self._chunker.next_index + self._chunker.pending - self._first_index
            again, self._silent = self._silent, False
        if again:
            self._on_frames()
        if chunk is None:
            return
        if not self._has_room():
            self.dropped_frames += chunk.num_frames
            return
        self._on_chunk(chunk)

    def _listen(self) -> None:
        """Until stopped: when the camera falls silent, send the partial chunk and say so, once."""
        while not self._stopped.wait(ROOM_POLL_S):
            with self._lock:
                if self._paused or self._silent or time.monotonic() - self.last_frame_at < self._silence_s:
                    continue
                self._silent = True
                tail = self._chunker.flush()
            if tail is not None:
                self._on_chunk(tail)  # one partial chunk: it goes in even past the backlog
            self._on_silence()

    def stop(self, flush: bool) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            tail = self._chunker.flush() if flush else None
        if tail is not None:
            self._on_chunk(tail)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the silence watch to end (frames come in on the caller's thread)."""
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
