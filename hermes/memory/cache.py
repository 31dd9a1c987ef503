"""`HermesCache`: a `transformers` Cache whose layers are the HERMES memory.

Each `HermesLayer` holds, in order, the fixed text prefix, an optional summary slot and the video
slots in stream order, and for every slot after the prefix what it holds: stream id, frame,
rotary position and last score. The model writes into the layer through `update`, as into any
transformers cache; the engine then either commits the new tokens as video slots (`commit`) or
drops them (`discard`), so that a question or a guidance pass leaves the memory bit-identical.

Storage is preallocated: keys and values live in one buffer per layer, sized on first use for the
prefix, the slots the policy keeps, one chunk and a question margin (`reserve`). Eviction, the
summary fold and re-indexing rewrite that buffer in place, so a stream past its budget allocates
no new cache tensors. Every layer always has the same length: transformers sizes one attention
mask from the first layer for all of them.

In 16-bit caches each layer also keeps every slot's key as the model computed it, with the
position it was computed at (its origin). A re-index rotates that origin key to the new position
in one step and rounds once, so keys do not drift however many compactions a stream goes through
(rotating the already rotated, already rounded key again would compound the rounding).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from hermes.memory.buffer import BufferLayer, grown_buffer, kv_bytes
from hermes.memory.config import HermesConfig
from hermes.memory.hybrid import HybridCache
from hermes.memory.means import group_mean, phase_aligned, running_mean
from hermes.memory.rope import RopeSpec, compact_positions, rotate_keys
from hermes.memory.selection import Merge
from hermes.memory.snapshot import LayerSnapshot, MemorySnapshot
from hermes.memory.state import StateLayer
from hermes.memory.tiers import TierMap

SUMMARY_ID = -1
# Tokens of storage beyond the first chunk's size: a later chunk of the same frames may be a few
# tokens longer (Qwen3-VL writes each frame pair's time, which gains a digit at 10 s, 100 s, ...),
# and should not make the buffers grow.
CHUNK_SLACK = 64
# Dtypes too coarse to rotate cached keys again and again: their layers keep origin keys.
LOW_PRECISION = (torch.bfloat16, torch.float16)


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token takes in a HermesCache over all layers: key, value and, in 16-bit caches,
    the origin key."""
    return num_layers * kv_bytes(1, kv_heads, head_dim, dtype.itemsize, 3 if dtype in LOW_PRECISION else 2)


def rank_within_frame(frames: torch.Tensor) -> torch.Tensor:
    """Each token's index among the tokens of its frame, in order: a frame's tokens are its
    patches in raster order, so this is the patch index the rivals compare across frames."""
    frames = torch.as_tensor(frames, dtype=torch.long)
    if frames.numel() == 0:
        return frames.clone()
    first = torch.ones_like(frames, dtype=torch.bool)
    first[1:] = frames[1:] != frames[:-1]
    starts = torch.arange(frames.numel())[first]
    run = torch.cumsum(first.long(), 0) - 1
    return torch.arange(frames.numel()) - starts[run]


@dataclass
class ChunkMeta:
    """What the engine knows about a chunk's tokens: frame index, absolute position and patch
    index (the token's place within its frame; by default its rank among its frame's tokens)."""

    frames: torch.Tensor  # (n,) long
    positions: torch.Tensor  # (axes, n) long
    patches: torch.Tensor | None = None  # (n,) long

    def __post_init__(self) -> None:
        self.frames = torch.as_tensor(self.frames, dtype=torch.long).cpu()
        positions = torch.as_tensor(self.positions, dtype=torch.long).cpu()
        self.positions = positions.unsqueeze(0) if positions.dim() == 1 else positions
        if self.positions.shape[-1] != self.frames.numel():
            raise ValueError("ChunkMeta needs one frame index and one position per token")
        if self.patches is None:
            self.patches = rank_within_frame(self.frames)
        self.patches = torch.as_tensor(self.patches, dtype=torch.long).cpu()
        if self.patches.numel() != self.frames.numel():
            raise ValueError("ChunkMeta needs one patch index per token")

    def __len__(self) -> int:
        return self.frames.numel()


class HermesLayer(BufferLayer):
    """One decoder layer's memory: a preallocated key/value buffer and the bookkeeping of its slots.

    `length` counts every token held, scratch tokens (a question, a guidance prompt) included;
    `committed` only those of the memory."""

    is_croppable = True

    def __init__(self, rope: RopeSpec) -> None:
        super().__init__()
        self.rope = rope
        self._k0: torch.Tensor | None = None  # origin keys, in 16-bit caches only
        self.committed = 0  # tokens that belong to the memory: prefix + slots
        self.prefix_len = 0
        self.stream_ids = torch.empty(0, dtype=torch.long)  # SUMMARY_ID for the summary slot
        self.frames = torch.empty(0, dtype=torch.long)  # -1 for the summary slot
        self.patches = torch.empty(0, dtype=torch.long)  # index within the frame; -1 for the summary
        self.positions = torch.empty(rope.axes, 0, dtype=torch.long)
        self.origins = torch.empty(rope.axes, 0, dtype=torch.long)  # where each slot's origin key was computed
        self.scores = torch.empty(0)  # last smoothed score, NaN if never scored
        self.summary_count = 0  # evicted tokens folded into the summary so far

    # -- the transformers layer interface (the rest is BufferLayer's; `start` stays 0) -----------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape[0] != 1:
            raise ValueError(f"a HermesCache holds one stream (batch size 1), got batch size {key_states.shape[0]}")
        self._k = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[-1])
        self._v = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[-1])
        if key_states.dtype in LOW_PRECISION:
            self._k0 = self._k.new_empty(self._k.shape)
        self.is_initialized = True

    def reset(self) -> None:
        """Empty the layer as transformers' `reset` empties a static cache: the keys and values are
        zeroed in place and the storage is kept, so that the next stream fills it without allocating."""
        for t in self._buffers() if self.is_initialized else ():
            t.zero_()
        self.start = self.length = self.committed = self.prefix_len = self.summary_count = 0
        self.stream_ids, self.frames, self.scores = self.stream_ids[:0], self.frames[:0], self.scores[:0]
        self.patches = self.patches[:0]
        self.positions, self.origins = self.positions[:, :0], self.origins[:, :0]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last scratch tokens (transformers' convention: a negative count)."""
        if tokens_to_remove > 0 or self.length + tokens_to_remove < self.committed:
            raise ValueError("a HermesCache can only crop scratch tokens (questions, answers), not its memory")
        self.length += tokens_to_remove

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("a HermesCache holds one stream: beam search and batch expansion are not supported")

    batch_repeat_interleave = batch_select_indices = reorder_cache

    # -- storage --------------------------------------------------------------------------------
    @property
    def allocated(self) -> int:
        """Tokens the buffer can hold without growing."""
        return 0 if self._k is None else self._k.shape[-2]

    def reserve(self, n: int, total: int | None = None) -> None:
        """Make room for `n` more tokens; when the buffer must grow, size it for `total` tokens,
        or, when the total is unknown (a cache without a budget), half as much again as now."""
        need = self.length + n
        if need <= self.allocated:
            return
        size = max(need, total if total is not None else self.allocated * 3 // 2)
        self._k, self._v = (grown_buffer(t, size, self.length) for t in (self._k, self._v))
        if self._k0 is not None:
            self._k0 = grown_buffer(self._k0, size, self.committed)

    def origin_columns(self) -> torch.Tensor | None:
        """The slots' origin keys (16-bit caches only; the prefix's are never read, nor saved)."""
        return None if self._k0 is None else self._k0[..., self.prefix_len : self.committed, :]

    def restore_origins(self, origins: torch.Tensor) -> None:
        """Origin keys for the slots of a layer restored with `restore_columns` (its prefix set)."""
        with torch.inference_mode(False):
            self._k0 = torch.zeros_like(self._k)
            self._k0[..., self.prefix_len : self.prefix_len + origins.shape[2], :] = origins

    def nbytes(self) -> int:
        """Bytes of keys and values of the memory (prefix and slots)."""
        if self._k is None:
            return 0
        return kv_bytes(
            self.committed, self._k.shape[1], self._k.shape[-1], self._k.element_size(), len(self._buffers())
        )

    # -- slots ----------------------------------------------------------------------------------
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

    @property
    def slots(self) -> int:
        return self.stream_ids.numel()

    def commit_prefix(self) -> None:
        """Everything held becomes the fixed text prefix."""
        if self.slots:
            raise RuntimeError("the prefix must be committed before any video token")
        self.committed = self.prefix_len = self.length

    def commit(self, ids: torch.Tensor, meta: ChunkMeta) -> None:
        """The scratch tokens become video slots: they are the chunk that `meta` describes."""
        n = len(meta)
        if self.length != self.committed + n:
            raise ValueError(f"layer holds {self.length - self.committed} new tokens, the chunk has {n}")
        self.stream_ids = torch.cat([self.stream_ids, ids])
        self.frames = torch.cat([self.frames, meta.frames])
        self.patches = torch.cat([self.patches, meta.patches])
        self.positions = torch.cat([self.positions, meta.positions], dim=1)
        self.origins = torch.cat([self.origins, meta.positions], dim=1)
        self.scores = torch.cat([self.scores, torch.full((n,), float("nan"))])
        if self._k0 is not None:
            self._k0[..., self.committed : self.length, :] = self._k[..., self.committed : self.length, :]
        self.committed = self.length

    def discard(self) -> None:
        """Forget the scratch tokens: the layer holds its memory exactly as before."""
        self.start, self.length = 0, self.committed

    def hide_slots(self) -> None:
        """Until `discard`: the model reads a copy of the prefix written after the memory, and what
        is written after that, instead of the memory itself (a question's own context, as ReKV's
        code builds it: the prefix and the retrieved frames alone). The memory is not written."""
        if self.length != self.committed:
            raise RuntimeError("hide the slots before any scratch token")
        p = self.prefix_len
        self.reserve(p)
        for t in (self._k, self._v):
            t[..., self.length : self.length + p, :] = t[..., :p, :]
        self.start, self.length = self.length, self.length + p

    def evict(self, keep: torch.Tensor, scores: torch.Tensor, summarise: bool, merges: Sequence[Merge] = ()) -> int:
        """Keep the video slots `keep` (indices in stream order) with their `scores`, in place; fold
        the others into the summary slot if `summarise`. Returns how many were evicted.

        Each of `merges` is a group of video slots whose first one is kept: that slot then holds
        the group's mean key and value (weighed, if the group has weights) instead of its own (a
        prototype), keys phase-aligned to it first, as the summary's are."""
        if self.length != self.committed:
            raise RuntimeError("discard or commit the scratch tokens before evicting")
        if self.has_summary and not summarise:
            raise RuntimeError("a layer with a summary slot must keep summarising")
        p, off, head = self.prefix_len, self.video_offset, int(summarise)
        mask = torch.ones(self.slots - off, dtype=torch.bool)
        mask[keep] = False
        evicted = mask.nonzero().squeeze(1)
        # The prototypes and the summary are read before the buffers move.
        prototypes = [self._merge(m.slots + off, m.weights) for m in merges]
        summary = self._fold(evicted + off) if summarise else None
        src = (p + keep + off).to(self.device)
        # index_select makes a temporary; the buffers themselves are rewritten, never replaced.
        for t in self._buffers():
            t[..., p + head : p + head + keep.numel(), :] = t.index_select(-2, src)
        column = {int(slot): p + head + i for i, slot in enumerate(keep)}
        for merge, values in zip(merges, prototypes, strict=True):
            self._write_column(column[int(merge.slots[0])], values)
        if summary is not None:
            self._write_column(p, summary)
            self.summary_count += evicted.numel()
        self._keep_books(keep + off, scores.float(), summarise)
        self.length = self.committed = p + self.slots
        return int(evicted.numel())

    def _write_column(self, at: int, values: Sequence[torch.Tensor]) -> None:
        """Write one column of every buffer: `values` holds one tensor per buffer (`_buffers`)."""
        for t, value in zip(self._buffers(), values, strict=True):
            t[..., at : at + 1, :] = value

    def _keep_books(self, slots: torch.Tensor, scores: torch.Tensor, summary: bool) -> None:
        """Keep the bookkeeping of `slots` (indices after the prefix), now scored `scores`, after a
        summary slot's at position P if `summary`."""
        books = [self.stream_ids[slots], self.frames[slots], self.patches[slots], scores]
        positions, origins = self.positions[:, slots], self.origins[:, slots]
        if summary:
            heads = torch.tensor([SUMMARY_ID]), torch.tensor([-1]), torch.tensor([-1]), torch.tensor([float("nan")])
            books = [torch.cat([h, b]) for h, b in zip(heads, books, strict=True)]
            at_p = torch.full((self.rope.axes, 1), self.prefix_len, dtype=torch.long)
            positions, origins = torch.cat([at_p, positions], dim=1), torch.cat([at_p, origins], dim=1)
        self.stream_ids, self.frames, self.patches, self.scores = books
        self.positions, self.origins = positions, origins

    def _buffers(self) -> tuple[torch.Tensor, ...]:
        """The storage laid out by slot: keys, values and, if kept, origin keys."""
        return (self._k, self._v) if self._k0 is None else (self._k, self._v, self._k0)

    def origin_keys(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys to rotate from (the whole buffer, prefix included), and the positions of the slots
        after the prefix: the origin keys where kept, else the keys themselves."""
        return (self._k, self.positions) if self._k0 is None else (self._k0, self.origins)

    def _fold(self, evicted_slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The summary once `evicted_slots` (slot indices after the prefix) are folded in
        (Algorithm 1, `running_mean`), at position P; as many tensors as `_buffers`."""
        p = self.prefix_len
        keys, at = self.origin_keys()
        k, v = phase_aligned(keys, self._v, p + evicted_slots, p - at[:, evicted_slots], self.rope)
        summary = (keys[..., p : p + 1, :], self._v[..., p : p + 1, :]) if self.has_summary else None
        k, v = running_mean(k, v, self.summary_count, summary)
        k, v = k.to(self._k.dtype), v.to(self._v.dtype)
        return (k, v) if self._k0 is None else (k, v, k)  # at P, where its origin is

    def _merge(self, slots: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The prototype of `slots` (slot indices after the prefix; `group_mean`), keys first rotated
        to where the first slot sits; as many tensors as `_buffers` (the origin key too, if kept)."""
        keys, at = self.origin_keys()
        first = slots[:1]
        aligned = phase_aligned(keys, self._v, self.prefix_len + slots, at[:, first] - at[:, slots], self.rope)
        k, v = group_mean(*aligned, weights)
        v = v.to(self._v.dtype)
        if self._k0 is None:
            return k.to(self._k.dtype), v
        # The origin key sits at the first slot's origin; the key itself at its current position.
        k_now = rotate_keys(k, self.positions[:, first] - self.origins[:, first], self.rope)
        return k_now.to(self._k.dtype), v, k.to(self._k0.dtype)

    def reindex(self) -> None:
        """Summary at P, video slots left-compacted after it (per axis), keys rotated in place."""
        p, off = self.prefix_len, self.video_offset
        old = self.positions[:, off:]
        new = compact_positions(old, p + off)
        if bool((new - old).any()):
            start, end = p + off, self.committed
            keys, at = self.origin_keys()
            self._k[..., start:end, :] = rotate_keys(keys[..., start:end, :], new - at[:, off:], self.rope)
            self.positions = torch.cat([self.positions[:, :off], new], dim=1)

    def snapshot(self, tier) -> LayerSnapshot:
        return LayerSnapshot(
            tier=tier,
            stream_ids=self.stream_ids.numpy().copy(),
            frames=self.frames.numpy().copy(),
            positions=self.positions.numpy().copy(),
            scores=self.scores.numpy().copy(),
            summary_count=self.summary_count,
        )


class HermesCache(HybridCache):
    """The hierarchical memory of one stream, as a transformers Cache the model runs on directly.

    `config` gives the budget and the re-indexing mode; `rope` the model's rotary frequencies;
    `capacity` the slots after the prefix that each layer keeps (None: no limit), used to size the
    storage once. `linear` lists the decoder layers that are linear attention (a hybrid model's
    Gated DeltaNet layers): those hold a fixed-size `StateLayer`, every other layer a `HermesLayer`.
    The tiers, scores, smoothing and eviction run over the HERMES layers only (`kv_layers`, in
    depth order); their tier is decided here, once, from the config.
    """

    def __init__(
        self,
        num_layers: int,
        rope: RopeSpec,
        config: HermesConfig | None = None,
        capacity: int | None = None,
        linear: Sequence[int] = (),
    ):
        self.config = config or HermesConfig()
        self.rope = rope
        self.capacity = capacity
        linear = set(linear)
        layers = [StateLayer() if i in linear else HermesLayer(rope) for i in range(num_layers)]
        self.kv_layers: list[HermesLayer] = [layer for layer in layers if isinstance(layer, HermesLayer)]
        self.state_layers: list[StateLayer] = [layer for layer in layers if isinstance(layer, StateLayer)]
        # The decoder layer of each HERMES layer, for the views that name layers as the model does.
        self.kv_layer_indices = [i for i, layer in enumerate(layers) if isinstance(layer, HermesLayer)]
        self.tiers = TierMap.for_config(len(self.kv_layers), self.config)
        self.tokens_seen = 0
        self.compactions = 0
        super().__init__(layers=layers)

    # -- reading ---------------------------------------------------------------------------------
    @property
    def prefix_len(self) -> int:
        return self.kv_layers[0].prefix_len

    @property
    def slots(self) -> int:
        """Slots after the prefix; the same in every layer."""
        return self.kv_layers[0].slots

    @property
    def next_position(self) -> int:
        """Where new tokens go: one past the largest position on any axis of any layer."""
        top = max((int(layer.positions.max()) for layer in self.kv_layers if layer.positions.numel()), default=-1)
        return max(top + 1, self.prefix_len)

    def position_ids(self, n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Position ids for `n` text tokens after the memory, in the shape the model takes:
        (1, n) for RoPE, (3, 1, n) for M-RoPE (text advances on all three axes)."""
        pos = self.next_position + torch.arange(n, device=device)[None]
        return pos if self.rope.axes == 1 else pos.expand(3, 1, n)

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) per layer, as views of the storage."""
        return [(layer.keys, layer.values) for layer in self.kv_layers]

    def state_bytes(self) -> int:
        """Bytes of the linear-attention layers' states: fixed, whatever the stream's length."""
        return sum(layer.nbytes() for layer in self.state_layers)

    def cache_bytes(self) -> int:
        """Bytes held by the memory: the keys and values of the HERMES layers, plus the states."""
        return sum(layer.nbytes() for layer in self.kv_layers) + self.state_bytes()

    def copy_bytes(self) -> int:
        """Bytes of a copy of what the model reads (keys and values in use, and the states), as a
        batch of answers takes it."""
        return sum(layer.used_bytes() for layer in self.kv_layers) + self.state_bytes()

    def storage(self) -> list[int]:
        """The data pointers of every layer's storage (they change only when a key buffer grows)."""
        kv = [t.data_ptr() for layer in self.kv_layers if layer.is_initialized for t in layer._buffers()]
        return kv + [p for layer in self.state_layers for p in layer.storage()]

    def video_tokens_per_layer(self) -> list[int]:
        """Video slots per HERMES layer (the summary slot not counted)."""
        return [layer.video_ids.numel() for layer in self.kv_layers]

    def snapshot(self) -> MemorySnapshot:
        """A copy of the bookkeeping (no keys or values) for the UI and metrics."""
        return MemorySnapshot(
            prefix_len=self.prefix_len,
            budget=self.config.budget,
            tokens_seen=self.tokens_seen,
            next_position=self.next_position,
            cache_bytes=self.cache_bytes(),
            layers=[layer.snapshot(self.tiers[i]) for i, layer in enumerate(self.kv_layers)],
            layer_indices=list(self.kv_layer_indices),
            state_layers=len(self.state_layers),
            state_bytes=self.state_bytes(),
        )

    # -- filling ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the memory, keeping its storage (transformers' `reset`): a new prefix comes next."""
        super().reset()
        self.tokens_seen = self.compactions = 0

    def commit_prefix(self) -> None:
        """What the model has written so far is the fixed text prefix (positions 0..P-1)."""
        for layer in self.kv_layers:
            layer.commit_prefix()
        for state in self.state_layers:
            state.commit()

    def reserve(self, n: int) -> None:
        """Make room for `n` scratch tokens in every layer, sizing storage for the whole stream."""
        total = None
        if self.capacity is not None:
            total = self.prefix_len + self.capacity + n + CHUNK_SLACK
        for layer in self.kv_layers:
            if layer.is_initialized:
                layer.reserve(n, total)

    def commit(self, meta: ChunkMeta) -> None:
        """The tokens the model just wrote in every layer are the chunk `meta` describes."""
        if meta.positions.shape[0] != self.rope.axes:
            raise ValueError(f"positions need {self.rope.axes} axes, got {meta.positions.shape[0]}")
        ids = torch.arange(self.tokens_seen, self.tokens_seen + len(meta))
        for layer in self.kv_layers:
            layer.commit(ids, meta)
        for state in self.state_layers:
            state.commit()
        self.tokens_seen += len(meta)

    def discard(self) -> None:
        """Drop every scratch token: the memory is exactly as it was before they were written (keys and
        values cut back, linear-attention states copied back)."""
        for layer in self.layers:
            layer.discard()

    def hide_slots(self) -> None:
        """Every HERMES layer reads a copy of its prefix and the scratch tokens after it, not its
        slots, until `discard` (`HermesLayer.hide_slots`)."""
        for layer in self.kv_layers:
            layer.hide_slots()

    @contextmanager
    def scratch(self) -> Iterator[HermesCache]:
        """Tokens written inside (a question, its answer, a guidance prompt) are dropped on exit.

        Leftovers of an earlier reader that never finished are dropped on entry as well.
        """
        self.discard()
        try:
            yield self
        finally:
            self.discard()

    @contextmanager
    def riding(self, keep: int) -> Iterator[HermesCache]:
        """Within: the tokens of a pass after its first `keep` ride on it (a guidance prompt after a
        chunk; a layer may carry fewer of them than the pass began with). They read the memory and
        the tokens before them, but leave the linear-attention layers' convolution states as the
        kept tokens left them (the model's recurrent rule must stop there as well:
        `VideoLM.riding`), and a clean exit drops them from every HERMES layer, so that the kept
        tokens are left to commit."""
        for state in self.state_layers:
            state.keep = keep
        try:
            yield self
        finally:
            for state in self.state_layers:
                state.keep = None
        for layer in self.kv_layers:
            layer.crop(layer.committed + keep - layer.length)

    # -- positions -------------------------------------------------------------------------------
    def start_position(self, n_tokens: int) -> int:
        """Start position for `n_tokens` new tokens, compacting positions first if they would run out.

        This is lazy re-indexing: positions stay as they were until next position + new tokens +
        the question margin would pass the limit.
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
        """Eager re-indexing of every layer: positions compacted, keys rotated by the shift."""
        for layer in self.kv_layers:
            layer.reindex()
        self.compactions += 1

    def evict(
        self,
        keep: Sequence[torch.Tensor],
        scores: Sequence[torch.Tensor],
        summarise: Sequence[bool],
        merges: Sequence[Sequence[Merge]] | None = None,
    ) -> list[int]:
        """Per HERMES layer: keep those video slots, fold the rest into the summary where asked, and turn
        each merge group's first slot into the group's prototype (`HermesLayer.evict`)."""
        merges = merges or [()] * len(self.kv_layers)
        return [
            layer.evict(k, s, f, m)
            for layer, k, s, f, m in zip(self.kv_layers, keep, scores, summarise, merges, strict=True)
        ]
