"""Read-only copies of the memory's bookkeeping, detached from the tensors the model thread mutates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hermes.memory.tiers import Tier


@dataclass
class LayerSnapshot:
    """One layer's slots after the prefix: identity, frame, position, score (numpy arrays)."""

    tier: Tier
    stream_ids: np.ndarray
    frames: np.ndarray
    positions: np.ndarray
    scores: np.ndarray
    summary_count: int


@dataclass
class MemorySnapshot:
    """The memory state at one moment."""

    prefix_len: int
    budget: int
    tokens_seen: int
    next_position: int
    cache_bytes: int
    layers: list[LayerSnapshot]  # the HERMES layers (those with keys and values), in depth order
    # The decoder layer of each entry of `layers` (None: the same numbers), and how many decoder
    # layers hold a fixed-size linear-attention state instead of keys and values (hybrid models).
    layer_indices: list[int] | None = None
    state_layers: int = 0
    state_bytes: int = 0  # of those states, included in cache_bytes; constant

    def layer_names(self) -> list[int]:
        """The decoder layer number of each entry of `layers`, as the model counts its layers."""
        return list(range(len(self.layers))) if self.layer_indices is None else list(self.layer_indices)

    def frames_in_memory(self) -> int:
        """Distinct frames of which some layer still keeps at least one token."""
        if not self.layers:
            return 0
        frames = np.concatenate([layer.frames for layer in self.layers])
        return int(np.unique(frames[frames >= 0]).size)
