"""HermesCache as a library: plain `model.generate` on it, its storage, and the example script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes import HermesCache
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from tests.helpers import assert_same_memory, generate_on_cache, memory_state, random_chunk

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is happening?"


def _streamed(lm, budget: int, chunks: int, **config) -> StreamingSession:
    session = StreamingSession(lm, HermesConfig(budget=budget, chunk_frames=2, fps=1.0, **config))
    for i in range(chunks):
        session.ingest(random_chunk(i))
    return session


@pytest.mark.parametrize("reindex", ["lazy", "eager"])
@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_generate_on_the_cache_equals_the_session(lm, reindex, name):
    session = _streamed(lm, budget=150, chunks=4, reindex=reindex)
    cache = session.memory
    assert isinstance(cache, HermesCache) and cache.tokens_seen > 150  # compressed for real
    before = memory_state(cache)
    answer = session.ask(QUESTION, max_new_tokens=8)
    tokens, logprobs = generate_on_cache(lm, cache, QUESTION, max_new_tokens=8, name=name)
    assert lm.decode([t for t in tokens if t not in lm.eos_token_ids]) == answer.text
    assert (logprobs - session.first_token_logprobs(QUESTION)).abs().max().item() < 1e-5
    assert_same_memory(before, cache)  # generate left the memory bit-identical


def test_storage_is_not_reallocated_once_the_budget_is_reached(lm):
    session = _streamed(lm, budget=150, chunks=3)
    storage = session.memory.storage()
    for i in range(3, 10):
        session.ingest(random_chunk(i))
        session.ask(QUESTION, max_new_tokens=4)
        assert session.memory.storage() == storage, f"chunk {i} reallocated the cache"


def test_the_memory_cannot_be_cropped(llava_lm):
    cache = _streamed(llava_lm, budget=150, chunks=2).memory
    with pytest.raises(ValueError, match="scratch tokens"):
        cache.crop(-1)


def test_example_script_answers_offline(tmp_path):
    # As a newcomer runs it: from elsewhere, with the checkout neither installed nor on PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    saved = ["--save-memory", str(tmp_path / "memory.hermes")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "library.py"), "--model", "tiny", "--budget", "256", *saved],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "frames streamed" in done.stdout and "\nA: " in done.stdout
    assert "loaded back: " in done.stdout and "A (from the file): " in done.stdout
