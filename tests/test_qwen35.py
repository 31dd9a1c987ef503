"""Qwen3.5 (hybrid): partial interleaved rotary, a memory of HERMES layers and linear-attention
states, answers equal to `full` and to transformers' one pass, states untouched by questions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec, rotate_keys
from hermes.models import tiny
from hermes.models.loading import ADAPTERS, ModelLoadError, load_video_lm
from hermes.models.qwen3_5 import ANSWER_OPENING
from hermes.models.random7b import parameter_count, random_config
from tests.helpers import (
    assert_same_memory,
    generate_on_cache,
    memory_state,
    pair_chunks,
    qwen_frames,
    whole_video_inputs,
)

FPS = 1.0
QUESTION = "What is happening?"


def _stream(lm, policy: str, budget: int, frames: np.ndarray) -> StreamingSession:
    session = StreamingSession(lm, HermesConfig(budget=budget, chunk_frames=2, fps=FPS), policy=policy)
    for chunk in pair_chunks(frames):
        session.ingest(chunk)
    return session


# -- structure -------------------------------------------------------------------------------------
def test_the_memory_has_a_hermes_layer_per_attention_layer_and_a_state_per_linear_one(qwen35_lm):
    lm = qwen35_lm
    assert lm.num_layers == 12 and lm.linear_layers == [0, 1, 2, 4, 5, 6, 8, 9, 10] and lm.kv_layers == 3
    session = _stream(lm, "hermes", 100, qwen_frames(4, seed=1, size=64))
    memory = session.memory
    assert memory.kv_layer_indices == [3, 7, 11] and len(memory.state_layers) == 9
    assert [t.value for t in memory.tiers.tiers] == ["sensory", "working", "long-term"]
    # The states' bytes are what the adapter predicts for admission, and the memory counts them.
    assert memory.state_bytes() == lm.state_bytes > 0
    kv = sum(layer.nbytes() for layer in memory.kv_layers)
    assert memory.cache_bytes() == kv + lm.state_bytes
    assert kv == (memory.prefix_len + memory.slots) * lm.kv_bytes_per_token
    snap = memory.snapshot()
    assert snap.layer_names() == [3, 7, 11] and snap.state_layers == 9 and len(snap.layers) == 3


def test_adapters_and_the_real_shapes():
    assert ADAPTERS["qwen3_5"].model_class == "Qwen3_5ForConditionalGeneration"
    assert ADAPTERS["qwen3_5_moe"].model_class == "Qwen3_5MoeForConditionalGeneration"
    from hermes.models.random7b import _processor

    tokenizer = _processor("qwen3_5").tokenizer
    # The published sizes give the published parameter counts (vision tower included).
    small = random_config("qwen3.5-0.8b-random", tokenizer)
    large = random_config("qwen3.5-9b-random", tokenizer)
    assert 0.8e9 < parameter_count(small) < 0.95e9
    assert 9.0e9 < parameter_count(large) < 9.8e9
    text = small.text_config
    assert text.layer_types.count("full_attention") == 6 and text.layer_types[3] == "full_attention"


def test_the_answer_opens_with_thinking_off(qwen35_lm):
    """The question's tail is the chat template's with `enable_thinking=False`: an empty thinking block."""
    tokenizer = qwen35_lm.tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    off = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    on = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert off.endswith(f"{QUESTION}<|im_end|>\n{ANSWER_OPENING}") and not on.endswith(ANSWER_OPENING)
    tail = tokenizer.decode(qwen35_lm.question_ids(QUESTION)[0], skip_special_tokens=False)
    assert off.endswith(tail)


def test_an_uncached_checkpoint_offline_gets_the_one_line_error():
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set") as err:
        load_video_lm("Qwen/Qwen3.5-0.8B")
    assert "\n" not in str(err.value) and "tiny-qwen35" in str(err.value)


# -- partial rotary --------------------------------------------------------------------------------
def _keys_at(lm, positions: torch.Tensor) -> torch.Tensor:
    """The first attention layer's keys of fixed hidden states at `positions` (3, n), computed the
    way the model computes them: k_norm(k_proj(h)), then its own rotary embedding."""
    attn = lm.attention_modules()[0]
    rotary = lm.language_model.rotary_emb
    n = positions.shape[-1]
    hidden = torch.randn(1, n, lm.text_config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        k = attn.k_norm(attn.k_proj(hidden).view(1, n, -1, attn.head_dim)).transpose(1, 2)
        cos, sin = rotary(k, positions[:, None, :])
        return apply_rotary_pos_emb(k, k, cos, sin)[1]


def test_rotating_keys_equals_computing_them_at_the_new_position(qwen35_lm):
    lm = qwen35_lm
    spec = lm.rope_spec()
    head_dim = lm.attention_modules()[0].head_dim
    assert spec.rotary_dim == head_dim // 4 and spec.interleaved and spec.mrope_section == (3, 3, 2)
    n = 6
    start = torch.stack([torch.arange(n) + 40, torch.arange(n) % 3 + 40, torch.arange(n) % 2 + 40])
    base = _keys_at(lm, start)
    shifts = {"t": [25, 0, 0], "h": [0, 17, 0], "w": [0, 0, 11], "all": [-30, 9, 21]}
    wrong = {
        # Every channel rotated, as if the rotary were not partial (the same sections over 32 pairs).
        "all channels": RopeSpec.from_config(head_dim, tiny.QWEN35_ROPE_THETA, [11, 11, 10], interleaved=True),
        # The right channels, in contiguous sections instead of interleaved.
        "contiguous": RopeSpec(spec.inv_freq, spec.mrope_section, interleaved=False),
    }
    for name, shift in shifts.items():
        delta = torch.tensor(shift)[:, None].expand(3, n)
        expected = _keys_at(lm, start + delta)
        moved = rotate_keys(base, delta, spec)
        assert (moved - expected).abs().max().item() < 1e-4, name
        assert torch.equal(moved[..., spec.rotary_dim :], base[..., spec.rotary_dim :])  # passed through
        for label, bad in wrong.items():
            assert (rotate_keys(base, delta, bad) - expected).abs().max().item() > 1e-2, (name, label)


# -- the memory on the tiny model ------------------------------------------------------------------
def test_hermes_below_its_budget_answers_as_full_and_as_one_pass(qwen35_lm):
    """Chunk by chunk, with the linear-attention states carried from chunk to chunk, the first answer
    token's log-probabilities equal `full`'s and those of transformers' one pass over the same tokens."""
    lm = qwen35_lm
    frames = qwen_frames(6, seed=2)
    hermes = _stream(lm, "hermes", 100_000, frames)
    full = _stream(lm, "full", 100_000, frames)
    logp = hermes.first_token_logprobs(QUESTION)
    assert torch.equal(logp, full.first_token_logprobs(QUESTION))
    assert hermes.ask(QUESTION, 4).text == full.ask(QUESTION, 4).text

    question = lm.question_ids(QUESTION)[0]
    proc = whole_video_inputs(lm, frames, QUESTION, FPS)
    assert proc["input_ids"].shape[-1] == hermes.memory.get_seq_length() + question.numel()
    with torch.inference_mode():
        out = lm.model(**proc)
    expected = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    assert (logp - expected).abs().max().item() < 1e-3


def test_the_states_carry_the_stream(qwen35_lm):
    """The control of the test above: a memory whose linear-attention states are zeroed (keys and
    values kept) answers otherwise, so the states really carry the stream."""
    lm = qwen35_lm
    session = _stream(lm, "full", 100_000, qwen_frames(4, seed=3, size=64))
    logp = session.first_token_logprobs(QUESTION)
    for layer in session.memory.state_layers:
        for t in (*layer.states().values(), *layer._saved.values()):
            t.zero_()
    assert (session.first_token_logprobs(QUESTION) - logp).abs().max().item() > 1e-3


def test_past_the_budget_bytes_are_flat_and_questions_leave_everything_bit_identical(qwen35_lm):
    lm = qwen35_lm
    session = StreamingSession(lm, HermesConfig(budget=80, chunk_frames=2, fps=FPS))
    session.standing.add("Is there a red ball?")
    reports = [session.ingest(chunk) for chunk in pair_chunks(qwen_frames(12, seed=4, size=64))]
    past = [r for r in reports if r.evicted]
    assert len(past) >= 3 and all(r.watches for r in past)  # standing checks ran after every chunk
    assert len({r.cache_bytes for r in past}) == 1
    storage = session.memory.storage()
    before = memory_state(session.memory)
    # Inside a question the states do change (the test below could fail) ...
    with session.memory.scratch():
        session.reader.read_question(QUESTION)
        moved = [t for layer in session.memory.state_layers for t in layer.states().values()]
        assert any(not torch.equal(a, b) for a, b in zip(before[2], moved, strict=True))
    # ... and after any reader (an answer, log-probabilities, generate, a guidance pass) they are back.
    session.ask(QUESTION, 5)
    session.first_token_logprobs("Who is there?")
    session.continuation_logprobs(QUESTION, [ord("a"), ord("b")])
    generate_on_cache(lm, session.memory, QUESTION, 3)
    session.guidance_attention()
    session.check_standing()
    assert_same_memory(before, session.memory)
    session.ingest(pair_chunks(qwen_frames(2, seed=5, size=64))[0])
    assert session.memory.storage() == storage  # a chunk past the budget allocates nothing


# -- the app's serving layer -----------------------------------------------------------------------
def test_compare_mode_and_a_standing_question_on_a_live_stream(worker, qwen35_lm, clips):
    """Compare (hermes beside fifo) with a standing question, through the app's serving layer: the
    published map names the attention layers and the states, and both memories hold their budget."""
    from hermes.runtime.settings import StreamSettings
    from hermes.serving.admission import cache_bytes_for
    from hermes.serving.live import LiveStream
    from tests.helpers import streamed

    settings = StreamSettings(budget=60, chunk_frames=2, fps=FPS, compare=True)
    stream = LiveStream(worker, qwen35_lm, settings, key="q35")
    try:
        stream.watch("Is there a red square?")
        streamed(stream, clips["short"], settings=settings)
        view = stream.view()
        assert {p.name for p in view.snapshots} == {"hermes", "fifo"}
        for policy, snap in view.snapshots.items():
            assert snap.layer_names() == [3, 7, 11] and snap.state_layers == 9
            alone = cache_bytes_for(qwen35_lm, StreamSettings(budget=60, chunk_frames=2, fps=FPS, policy=policy))
            assert snap.cache_bytes == alone  # past the budget: what admission reserved, states included
        metrics = stream.metrics()
        assert metrics["kv_layers"]["hermes"] == [3, 7, 11] and metrics["state_bytes"]["fifo"] == qwen35_lm.state_bytes
        assert {p.policy.name for p in view.watch_history} == {"hermes", "fifo"}
        done = [e for e in stream.ask("What happened?", max_new_tokens=3).events() if e.done]
        assert [e.policy.name for e in done] == ["hermes", "fifo"] and all(e.error is None for e in done)
    finally:
        stream.close()


def test_a_device_map_with_offloaded_layers_streams_like_one_device(qwen35_lm, tmp_path):
    """`--device-map`: with every other decoder layer offloaded to disk (linear-attention and
    attention layers alike, run through accelerate's hooks), the stream is the one-device stream."""
    from tests.helpers import random_chunk

    layers = {f"model.language_model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(qwen35_lm.num_layers)}
    rest = ("model.visual", "model.language_model.embed_tokens", "model.language_model.norm", "lm_head")
    placement = {**dict.fromkeys(rest, "cpu"), "model.language_model.rotary_emb": "cpu", **layers}
    lm = load_video_lm("tiny-qwen35", device_map=placement, offload_folder=tmp_path)
    assert lm.language_model.layers[1].linear_attn.in_proj_qkv.weight.device.type == "meta"  # really offloaded
    assert lm.language_model.layers[7].self_attn.q_proj.weight.device.type == "meta"
    config = HermesConfig(budget=100, chunk_frames=2, fps=FPS)
    mapped, plain = StreamingSession(lm, config), StreamingSession(qwen35_lm, config)
    for i in range(4):
        a, b = mapped.ingest(random_chunk(i)), plain.ingest(random_chunk(i))
        assert a.evicted == b.evicted and a.cache_bytes == b.cache_bytes
    assert b.evicted > 0
    for (k0, v0), (k1, v1) in zip(mapped.memory.kv(), plain.memory.kv(), strict=True):
        torch.testing.assert_close(k0, k1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v0, v1, rtol=1e-5, atol=1e-5)
    for s0, s1 in zip(mapped.memory.state_layers, plain.memory.state_layers, strict=True):
        for name, t in s0.states().items():
            torch.testing.assert_close(t, s1.states()[name], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        mapped.first_token_logprobs(QUESTION), plain.first_token_logprobs(QUESTION), rtol=1e-4, atol=1e-4
    )


def test_eval_scores_a_benchmark_file_on_qwen35(qwen35_lm, eval_videos, tmp_path):
    """The benchmark harness streams a StreamingBench file into a Qwen3.5 memory and scores each
    question from the first answer token's log-probabilities, the memory untouched between them."""
    from hermes.eval.formats import BENCHES
    from hermes.eval.harness import EvalSettings, run_eval
    from tests.eval_helpers import records_of, write_json

    opts = ["A. yes", "B. no", "C. maybe", "D. never"]
    questions = [
        {"task_type": "T", "question": q, "time_stamp": at, "answer": a, "options": opts}
        for q, at, a in (("Now?", "00:00:04", "A"), ("Later?", "00:00:07", "B"))
    ]
    ann = write_json(tmp_path / "sb.json", [{"video_path": "videos/long.mp4", "questions": questions}])
    spec = BENCHES["streamingbench"]
    items, problems = spec.load(ann)
    session = StreamingSession(qwen35_lm, HermesConfig(budget=60, chunk_frames=2, fps=FPS))
    out = tmp_path / "q35.jsonl"
    summary = run_eval(qwen35_lm, spec, items, problems, session, eval_videos, out, EvalSettings(0), False)
    records = {r["qid"]: r for r in records_of(out)}
    assert [records[q]["status"] for q in ("0.0", "0.1")] == ["answered", "answered"]
    assert records["0.1"]["frames_seen"] == 8 and summary["overall"]["answered"] == 2


def test_admission_splits_keys_and_states_over_devices_by_their_layers(qwen35_lm, monkeypatch):
    """With layers 0-7 on one GPU and 8-11 on another, the first holds 2 of the 3 attention layers'
    keys and values and 6 of the 9 states."""
    from hermes.runtime.settings import StreamSettings
    from hermes.serving import admission

    settings = StreamSettings(budget=256, chunk_frames=2, fps=FPS)
    total = admission.cache_bytes_for(qwen35_lm, settings)
    states = qwen35_lm.state_bytes
    cuda = [torch.device("cuda", 0)] * 8 + [torch.device("cuda", 1)] * 4
    monkeypatch.setattr(qwen35_lm, "layer_devices", lambda: cuda)
    split = admission.cache_bytes_per_device(qwen35_lm, settings)
    assert split == {cuda[0]: (total - states) * 2 // 3 + states * 6 // 9, cuda[8]: (total - states) // 3 + states // 3}
    assert abs(sum(split.values()) - total) <= 2  # integer shares


def test_hybrid_rows_join_only_an_empty_batch_with_equal_length_questions(qwen35_lm):
    """No hybrid row is ever padded: the first step takes the rows whose questions have the first
    one's length; a row with another length waits for the next batch, and all answer as alone."""
    from hermes.engine.batch import BatchDecoder
    from tests.helpers import random_chunk

    sessions = []
    for s in range(3):
        session = StreamingSession(qwen35_lm, HermesConfig(budget=60, chunk_frames=2, fps=FPS))
        for i in range(s + 1):  # memories of different lengths: their keys are left-padded, as usual
            session.ingest(random_chunk(i, seed=10 * s + i))
        sessions.append(session)
    questions = ["Who?", "Where is it?", "Why?"]
    decoder = BatchDecoder(qwen35_lm)
    rows = [decoder.add(s, q, 3) for s, q in zip(sessions, questions, strict=True)]
    decoder.step()
    assert decoder.rows == [rows[0], rows[2]] and decoder.joining == [rows[1]]
    assert not decoder._padded or decoder._mask[:, -rows[0].ids.shape[-1] :].all()  # no padded question token
    while len(decoder):
        decoder.step()
    for session, question in zip(sessions, questions, strict=True):
        batched, alone = session.reader.answers[-1], session.ask(question, 3)
        assert (batched.text, batched.tokens) == (alone.text, alone.tokens)


def test_the_same_adapter_serves_the_mixture_of_experts_checkpoints(qwen35_lm):
    """Qwen3.5-MoE and Qwen3.6 (`qwen3_5_moe`): the tiny model's layers with expert MLPs wrap into the
    same memory, hold the budget, and below it answer as `full`."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    from hermes.models.loading import wrap
    from hermes.models.qwen3_5 import Qwen35Moe
    from tests.helpers import random_chunk

    dense = qwen35_lm.model.config
    text = {k: v for k, v in dense.text_config.to_dict().items() if k not in ("model_type", "intermediate_size")}
    text |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    text["shared_expert_intermediate_size"] = 32
    ids = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    vision = {k: v for k, v in dense.vision_config.to_dict().items() if k != "model_type"}
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, **{k: getattr(dense, k) for k in ids})
    torch.manual_seed(0)
    lm = wrap(Qwen3_5MoeForConditionalGeneration(config), qwen35_lm.processor)
    assert isinstance(lm, Qwen35Moe) and lm.linear_layers == qwen35_lm.linear_layers
    small = StreamingSession(lm, HermesConfig(budget=60, chunk_frames=2, fps=FPS))
    hermes = StreamingSession(lm, HermesConfig(budget=100_000, chunk_frames=2, fps=FPS))
    full = StreamingSession(lm, HermesConfig(budget=100_000, chunk_frames=2, fps=FPS), policy="full")
    for i in range(3):
        report = small.ingest(random_chunk(i))
        hermes.ingest(random_chunk(i))
        full.ingest(random_chunk(i))
    assert report.evicted > 0 and report.video_tokens_per_layer == [61, 61, 60]
    assert torch.equal(hermes.first_token_logprobs(QUESTION), full.first_token_logprobs(QUESTION))
