"""A chunk: the unit of video the engine prefills into the cache at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Chunk:
    """A group of frames of one common size, ready for a processor.

    ``pixels`` (F, H, W, 3) uint8 RGB; ``timestamps`` (F,) seconds; ``frame_ids`` (F,) global
    frame indices in stream order (0, 1, 2, ... across chunks); ``source_ids`` (F,) frame
    numbers in the file (-1 for webcam frames).
    """

    pixels: np.ndarray
    timestamps: np.ndarray
    frame_ids: np.ndarray
    source_ids: np.ndarray
    chunk_index: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of every frame."""
        return int(self.pixels.shape[2]), int(self.pixels.shape[1])

    @property
    def start(self) -> float:
        return float(self.timestamps[0])

    @property
    def end(self) -> float:
        return float(self.timestamps[-1])
