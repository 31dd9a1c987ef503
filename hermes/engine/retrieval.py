"""ReKV's question-time step: each layer brings back its best frames from the host store while the
model reads the question.

Before the forward pass every layer of the cache takes the same number of columns after the
memory (transformers sizes one mask for all layers); as the pass reaches a layer, a hook reads
that layer's question queries (before RoPE, as ReKV does), ranks the frames outside the window by
`FrameRetrieval.rank` and writes the chosen frames' keys and values into those columns, at the
positions they were computed at. The question's own tokens follow. The caller drops them all
afterwards (they are scratch tokens of the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hermes.engine.metrics import now_ms
from hermes.memory.cache import HermesCache
from hermes.memory.rivals.host_store import HostStore
from hermes.memory.rivals.rekv import FrameRetrieval


@dataclass
class RetrievalCost:
    """What one question's retrieval cost: the similarity search and the host-to-device copy
    summed over layers, the tokens each layer brought back, and their bytes over all layers."""

    ms: float = 0.0
    tokens: int = 0
    bytes: int = 0
    frames: dict[int, list[int]] = field(default_factory=dict)  # per layer, the frames brought back


def candidate_blocks(memory: HermesCache, store: HostStore) -> torch.Tensor:
    """The store's frame blocks whose frame is no longer in the window: the frames still there are
    attended to as they are, and a key held twice would count twice."""
    window = memory.layers[0].frames.unique()
    return (~torch.isin(store.block_frame, window)).nonzero().squeeze(1)


class FrameRetriever:
    """Context manager around one forward pass over a question: brings `tokens` tokens of each
    layer's best frames among `candidates` (store blocks) into the columns after the memory."""

    def __init__(
        self,
        attention_modules: Sequence[torch.nn.Module],
        memory: HermesCache,
        store: HostStore,
        rule: FrameRetrieval,
        candidates: torch.Tensor,
        tokens: int,
    ) -> None:
        self.modules = attention_modules
        self.memory = memory
        self.store = store
        self.rule = rule
        self.candidates = candidates
        self.lengths = store.block_length[candidates]
        self.tokens = tokens
        self.cost = RetrievalCost(tokens=tokens)
        self._handles: list = []

    def __enter__(self) -> FrameRetriever:
        at = self.memory.prefix_len + self.memory.slots
        for layer in self.memory.layers:
            layer.take_columns(self.tokens)
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._hook(at), with_kwargs=True))
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
            q = module.q_proj(hidden).view(*hidden.shape[:2], -1, module.head_dim)
            if getattr(module, "q_norm", None) is not None:  # Qwen3 normalises each head's query before RoPE
                q = module.q_norm(q)
            query = q[0].float().mean(dim=0).flatten().cpu()  # (heads x dim): the question's mean query
            layer = module.layer_idx
            keys = self.store.mean_keys(layer, q.shape[2])[self.candidates]
            order = self.rule.rank(query, keys)
            picks = [(int(self.candidates[i]), n) for i, n in self.rule.take(order, self.lengths, self.tokens)]
            k, v = self.store.gather(layer, picks)
            self.memory.layers[layer].write_columns(at, k, v)
            self.cost.frames[layer] = [int(self.store.block_frame[b]) for b, _ in picks]
            self.cost.bytes += k.nbytes + v.nbytes
            self.cost.ms += now_ms(device) - t0

        return hook
