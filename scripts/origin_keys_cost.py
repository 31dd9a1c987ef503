"""What the origin keys of 16-bit caches cost, per chunk and per decoded token, at the real
LLaVA-OV-0.5B cache shapes (24 layers, 2 KV heads of 64 channels, bf16), budget 4,096, 16-frame
chunks (3,137 tokens), eager re-indexing (the case that rotates every chunk).

    python scripts/origin_keys_cost.py

Each step is timed with and without origin keys in one run, and the ratios are printed. The
decode step reads keys and values only (the origin keys are never read there), so a token's
attention over the cache is timed too.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes.memory import cache as memory_cache
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec

LAYERS, KV_HEADS, HEAD_DIM, BUDGET, CHUNK, PREFIX, CHUNKS = 24, 2, 64, 4096, 3137, 20, 6


def run(origin_keys: bool) -> tuple[float, float, int]:
    """Median ms per chunk (commit, evict, re-index), per decoded token's attention read, and the
    cache bytes."""
    memory_cache.LOW_PRECISION = (torch.bfloat16, torch.float16) if origin_keys else ()
    spec = RopeSpec.from_config(HEAD_DIM, 1_000_000.0)
    cache = HermesCache(LAYERS, spec, HermesConfig(budget=BUDGET, reindex="eager"), capacity=BUDGET)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randn(1, KV_HEADS, PREFIX, HEAD_DIM, generator=gen).bfloat16()
    for layer in cache.layers:
        layer.update(prefix, prefix)
    cache.commit_prefix()
    chunk_ms, read_ms = [], []
    for step in range(CHUNKS):
        kv = torch.randn(1, KV_HEADS, CHUNK, HEAD_DIM, generator=gen).bfloat16()
        cache.reserve(CHUNK + 256)
        for layer in cache.layers:
            layer.update(kv, kv)
        start = cache.next_position
        t0 = time.perf_counter()
        cache.commit(ChunkMeta(frames=torch.zeros(CHUNK), positions=torch.arange(start, start + CHUNK)))
        if cache.slots > BUDGET:
            keep = [torch.sort(torch.randperm(cache.slots, generator=gen)[:BUDGET]).values] * LAYERS
            cache.evict(keep, [torch.zeros(BUDGET)] * LAYERS, [False] * LAYERS)
            cache.reindex()
        chunk_ms.append((time.perf_counter() - t0) * 1000)
        q = torch.randn(1, KV_HEADS, 1, HEAD_DIM, generator=gen).bfloat16()
        t0 = time.perf_counter()
        for keys, values in cache.kv():
            torch.nn.functional.scaled_dot_product_attention(q, keys, values)
        read_ms.append((time.perf_counter() - t0) * 1000)
        if step == 0:  # the first chunk fills the storage; steady state starts after it
            chunk_ms.clear()
    return statistics.median(chunk_ms), statistics.median(read_ms), cache.cache_bytes()


def main() -> None:
    torch.set_num_threads(1)
    plain_chunk, plain_read, plain_bytes = run(origin_keys=False)
    kept_chunk, kept_read, kept_bytes = run(origin_keys=True)
    print(
        f"per chunk (commit + evict + eager re-index): {plain_chunk:.1f} ms without, {kept_chunk:.1f} ms with "
        f"origin keys: x{kept_chunk / plain_chunk:.2f}"
    )
    print(
        f"per decoded token (attention read of all layers): {plain_read:.2f} ms without, {kept_read:.2f} ms with: "
        f"x{kept_read / plain_read:.2f}"
    )
    print(
        f"cache bytes: {plain_bytes / 2**20:.1f} MiB without, {kept_bytes / 2**20:.1f} MiB with: "
        f"x{kept_bytes / plain_bytes:.2f}"
    )


if __name__ == "__main__":
    main()
