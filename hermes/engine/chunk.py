"""A chunk: the unit of video the engine prefills into the cache at once, and how far a stream has come."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def padded_frames(n: int, multiple: int) -> int:
    """Frames a chunk of `n` frames is prefilled as, for a model that merges frames `multiple` at a
    time (Qwen2.5-VL and Qwen3-VL: pairs): up to the next multiple."""
    return -(-n // multiple) * multiple


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

    def padded_pixels(self, multiple: int) -> np.ndarray:
        """The frames as the model takes them: the last one repeated up to `padded_frames`."""
        extra = padded_frames(self.num_frames, multiple) - self.num_frames
        return np.concatenate([self.pixels, np.repeat(self.pixels[-1:], extra, axis=0)]) if extra else self.pixels


@dataclass
class StreamProgress:
    """How far a stream has come: the frames and chunks its memory took, and the stream time of the
    last frame."""

    frames_seen: int = 0
    stream_time_s: float = 0.0
    chunks_seen: int = 0

    def advance(self, chunk: Chunk) -> None:
        """`chunk`'s frames are in (its count of chunks moves on once the chunk is fully handled)."""
        self.frames_seen += chunk.num_frames
        self.stream_time_s = chunk.end
