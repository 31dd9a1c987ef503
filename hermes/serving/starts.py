"""The ways a live stream starts: a video file or a folder of frames, a network URL, the webcam's
first frame, a memory file loaded, and a source going on into that memory.

Each is a `Start`, and `LiveStream.begin` runs every one the same way, inside admission control
(Busy refuses before anything is read): `prepare` checks or opens what the start needs while the
running stream goes on untouched (a bad file or a URL that does not open leaves it as it was), the
stream starts over (holding `memory()` if there is one) or goes on in `generation`, and `open`
makes the source of that generation, which the stream then starts. What `prepare` opened is let go
by `abandon` if a later step fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hermes.engine.session import StreamingSession
from hermes.runtime.feed import Feed, FeedHooks
from hermes.runtime.network import opened
from hermes.runtime.readers import Source
from hermes.runtime.settings import StreamSettings
from hermes.video.decoding import VideoInfo, check_start
from hermes.video.frames_folder import check_folder_start
from hermes.video.network import NetworkReader


def checked(path: Path, fps: float) -> VideoInfo:
    """What Start checks of a video file or a folder of frames (VideoError with its name otherwise)."""
    return check_folder_start(path, fps) if path.is_dir() else check_start(path, fps)


@dataclass(frozen=True)
class Opened:
    """A source made for one generation of a stream (not started), its name for the status line
    and a file's length (None for a live source)."""

    source: Source
    name: str
    duration_s: float | None = None


class Start(Protocol):
    """One start of a stream (see the module's docstring for the order its steps run in)."""

    settings: StreamSettings
    held_bytes: int  # a loaded memory's bytes, reserved by admission beside the stream's own
    generation: int | None  # go on in this generation instead of starting over

    def prepare(self) -> None:
        """Check (or open, or load) what the start needs; raise to refuse it."""

    def memory(self) -> StreamingSession | None:
        """The loaded memory to start over holding (None: fresh memories)."""

    def open(self, gen: int, hooks: FeedHooks, key: str) -> Opened | None:
        """The source of generation `gen` (not started), reporting to `hooks`; None: no source."""

    def abandon(self) -> None:
        """Let go of what `prepare` opened: a later step failed."""


@dataclass(frozen=True)
class Resume:
    """Where a source goes on in a memory loaded from a file: the generation holding it, the stream
    time and the number of the next frame (as if the stream had never stopped), and the memory's
    bytes, which admission keeps reserved."""

    generation: int
    start_s: float
    first: int
    held_bytes: int


class _SourceStart:
    """A start of a source: into fresh memories, or with `resume` on into a loaded memory."""

    def __init__(self, settings: StreamSettings, resume: Resume | None) -> None:
        self.settings, self.resume = settings, resume
        self.held_bytes = 0 if resume is None else resume.held_bytes
        self.generation = None if resume is None else resume.generation
        self.start_s, self.first = (0.0, 0) if resume is None else (resume.start_s, resume.first)

    def memory(self) -> StreamingSession | None:
        return None

    def abandon(self) -> None:
        """Nothing was opened."""


class FileStart(_SourceStart):
    """A video file, or a folder of frame images, read at the feed's pace from its beginning (or on
    from where a loaded memory stopped: the same video goes on as if it had never stopped)."""

    def __init__(
        self, feed: Feed, path: str | Path, speed: str, settings: StreamSettings, resume: Resume | None = None
    ) -> None:
        super().__init__(settings, resume)
        self.feed, self.path, self.speed = feed, Path(path), speed
        self.info: VideoInfo | None = None

    def prepare(self) -> None:
        self.info = checked(self.path, self.settings.fps)
        self.feed.set_speed(self.speed)

    def open(self, gen: int, hooks: FeedHooks, key: str) -> Opened:
        source = self.feed.file(self.path, self.settings, hooks, f"read-{key}", self.start_s, self.first)
        return Opened(source, self.info.name, self.info.duration)


class UrlStart(_SourceStart):
    """A network stream, opened (its first frame decoded) before the running stream is touched; with
    `resume`, reconnected into a loaded memory, its stream time going on from there."""

    def __init__(
        self, feed: Feed, url: str, settings: StreamSettings, reader: dict, key: str, resume: Resume | None = None
    ) -> None:
        super().__init__(settings, resume)
        self.feed, self.url, self.key = feed, url, key
        # The reader keeps the newest chunk's frames while the model takes one in.
        self.reader_options = {"queue_frames": max(2, settings.chunk_frames)} | reader
        self.reader: NetworkReader | None = None

    def prepare(self) -> None:
        self.reader = opened(self.url, self.settings.fps, f"decode-{self.key}", **self.reader_options)

    def open(self, gen: int, hooks: FeedHooks, key: str) -> Opened:
        source = self.feed.stream(self.reader, self.settings, hooks, f"read-{key}", self.start_s, self.first)
        return Opened(source, self.reader.name)

    def abandon(self) -> None:
        if self.reader is not None:
            self.reader.stop()


class CameraStart(_SourceStart):
    """The webcam: frames come in as the page pushes them (with `resume`, on into a loaded memory)."""

    def __init__(self, feed: Feed, settings: StreamSettings, resume: Resume | None = None) -> None:
        super().__init__(settings, resume)
        self.feed = feed

    def prepare(self) -> None:
        """Nothing to check: the first frame is here."""

    def open(self, gen: int, hooks: FeedHooks, key: str) -> Opened:
        return Opened(self.feed.camera(self.settings, hooks, self.start_s, self.first), "webcam")


@dataclass
class LoadStart:
    """A memory file's session, loaded on the model thread (`load`), held by the stream from now on;
    no source until one goes on into it (a source start with a `Resume`)."""

    settings: StreamSettings
    held_bytes: int
    load: Callable[[], StreamingSession]
    generation: int | None = None
    session: StreamingSession | None = None

    def prepare(self) -> None:
        self.session = self.load()

    def memory(self) -> StreamingSession | None:
        return self.session

    def open(self, gen: int, hooks: FeedHooks, key: str) -> None:
        return None

    def abandon(self) -> None:
        """The loaded session is dropped with this start."""
