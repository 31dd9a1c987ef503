"""Video decoding: files through decord, fps sampling, and webcam frames brought to RGB.

Frames are always uint8 RGB numpy arrays of shape (H, W, 3). Two sources feed the same
``Chunker``:

* files: ``VideoFile(path).frames(fps)`` decodes lazily, a batch of frames at a time, so
  a 30-minute video never sits in RAM. Frames larger than ``max_side`` (default 768 px on
  the longer side) are downscaled by decord while decoding, aspect kept.
* webcam: ``Chunker.push(array)`` takes arrays of any supported layout (RGB, RGBA,
  grayscale, float in [0, 1]) and of varying sizes, and brings them all to one size.

Sampling uses the stream's own timestamps: at ``fps`` the sample times are 0, 1/fps,
2/fps, ... and each picks the frame on screen at that time.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

DEFAULT_MAX_SIDE = 768
# Timestamps from containers are float32-ish (0.1 -> 0.10000000149); compare with slack.
_EPS = 1e-3


class VideoError(ValueError):
    """A video file cannot be used: missing, empty, not a video, corrupt or without frames."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"Cannot read video '{Path(path).name}': {reason}")


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: ``image`` (H, W, 3) uint8 RGB, ``t`` seconds from stream start,
    ``source_index`` the frame number in the file (-1 for pushed webcam frames)."""

    image: np.ndarray
    t: float
    source_index: int = -1


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

_decord_lock = threading.Lock()
_decord_ready = False


def _decord():
    """Import decord lazily (webcam-only use does not need it) and quieten ffmpeg's logs:
    errors reach the caller as VideoError. Set HERMES_VIDEO_DEBUG=1 to see them."""
    global _decord_ready
    try:
        import decord
    except ImportError as e:  # e.g. platforms without decord wheels
        raise ImportError("decord is needed to read video files: pip install decord") from e
    with _decord_lock:
        if not _decord_ready:
            if not os.environ.get("HERMES_VIDEO_DEBUG"):
                decord.logging.set_level(decord.logging.QUIET)
            _decord_ready = True
    return decord


_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\]\s+\S+:\d+:\s*")


def _short(e: BaseException) -> str:
    """A readable reason from a decord error (they carry C++ file/line prefixes)."""
    text = str(e).strip() or type(e).__name__
    if "cannot find video stream" in text:
        return "no video stream (0 frames)"
    if text.startswith("Error reading"):
        return "not a video file, or its header/index is damaged"
    lines = [_LOG_PREFIX.sub("", ln).strip() for ln in text.splitlines()]
    msg = next((ln for ln in reversed(lines) if ln), text)
    return msg[-200:]


class VideoFile:
    """A video file opened for lazy, fps-sampled decoding.

    Opening checks the file (exists, non-empty), reads the index and decodes the first
    frame, so a bad file fails here with VideoError naming the file. Not thread-safe:
    use one VideoFile per consumer thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_side: int | None = DEFAULT_MAX_SIDE,
        num_threads: int = 0,
    ) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise VideoError(path, "file not found")
        if not self.path.is_file():
            raise VideoError(path, "not a regular file")
        if self.path.stat().st_size == 0:
            raise VideoError(path, "file is empty (0 bytes)")
        decord = _decord()
        self._num_threads = num_threads
        try:
            vr = decord.VideoReader(str(self.path), ctx=decord.cpu(0), num_threads=num_threads)
            n = len(vr)
        except Exception as e:  # decord raises RuntimeError/DECORDError/AssertionError
            raise VideoError(path, f"cannot open: {_short(e)}") from e
        if n <= 0:
            raise VideoError(path, "video has no frames")
        try:
            first = vr[0].asnumpy()
            ts = np.asarray(vr.get_frame_timestamp(list(range(n))), dtype=np.float64)
            avg_fps = float(vr.get_avg_fps())
        except Exception as e:
            raise VideoError(path, f"cannot decode the first frame: {_short(e)}") from e
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
                vr = decord.VideoReader(
                    str(self.path),
                    ctx=decord.cpu(0),
                    width=out_w,
                    height=out_h,
                    num_threads=num_threads,
                )
            except Exception as e:
                raise VideoError(path, f"cannot reopen for resizing: {_short(e)}") from e
        self._vr = vr
        self.info = VideoInfo(
            path=str(self.path),
            duration=float(end),
            fps=avg_fps,
            num_frames=n,
            width=width,
            height=height,
            frame_size=(out_w, out_h),
        )

    # -- context manager / cleanup
    def close(self) -> None:
        """Free the decoder (the object cannot decode afterwards)."""
        self._vr = None

    def __enter__(self) -> VideoFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

        Decodes ``batch_size`` frames at a time (memory stays bounded). Decoding errors
        in the middle of a file (truncated or damaged data) raise VideoError.
        """
        if self._vr is None:
            raise VideoError(self.path, "video was closed")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        idx, times = self.sample(fps, start, end)
        return self._iter(idx, times, batch_size)

    def _iter(self, idx: np.ndarray, times: np.ndarray, batch_size: int) -> Iterator[Frame]:
        for b0 in range(0, len(idx), batch_size):
            bidx = idx[b0 : b0 + batch_size]
            vr = self._vr
            if vr is None:
                raise VideoError(self.path, "video was closed")
            try:
                batch = vr.get_batch([int(i) for i in bidx]).asnumpy()
            except Exception as e:
                raise VideoError(
                    self.path,
                    f"decoding failed at frames {int(bidx[0])}..{int(bidx[-1])}: {_short(e)}",
                ) from e
            for j in range(batch.shape[0]):
                yield Frame(batch[j], float(times[b0 + j]), int(bidx[j]))


def probe(path: str | os.PathLike[str], *, max_side: int | None = DEFAULT_MAX_SIDE) -> VideoInfo:
    """Metadata of a video file (raises VideoError if it cannot be decoded)."""
    with VideoFile(path, max_side=max_side) as vf:
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
