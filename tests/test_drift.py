"""Keys stay exact in 16-bit caches however many compactions a stream goes through."""

from __future__ import annotations

import pytest
import torch

from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec

HEAD_DIM, THETA, LAYERS, BUDGET, CHUNK, STEPS = 128, 1_000_000.0, 3, 24, 6, 1000


def _exact(keys: torch.Tensor, delta: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """RoPE(delta) applied in fp64 throughout: the reference, never rounded."""
    angle = delta.double()[spec.channel_axes()].T * spec.inv_freq.double()
    emb = torch.cat((angle, angle), dim=-1)
    k = keys.double()
    half = k.shape[-1] // 2
    return k * emb.cos() + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * emb.sin()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_thousand_eager_compactions_do_not_drift(dtype):
    gen = torch.Generator().manual_seed(0)
    spec = RopeSpec.from_config(HEAD_DIM, THETA)
    cache = HermesCache(LAYERS, spec, HermesConfig(budget=BUDGET), capacity=BUDGET)
    prefix = torch.randn(1, 1, 4, HEAD_DIM, generator=gen).to(dtype)
    for layer in cache.layers:
        layer.update(prefix, prefix)
    cache.commit_prefix()
    written: dict[int, torch.Tensor] = {}  # stream id -> the key as written (layer 0)
    origin: dict[int, int] = {}
    shifts = torch.randint(0, 201, (STEPS,), generator=gen)
    for step in range(STEPS):
        # A gap before each chunk, as lazy positions leave after evictions: 0 to 200 positions.
        start = cache.next_position + int(shifts[step])
        keys = (4 * torch.randn(1, 1, CHUNK, HEAD_DIM, generator=gen)).to(dtype)
        for layer in cache.layers:
            layer.update(keys, keys)
        positions = torch.arange(start, start + CHUNK)
        first = cache.tokens_seen
        cache.commit(ChunkMeta(frames=torch.zeros(CHUNK), positions=positions))
        for i in range(CHUNK):
            written[first + i], origin[first + i] = keys[0, 0, i], start + i
        if cache.slots > BUDGET:
            n = cache.slots
            keep = [torch.arange(n - BUDGET, n)] * LAYERS
            cache.evict(keep, [torch.zeros(BUDGET)] * LAYERS, [False] * LAYERS)
            cache.reindex()
    assert cache.compactions >= STEPS - 5

    layer = cache.layers[0]
    p = cache.prefix_len
    ids = layer.video_ids.tolist()
    original = torch.stack([written[t] for t in ids])
    delta = (layer.positions[0] - torch.tensor([origin[t] for t in ids]))[None]
    exact = _exact(original, delta, spec)
    rounded_once = exact.to(dtype).double()
    cached = layer.keys[0, 0, p:].double()
    err_cached = (cached - exact).norm(dim=-1)
    err_once = (rounded_once - exact).norm(dim=-1)
    assert (err_cached <= 2 * err_once + 1e-12).all(), (err_cached / err_once).max()

    # The control: rotating the rounded key again at every step, as a naive cache does, drifts
    # far past that bound. This is what the origin keys prevent.
    naive = original.clone()
    steps = torch.tensor([origin[t] for t in ids])[None]
    position = steps.clone()
    for _ in range(50):
        shift = torch.randint(1, 200, (1, len(ids)), generator=gen)
        naive = _exact(naive, shift, spec).to(dtype)
        position = position + shift
    drift = (naive.double() - _exact(original, position - steps, spec)).norm(dim=-1)
    assert drift.mean() > 2 * err_once.mean()
