"""The HERMES memory: per-layer KV slots with token identity, positions, summary and scores.

Works on plain tensors, one `LayerMemory` per decoder layer (keys and values of shape
(1, heads, length, head_dim), as transformers stores them). Each layer holds, in order, the fixed
text prefix, an optional summary slot and the video slots in stream order. Every layer always has
the same length: transformers sizes one attention mask from the first layer for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec, compact_positions, rotate_keys
from hermes.memory.tiers import Tier, TierMap

SUMMARY_ID = -1


@dataclass
class ChunkMeta:
    """What the engine knows about a chunk's tokens: frame index and absolute position of each."""

    frames: torch.Tensor  # (n,) long
    positions: torch.Tensor  # (axes, n) long

    def __post_init__(self) -> None:
        self.frames = torch.as_tensor(self.frames, dtype=torch.long).cpu()
        positions = torch.as_tensor(self.positions, dtype=torch.long).cpu()
        self.positions = positions.unsqueeze(0) if positions.dim() == 1 else positions
        if self.positions.shape[-1] != self.frames.numel():
            raise ValueError("ChunkMeta needs one frame index and one position per token")

    def __len__(self) -> int:
        return self.frames.numel()


@dataclass
class LayerMemory:
    """One decoder layer's cache and, for each slot after the prefix, what it holds."""

    keys: torch.Tensor
    values: torch.Tensor
    stream_ids: torch.Tensor  # (S,) global stream index, SUMMARY_ID for the summary slot
    frames: torch.Tensor  # (S,) frame index, -1 for the summary slot
    positions: torch.Tensor  # (axes, S) rotary positions
    scores: torch.Tensor  # (S,) last smoothed score, NaN if never scored
    summary_count: int = 0  # evicted tokens folded into the summary so far
    attention: tuple[torch.Tensor, torch.Tensor] | None = None  # last guidance (ids, weights)

    @property
    def has_summary(self) -> bool:
        return self.stream_ids.numel() > 0 and int(self.stream_ids[0]) == SUMMARY_ID

    @property
    def video_offset(self) -> int:
        """Index of the first video slot among the slots after the prefix."""
        return 1 if self.has_summary else 0

    @property
    def video_ids(self) -> torch.Tensor:
        return self.stream_ids[self.video_offset :]


@dataclass
class CompressionReport:
    """What one compression step did, for metrics and the UI."""

    evicted: list[int] = field(default_factory=list)  # per layer
    reindexed: bool = False


class HermesMemory:
    """Fixed-size KV memory managed by a policy (hermes, fifo or full)."""

    def __init__(self, num_layers: int, rope: RopeSpec, config: HermesConfig | None = None) -> None:
        self.config = config or HermesConfig()
        self.rope = rope
        self.tiers = TierMap.partition(num_layers, self.config.shallow_fraction, self.config.deep_fraction)
        self.prefix_len = 0
        self.layers: list[LayerMemory] = []
        self.tokens_seen = 0
        self.compactions = 0

    # -- filling ---------------------------------------------------------------------------
    def set_prefix(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Install the fixed text prefix (positions 0..P-1); clears any video memory."""
        if len(keys) != len(self.tiers) or len(values) != len(self.tiers):
            raise ValueError(f"expected {len(self.tiers)} layers of keys and values")
        self.prefix_len = keys[0].shape[-2]
        axes = self.rope.axes
        self.layers = [
            LayerMemory(
                keys=k,
                values=v,
                stream_ids=torch.empty(0, dtype=torch.long),
                frames=torch.empty(0, dtype=torch.long),
                positions=torch.empty(axes, 0, dtype=torch.long),
                scores=torch.empty(0),
            )
            for k, v in zip(keys, values, strict=True)
        ]
        self.tokens_seen = 0

    def append(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], meta: ChunkMeta) -> None:
        """Add a chunk's new tokens (keys/values of the new tokens only) to every layer."""
        self.absorb(
            [torch.cat([layer.keys, k], dim=-2) for layer, k in zip(self.layers, keys, strict=True)],
            [torch.cat([layer.values, v], dim=-2) for layer, v in zip(self.layers, values, strict=True)],
            meta,
        )

    def absorb(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], meta: ChunkMeta) -> None:
        """Take over full layer tensors that already end with the chunk's tokens.

        This is what a transformers cache holds after a prefill: the old slots plus the new ones,
        so no copy is made.
        """
        if not self.layers:
            raise RuntimeError("set_prefix must be called before video tokens are added")
        n = len(meta)
        if meta.positions.shape[0] != self.rope.axes:
            raise ValueError(f"positions need {self.rope.axes} axes, got {meta.positions.shape[0]}")
        ids = torch.arange(self.tokens_seen, self.tokens_seen + n)
        for layer, k, v in zip(self.layers, keys, values, strict=True):
            if k.shape[-2] != layer.keys.shape[-2] + n:
                raise ValueError(f"layer length {k.shape[-2]} is not {layer.keys.shape[-2]} + {n} new tokens")
            layer.keys, layer.values = k, v
            layer.stream_ids = torch.cat([layer.stream_ids, ids])
            layer.frames = torch.cat([layer.frames, meta.frames])
            layer.positions = torch.cat([layer.positions, meta.positions], dim=1)
            layer.scores = torch.cat([layer.scores, torch.full((n,), float("nan"))])
        self.tokens_seen += n

    # -- positions ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Slots after the prefix; the same in every layer."""
        return self.layers[0].stream_ids.numel() if self.layers else 0

    @property
    def next_position(self) -> int:
        """Where new tokens go: one past the largest position on any axis of any layer."""
        top = max((int(layer.positions.max()) for layer in self.layers if layer.positions.numel()), default=-1)
        return max(top + 1, self.prefix_len)

    def reserve(self, n_tokens: int) -> int:
        """Start position for `n_tokens` new tokens, compacting positions first if they would run out.

        This is lazy re-indexing: positions stay as they were until next position + new tokens +
        the question margin would pass the model's limit.
        """
        limit = self.config.max_positions
        start = self.next_position
        if limit is not None and start + n_tokens + self.config.position_margin > limit:
            self.reindex()
            start = self.next_position
            if start + n_tokens + self.config.position_margin > limit:
                raise ValueError(
                    f"{n_tokens} new tokens do not fit in {limit} positions even after re-indexing: "
                    "lower the budget or the chunk size"
                )
        return start

    def reindex(self) -> None:
        """Eager re-indexing: summary at P, video slots left-compacted after it, keys rotated."""
        p = self.prefix_len
        for layer in self.layers:
            off = layer.video_offset
            old = layer.positions[:, off:]
            new = compact_positions(old, p + off)
            delta = new - old
            if bool(delta.any()):
                start = p + off
                layer.keys = torch.cat(
                    [layer.keys[..., :start, :], rotate_keys(layer.keys[..., start:, :], delta, self.rope)], dim=-2
                )
                layer.positions = torch.cat([layer.positions[:, :off], new], dim=1)
        self.compactions += 1

    # -- eviction --------------------------------------------------------------------------
    def compress(self, policy, attention: Sequence[torch.Tensor | None] | None = None) -> CompressionReport | None:
        """Evict down to the policy's capacity if the slots exceed it; None when nothing to do.

        `attention[l]`, when the policy needs it, is the guidance attention W over layer l's slots
        after the prefix (summary included), as the engine's guidance pass measured it.
        """
        capacity = policy.capacity()
        if capacity is None or self.slots <= capacity:
            return None
        scores = policy.score(self, attention)
        report = CompressionReport()
        for i, layer in enumerate(self.layers):
            if attention is not None and attention[i] is not None:
                layer.attention = (layer.video_ids.clone(), attention[i][layer.video_offset :].float().cpu())
            summarise = policy.summarises(self.tiers[i])
            keep = top_k(scores[i], layer.video_ids, capacity - (1 if summarise else 0))
            report.evicted.append(self._evict(layer, keep, scores[i], summarise))
        if self.config.reindex == "eager":
            self.reindex()
            report.reindexed = True
        return report

    def _evict(self, layer: LayerMemory, keep: torch.Tensor, scores: torch.Tensor, summarise: bool) -> int:
        p, off = self.prefix_len, layer.video_offset
        n_video = layer.stream_ids.numel() - off
        mask = torch.ones(n_video, dtype=torch.bool)
        mask[keep] = False
        evicted = mask.nonzero().squeeze(1)
        kept_slots = keep + off
        device = layer.keys.device
        kv_index = torch.cat([torch.arange(p), p + kept_slots]).to(device)
        keys = layer.keys.index_select(-2, kv_index)
        values = layer.values.index_select(-2, kv_index)
        ids, frames = layer.stream_ids[kept_slots], layer.frames[kept_slots]
        positions, new_scores = layer.positions[:, kept_slots], scores[keep].float()
        if summarise:
            k_sum, v_sum = self._fold_summary(layer, evicted + off)
            keys = torch.cat([keys[..., :p, :], k_sum, keys[..., p:, :]], dim=-2)
            values = torch.cat([values[..., :p, :], v_sum, values[..., p:, :]], dim=-2)
            ids = torch.cat([torch.tensor([SUMMARY_ID]), ids])
            frames = torch.cat([torch.tensor([-1]), frames])
            positions = torch.cat([torch.full((self.rope.axes, 1), p, dtype=torch.long), positions], dim=1)
            new_scores = torch.cat([torch.tensor([float("nan")]), new_scores])
            layer.summary_count += evicted.numel()
        elif layer.has_summary:
            raise RuntimeError("a layer with a summary slot must keep summarising")
        layer.keys, layer.values = keys, values
        layer.stream_ids, layer.frames, layer.positions, layer.scores = ids, frames, positions, new_scores
        return int(evicted.numel())

    def _fold_summary(self, layer: LayerMemory, evicted_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Algorithm 1 as a running mean: v = (n v + sum V_ev) / (n + m), keys phase-aligned first."""
        p = self.prefix_len
        idx = (p + evicted_slots).to(layer.keys.device)
        k_ev = layer.keys.index_select(-2, idx)
        v_ev = layer.values.index_select(-2, idx)
        # Rotate every evicted key to the summary's position, so that they average in one phase.
        delta = p - layer.positions[:, evicted_slots]
        k_ev = rotate_keys(k_ev, delta, self.rope).float()
        n, m = layer.summary_count, evicted_slots.numel()
        k_sum = k_ev.sum(dim=-2, keepdim=True)
        v_sum = v_ev.float().sum(dim=-2, keepdim=True)
        if layer.has_summary:
            k_sum = k_sum + n * layer.keys[..., p : p + 1, :].float()
            v_sum = v_sum + n * layer.values[..., p : p + 1, :].float()
        return (k_sum / (n + m)).to(layer.keys.dtype), (v_sum / (n + m)).to(layer.values.dtype)

    # -- reading -----------------------------------------------------------------------------
    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) per layer, to seed a transformers cache without copying."""
        return [(layer.keys, layer.values) for layer in self.layers]

    def cache_bytes(self) -> int:
        """Bytes held by keys and values of all layers."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def video_tokens_per_layer(self) -> list[int]:
        """Video slots per layer (the summary slot not counted)."""
        return [layer.video_ids.numel() for layer in self.layers]

    def snapshot(self) -> MemorySnapshot:
        """A copy of the bookkeeping (no tensors of keys or values) for the UI and metrics."""
        return MemorySnapshot(
            prefix_len=self.prefix_len,
            budget=self.config.budget,
            tokens_seen=self.tokens_seen,
            next_position=self.next_position if self.layers else 0,
            cache_bytes=self.cache_bytes(),
            layers=[
                LayerSnapshot(
                    tier=self.tiers[i],
                    stream_ids=layer.stream_ids.numpy().copy(),
                    frames=layer.frames.numpy().copy(),
                    positions=layer.positions.numpy().copy(),
                    scores=layer.scores.numpy().copy(),
                    summary_count=layer.summary_count,
                    attention=None
                    if layer.attention is None
                    else (layer.attention[0].numpy().copy(), layer.attention[1].numpy().copy()),
                )
                for i, layer in enumerate(self.layers)
            ],
        )


def top_k(scores: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores, ties going to the newer token, returned in stream order."""
    if k >= scores.numel():
        return torch.arange(scores.numel())
    newest_first = torch.argsort(ids, descending=True)
    _, order = torch.sort(scores.float()[newest_first], descending=True, stable=True)
    return newest_first[order[:k]].sort().values


@dataclass
class LayerSnapshot:
    """One layer's slots after the prefix: identity, frame, position, score (numpy arrays)."""

    tier: Tier
    stream_ids: np.ndarray
    frames: np.ndarray
    positions: np.ndarray
    scores: np.ndarray
    summary_count: int
    attention: tuple[np.ndarray, np.ndarray] | None


@dataclass
class MemorySnapshot:
    """The memory state at one moment, detached from the tensors the worker keeps mutating."""

    prefix_len: int
    budget: int
    tokens_seen: int
    next_position: int
    cache_bytes: int
    layers: list[LayerSnapshot]
