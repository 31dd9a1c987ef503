"""Every viewer's stream in one registry: isolation, admission control by exact cache bytes, freeing."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hermes.engine.methods import PolicySpec
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.runtime.settings import StreamSettings
from hermes.serving.admission import Busy, cache_bytes_for, default_memory_cap, full_slot_limit, prefix_len
from hermes.serving.answers import batch_memory_cap
from hermes.serving.registry import StreamRegistry
from hermes.video.chunking import Chunker
from tests.helpers import SMALL, streamed, wait_for


def test_registry_isolates_sessions_admits_and_frees(llava_lm, clips):
    registry = StreamRegistry(llava_lm, settings=SMALL, max_streams=1)
    try:
        a, b = registry.get("a"), registry.get("b")
        assert a is not b and registry.get("a") is a and len(registry) == 2
        a.start_file(clips["short"], speed="1x")  # still running for a while
        with pytest.raises(Busy, match="Try again"):
            b.start_file(clips["short"])
        a.chat.add({"role": "user", "content": "mine"})
        assert b.chat.messages() == [] and b.view().frames_seen == 0
        assert registry.close("a") and a.closed and len(registry) == 1
        assert registry.worker.wait_idle("a", 10)
        streamed(b, clips["short"])  # a's slot is free again
        assert registry.get("b", create=False) is b and registry.get("zzz", create=False) is None
    finally:
        registry.shutdown()
    assert not registry.worker.alive


@pytest.mark.parametrize(
    "settings",
    [StreamSettings(policy="hermes"), StreamSettings(policy="fifo"), StreamSettings(reindex="eager", compare=True)],
    ids=["hermes", "fifo", "compare-eager"],
)
def test_cache_bytes_for_is_exactly_what_a_stream_holds_past_its_budget(lm, settings):
    # Budgets of one to two chunks' tokens (LLaVA-OV: 393 a chunk of 2 frames; Qwen2.5-VL: 70).
    budget = 500 if lm.arch == "llava_onevision" else 100
    settings = dataclasses.replace(settings, budget=budget, chunk_frames=2)
    sessions = [StreamingSession(lm, settings.config(), policy=p) for p in settings.policies]
    chunker = Chunker(2)
    rng = np.random.default_rng(0)
    sizes = []
    for i in range(8):  # 4 chunks: every memory is past its budget from the second on
        chunk = chunker.push(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8), t=float(i))
        if chunk is not None:
            reports = [s.ingest(chunk) for s in sessions]
            sizes.append(sum(r.cache_bytes for r in reports))
    assert sizes[-1] == sizes[-2] == sizes[-3] == cache_bytes_for(lm, settings)
    assert sizes[0] < sizes[-1]  # before the budget is reached the caches are smaller


def test_full_policy_reserves_its_bound(llava_lm):
    settings = StreamSettings(policy="full")
    limit = full_slot_limit(llava_lm, settings.config())
    assert limit == llava_lm.max_positions - HermesConfig().position_margin - prefix_len(llava_lm)
    per_token = cache_bytes_for(llava_lm, StreamSettings(policy="fifo", budget=2)) - cache_bytes_for(
        llava_lm, StreamSettings(policy="fifo", budget=1)
    )
    assert cache_bytes_for(llava_lm, settings) == (prefix_len(llava_lm) + limit) * per_token


def test_default_memory_cap(monkeypatch):
    mb = 2**20
    monkeypatch.delenv("HERMES_MEMORY_CAP_MB", raising=False)
    assert default_memory_cap(torch.device("cpu"), 12.5) == int(12.5 * mb)
    assert 0 < default_memory_cap(torch.device("cpu")) <= 4096 * mb
    monkeypatch.setenv("HERMES_MEMORY_CAP_MB", "300")
    assert default_memory_cap(torch.device("cpu")) == 300 * mb
    with pytest.raises(ValueError, match="positive"):
        default_memory_cap(torch.device("cpu"), 0)
    # On a GPU: the free memory less a margin of 10% of the card, and at least 2 GiB.
    monkeypatch.delenv("HERMES_MEMORY_CAP_MB")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60_000 * mb, 80_000 * mb))
    assert default_memory_cap(torch.device("cuda")) == 52_000 * mb
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10_000 * mb, 16_000 * mb))
    assert default_memory_cap(torch.device("cuda")) == 7_952 * mb


def test_the_answer_batch_copies_memories_within_half_the_gpu_margin(monkeypatch):
    mb = 2**20
    assert batch_memory_cap(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80_000 * mb))
    assert batch_memory_cap(torch.device("cuda")) == 4_000 * mb  # 10% of the card, halved
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=16_000 * mb))
    assert batch_memory_cap(torch.device("cuda")) == 1_024 * mb  # at least 2 GiB of margin, halved


def test_admission_reserves_cache_memory_and_refuses_when_it_is_short(llava_lm, clips):
    need = cache_bytes_for(llava_lm, SMALL)
    registry = StreamRegistry(llava_lm, settings=SMALL, memory_cap_bytes=int(2.5 * need))
    try:
        a, b, c = (registry.get(k) for k in "abc")
        streamed(a, clips["short"])  # finished, but it still holds its memory (it can be asked)
        b.start_file(clips["short"], speed="1x")
        assert a.reserved_bytes == b.reserved_bytes == need and registry.reserved_bytes() == 2 * need
        with pytest.raises(Busy, match=r"Busy: the other streams hold .* MB .* Try again in a minute") as info:
            c.start_file(clips["short"])
        assert f"needs {need / 2**20:,.1f} MB" in str(info.value) and c.reserved_bytes == 0
        with pytest.raises(Busy, match="more than this server gives one stream"):
            c.start_file(clips["short"], settings=StreamSettings(policy="full"))
        with pytest.raises(Busy, match="Busy"):  # a webcam is admitted the same way
            c.push_frame(np.zeros((120, 160, 3), dtype=np.uint8))
        a.reset()  # gives its memory back
        assert a.reserved_bytes == 0 and registry.reserved_bytes() == need
        c.start_file(clips["short"], speed="1x")
        registry.close("b")  # a closed tab gives its memory back too
        assert registry.reserved_bytes() == need
        a.start_file(clips["short"], speed="max")  # restarting takes only what is free
    finally:
        registry.shutdown()


def test_closing_a_tab_mid_stream_frees_its_memory_and_reader(llava_lm, clips):
    registry = StreamRegistry(llava_lm, settings=SMALL)
    try:
        stream = registry.get("tab")
        stream.start_file(clips["short"], speed="1x")  # 8 s of video: still streaming below
        assert wait_for(lambda: stream.view().frames_seen > 0, 30)
        reader, memory = stream.feed.source.thread, weakref.ref(stream._memories.sessions[PolicySpec("hermes")].memory)
        assert reader.is_alive() and registry.reserved_bytes() > 0 and stream.status().state == "streaming"
        assert registry.close("tab")
        assert not reader.is_alive() and stream.status().state == "closed"
        assert registry.worker.wait_idle("tab", 10)
        gc.collect()
        assert memory() is None, "the closed stream's cache tensors are still referenced"
        assert len(registry) == 0 and registry.reserved_bytes() == 0 and registry.worker.alive
        with pytest.raises(RuntimeError, match="closed"):
            stream.ask("Anyone?")
    finally:
        registry.shutdown()
