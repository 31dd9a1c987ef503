"""Long streams: the cache size is exactly constant and memory does not creep.

CI runs a short soak (HERMES_SOAK_FRAMES, default 160 frames). The full one from the issue:
    HERMES_SOAK_FRAMES=2000 python -m pytest -q tests/test_soak.py
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from hermes.engine.metrics import process_rss
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.video.chunking import Chunker

FRAMES = int(os.environ.get("HERMES_SOAK_FRAMES", "160"))
CHUNK = 8


@pytest.mark.soak
def test_soak_constant_cache_and_flat_rss(llava_lm):
    session = StreamingSession(llava_lm, HermesConfig(budget=1024, chunk_frames=CHUNK, fps=1.0))
    chunker = Chunker(CHUNK)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    sizes, rss = [], []
    warmup = max(4, FRAMES // CHUNK // 5)
    for i in range(FRAMES):
        # A moving pattern, so frames differ without allocating a new random image each time.
        chunk = chunker.push(np.roll(base, i, axis=1), t=float(i))
        if chunk is None:
            continue
        report = session.ingest(chunk)
        if session.memory.tokens_seen > 1025:
            sizes.append(report.cache_bytes)
        if chunk.chunk_index == warmup or chunk.chunk_index % 10 == 0:
            gc.collect()
            rss.append((chunk.chunk_index, process_rss()))
        if chunk.chunk_index % 25 == 0:
            session.ask("What changed?", max_new_tokens=2)
    assert session.frames_seen == FRAMES
    assert len(set(sizes)) == 1, "cache bytes must be exactly constant past the budget"
    after_warmup = [r for i, r in rss if i >= warmup]
    growth = (after_warmup[-1] - after_warmup[0]) / after_warmup[0]
    assert growth < 0.05, f"RSS grew {growth:.1%} after warm-up"
