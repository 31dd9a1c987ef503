"""Frames out of decord, with the fallbacks that decord's bugs need, and its errors in words.

`FrameReader` decodes a batch of frames at a time, as fast as decord goes, and steps down only
when a batch fails:

1. FFmpeg's own threads (decord's `num_threads=0`) while that works. decord's threaded decoding
   breaks on VP9 (what a browser's MediaRecorder writes): FFmpeg asks it to wait and it fails
   instead. A batch that fails is retried single-threaded, and the file is read single-threaded
   from then on; H.264 keeps its threads.
2. A batch that fails single-threaded too is read one frame at a time. When every frame then
   decodes, decord's batch path is what is broken for this file (frames narrower than its row
   alignment, 16x16 say, cannot be copied into a batch), and the file is read a frame at a time
   from then on.
3. Once a frame fails in decord, the rest of the batch is decoded by FFmpeg itself, a frame at a
   time, single-threaded and stopping at the first error. decord's worker thread runs ahead of
   the frame asked for, so a damaged packet fails frames *before* it, and which ones depends on
   timing; FFmpeg decodes exactly the packets a frame needs. A frame that FFmpeg cannot decode
   either ends the reading with `FrameFailed`: the file is damaged there, and every frame before
   it has been handed out.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import numpy as np

from hermes.video.native import codec_name, decord, ffmpeg_frame, ffmpeg_tool, quiet_native

log = logging.getLogger(__name__)

# FFmpeg's error codes, as decord's messages print them: no decoder for the stream's codec, no stream.
_DECODER_NOT_FOUND = "-1128613112"
_STREAM_NOT_FOUND = "-1381258232"


class FrameFailed(Exception):
    """Frame `index` of the file cannot be decoded, even alone."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(f"frame {index} cannot be decoded")


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
    """A frame as (H, W, 3). decord hands out frames whose rows are padded (an RGB row of a 16 px wide
    frame takes 96 bytes, not 48) as (H, W, padded_row_bytes / W); the pixels are each row's start."""
    h, w, c = image.shape
    if c == 3:
        return image
    return np.ascontiguousarray(image.reshape(h, w * c)[:, : w * 3].reshape(h, w, 3))


class FrameReader:
    """One decord reader over a file, stepping down from threaded batches as the module says.

    `size` (w, h) has decord scale while decoding (None: the native size). Opening raises OpenFailed.
    Not thread-safe: one reader per consumer thread.
    """

    def __init__(self, path: Path, size: tuple[int, int] | None = None) -> None:
        self.path = path
        self._size = size
        self._threaded = True
        self._one_at_a_time = False
        self._vr = self._open()
        self._broken = False  # a decord reader that failed once keeps failing: the next call reopens it
        self._starts: np.ndarray | None = None
        self._frame_size = size  # (w, h) of the frames handed out, once known: FFmpeg's must match

    @property
    def mode(self) -> str:
        """How this file is being read: "threaded batches", "single-threaded batches" or "one frame at a time"."""
        if self._one_at_a_time:
            return "one frame at a time"
        return "threaded batches" if self._threaded else "single-threaded batches"

    def _open(self):
        w, h = self._size or (-1, -1)
        lib = decord()
        threads = 0 if self._threaded else 1
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
        """Frame 0 (OpenFailed if it cannot be decoded)."""
        try:
            return next(self.read([0]))
        except FrameFailed as e:
            raise open_reason(e.__cause__ or e, self.path, first_frame=True) from e

    def read(self, indices: Sequence[int]) -> Iterator[np.ndarray]:
        """The frames at `indices` (ascending), each (H, W, 3) uint8; FrameFailed at the first that
        cannot be decoded, after the ones before it."""
        indices = [int(i) for i in indices]
        if not self._one_at_a_time:
            batch = self._batch(indices)
            if batch is not None:
                self._frame_size = self._frame_size or (batch.shape[2], batch.shape[1])
                yield from batch
                return
        if (yield from self._singly(indices)):
            self._one_at_a_time = True  # decord decoded every frame alone: its batches are broken here

    def _batch(self, indices: list[int]) -> np.ndarray | None:
        """The frames as one batch, stepping down to a single thread if needed; None if that fails too."""
        try:
            vr = self._reader()
            with quiet_native():
                return vr.get_batch(indices).asnumpy()
        except Exception as e:
            log.debug("decord batch of %s failed (threaded=%s): %s", self.path, self._threaded, e)
            self._broken = True
        if not self._threaded:
            return None
        self._threaded = False
        return self._batch(indices)

    def _singly(self, indices: list[int]) -> Generator[np.ndarray, None, bool]:
        """The frames one at a time; returns whether decord decoded them all itself.

        Once decord fails on a frame, the rest of the batch comes from FFmpeg, one frame each: decord
        reads packets ahead of the frame it returns, so a damaged packet further on fails frames
        before it, and which ones depends on its threads' timing.
        """
        by_decord = True
        for index in indices:
            image = self._decord_frame(index) if by_decord else None
            if image is None:
                by_decord = False
                image = self._exact_frame(index)
            image = unpad(image)
            self._frame_size = self._frame_size or (image.shape[1], image.shape[0])
            yield image
        return by_decord

    def _decord_frame(self, index: int) -> np.ndarray | None:
        try:
            vr = self._reader()
            with quiet_native():
                return vr[index].asnumpy()
        except Exception as e:
            log.debug("decord could not decode frame %d of %s: %s", index, self.path, e)
            self._broken = True
            return None

    def _exact_frame(self, index: int) -> np.ndarray:
        """Frame `index` decoded by FFmpeg alone, single-threaded, failing at the first damaged packet on
        its way (FrameFailed); without ffmpeg, by a fresh decord reader."""
        if self._starts is None:
            self._starts = self.timestamps()[:, 0]
        image = ffmpeg_frame(self.path, float(self._starts[index]), self._frame_size)
        if image is None and ffmpeg_tool("ffmpeg") is None:
            image = self._decord_frame(index)
        if image is None:
            raise FrameFailed(index)
        return image
