"""What a stream reads, opened once and read by the driver: a video file, a folder of frames or a URL.

Each source checks itself when it opens (a bad file, a folder without images or a stream that does
not open fails before a model loads), then yields `Frame`s from the stream time its session has
reached (a resumed memory's stream goes on from there), says what happened to it (frames skipped,
the stream dropped or back) through a callback, and ends at its end or when `stop_requested` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hermes.video.decoding import Frame

Say = Callable[[dict], None]


class FileFrames:
    """A video file's frames: a frame that cannot be decoded is skipped, and said; a file that decodes
    no further streams to its last good frame, and its error is raised by `raise_damage` afterwards."""

    def __init__(self, path: str, fps: float) -> None:
        from hermes.video.decoding import check_start

        self.path = path
        self.info = check_start(path, fps)
        self._frames: Any = None
        self.stop_requested = threading.Event()  # the stream ends at its next frame

    def total(self, fps: float) -> int | None:
        """Frames the stream will have at `fps` (None: not known ahead, as for a live stream)."""
        return max(1, int(self.info.duration * fps) + 1)

    def frames(self, start_s: float, fps: float, say: Say) -> Iterator[Frame]:
        """The frames from `start_s` on, sampled at `fps`."""
        from hermes.video.decoding import UntilDamage, iter_frames

        self._frames = UntilDamage(
            iter_frames(self.path, fps, start=start_s),
            on_skip=lambda s: say({"event": "skipped", "at_s": s.at_s, "frames": s.frames, "note": str(s)}),
        )
        return self._frames

    def close(self) -> None:
        """Nothing to let go of: the decoder closes with its iterator."""

    def closing_note(self) -> str | None:
        """What to tell the viewer once the stream has ended (None: nothing)."""
        return None

    def raise_damage(self) -> None:
        """The error that ended a damaged file early, if any (after its good part was streamed)."""
        if self._frames is not None and self._frames.damage is not None:
            raise self._frames.damage


class FolderFrames(FileFrames):
    """A folder of frame images (name order, numbers as numbers) recorded at `folder_fps`: image k is
    on screen from k / folder_fps, sampled at the stream's fps as a file's frames are."""

    def __init__(self, path: str, folder_fps: float) -> None:
        from hermes.video.frames_folder import frame_files

        if not folder_fps > 0:
            raise ValueError(f"a folder of frames needs its frame rate > 0, got {folder_fps}")
        self.path, self.folder_fps = path, folder_fps
        self.count = len(frame_files(path))  # VideoError for a folder without images
        self._frames = None
        self.stop_requested = threading.Event()

    def total(self, fps: float) -> int | None:
        return max(1, int(self.count / self.folder_fps * fps))

    def frames(self, start_s: float, fps: float, say: Say) -> Iterator[Frame]:
        from hermes.video.frames_folder import iter_folder_frames

        return iter_folder_frames(self.path, self.folder_fps, fps, start=start_s)


class NetworkFrames:
    """A network stream's frames, from its opening (StreamError if it does not open) until it ends or
    `stop_requested`; drops and reconnects are said as they happen, from the reading thread's notes."""

    def __init__(self, url: str, fps: float, chunk_frames: int) -> None:
        from hermes.video.network import NetworkReader

        # While the model takes a chunk in, the reader keeps the newest chunk's frames: the next one.
        self.reader = NetworkReader(url, fps, queue_frames=max(2, chunk_frames))
        self.reader.start()
        self.reader.wait_open()
        self._links: list[dict] = []  # what the reader's thread said, said again by the reading thread
        self.reader.on_link = self._heard
        self.stop_requested = threading.Event()  # the stream ends, even while it is stalled

    def _heard(self, link, detail: str | None) -> None:
        from hermes.video.network import Link

        if link is Link.RECONNECTING:
            self._links.append({"event": "dropped", "note": f"{detail}; reconnecting"})
        elif link is Link.STREAMING:
            self._links.append({"event": "reconnected", "note": "the stream goes on, its memory kept"})

    def total(self, fps: float) -> int | None:
        return None

    def frames(self, start_s: float, fps: float, say: Say) -> Iterator[Frame]:
        while not self.reader.done and not self.stop_requested.is_set():
            while self._links:
                say(self._links.pop(0))
            live = self.reader.get(0.2)
            if live is not None:
                yield Frame(live.image, start_s + live.t)
        if self.reader.failure is not None:
            raise self.reader.failure

    def close(self) -> None:
        """Stop the reading thread."""
        self.reader.stop()

    def closing_note(self) -> str | None:
        """How much of the stream the model skipped to stay at its live edge, if any."""
        skipped = self.reader.frames.skipped_s
        return f"the model skipped {skipped:.0f} s of the stream to stay at its live edge" if skipped else None

    def raise_damage(self) -> None:
        """A network stream's failures are raised while it is read."""


def open_source(
    video: str, fps: float, chunk_frames: int, folder_fps: float | None = None
) -> FileFrames | FolderFrames | NetworkFrames:
    """The source `video` names: a URL, a folder of frames (recorded at `folder_fps`, by default one
    image per frame at `fps`), or a video file; checked now (VideoError, StreamError, UrlRefused)."""
    from hermes.video.urls import is_url

    if is_url(video):
        return NetworkFrames(video, fps, chunk_frames)
    if Path(video).is_dir():
        return FolderFrames(video, folder_fps or fps)
    return FileFrames(video, fps)
