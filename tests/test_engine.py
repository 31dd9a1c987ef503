"""StreamingSession on both tiny architectures: sizes, equivalence, guidance, answering, positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.engine import guidance
from hermes.engine.guidance import (
    GLOBAL_PROMPT,
    AttentionProbe,
    guidance_prompt,
)
from hermes.engine.session import QuestionError, StreamingSession
from hermes.memory.config import HermesConfig
from hermes.memory.tiers import Tier
from tests.helpers import assert_same_memory, memory_state, random_chunk

FRAMES = 2  # per chunk: small, and even for Qwen2.5-VL


def _session(lm, budget: int, policy: str = "hermes", **kw) -> StreamingSession:
    return StreamingSession(lm, HermesConfig(budget=budget, chunk_frames=FRAMES, fps=1.0, **kw), policy=policy)


def test_memory_size_is_fixed_after_many_chunks(lm):
    budget = 150
    s = _session(lm, budget)
    sizes = set()
    for i in range(8):
        report = s.ingest(random_chunk(i, FRAMES))
        if s.memory.tokens_seen > budget + 1:
            lengths = {layer.keys.shape[-2] for layer in s.memory.kv_layers}
            assert lengths == {s.memory.prefix_len + 1 + budget}
            sizes.add(report.cache_bytes)
    assert len(sizes) == 1  # exactly constant once the budget is reached
    assert s.memory.tokens_seen > 3 * budget


def test_hermes_equals_full_until_it_must_evict(lm):
    hermes, full = _session(lm, 100_000), _session(lm, 100_000, policy="full")
    for i in range(3):
        hermes.ingest(random_chunk(i, FRAMES))
        full.ingest(random_chunk(i, FRAMES))
    a = hermes.first_token_logprobs("What is happening?")
    b = full.first_token_logprobs("What is happening?")
    assert torch.equal(a, b)
    # ...and once it evicts, the memory (and so the answer distribution) differs.
    small = _session(lm, 100)
    for i in range(3):
        small.ingest(random_chunk(i, FRAMES))
    assert not torch.allclose(small.first_token_logprobs("What is happening?"), b)


@pytest.mark.parametrize("block_bytes", [None, 1], ids=["one block", "a row per block"])
def test_guidance_attention_matches_eager_and_leaves_cache(lm, monkeypatch, block_bytes):
    if block_bytes is not None:  # the probe's blocks of query rows add up to the whole
        monkeypatch.setattr(guidance, "PROBE_BLOCK_BYTES", block_bytes)
        monkeypatch.setattr(guidance, "PROBE_BLOCK_BYTES_ACCELERATOR", block_bytes)
    s = _session(lm, 120)
    for i in range(3):
        s.ingest(random_chunk(i, FRAMES))
    before = memory_state(s.memory)
    ids = lm.question_ids("Where is the red ball?")
    positions = s.memory.next_position + torch.arange(ids.shape[-1])[None]
    layers = range(lm.kv_layers)  # a hybrid model's linear-attention layers have no attention to probe
    with s.memory.scratch(), AttentionProbe(lm.attention_modules(), layers) as probe:
        lm.forward(s.memory, ids, positions)
    assert_same_memory(before, s.memory)
    implementation = lm.model.config._attn_implementation
    try:
        lm.model.set_attn_implementation("eager")
        with torch.inference_mode(), s.memory.scratch():
            out = lm.model(
                input_ids=ids,
                position_ids=lm.position_ids(positions),
                cache=s.memory,
                use_cache=True,
                output_attentions=True,
            )
    finally:
        lm.model.set_attn_implementation(implementation)
    for layer in layers:
        eager = out.attentions[layer][0].float().mean(dim=(0, 1))
        assert (probe.weights[layer] - eager).abs().max().item() < 1e-4
    # The full guidance pass used during compression leaves the memory untouched too.
    s.guidance_attention()
    assert_same_memory(before, s.memory)


def test_asking_leaves_cache_and_is_repeatable(lm):
    s = _session(lm, 120)
    for i in range(3):
        s.ingest(random_chunk(i, FRAMES))
    before = memory_state(s.memory)
    first = s.ask("What is happening?", max_new_tokens=6)
    assert_same_memory(before, s.memory)
    second = s.ask("What is happening?", max_new_tokens=6)
    assert_same_memory(before, s.memory)
    assert first.text == second.text and first.tokens >= 1
    assert first.ttft_ms > 0 and len(first.top_logprobs) == 5
    assert first.top_logprobs == second.top_logprobs


def test_bad_questions(lm):
    s = _session(lm, 120)
    with pytest.raises(QuestionError, match="No video yet"):
        s.ask("What is happening?")
    s.ingest(random_chunk(0, FRAMES))
    with pytest.raises(QuestionError, match="empty"):
        s.ask("   ")
    with pytest.raises(QuestionError, match="20,000 characters"):
        s.ask("x" * 20_000)


def test_qwen_positions_continue_across_chunks(qwen_lm):
    """Each chunk's 3D positions are get_rope_index's for [prefix + chunk], moved to start one past
    the largest position so far; question tokens continue after the maximum on all axes."""
    lm = qwen_lm
    s = _session(lm, 100_000)
    prefix = lm.prefix_ids().cpu()
    p = prefix.shape[-1]
    seen = []
    for i in range(3):
        start = s.memory.next_position
        chunk = random_chunk(i, FRAMES)
        inputs = lm.chunk_inputs(chunk.pixels, 1.0)
        proc = lm.processor(
            text=lm.processor.video_token,
            videos=[list(chunk.pixels)],
            video_metadata=[{"fps": 1.0, "total_num_frames": FRAMES}],
            do_sample_frames=False,
            return_tensors="pt",
        )
        ids = torch.cat([prefix, proc["input_ids"]], dim=1)
        types = torch.cat([torch.zeros_like(prefix), proc["mm_token_type_ids"]], dim=1)
        whole, _ = lm.model.model.get_rope_index(
            ids,
            mm_token_type_ids=types,
            video_grid_thw=proc["video_grid_thw"],
            second_per_grid_ts=torch.as_tensor(proc["second_per_grid_ts"]),
        )
        expected = whole[:, 0, p:] - p + start
        s.ingest(chunk)
        got = s.memory.kv_layers[0].positions[:, -inputs.num_tokens :]
        assert torch.equal(got, expected)
        assert start == (max(int(x.max()) for x in seen) + 1 if seen else p)
        seen.append(got)

    captured = []
    rotary = lm.language_model.rotary_emb
    handle = rotary.register_forward_hook(lambda mod, args, out: captured.append(args[1].clone()))
    try:
        s.ask("What is happening?", max_new_tokens=2)
    finally:
        handle.remove()
    question = captured[0]  # (3, 1, Q): the same position on all three axes
    top = max(int(x.max()) for x in seen)
    q_len = lm.question_ids("What is happening?").shape[-1]
    assert torch.equal(question[0, 0], torch.arange(top + 1, top + 1 + q_len))
    assert torch.equal(question[0], question[1]) and torch.equal(question[1], question[2])
    assert int(captured[1][0, 0, 0]) == top + 1 + q_len  # the first decoded token follows


def test_one_guidance_pass_serves_both_prompts(lm):
    """Deep layers read the global prompt's queries inside the hybrid pass: the same attention as
    a pass over the global prompt alone, because the global prompt comes first."""
    s = _session(lm, 120)
    for i in range(3):
        s.ingest(random_chunk(i, FRAMES))
    combined = s.guidance_attention()
    ids = torch.cat([lm.encode(lm.video_close), lm.encode(GLOBAL_PROMPT)], dim=-1)
    positions = s.memory.next_position + torch.arange(ids.shape[-1])[None]
    deep = s.memory.tiers.layers(Tier.LONG_TERM)
    with s.memory.scratch(), AttentionProbe(lm.attention_modules(), deep) as probe:
        lm.forward(s.memory, ids, positions)
    p = s.memory.prefix_len
    for layer in deep:
        alone = probe.weights[layer][p : p + s.memory.slots]
        assert (combined[layer] - alone).abs().max().item() < 1e-6
    # Middle layers average over the whole hybrid prompt, which differs from the global part alone.
    middle = s.memory.tiers.layers(Tier.WORKING)[0]
    with s.memory.scratch(), AttentionProbe(lm.attention_modules(), [middle]) as probe:
        lm.forward(s.memory, ids, positions)
    assert (combined[middle] - probe.weights[middle][p : p + s.memory.slots]).abs().max().item() > 1e-6


def test_guidance_history_keeps_question_and_answer_each_capped(llava_lm):
    """A long question must not push the answer out of the guidance history."""
    lm = llava_lm
    question = "What is the man holding in his left hand while he walks across the busy street?"
    answer = "A red umbrella."
    ids, n_global = guidance_prompt(lm.encode, lm.video_close, (question, answer))
    text = lm.tokenizer.decode(ids[0, :n_global])
    assert answer in text  # the whole short answer survives
    cap = HermesConfig.history_tokens
    assert question[:cap] in text and question not in text  # byte tokens: one per character
    long_answer = "word " * 100
    ids, n_global = guidance_prompt(lm.encode, lm.video_close, (question, long_answer))
    history_len = n_global - guidance_prompt(lm.encode, lm.video_close)[1]
    fixed = len(lm.encode("Q: ")[0]) + len(lm.encode(" A: ")[0]) + len(lm.encode(" ")[0])
    assert history_len == 2 * cap + fixed
    short = guidance_prompt(lm.encode, lm.video_close, (question, long_answer), history_tokens=5)[1]
    assert short - guidance_prompt(lm.encode, lm.video_close)[1] == 2 * 5 + fixed
    none = guidance_prompt(lm.encode, lm.video_close, (question, answer), history_tokens=0)
    assert torch.equal(none[0], guidance_prompt(lm.encode, lm.video_close)[0])


def test_a_stream_can_leave_the_conversation_out_of_its_guidance(llava_lm):
    """`hermes.history_tokens=0`: after an answer, the compression is guided as before any question,
    while the default stream's guidance changes with the conversation."""
    from hermes.engine.methods import parse_policy

    config = HermesConfig(budget=40, chunk_frames=FRAMES, fps=1.0)
    plain = StreamingSession(llava_lm, config, policy=parse_policy("hermes", {"hermes.history_tokens": 0}))
    talks, silent = StreamingSession(llava_lm, config), StreamingSession(llava_lm, config)
    assert (plain.policy.history_tokens, talks.policy.history_tokens) == (0, HermesConfig.history_tokens)
    for s in (plain, talks, silent):
        s.ingest(random_chunk(0, FRAMES))
    for s in (plain, talks):
        s.ask("What is on the table?", max_new_tokens=4)
    before = guidance_prompt(llava_lm.encode, llava_lm.video_close)[0]
    assert torch.equal(plain.guidance.prompt(plain.reader.last_turn, 0)[0], before)
    assert talks.guidance.prompt(talks.reader.last_turn, talks.policy.history_tokens)[0].shape[-1] > before.shape[-1]
    quiet, asked, never = (s.ingest(random_chunk(1, FRAMES)) for s in (plain, talks, silent))
    assert quiet.evicted > 0 and asked.evicted > 0
    probed = [
        (a[1], b[1], c[1])
        for a, b, c in zip(quiet.attention, asked.attention, never.attention, strict=True)
        if a is not None
    ]
    assert probed and all(np.array_equal(a, c) for a, _, c in probed)  # as if nobody had asked
    assert not all(np.allclose(a, b) for a, b, _ in probed)  # the conversation guides the default


def test_lazy_compaction_is_reported_as_reindexing(llava_lm):
    """A lazy compaction runs before a chunk's prefill: the report says so and times it apart."""
    s = _session(llava_lm, 150, max_positions=1400, position_margin=64)
    reports = [s.ingest(random_chunk(i, FRAMES)) for i in range(6)]
    lazy = [r for r in reports if r.reindexed]
    assert lazy and s.memory.compactions == len(lazy)
    assert all(r.reindex_ms > 0 and r.reindex_ms <= r.compress_ms for r in lazy)
    assert all(r.reindex_ms == 0 for r in reports if not r.reindexed)
    assert all(r.guidance_ms <= r.compress_ms for r in reports)


def test_a_question_past_the_reserved_margin_then_more_chunks(qwen_lm) -> None:
    """A question longer than the room reserved after the memory grows the cache while the model
    runs in inference mode; the chunks after it still evict in place (they used to fail)."""
    from hermes.engine.session import QUESTION_MARGIN

    session = _session(qwen_lm, budget=40)
    session.ingest(random_chunk(0, FRAMES, seed=1))
    question = "x" * (2 * QUESTION_MARGIN)  # one token per character with the tiny byte-level tokenizer
    assert qwen_lm.question_ids(question).shape[-1] > QUESTION_MARGIN
    session.ask(question, 2)
    for index in (1, 2):
        report = session.ingest(random_chunk(index, FRAMES, seed=index + 1))
    assert report.evicted > 0 and session.ask("And now?", 2).done
