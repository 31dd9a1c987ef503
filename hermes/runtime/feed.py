"""What feeds a live stream: its source of chunks (a video file read at a pace, a webcam, or a network
stream), the source's name for the status line, and the pace a viewer set.

A `Feed` builds a source for one generation of its stream from that generation's `FeedHooks`
(where the chunks go, whether the model has room, and what the source says about itself), and
keeps it until the next one. It is not locked: its stream holds its own lock around every move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hermes.engine.chunk import Chunk
from hermes.runtime.network import NetworkSource
from hermes.runtime.readers import FileSource, Source, WebcamSource
from hermes.runtime.settings import SPEEDS, StreamSettings
from hermes.video.network import NetworkReader


@dataclass(frozen=True)
class FeedHooks:
    """One stream generation's side of its source."""

    on_chunk: Callable[[Chunk], None]
    wait_room: Callable[[float], bool]  # a file's reader waits up to that many seconds for room
    has_room: Callable[[], bool]  # a webcam cannot wait: it drops a chunk without room
    wait_idle: Callable[[float], bool]  # a network stream waits (that long) until no chunk of it is in the model
    on_end: Callable[[], None]  # the file was read to its end
    on_error: Callable[[str], None]  # the file cannot be read (further)
    on_silence: Callable[[], None]  # the webcam stopped sending frames
    on_frames: Callable[[], None]  # and sends them again
    on_drop: Callable[[str], None]  # a network stream dropped (the reason): it is being reopened
    on_back: Callable[[], None]  # and is back


class Feed:
    """The source feeding one stream, its name and its pace."""

    def __init__(self) -> None:
        self.source: Source | None = None
        self.name: str | None = None  # the file's name, "webcam", or a URL without its credentials
        self.duration_s: float | None = None  # a file's total length (a webcam or a live stream has none)
        self.speed = "1x"

    @property
    def webcam(self) -> WebcamSource | None:
        """The webcam source, if the stream has one (running or stopped with the Stop control)."""
        return self.source if isinstance(self.source, WebcamSource) else None

    @property
    def network(self) -> NetworkSource | None:
        """The network source, if the stream has one."""
        return self.source if isinstance(self.source, NetworkSource) else None

    def set_speed(self, speed: str) -> None:
        """Pace of a file stream: "1x" (real time), "2x", "4x" or "max"; applies at once."""
        if speed not in SPEEDS:
            raise ValueError(f"speed must be one of {', '.join(SPEEDS)}; got {speed!r}")
        self.speed = speed

    def file(
        self,
        path: Path,
        settings: StreamSettings,
        hooks: FeedHooks,
        thread_name: str,
        start_s: float = 0.0,
        first: int = 0,
    ) -> FileSource:
        """A source reading the file at `path` at the feed's pace (not started), from `start_s` s on,
        its first frame numbered `first`."""
        return FileSource(
            path,
            settings.chunk_frames,
            settings.fps,
            lambda: SPEEDS[self.speed],
            on_chunk=hooks.on_chunk,
            has_room=hooks.wait_room,
            on_end=hooks.on_end,
            on_error=hooks.on_error,
            name=thread_name,
            start_s=start_s,
            first_frame=first,
        )

    @staticmethod
    def camera(settings: StreamSettings, hooks: FeedHooks, start_s: float = 0.0, first: int = 0) -> WebcamSource:
        """A source cutting webcam frames into chunks as they are pushed, its stream time counted
        from `start_s`, its first frame numbered `first`."""
        return WebcamSource(
            settings.chunk_frames,
            settings.fps,
            on_chunk=hooks.on_chunk,
            has_room=hooks.has_room,
            on_silence=hooks.on_silence,
            on_frames=hooks.on_frames,
            start_s=start_s,
            first_frame=first,
        )

    @staticmethod
    def stream(
        reader: NetworkReader,
        settings: StreamSettings,
        hooks: FeedHooks,
        thread_name: str,
        start_s: float = 0.0,
        first: int = 0,
    ) -> NetworkSource:
        """A source cutting a network stream's frames (from `reader`, opened) into chunks (not
        started), its stream time counted from `start_s`, its first frame numbered `first`."""
        return NetworkSource(
            reader,
            settings.chunk_frames,
            on_chunk=hooks.on_chunk,
            has_room=hooks.wait_idle,
            on_end=hooks.on_end,
            on_error=hooks.on_error,
            on_drop=hooks.on_drop,
            on_back=hooks.on_back,
            name=thread_name,
            start_s=start_s,
            first_frame=first,
        )

    def landed(self, chunk: Chunk) -> None:
        """`chunk` is in memory now (a network source measures its glass-to-memory latency)."""
        if (network := self.network) is not None:
            network.ingested(chunk)

    def attach(self, source: Source, name: str, duration_s: float | None = None) -> None:
        self.source, self.name, self.duration_s = source, name, duration_s

    def detach(self) -> None:
        self.source = self.name = self.duration_s = None

    def stop(self, flush: bool) -> None:
        """End the source and wait for its thread; with `flush` the partial chunk still goes out."""
        if self.source is not None:
            self.source.stop(flush)
            self.source.join()
