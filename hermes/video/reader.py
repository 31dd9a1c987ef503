"""Frames out of decord, with the fallbacks that decord's bugs need, and its errors in words.

`FrameReader` reads frame by frame, the one way decord reads every file on every processor (see
docs/design.md, "Decoding video files"), and steps down only when a frame fails:

1. FFmpeg's own threads (decord's `num_threads=0`) while that works. decord's threaded decoding
   breaks on VP9 (what a browser's MediaRecorder writes): FFmpeg asks it to wait and it fails
   instead. A frame that fails is retried single-threaded, and the file is read single-threaded
   from then on; H.264 keeps its threads.
2. A frame that fails single-threaded too, and the rest of the frames asked for with it, are
   decoded by FFmpeg itself, in one pass from the key frame before it, as FFmpeg's own player
   decodes them: a damaged packet is dropped, the frames that refer to it are concealed, and
   decoding goes on. decord's worker thread runs ahead of the frame asked for, so a damaged packet
   fails frames *before* it, and which ones depends on timing; FFmpeg decodes exactly the packets
   each frame needs. A frame that FFmpeg does not output either comes back as None: skipped.

decord shapes a frame whose RGB rows FFmpeg padded as (H, W, padded row bytes / W) whenever that
divides evenly; `unpad` cuts the rows back to their pixels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from hermes.video.libav import decode_at, pyav, stream_start
from hermes.video.native import codec_name, decord, quiet_native

log = logging.getLogger(__name__)

# FFmpeg's error codes, as decord's messages print them: no decoder for the stream's codec, no stream.
_DECODER_NOT_FOUND = "-1128613112"
_STREAM_NOT_FOUND = "-1381258232"
# How far from its start a frame that FFmpeg decodes may lie and still be the frame asked for, as a
# share of the gap to its neighbours: decord's times are float32 (about 1 ms off after 3 hours).
_SLACK = 0.4


class OpenFailed(Exception):
    """decord cannot open the file or decode its first frame. `reason` says why in words; `container`
    is True when a fresh container (a remux) might help, False when the file is not a video at all,
    has no video stream, or is in a codec the decoder lacks."""

    def __init__(self, reason: str, container: bool) -> None:
        self.reason, self.container = reason, container
        super().__init__(reason)


def open_reason(exc: BaseException, path: Path, first_frame: bool = False) -> OpenFailed:
    """decord's error at opening (or at the first frame) as a reason in words."""
    text = str(exc)
    log.debug("decord could not read %s: %s", path, text)
    if _DECODER_NOT_FOUND in text:
        name = codec_name(path)
        return OpenFailed(f"codec not supported: {name}" if name else "codec not supported by the decoder", False)
    if _STREAM_NOT_FOUND in text or "cannot find video stream" in text:
        return OpenFailed("no video stream", False)
    if text.startswith("Error reading") or "ERROR opening" in text:
        return OpenFailed("not a video file, or its header is damaged", False)
    if "broken metadata" in text:
        return OpenFailed("its header gives no duration or frame count", True)
    if first_frame:
        return OpenFailed("the first frame cannot be decoded (the file is damaged at its start)", True)
    return OpenFailed("the decoder cannot read this file", True)


def unpad(image: np.ndarray) -> np.ndarray:
    """A frame as (H, W, 3). decord hands out frames whose rows are padded (a 96 px RGB row that FFmpeg
    aligned to 128 px takes 384 bytes, not 288) as (H, W, padded_row_bytes / W); the pixels are each
    row's start."""
    h, w, c = image.shape
    if c == 3:
        return image
    return np.ascontiguousarray(image.reshape(h, w * c)[:, : w * 3].reshape(h, w, 3))


def frame_slack(starts: np.ndarray) -> np.ndarray:
    """For each frame start, how far from it a decoded frame's time may lie and still be that frame."""
    gaps = np.diff(starts)
    before = np.concatenate([[np.inf], gaps])
    after = np.concatenate([gaps, [np.inf]])
    nearest = np.minimum(before, after)
    return np.where(np.isfinite(nearest), _SLACK * nearest, 0.5)


class FrameReader:
    """One decord reader over a file, stepping down from FFmpeg's threads as the module says.

    `size` (w, h) has decord scale while decoding (None: the native size). Opening raises OpenFailed.
    Not thread-safe: one reader per consumer thread.
    """

    def __init__(self, path: Path, size: tuple[int, int] | None = None) -> None:
        self.path = path
        self._size = size
        self.threaded = True  # decoding with FFmpeg's threads; False once a frame failed with them
        self.rescued = 0  # frames that decord could not decode and FFmpeg did
        self._vr = self._open()
        self._broken = False  # a decord reader that failed once keeps failing: the next call reopens it
        self._error: Exception | None = None  # decord's last error, for the reason a file cannot be read
        self._starts: np.ndarray | None = None  # frame starts, their slack, the key frames and where the stream
        self._slack: np.ndarray | None = None  # starts on the container's clock: for FFmpeg
        self._keys: np.ndarray | None = None
        self._origin = 0.0
        self._frame_size = size  # (w, h) of the frames handed out, once known: FFmpeg's must match

    def _open(self):
        w, h = self._size or (-1, -1)
        lib = decord()
        threads = 0 if self.threaded else 1
        try:
            with quiet_native():
                return lib.VideoReader(str(self.path), ctx=lib.cpu(0), width=w, height=h, num_threads=threads)
        except Exception as e:  # decord raises RuntimeError/DECORDError/AssertionError
            raise open_reason(e, self.path) from e

    def _reader(self):
        if self._broken:
            self._vr, self._broken = self._open(), False
        return self._vr

    def __len__(self) -> int:
        with quiet_native():
            return len(self._reader())

    def timestamps(self) -> np.ndarray:
        """(start, end) seconds of every frame from the video stream's start, as the container gives them."""
        vr = self._reader()
        with quiet_native():
            return np.asarray(vr.get_frame_timestamp(list(range(len(vr)))), dtype=np.float64)

    def avg_fps(self) -> float:
        with quiet_native():
            return float(self._reader().get_avg_fps())

    def first_frame(self) -> np.ndarray:
        """Frame 0 (OpenFailed, with decord's reason in words, if it cannot be decoded)."""
        image = next(self.read([0]))
        if image is None:
            raise open_reason(self._error or RuntimeError("no frame"), self.path, first_frame=True)
        return image

    def read(self, indices: Sequence[int]) -> Iterator[np.ndarray | None]:
        """The frames at `indices` (ascending), each (H, W, 3) uint8, or None for a frame that neither
        decord nor FFmpeg can decode (its packet is damaged)."""
        indices = [int(i) for i in indices]
        for k, index in enumerate(indices):
            image = self._decord_frame(index)
            if image is None:
                yield from self.read_by_ffmpeg(indices[k:])
                return
            self._frame_size = self._frame_size or (image.shape[1], image.shape[0])
            yield image

    def _decord_frame(self, index: int) -> np.ndarray | None:
        """Frame `index` from decord, retried single-threaded if it fails threaded; None if that fails too."""
        try:
            vr = self._reader()
            with quiet_native():
                return unpad(vr[index].asnumpy())
        except OpenFailed:
            raise
        except Exception as e:
            log.debug("decord could not decode frame %d of %s (threaded=%s): %s", index, self.path, self.threaded, e)
            self._broken, self._error = True, e
        if not self.threaded:
            return None
        self.threaded = False
        return self._decord_frame(index)

    def read_by_ffmpeg(self, indices: Sequence[int]) -> Iterator[np.ndarray | None]:
        """The frames at `indices` (ascending) decoded by FFmpeg in one pass, what `read` falls back to
        (None for those it does not decode); without PyAV, each by a fresh decord reader."""
        indices = [int(i) for i in indices]
        if pyav() is None:
            for index in indices:
                self._broken = True
                yield self._decord_frame(index)
            return
        if self._starts is None or self._slack is None or self._keys is None:
            self._starts = self.timestamps()[:, 0]
            self._slack, self._origin = frame_slack(self._starts), stream_start(self.path)
            with quiet_native():
                self._keys = np.asarray(self._reader().get_key_indices(), dtype=np.int64)
        starts = [float(self._starts[i]) for i in indices]
        slack = [float(self._slack[i]) for i in indices]
        # From the key frame before the first, a little before it: MPEG-TS, say, seeks only roughly.
        before = self._keys[self._keys <= indices[0]]
        key = int(before[-1]) if len(before) else 0
        seek = float(self._starts[key] - self._slack[key])
        images = decode_at(self.path, starts, slack, self._frame_size, seek_s=seek, origin_s=self._origin)
        for image in images:
            if image is not None:
                self._frame_size = self._frame_size or (image.shape[1], image.shape[0])
                self.rescued += 1
            yield image
