"""Chunking: group decoded or pushed frames into chunks of one size for the engine."""

from __future__ import annotations

import time

import numpy as np
from PIL import Image

from hermes.engine.chunk import Chunk
from hermes.video.decoding import DEFAULT_MAX_SIDE, Frame, fit_size, letterbox, to_rgb_uint8


class Chunker:
    """Group frames into chunks of ``chunk_frames`` frames of one common size.

    Size: ``size`` (w, h) if given, else the first frame's size after the ``max_side``
    downscale. Every later frame of another size is letterboxed into it (aspect kept,
    black bars), so the number of visual tokens per frame stays fixed for the stream.
    Global indices count accepted frames 0, 1, 2, ... across chunks and flushes
    (``reset`` starts over).

    ``fps``: if set, pushed frames are thinned to that rate by timestamp (for webcams
    that deliver faster than the model samples); dropped frames return None.
    """

    def __init__(
        self,
        chunk_frames: int = 16,
        *,
        size: tuple[int, int] | None = None,
        max_side: int | None = DEFAULT_MAX_SIDE,
        fps: float | None = None,
    ) -> None:
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        if size is not None and (size[0] < 1 or size[1] < 1):
            raise ValueError(f"size must be positive (w, h), got {size}")
        if fps is not None and not fps > 0:
            raise ValueError(f"fps must be > 0 or None, got {fps}")
        self.chunk_frames = int(chunk_frames)
        self.max_side = max_side
        self.fps = fps
        self._fixed_size = None if size is None else (int(size[0]), int(size[1]))
        self.reset()

    def reset(self) -> None:
        """Forget all frames, the size and the clock: the next push starts a new stream."""
        self.size: tuple[int, int] | None = self._fixed_size
        self._images: list[np.ndarray] = []
        self._times: list[float] = []
        self._sources: list[int] = []
        self.next_index = 0  # global index of the next accepted frame
        self.chunks_emitted = 0
        self.dropped = 0
        self._t0: float | None = None
        self._next_due: float | None = None

    @property
    def pending(self) -> int:
        """Frames buffered but not yet emitted."""
        return len(self._images)

    def _accept_time(self, t: float) -> bool:
        if self.fps is None:
            return True
        period = 1.0 / self.fps
        if self._next_due is None or t >= self._next_due - 0.25 * period:
            # Advance on a fixed grid to keep the average rate; resync after a gap.
            due = (t if self._next_due is None else self._next_due) + period
            self._next_due = due if due > t else t + period
            return True
        return False

    def push(
        self, frame: Frame | np.ndarray | Image.Image, t: float | None = None, source_index: int = -1
    ) -> Chunk | None:
        """Add one frame; return a full Chunk when ``chunk_frames`` are buffered, else None.

        ``frame`` is a Frame (its t and source_index are used) or an image array
        (see ``to_rgb_uint8``). ``t`` defaults to seconds since the first push.
        """
        if isinstance(frame, Frame):
            image, t, source_index = frame.image, frame.t, frame.source_index
        else:
            image = frame
        image = to_rgb_uint8(image)
        if t is None:
            now = time.monotonic()
            if self._t0 is None:
                self._t0 = now
            t = now - self._t0
        if not self._accept_time(float(t)):
            self.dropped += 1
            return None
        if self.size is None:
            h, w = image.shape[:2]
            self.size = fit_size(w, h, self.max_side)
        image = letterbox(image, self.size)
        self._images.append(image)
        self._times.append(float(t))
        self._sources.append(int(source_index))
        if len(self._images) >= self.chunk_frames:
            return self._emit()
        return None

    def flush(self) -> Chunk | None:
        """Emit the buffered partial chunk (None if empty). The engine pads it to the model's
        frame multiple itself."""
        return self._emit() if self._images else None

    def _emit(self) -> Chunk:
        n = len(self._images)
        chunk = Chunk(
            pixels=np.stack(self._images),
            timestamps=np.asarray(self._times, dtype=np.float64),
            frame_ids=np.arange(self.next_index, self.next_index + n, dtype=np.int64),
            source_ids=np.asarray(self._sources, dtype=np.int64),
            chunk_index=self.chunks_emitted,
        )
        self.next_index += n
        self.chunks_emitted += 1
        self._images, self._times, self._sources = [], [], []
        return chunk
