"""One compression step on a `HermesCache`: score per tier, smooth across layers, keep Top-K with a
summary. Re-indexing positions is the next step, `HermesCache.reindex`, for an eager memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hermes.memory.cache import HermesCache
from hermes.memory.policies import MemoryPolicy
from hermes.memory.scorer import LayerInputs

AttentionRecord = tuple[np.ndarray, np.ndarray]  # (stream ids, weights) over a layer's video slots


@dataclass
class CompressionReport:
    """What one compression step did."""

    evicted: list[int]
    attention: tuple[AttentionRecord | None, ...]  # per layer, what the guidance pass measured


def compress(
    cache: HermesCache, policy: MemoryPolicy, attention: Sequence[torch.Tensor | None] | None = None
) -> CompressionReport | None:
    """Evict down to the policy's capacity if the slots exceed it; None when there is nothing to do.

    `attention[l]`, for the layers the policy probes, is the guidance attention W over layer l's
    slots after the prefix (summary included), as the engine's guidance pass measured it.
    """
    selection = policy.selection
    if not policy.over_capacity(cache.slots):
        return None
    tiers = cache.tiers
    ids = [layer.video_ids for layer in cache.kv_layers]
    video_attention = [
        None if attention is None or attention[i] is None else attention[i][layer.video_offset :].float().cpu()
        for i, layer in enumerate(cache.kv_layers)
    ]
    scores = [
        policy.scorer.score(layer_inputs(cache, i, video_attention[i], selection.video_slots(tiers[i])))
        for i in range(len(cache.kv_layers))
    ]
    if policy.smoothing is not None:
        scores = policy.smoothing(scores, ids, tiers)
    plans = [
        selection.plan(s, i, layer.frames[layer.video_offset :], tiers[n])
        for n, (s, i, layer) in enumerate(zip(scores, ids, cache.kv_layers, strict=True))
    ]
    keep = [k for k, _ in plans]
    record = tuple(
        None if att is None else (i.numpy().copy(), att.numpy()) for i, att in zip(ids, video_attention, strict=True)
    )
    evicted = cache.evict(
        keep,
        [s[k] for s, k in zip(scores, keep, strict=True)],
        [selection.summarises(t) for t in tiers.tiers],
        [m for _, m in plans],
    )
    return CompressionReport(evicted=evicted, attention=record)


def layer_inputs(cache: HermesCache, layer: int, attention: torch.Tensor | None, slots_kept: int) -> LayerInputs:
    """What a scorer sees of `layer`: its video slots' keys and values (views of the storage, no
    copy) and bookkeeping, its tier, the slots it keeps and the probe `attention` over its slots."""
    held = cache.kv_layers[layer]
    start = held.prefix_len + held.video_offset
    off = held.video_offset
    origin_keys, origins = held.origin_keys()
    return LayerInputs(
        layer,
        cache.tiers,
        held.video_ids.numel(),
        attention,
        keys=held.keys[..., start : held.committed, :],
        values=held.values[..., start : held.committed, :],
        stream_ids=held.video_ids,
        frames=held.frames[off:],
        patches=held.patches[off:],
        slots_kept=slots_kept,
        origin_keys=origin_keys[..., start : held.committed, :],
        origins=origins[:, off:],
        rope=held.rope,
    )
