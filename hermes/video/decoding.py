"""Video decoding: files through decord, fps sampling, and webcam frames brought to RGB.

Frames are always uint8 RGB numpy arrays of shape (H, W, 3). Two sources feed the same
``Chunker``:

* files: ``VideoFile(path).frames(fps)`` decodes lazily, a batch of frames at a time, so
  a 30-minute video never sits in RAM. Frames larger than ``max_side`` (default 768 px on
  the longer side) are downscaled by decord while decoding, aspect kept. The decoder's
  fallbacks are in ``hermes.video.reader``. A frame that cannot be decoded is skipped, and the
  next frame that decodes says so (``Frame.skipped``); a file that decodes no further raises
  ``VideoDamaged`` after its last good frame (``UntilDamage`` turns that into a clean end and
  collects the skips), and ``check_start`` is what Start asks before it says "Streaming".
* webcam: ``Chunker.push(array)`` takes arrays of any supported layout (RGB, RGBA,
  grayscale, float in [0, 1]) and of varying sizes, and brings them all to one size.

Sampling uses the stream's own timestamps: at ``fps`` the sample times are 0, 1/fps,
2/fps, ... and each picks the frame on screen at that time.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
from PIL import Image

from hermes.video.errors import Skipped, VideoDamaged, VideoError
from hermes.video.libav import check_frame_sizes, pyav, remux
from hermes.video.reader import FrameReader, OpenFailed, open_reason
from hermes.video.sizes import MAX_FRAME_PIXELS, TooLarge

DEFAULT_MAX_SIDE = 768
# Sampled frames that Start decodes before it says "Streaming" (the first few seconds at 1 fps).
START_CHECK_FRAMES = 4
# Timestamps from containers are float32-ish (0.1 -> 0.10000000149); compare with slack.
_EPS = 1e-3


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: ``image`` (H, W, 3) uint8 RGB, ``t`` seconds from stream start,
    ``source_index`` the frame number in the file (-1 for pushed webcam frames); ``skipped``, the
    frames just before it that could not be decoded (None when there were none)."""

    image: np.ndarray
    t: float
    source_index: int = -1
    skipped: Skipped | None = None


@dataclass(frozen=True, slots=True)
class VideoInfo:
    """Metadata of a video file. ``width``/``height`` are native; ``frame_size`` is the
    (w, h) that decoding yields after the ``max_side`` downscale."""

    path: str
    duration: float
    fps: float
    num_frames: int
    width: int
    height: int
    frame_size: tuple[int, int]

    @property
    def name(self) -> str:
        return Path(self.path).name


# --------------------------------------------------------------------------- helpers


def fit_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """(w, h) scaled down so that the longer side is at most ``max_side``, aspect kept.

    Never upscales; ``max_side`` None or <= 0 means no limit. Sides are at least 1 px.
    """
    if not max_side or max_side <= 0 or max(width, height) <= max_side:
        return int(width), int(height)
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def to_rgb_uint8(frame: object) -> np.ndarray:
    """Normalise a webcam/user frame to a contiguous (H, W, 3) uint8 RGB array.

    Accepts uint8 RGB (H, W, 3); RGBA (H, W, 4), alpha dropped (webcams send opaque
    frames, so compositing would only cost time); grayscale (H, W) or (H, W, 1),
    replicated to 3 channels; float arrays in [0, 1]; other integer arrays with
    values in [0, 255]; PIL images. Anything else raises ValueError.
    """
    if isinstance(frame, Image.Image):
        frame = np.asarray(frame.convert("RGB"))
    if not isinstance(frame, np.ndarray):
        raise ValueError(f"frame must be a numpy array (H, W, 3), got {type(frame).__name__}")
    a = frame
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise ValueError(f"frame must have shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); got {frame.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"frame is empty: shape {frame.shape}")

    kind = a.dtype.kind
    if kind == "f":
        if not np.isfinite(a).all():
            raise ValueError("float frame contains NaN or inf")
        lo, hi = float(a.min()), float(a.max())
        if lo < 0.0 or hi > 1.0:
            raise ValueError(f"float frames must be in [0, 1]; got range [{lo:.3g}, {hi:.3g}]")
        a = np.rint(a * 255.0).astype(np.uint8)
    elif kind in "iu" and a.dtype != np.uint8:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 255:
            raise ValueError(f"integer frames must be in [0, 255]; got {a.dtype} range [{lo}, {hi}]")
        a = a.astype(np.uint8)
    elif a.dtype != np.uint8:
        raise ValueError(f"unsupported frame dtype {a.dtype}; use uint8 RGB")

    if a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    elif a.shape[2] == 4:
        a = a[:, :, :3]
    return np.ascontiguousarray(a)


def letterbox(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize a (H, W, 3) uint8 image into ``size`` (w, h), aspect kept, black bars.

    Letterboxing (not stretching) keeps objects undistorted when a webcam changes
    resolution or orientation mid-stream.
    """
    tw, th = size
    h, w = image.shape[:2]
    if (w, h) == (tw, th):
        return image
    scale = min(tw / w, th / h)
    nw, nh = max(1, min(tw, round(w * scale))), max(1, min(th, round(h * scale)))
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BILINEAR))
    if (nw, nh) == (tw, th):
        return resized
    out = np.zeros((th, tw, 3), dtype=np.uint8)
    y0, x0 = (th - nh) // 2, (tw - nw) // 2
    out[y0 : y0 + nh, x0 : x0 + nw] = resized
    return out


def sample_times(duration: float, fps: float, start: float = 0.0) -> np.ndarray:
    """Sample times k / fps (k = 0, 1, ...) that fall in [start, duration).

    The grid is anchored at t = 0, not at ``start``, so that resuming a stream at
    ``start`` picks the same frames as decoding from the beginning. 0.5 fps gives
    0, 2, 4, ... A clip shorter than 1/fps still yields t = 0.
    """
    if fps <= 0 or not math.isfinite(fps):
        raise ValueError(f"fps must be > 0, got {fps}")
    # _EPS absorbs float32 container times: a sample at (or within 1 ms of) the end,
    # e.g. t = 5.0 for a 5 s clip, is past the last frame and is left out.
    k0 = max(0, math.ceil((start - _EPS) * fps))
    k1 = math.ceil((duration - _EPS) * fps)
    if k1 <= 0 and k0 == 0 and duration > 0:
        k1 = 1  # a very short (or 1-frame) clip still has its first frame
    return np.arange(k0, max(k0, k1), dtype=np.float64) / fps


def sample_indices(
    frame_times: np.ndarray,
    fps: float | None,
    start: float = 0.0,
    end: float | None = None,
    duration: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pick frames to decode: (source indices, their timestamps).

    ``frame_times`` are the start times of the native frames (sorted, first at 0);
    ``duration`` defaults to one median frame step past the last start.
    For each sample time the frame on screen then is chosen (the last frame starting
    at or before it). When ``fps`` exceeds the native rate a frame would repeat; each
    source frame is used once, so the effective rate is capped at the native one.
    ``fps=None`` keeps every native frame. ``end`` (exclusive) limits the range.
    """
    ft = np.asarray(frame_times, dtype=np.float64)
    n = ft.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    stop = math.inf if end is None else end
    if fps is None:
        idx = np.nonzero((ft >= start - _EPS) & (ft < stop - _EPS))[0].astype(np.int64)
        return idx, ft[idx]
    if duration is None:
        step = float(np.median(np.diff(ft))) if n > 1 else 0.0
        duration = ft[-1] + (step if step > 0 else 1.0 / fps)
    times = sample_times(min(duration, stop), fps, start)
    idx = np.searchsorted(ft, times + _EPS, side="right") - 1
    idx = np.clip(idx, 0, n - 1).astype(np.int64)
    idx = np.unique(idx)  # sorted, de-duplicated
    return idx, ft[idx]


# --------------------------------------------------------------------------- decoding


def check_frame_size(path: Path, max_pixels: int | None) -> None:
    """VideoError naming the size when a video stream of `path` has frames of more than `max_pixels`
    (None: no limit), by its header or at any key frame (`check_frame_sizes`); none is allocated."""
    try:
        check_frame_sizes(path, max_pixels)
    except TooLarge as e:
        raise VideoError(path, e.reason) from e


class VideoFile:
    """A video file opened for lazy, fps-sampled decoding.

    Opening checks the file (exists, non-empty, frames within `max_pixels` in every video stream,
    before decord opens it: `check_frame_size`), reads the index and decodes the first frame, so a
    bad file fails here with VideoError naming the file and the reason. A file that decord cannot
    open by itself (a browser recording without a duration, Ogg, an MPEG program stream) is first
    copied, stream untouched, into a fresh container by FFmpeg (`hermes.video.libav.remux`); that
    copy lives until `close`. Not thread-safe: use one VideoFile per consumer thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_side: int | None = DEFAULT_MAX_SIDE,
        max_pixels: int | None = MAX_FRAME_PIXELS,
    ) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise VideoError(path, "file not found")
        if not self.path.is_file():
            raise VideoError(path, "not a regular file")
        if self.path.stat().st_size == 0:
            raise VideoError(path, "file is empty (0 bytes)")
        check_frame_size(self.path, max_pixels)
        self._remuxed: Path | None = None
        reader, first = self._open_first()
        n = len(reader)
        if n <= 0:
            raise VideoError(path, "video has no frames")
        try:
            ts = reader.timestamps()
            avg_fps = reader.avg_fps()
        except Exception as e:
            raise VideoError(path, open_reason(e, self.path).reason) from e
        height, width = int(first.shape[0]), int(first.shape[1])

        # Normalise timestamps so the first frame is at t = 0 (containers may start later).
        starts = ts[:, 0] - ts[0, 0]
        if not np.all(np.isfinite(starts)) or (n > 1 and np.any(np.diff(starts) < 0)):
            # Broken pts: fall back to the nominal rate.
            rate = avg_fps if avg_fps > 0 else 25.0
            starts = np.arange(n, dtype=np.float64) / rate
        self._starts = starts
        end = float(ts[-1, 1] - ts[0, 0]) if np.isfinite(ts[-1, 1]) else 0.0
        if not end > starts[-1]:
            # Missing end time: assume the last frame lasts one nominal frame.
            end = starts[-1] + 1.0 / (avg_fps if avg_fps > 0 else 25.0)
        if not avg_fps > 0:
            avg_fps = n / end

        out_w, out_h = fit_size(width, height, max_side)
        if (out_w, out_h) != (width, height):
            # Let decord scale while decoding: a 4K frame is never held at full size.
            try:
                reader = FrameReader(reader.path, (out_w, out_h))
            except OpenFailed as e:
                raise VideoError(path, e.reason) from e
        self._reader: FrameReader | None = reader
        self.info = VideoInfo(
            path=str(self.path),
            duration=float(end),
            fps=avg_fps,
            num_frames=n,
            width=width,
            height=height,
            frame_size=(out_w, out_h),
        )

    def _open_first(self) -> tuple[FrameReader, np.ndarray]:
        """A reader over the file (or over a remuxed copy of it) and its first frame."""
        try:
            reader = FrameReader(self.path)
            return reader, reader.first_frame()
        except OpenFailed as e:
            failed = e
        self._remuxed = remux(self.path) if failed.container else None
        if self._remuxed is None:
            rewritable = failed.container and pyav() is None
            hint = " (install PyAV, pip install av, to have its container rewritten)" if rewritable else ""
            raise VideoError(self.path, failed.reason + hint) from failed
        self._cleanup = weakref.finalize(self, self._remuxed.unlink, missing_ok=True)
        try:
            reader = FrameReader(self._remuxed)
        except OpenFailed as e:
            self.close()
            raise VideoError(self.path, failed.reason) from e  # the copy got no further than the file
        try:
            return reader, reader.first_frame()
        except OpenFailed as e:
            self.close()
            raise VideoError(self.path, e.reason) from e

    # -- context manager / cleanup
    def close(self) -> None:
        """Free the decoder and any remuxed copy (the object cannot decode afterwards)."""
        self._reader = None
        if self._remuxed is not None:
            self._cleanup()

    def __enter__(self) -> VideoFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def threaded(self) -> bool:
        """Whether decord still decodes this file with FFmpeg's threads (a frame that fails with them
        sets it to one thread, see `hermes.video.reader`)."""
        if self._reader is None:
            raise VideoError(self.path, "video was closed")
        return self._reader.threaded

    @property
    def rescued_frames(self) -> int:
        """Frames so far that decord could not decode and FFmpeg did (a damaged stretch of the file)."""
        if self._reader is None:
            raise VideoError(self.path, "video was closed")
        return self._reader.rescued

    @property
    def frame_times(self) -> np.ndarray:
        """Start time (s) of every native frame, first at 0."""
        return self._starts

    def sample(self, fps: float | None, start: float = 0.0, end: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(source indices, timestamps) that ``frames`` would yield."""
        return sample_indices(self._starts, fps, start, end, duration=self.info.duration)

    def count(self, fps: float | None, start: float = 0.0, end: float | None = None) -> int:
        """Number of frames ``frames(fps, start, end)`` yields (for progress bars)."""
        return int(self.sample(fps, start, end)[0].shape[0])

    def frames(
        self,
        fps: float | None,
        *,
        start: float = 0.0,
        end: float | None = None,
        batch_size: int = 16,
    ) -> Iterator[Frame]:
        """Yield frames sampled at ``fps`` (None: every frame) from ``start`` to ``end`` s.

        Decodes ``batch_size`` frames at a time (memory stays bounded). A frame that cannot be
        decoded is skipped, and the next one that decodes carries the count (``Frame.skipped``). A
        file that decodes no further yields every frame up to the last good one, then raises
        VideoDamaged saying where.
        """
        if self._reader is None:
            raise VideoError(self.path, "video was closed")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        idx, times = self.sample(fps, start, end)
        return self._iter(idx, times, batch_size)

    def _iter(self, idx: np.ndarray, times: np.ndarray, batch_size: int) -> Iterator[Frame]:
        good_until: float | None = None
        skipped: list[float] = []  # times of the frames that failed since the last good one
        for b0 in range(0, len(idx), batch_size):
            reader = self._reader
            if reader is None:
                raise VideoError(self.path, "video was closed")
            position = b0
            try:
                for image in reader.read(idx[b0 : b0 + batch_size]):
                    t = float(times[position])
                    if image is None:
                        skipped.append(t)
                    else:
                        note = Skipped(skipped[0], len(skipped)) if skipped else None
                        yield Frame(image, t, int(idx[position]), note)
                        good_until, skipped = t, []
                    position += 1
            except OpenFailed as e:  # the file went away, or cannot be opened again
                raise VideoDamaged(self.path, good_until, float(times[position])) from e
        if skipped:  # nothing decodes after the last good frame
            raise VideoDamaged(self.path, good_until, skipped[0])


class UntilDamage:
    """Frames up to the last good one: iterating ends where the file decodes no further, and
    `damage` then holds the VideoDamaged that says where (None when the file ended normally).
    `skips` collects the frames skipped on the way, each also handed to `on_skip` as it is found.
    For consumers that must finish with what was read: the CLI, the eval harness, a live stream."""

    def __init__(self, frames: Iterable[Frame], on_skip: Callable[[Skipped], None] | None = None) -> None:
        self._frames = iter(frames)
        self._on_skip = on_skip
        self.damage: VideoDamaged | None = None
        self.skips: list[Skipped] = []

    def __iter__(self) -> UntilDamage:
        return self

    def __next__(self) -> Frame:
        try:
            frame = next(self._frames)
        except VideoDamaged as exc:
            self.damage = exc
            raise StopIteration from None
        if frame.skipped is not None:
            self.skips.append(frame.skipped)
            if self._on_skip is not None:
                self._on_skip(frame.skipped)
        return frame


def probe(path: str | os.PathLike[str], *, max_side: int | None = DEFAULT_MAX_SIDE) -> VideoInfo:
    """Metadata of a video file (raises VideoError if it cannot be opened or its first frame decoded)."""
    with VideoFile(path, max_side=max_side) as vf:
        return vf.info


def check_start(
    path: str | os.PathLike[str],
    fps: float,
    *,
    max_side: int | None = DEFAULT_MAX_SIDE,
    frames: int = START_CHECK_FRAMES,
) -> VideoInfo:
    """What Start checks before it says "Streaming": the file opens and its first `frames` frames at
    `fps` that decode do (a damaged one among them is skipped, as the stream will), through the same
    reader a stream uses. Raises VideoError with the reason otherwise ("the file is damaged after
    0:01": nothing decodes after it); a file that decodes no further later streams up to there."""
    with VideoFile(path, max_side=max_side) as vf:
        try:
            for _ in islice(vf.frames(fps, batch_size=frames), frames):
                pass
        except VideoDamaged as exc:
            raise VideoError(path, exc.reason) from exc
        return vf.info


def iter_frames(
    path: str | os.PathLike[str],
    fps: float | None,
    *,
    max_side: int | None = DEFAULT_MAX_SIDE,
    start: float = 0.0,
    end: float | None = None,
    batch_size: int = 16,
) -> Iterator[Frame]:
    """Open ``path`` and yield its frames sampled at ``fps`` (see VideoFile.frames).

    The file is opened (and checked) on the first ``next()``, not at call time.
    """
    with VideoFile(path, max_side=max_side) as vf:
        yield from vf.frames(fps, start=start, end=end, batch_size=batch_size)
