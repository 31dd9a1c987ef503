"""ReKV's question-time step: each layer brings back its best frames from the host store while the
model reads the question's own words, and then the whole prompt is read after them.

Before the retrieval pass every layer of the cache takes the same number of columns after the
memory (transformers sizes one mask for all layers); as the pass over the question's words
reaches a layer, a hook reads that layer's queries of them (before RoPE, as ReKV does), ranks the
frames outside the window by `FrameRetrieval.rank` and writes the chosen frames' keys and values
into those columns, at the positions they were computed at. The words are then dropped and the
prompt read after the frames. The caller drops everything afterwards (scratch tokens of the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hermes.engine.guidance import head_queries
from hermes.engine.metrics import now_ms
from hermes.engine.policy import QuestionCost, QuestionState, QuestionStep
from hermes.memory.buffer import kv_bytes
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.persist import STORE, MemoryFile, MemoryFileError, pack_store, unpack_store
from hermes.memory.rivals.host_store import HostStore
from hermes.memory.rivals.rekv import FrameRetrieval
from hermes.memory.rope import compact_positions, rotate_keys
from hermes.models.base import VideoLM


@dataclass
class RetrievalCost(QuestionCost):
    """What one question's retrieval cost: the similarity search and the host-to-device copy
    summed over layers, the tokens each layer brought back, and their bytes over all layers."""

    ms: float | None = 0.0
    frames: dict[int, list[int]] = field(default_factory=dict)  # per layer, the frames brought back


@dataclass(frozen=True)
class Retrieval(QuestionStep):
    """ReKV's question-time step: every frame kept in host memory, each layer's best `top_k` frames
    brought back per question (`HostRetrieval`, per stream)."""

    rule: FrameRetrieval
    batchable = False  # each layer brings back its own frames: a row would not be a copy of the memory
    keeps_host_store = True
    keeps_positions = True  # frames come back unrotated, at the positions they were computed at

    def device_room(self, block_tokens: int) -> int:
        """`top_k` frame blocks of at most `block_tokens` tokens each."""
        return self.rule.top_k * block_tokens

    def start(self, memory: HermesCache, name: str, host_cap: int | None) -> HostRetrieval:
        return HostRetrieval(self.rule, memory, name, host_cap)


def candidate_blocks(memory: HermesCache, store: HostStore, every: bool = False) -> torch.Tensor:
    """The store's frame blocks a question chooses from: those whose frame is no longer in the window
    (the frames still there are attended to as they are, and a key held twice would count twice), or
    `every` block, for a context of the retrieved frames alone."""
    if every:
        return torch.arange(len(store))
    window = memory.kv_layers[0].frames.unique()
    return (~torch.isin(store.block_frame, window)).nonzero().squeeze(1)


class FrameRetriever:
    """Context manager around one forward pass over a question: brings `tokens` tokens of each
    layer's best frames among `candidates` (store blocks) into the columns from `at`, at the
    positions they were computed at, or, given `rebase`, re-rotated to contiguous positions from it."""

    def __init__(
        self,
        attention_modules: Sequence[torch.nn.Module],
        memory: HermesCache,
        store: HostStore,
        rule: FrameRetrieval,
        candidates: torch.Tensor,
        tokens: int,
        at: int,
        rebase: int | None = None,
    ) -> None:
        self.modules = attention_modules
        self.memory = memory
        self.store = store
        self.rule = rule
        self.candidates = candidates
        self.lengths = store.block_length[candidates]
        self.tokens = tokens
        self.at, self.rebase = at, rebase
        self.cost = RetrievalCost(tokens=tokens)
        self._handles: list = []

    def __enter__(self) -> FrameRetriever:
        for layer in self.memory.kv_layers:
            layer.take_columns(self.tokens)
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._hook(self.at), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, at: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            device = hidden.device
            t0 = now_ms(device)
            q = head_queries(module, hidden)
            query = q[0].float().mean(dim=0).flatten().cpu()  # (heads x dim): the question's mean query
            layer = module.layer_idx  # the decoder layer; the store counts key-value layers only
            keys = self.store.mean_keys(self.memory.kv_layer_indices.index(layer), q.shape[2])[self.candidates]
            order = self.rule.rank(query, keys)
            picks = [(int(self.candidates[i]), n) for i, n in self.rule.take(order, self.lengths, self.tokens)]
            k, v = self.store.gather(self.memory.kv_layer_indices.index(layer), picks)
            if self.rebase is not None:  # one after another from `rebase`, in stream order
                old = self.store.positions(picks)
                k = rotate_keys(k, compact_positions(old, self.rebase) - old, self.memory.rope)
            self.memory.layers[layer].write_columns(at, k, v)
            self.cost.frames[layer] = [int(self.store.block_frame[b]) for b, _ in picks]
            self.cost.bytes += k.nbytes + v.nbytes
            self.cost.ms += now_ms(device) - t0

        return hook


class HostRetrieval(QuestionState):
    """A retrieval policy's side of a session (ReKV): the host store of every frame and its cap,
    the device room its questions take, and the question's forward with the frames brought back.

    Positions are never compacted: frames come back at the positions they were computed at, so the
    stream ends when positions run out, as it ends at the host memory cap (`bound_note`)."""

    def __init__(self, rule: FrameRetrieval, memory: HermesCache, name: str, cap_bytes: int | None) -> None:
        self.rule = rule
        self.name = name
        self.cap_bytes = cap_bytes
        self.store = HostStore(memory.rope)
        self.last = RetrievalCost()  # the last question's
        self.prefix_len = 0  # the memory's, known once a chunk is in: a question's own context copies it

    def start_position(self, memory: HermesCache, tokens: int) -> int:
        """After every frame held: positions are never compacted (see the class's note)."""
        return self._after_all(memory)

    def next_position(self, memory: HermesCache) -> int:
        """Where a question's tokens go: after every frame held, or, when the answer reads the
        retrieved frames alone, after them (they take the positions after the prefix)."""
        if not self.rule.contiguous:
            return self._after_all(memory)
        every = self.store.block_length
        return memory.prefix_len + (self.rule.tokens_to_bring(every, self.rule.top_k) if every.numel() else 0)

    def _after_all(self, memory: HermesCache) -> int:
        """After the window and after every frame of the store (the window may hold none of them)."""
        return max(memory.next_position, self.store.next_position)

    def room(self, frames: torch.Tensor) -> int:
        """Device columns a question may bring back: top_k frame blocks as long as the longest of
        `frames` (a chunk's), reserved with the chunk so that asking allocates nothing."""
        if frames.numel() == 0:
            return 0
        _, counts = torch.unique_consecutive(frames, return_counts=True)
        return self.rule.top_k * int(counts.max()) + (self.prefix_len if self.rule.contiguous else 0)

    def after_prefill(self, memory: HermesCache, meta: ChunkMeta) -> None:
        """Copy the chunk `meta` describes, just written after the memory, into the host store
        (every frame, as computed, before the window moves on)."""
        end, n = memory.get_seq_length(), len(meta)
        self.prefix_len = memory.prefix_len
        self.store.add(
            [(k[..., end - n :, :], v[..., end - n :, :]) for k, v in memory.kv()], meta.frames, meta.positions
        )

    def bound_note(self, memory: HermesCache, tokens: int, frames: int, frames_seen: int) -> str | None:
        """Why a next chunk of `tokens` tokens in `frames` frames cannot go in: it would pass the
        host memory cap, or the positions the model has; None when it can."""
        if (
            self.cap_bytes is not None
            and self.store.nbytes() + self._bytes_for(memory, tokens, frames) > self.cap_bytes
        ):
            return (
                f"The host store reached its cap ({self.cap_bytes / 2**20:,.1f} MB): {self.name} keeps every frame's "
                f"keys and values in host memory, so the stream stops here ({frames_seen:,} frames, "
                f"{self.store.nbytes() / 2**20:,.1f} MB held)."
            )
        config = memory.config
        limit = config.max_positions
        if limit is not None and self._after_all(memory) + tokens + config.position_margin > limit:
            return (
                f"{self.name} keeps every frame at the position it was computed at (frames come back from host "
                f"memory unrotated), so the stream stops when the model's {limit:,} positions run out "
                f"({frames_seen:,} frames)."
            )
        return None

    def host_bytes(self) -> int:
        return self.store.nbytes()

    def pack(self) -> MemoryFile:
        return pack_store(self.store)

    def unpack(self, memory: MemoryFile) -> None:
        if STORE not in memory.header:
            raise MemoryFileError("the memory file is damaged: its host store does not match its policy")
        self.store = unpack_store(memory, self.store.rope)

    def cost(self) -> RetrievalCost:
        return self.last

    @staticmethod
    def _bytes_for(memory: HermesCache, tokens: int, frames: int) -> int:
        """Host bytes `tokens` tokens in `frames` frame blocks add to the store: key and value in
        every layer, and one fp32 mean key per block and layer."""
        _, heads, _, dim = memory.kv_layers[0].keys.shape
        itemsize = memory.kv_layers[0].keys.element_size()
        return len(memory.kv_layers) * (kv_bytes(tokens, heads, dim, itemsize) + kv_bytes(frames, heads, dim, 4, 1))

    def forward(
        self,
        lm: VideoLM,
        memory: HermesCache,
        ids: torch.Tensor,
        positions: torch.Tensor,
        query: torch.Tensor,
        **kwargs: Any,
    ) -> torch.Tensor:
        """`lm` over question tokens `ids` after the memory (scratch tokens), once each layer has
        brought back its best frames that have left the window; the cost in `last`.

        As in ReKV, the frames are chosen in a pass of their own over the `query` tokens alone (the
        question's words: `FrameRetriever`'s hooks read their queries); those tokens are then
        dropped, the frames stay, and `ids` (the whole prompt) follow at the same positions. When the
        answer reads the retrieved frames alone (`rule.contiguous`), every frame is a candidate and the
        model reads a copy of the prefix, then the frames, from where the memory ends
        (`HermesCache.hide_slots`), until the caller drops the scratch tokens."""
        contiguous = self.rule.contiguous
        candidates = candidate_blocks(memory, self.store, every=contiguous)
        if candidates.numel() == 0:  # every frame is still in the window
            self.last = RetrievalCost()
            return lm.forward(memory, ids, positions, **kwargs)
        tokens = self.rule.tokens_to_bring(self.store.block_length[candidates], self.rule.top_k)
        n = query.shape[-1]
        p = memory.prefix_len
        memory.reserve((p if contiguous else 0) + tokens + max(n, ids.shape[-1]))
        if contiguous:
            memory.hide_slots()
        at = memory.kv_layers[0].length
        retriever = FrameRetriever(
            lm.attention_modules(), memory, self.store, self.rule, candidates, tokens, at, p if contiguous else None
        )
        with retriever:
            lm.forward(memory, query, positions[:, :1] + torch.arange(n))
        for layer in memory.kv_layers:
            layer.crop(-n)
        for state in memory.state_layers:  # a hybrid model's linear layers read the query too
            state.discard()
        self.last = retriever.cost
        return lm.forward(memory, ids, positions, **kwargs)
