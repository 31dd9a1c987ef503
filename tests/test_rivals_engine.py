"""The rivals through the real engine on the tiny backbones: budgets, read-only questions, the
proxy query's probe and the +dtd input filter's real path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from hermes.engine.chunk import Chunk
from hermes.engine.filtering import FilteredInputs
from hermes.engine.methods import PolicyError
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from tests.helpers import assert_same_memory, memory_state, random_chunk

FRAMES = 2  # per chunk: small, and even for the Qwen backbones
BUDGETED = ["sink", "infinipot-v", "streammem", "hermes+dtd", "fifo+dtd", "streammem+dtd"]


def _session(lm, policy: str, budget: int = 120, params=None) -> StreamingSession:
    config = HermesConfig(budget=budget, chunk_frames=FRAMES, fps=1.0)
    return StreamingSession(lm, config, policy=policy, params=params)


def _static_chunk(index: int, size: int = 64) -> Chunk:
    """Chunk `index` of a clip whose every frame is the same picture."""
    pixels = np.repeat(np.random.default_rng(7).integers(0, 256, (1, size, size, 3), dtype=np.uint8), FRAMES, axis=0)
    ids = np.arange(index * FRAMES, (index + 1) * FRAMES)
    return Chunk(pixels, ids.astype(float), ids, ids, chunk_index=index)


@pytest.mark.parametrize("policy", BUDGETED)
def test_budget_holds_with_constant_bytes_and_questions_leave_memory_alone(lm, policy):
    if "+dtd" in policy and lm.no_input_filter is not None:
        with pytest.raises(PolicyError, match="input filter"):
            _session(lm, policy)
        return
    s = _session(lm, policy, budget=60)
    sizes, storage = set(), set()
    for i in range(5):
        report = s.ingest(random_chunk(i, FRAMES))
        if s.memory.slots >= s.policy.capacity:
            assert {layer.slots for layer in s.memory.kv_layers} == {s.policy.capacity}
            sizes.add(report.cache_bytes)
            storage.add(tuple(s.memory.storage()))
    assert len(sizes) == 1 and len(storage) == 1  # exactly constant, no storage reallocated
    assert s.memory.tokens_seen > 2 * s.policy.capacity
    before = memory_state(s.memory)
    first = s.ask("What is happening?", max_new_tokens=4)
    assert_same_memory(before, s.memory)
    assert s.ask("What is happening?", max_new_tokens=4).text == first.text
    assert_same_memory(before, s.memory)


def test_streammem_probes_with_the_chat_template_tokens(llava_lm):
    s = _session(llava_lm, "streammem", budget=60)
    s.ingest(random_chunk(0, FRAMES))
    att = s.guidance_attention()
    assert att is not None and all(a is not None and a.numel() == s.memory.slots for a in att)
    # The probe is the template's tail after the video, with no question in it.
    assert torch.equal(llava_lm.template_ids(), llava_lm.question_ids(""))
    report = s.ingest(random_chunk(1, FRAMES))
    kept = [set(layer.video_ids.tolist()) for layer in s.memory.kv_layers]
    assert report.evicted and all(len(k) == 60 for k in kept)


def test_dtd_drops_a_static_clip_and_keeps_what_moves(llava_lm, qwen_lm):
    for lm in (llava_lm, qwen_lm):
        s = _session(lm, "fifo+dtd", budget=10_000)
        encoded = dropped = 0
        for i in range(4):
            r = s.ingest(_static_chunk(i))
            encoded, dropped = encoded + r.tokens + r.dropped, dropped + r.dropped
        assert dropped >= encoded / 2  # after the first frame, nothing changes
        moving = _session(lm, "fifo+dtd", budget=10_000, params={"dtd.threshold": 0.999})
        r = moving.ingest(random_chunk(0, FRAMES))
        r = moving.ingest(random_chunk(1, FRAMES))
        assert r.dropped < r.tokens  # random frames differ


@dataclass(frozen=True)
class KeepFirst:
    """An input filter rule that keeps every token but the last `dropped` of each chunk."""

    dropped: int = 0

    def select(self, features, frames, patches, visual, previous=None):
        keep = torch.ones(frames.numel(), dtype=torch.bool)
        keep[frames.numel() - self.dropped :] = False
        return keep, previous


def test_an_input_filter_that_drops_nothing_leaves_the_memory_as_without_it(llava_lm, qwen_lm):
    """The input filter's path (the chunk's embeddings, features scattered by the adapter, then the
    kept tokens) feeds the model the same inputs as the model's own path: with a rule that keeps
    every token, the memories are bit-identical; with one that drops a token, they are not."""
    for lm in (llava_lm, qwen_lm):
        plain = _session(lm, "fifo")
        filtered = {n: _session(lm, "fifo+dtd") for n in (0, 1)}
        for n, session in filtered.items():
            session.input_filter = FilteredInputs(lm, KeepFirst(dropped=n))  # the path under test, its rule ours
        for i in range(3):
            plain.ingest(random_chunk(i, FRAMES))
            for n, session in filtered.items():
                assert session.ingest(random_chunk(i, FRAMES)).dropped == n
        assert_same_memory(memory_state(plain.memory), filtered[0].memory, storage=False)
        with pytest.raises(AssertionError):
            assert_same_memory(memory_state(plain.memory), filtered[1].memory, storage=False)


def test_streammem_saliency_is_the_eager_attention_of_the_template_tokens(lm):
    """The proxy query's attention, measured by the probe, against the model's own eager attention
    of the chat template's tokens read after the memory (mean over heads and template tokens)."""
    s = _session(lm, "streammem", budget=10_000)
    for i in range(2):
        s.ingest(random_chunk(i, FRAMES))
    before = memory_state(s.memory)
    probed = s.guidance_attention()
    assert_same_memory(before, s.memory)
    ids = lm.template_ids()
    positions = s.memory.next_position + torch.arange(ids.shape[-1])[None]
    implementation = lm.model.config._attn_implementation
    try:
        lm.model.set_attn_implementation("eager")
        with torch.inference_mode(), s.memory.scratch():
            out = lm.model(
                input_ids=ids, position_ids=lm.position_ids(positions), cache=s.memory, output_attentions=True
            )
    finally:
        lm.model.set_attn_implementation(implementation)
    p, n = s.memory.prefix_len, s.memory.slots
    # One attention map per key-value layer (a hybrid model's linear layers have none).
    assert len(out.attentions) == len(probed) == len(s.memory.kv_layers)
    for layer, attention in enumerate(out.attentions):
        eager = attention[0].float().mean(dim=(0, 1))[p : p + n]
        assert (probed[layer] - eager).abs().max().item() < 1e-4


def test_simplestream_keeps_the_last_frames_with_flat_bytes_and_read_only_questions(lm):
    """SimpleStream through the engine on every tiny backbone: after each chunk the memory holds the
    newest N frames whole (a merged frame pair whole: it holds the frame before too), whatever the
    budget; past N frames its bytes and storage stay put (within 10 s: Qwen3-VL's timestamps gain a
    digit there); a question changes nothing."""
    n = 3
    s = _session(lm, "simplestream", budget=10, params={"simplestream.frames": n})
    sizes, storage, seen = set(), set(), []
    for i in range(5):
        chunk = random_chunk(i, FRAMES)
        report = s.ingest(chunk)
        seen += chunk.frame_ids.tolist()
        # By hand: the last n frames, each named by its frame block (a pair starts at an even frame).
        newest = seen[-n:]
        blocks = {f - f % lm.frame_multiple for f in newest}
        for layer in s.memory.kv_layers:
            assert set(layer.frames.tolist()) == blocks, i
            assert layer.video_ids.numel() == s.memory.kv_layers[0].video_ids.numel()
        if i >= 2:  # the memory has held n frames since chunk 1, and room for the next chunk since chunk 2
            sizes.add(report.cache_bytes)
            storage.add(tuple(s.memory.storage()))
    assert len(sizes) == 1 and len(storage) == 1
    assert s.memory.slots > 10  # the token budget does not apply: the frames are whole
    before = memory_state(s.memory)
    first = s.ask("What is happening?", max_new_tokens=4)
    assert_same_memory(before, s.memory)
    assert s.ask("What is happening?", max_new_tokens=4).text == first.text
    assert_same_memory(before, s.memory)
