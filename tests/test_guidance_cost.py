"""The guidance pass does only the work the probe reads, and reads the same attention as a full pass.

The reference is the pass as it was: the whole prompt through every layer and the LM head, with
the probe's hooks recording the same layers.
"""

from __future__ import annotations

import numpy as np
import torch

from hermes.engine.guidance import AttentionProbe, probe_attention, tokens_needed
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models import qwen3_5
from tests.helpers import memory_state, random_chunk


def _streamed(lm) -> StreamingSession:
    session = StreamingSession(lm, HermesConfig(budget=64, chunk_frames=2, fps=lm.default_fps))
    for i in range(3):
        session.ingest(random_chunk(i, n=2))
    return session


def _full_pass(lm, memory, ids: torch.Tensor, queries: dict[int, slice]) -> dict[int, torch.Tensor]:
    """The probe over a pass of the whole prompt through every layer, as before."""
    positions = memory.next_position + torch.arange(ids.shape[-1])[None]
    with memory.scratch(), AttentionProbe(lm.attention_modules(), list(queries), queries) as probe:
        lm.forward(memory, ids, positions)
    return probe.weights


def _hermes_queries(session: StreamingSession) -> tuple[torch.Tensor, int, dict[int, slice]]:
    ids, n_global = session.guidance.prompt(session.reader.last_turn, session.policy.history_tokens)
    part = {"global": slice(0, n_global), "hybrid": slice(None)}
    wanted = {layer: session.policy.guidance(tier) for layer, tier in enumerate(session.memory.tiers.tiers)}
    return ids, n_global, {layer: part[q] for layer, q in wanted.items() if q in part}


def test_tokens_needed_per_decoder_layer() -> None:
    # Probed attention layers 1 (decoder 3, the whole prompt) and 2 (decoder 7, its first 4 tokens).
    needed = tokens_needed([0, 3, 7], {1: slice(None), 2: slice(0, 4)}, 10)
    assert needed == [10, 10, 10, 10, 4, 4, 4, 4]
    assert tokens_needed([0, 1], {0: slice(0, 4), 1: slice(None)}, 10) == [10, 10]


def test_the_pass_stops_early_and_carries_only_the_global_part_above_the_middle_layers(lm) -> None:
    session = _streamed(lm)
    ids, n_global, queries = _hermes_queries(session)
    modules = lm.attention_modules()
    deepest = max(queries)
    seen: dict[int, int] = {}
    # Inside each decoder layer (its first norm), after the pass has cut what the layer gets.
    hooks = [
        layer.input_layernorm.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].shape[1]))
        for i, layer in enumerate(lm.language_model.layers)
    ]
    try:
        fast = probe_attention(lm, session.memory, ids, queries)
    finally:
        for hook in hooks:
            hook.remove()
    assert max(seen) == modules[deepest].layer_idx  # nothing above the deepest probed layer ran
    assert seen[modules[deepest].layer_idx] == n_global < ids.shape[-1]  # the deep layer read the global part only
    assert seen[0] == ids.shape[-1]
    reference = _full_pass(lm, session.memory, ids, queries)
    assert sorted(fast) == sorted(reference) == sorted(queries)
    for layer, weights in reference.items():
        # The scratch tokens cut from the pass are the last keys; the memory's keys come first.
        assert torch.allclose(fast[layer], weights[: fast[layer].shape[0]], atol=1e-5, rtol=1e-4), layer


def test_the_guidance_attention_is_unchanged(lm) -> None:
    """What the policy reads (the weights over the video slots) against the full pass's."""
    session = _streamed(lm)
    ids, _, queries = _hermes_queries(session)
    reference = _full_pass(lm, session.memory, ids, queries)
    p, s = session.memory.prefix_len, session.memory.slots
    for layer, weights in enumerate(session.guidance_attention()):
        if layer in reference:
            assert torch.allclose(weights, reference[layer][p : p + s], atol=1e-5, rtol=1e-4), layer
        else:
            assert weights is None


def test_a_short_pass_runs_the_linear_layers_as_one_chunk(qwen35_lm, monkeypatch) -> None:
    """Qwen3.5 on a CPU: a pass shorter than the reference rule's 64-token chunk runs as one chunk
    of its own length, and the probe reads the same attention as with the padded chunk."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    session = _streamed(qwen35_lm)
    ids = qwen35_lm.encode("Recall the story.")  # 17 bytes: shorter than a chunk
    queries = {layer: slice(None) for layer in range(len(qwen35_lm.attention_modules()))}
    qwen3_5._install_chunk_choice()
    short = probe_attention(qwen35_lm, session.memory, ids, queries)
    installed = modeling_qwen3_5.torch_chunk_gated_delta_rule
    sizes: list[int | None] = []

    def spy(*args, **kwargs):
        sizes.append(kwargs.get("chunk_size"))
        return installed(*args, **kwargs)

    # The spy sees the chunk size that the running pass asks for.
    monkeypatch.setattr(modeling_qwen3_5, "torch_chunk_gated_delta_rule", qwen3_5._with_chunk_size(spy))
    probe_attention(qwen35_lm, session.memory, ids, queries)
    assert sizes and set(sizes) == {ids.shape[-1]}
    monkeypatch.setattr(qwen3_5, "REFERENCE_CHUNK", 0)  # the reference rule's own 64-token chunks
    sizes.clear()
    padded = probe_attention(qwen35_lm, session.memory, ids, queries)
    assert sizes and set(sizes) == {None}
    for layer, weights in padded.items():
        assert torch.allclose(short[layer], weights, atol=1e-5, rtol=1e-4), layer


def test_an_argument_it_cannot_cut_falls_back_to_the_whole_prompt(llava_lm, monkeypatch) -> None:
    """A decoder-layer argument per token that the cut does not know (another transformers release):
    the pass runs on every token instead, and reads the same attention."""
    session = _streamed(llava_lm)
    ids, _, queries = _hermes_queries(session)
    layers = llava_lm.language_model.layers
    extra = layers[-1].register_forward_pre_hook(
        lambda m, a, k: (a, {**k, "unknown_per_token": torch.zeros(ids.shape[-1])}), with_kwargs=True, prepend=True
    )
    try:
        weights = probe_attention(llava_lm, session.memory, ids, queries)
    finally:
        extra.remove()
    reference = _full_pass(llava_lm, session.memory, ids, queries)
    for layer, w in reference.items():
        assert torch.allclose(weights[layer], w, atol=1e-5, rtol=1e-4), layer


def test_the_guidance_prompt_riding_on_the_prefill_reads_what_its_own_pass_reads(lm, monkeypatch) -> None:
    """A stream whose guidance prompt rides on each compressing chunk's prefill runs no separate
    pass, and reads the same attention and keeps the same memory as a stream that runs one: keys,
    values and (Qwen3.5) the linear-attention states stop at the chunk's end; a question's history
    rides along."""
    from hermes.engine import guidance

    config = HermesConfig(budget=64, chunk_frames=2, fps=lm.default_fps)
    riding, separate = (StreamingSession(lm, config, guidance_rides=rides) for rides in (True, False))
    passes: list[int] = []
    probe = guidance.probe_attention
    monkeypatch.setattr(guidance, "probe_attention", lambda *a, **k: passes.append(1) or probe(*a, **k))
    for i in range(4):
        if i == 2:
            for session in (riding, separate):
                session.ask("What is on the table?", max_new_tokens=2)
        before = len(passes)
        ridden = riding.ingest(random_chunk(i, n=2))
        assert len(passes) == before, "the riding stream ran a separate guidance pass"
        alone = separate.ingest(random_chunk(i, n=2))
        assert ridden.evicted == alone.evicted and (alone.evicted > 0) == (len(passes) > before)
        for a, b in zip(ridden.attention, alone.attention, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], atol=1e-5, rtol=1e-4)
        kv_r, books_r, states_r, *_ = memory_state(riding.memory)
        kv_s, books_s, states_s, *_ = memory_state(separate.memory)
        for (k_r, v_r), (k_s, v_s) in zip(kv_r, kv_s, strict=True):
            assert torch.allclose(k_r, k_s, atol=1e-5) and torch.allclose(v_r, v_s, atol=1e-5)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(books_r, books_s, strict=True))  # the same slots kept
        assert len(states_r) == len(states_s) == (18 if lm.linear_layers else 0)
        assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(states_r, states_s, strict=True))
    assert len(passes) >= 2 and riding.reader.last_turn is not None


def _two_streams(lm, chunks: int) -> tuple[list, list]:
    """A stream whose prompt rides and one that runs its own pass, over the same chunks: their reports."""
    config = HermesConfig(budget=64, chunk_frames=2, fps=lm.default_fps)
    riding, separate = (StreamingSession(lm, config, guidance_rides=rides) for rides in (True, False))
    reports = [[s.ingest(random_chunk(i, n=2)) for i in range(chunks)] for s in (riding, separate)]
    return reports[0], reports[1]


def _assert_same_attention(ridden, alone) -> None:
    for r, a in zip(ridden, alone, strict=True):
        assert r.evicted == a.evicted
        for x, y in zip(r.attention, a.attention, strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert np.array_equal(x[0], y[0]) and np.allclose(x[1], y[1], atol=1e-5, rtol=1e-4)


def test_the_riding_prompt_goes_only_as_deep_as_the_probe_reads(llava_lm) -> None:
    """Above the last layer that reads the whole prompt, the decoder layers carry the chunk and the
    prompt's global part only."""
    session = StreamingSession(llava_lm, HermesConfig(budget=64, chunk_frames=2, fps=llava_lm.default_fps))
    session.ingest(random_chunk(0, n=2))
    seen: list[int] = []
    hooks = [
        layer.input_layernorm.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
        for layer in llava_lm.language_model.layers
    ]
    try:
        report = session.ingest(random_chunk(1, n=2))
    finally:
        for hook in hooks:
            hook.remove()
    ids, n_global = session.guidance.prompt(None, session.policy.history_tokens)
    assert report.evicted > 0 and seen[0] == report.tokens + ids.shape[-1]  # the prompt rode on the prefill
    assert seen[-1] == report.tokens + n_global < seen[0]


def test_a_riding_prompt_that_cannot_be_cut_runs_whole(llava_lm) -> None:
    """A decoder-layer argument per token that the cut does not know: the riding prefill runs again
    on every token, from the memory as the last commit left it, and reads the same attention."""
    layers = llava_lm.language_model.layers
    extra = layers[-1].register_forward_pre_hook(
        lambda m, a, k: (a, {**k, "unknown_per_token": torch.zeros(a[0].shape[1] if a else 1)}),
        with_kwargs=True,
        prepend=True,
    )
    try:
        ridden, alone = _two_streams(llava_lm, 3)
    finally:
        extra.remove()
    assert sum(r.evicted for r in ridden) > 0
    _assert_same_attention(ridden, alone)
