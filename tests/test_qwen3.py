"""Qwen3-VL: interleaved M-RoPE read from the model, timestamps, DeepStack and positions chunk by chunk
against transformers' own processing of the whole video, and the CLI on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hermes.cli.main import main
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models import tiny
from hermes.models.base import rotary_channel_axes
from tests.helpers import pair_chunks, qwen_frames, whole_video_inputs

FPS = 1.0
PAIRS = 3  # chunks of one frame pair each
QUESTION = "What is happening?"


def test_rope_spec_is_read_from_the_rotary_module(qwen3_lm, qwen_lm):
    spec = qwen3_lm.rope_spec()
    assert spec.interleaved and spec.mrope_section == tuple(tiny.QWEN3_MROPE_SECTION)
    assert spec.channel_axes().tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    rotary = qwen3_lm.language_model.rotary_emb
    assert rotary_channel_axes(rotary) == spec.channel_axes().tolist()
    torch.testing.assert_close(spec.inv_freq, rotary.inv_freq.float(), rtol=0, atol=0)
    # Qwen2.5-VL's rotary module reads as contiguous sections, LLaVA-OneVision's as plain RoPE.
    qwen25 = qwen_lm.rope_spec()
    assert not qwen25.interleaved and qwen25.channel_axes().tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


def test_chunks_match_transformers_on_the_whole_video(qwen3_lm):
    """Chunk by chunk, the tokens (timestamps included), the 3D positions, the DeepStack inputs and
    the answer's first-token log-probabilities are those transformers builds for the whole video."""
    lm = qwen3_lm
    frames = qwen_frames(2 * PAIRS)
    session = StreamingSession(lm, HermesConfig(budget=100_000, chunk_frames=2, fps=FPS), policy="full")
    language_model = lm.model.model.language_model
    captured: list[dict] = []

    def grab(module, args, kwargs):
        captured.append({k: kwargs.get(k) for k in ("deepstack_visual_embeds", "visual_pos_masks")})

    handle = language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        chunk_ids, chunk_deepstack = [], []
        for chunk in pair_chunks(frames):
            captured.clear()
            inputs = lm.chunk_inputs(chunk.pixels, FPS, chunk.timestamps)
            session.ingest(chunk)
            chunk_ids.append(inputs.input_ids[0])
            (call,) = [c for c in captured if c["deepstack_visual_embeds"] is not None]  # the prefill
            chunk_deepstack.append(call)
        logp = session.first_token_logprobs(QUESTION)

        prefix, question = lm.prefix_ids()[0], lm.question_ids(QUESTION)[0]
        proc = whole_video_inputs(lm, frames, QUESTION, FPS)
        captured.clear()
        with torch.inference_mode():
            out = lm.model(**proc)
    finally:
        handle.remove()

    # Tokens: the prefix, each chunk's frame pairs with their timestamps, the question.
    ids = proc["input_ids"][0]
    assert torch.equal(torch.cat([prefix, *chunk_ids, question]), ids)
    assert "<2.5 seconds>" in lm.tokenizer.decode(chunk_ids[1], skip_special_tokens=False)

    # Positions: what get_rope_index gives the whole sequence, and the question after the memory.
    whole, _ = lm.model.model.get_rope_index(
        proc["input_ids"], mm_token_type_ids=proc["mm_token_type_ids"], video_grid_thw=proc["video_grid_thw"]
    )
    p, video = prefix.numel(), sum(c.numel() for c in chunk_ids)
    assert torch.equal(session.memory.layers[0].positions, whole[:, 0, p : p + video])
    assert torch.equal(session.memory.position_ids(question.numel())[:, 0], whole[:, 0, p + video :])

    # DeepStack: each chunk's features for the first decoder layers are the whole video's, at the
    # same video tokens.
    (reference,) = [c for c in captured if c["deepstack_visual_embeds"] is not None]
    assert len(reference["deepstack_visual_embeds"]) == len(tiny.QWEN3_DEEPSTACK)
    for layer, embeds in enumerate(reference["deepstack_visual_embeds"]):
        streamed = torch.cat([c["deepstack_visual_embeds"][layer] for c in chunk_deepstack])
        torch.testing.assert_close(streamed, embeds, rtol=1e-5, atol=1e-5)
    masks = torch.cat([c["visual_pos_masks"][0] for c in chunk_deepstack])
    assert torch.equal(masks, reference["visual_pos_masks"][0, p : p + video])

    # And the model's own answer over the whole sequence.
    expected = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    assert (logp - expected).abs().max().item() < 1e-4


def test_deepstack_matters(qwen3_lm):
    """The control: without the DeepStack features the prefill gives another memory."""
    lm = qwen3_lm
    chunk = pair_chunks(qwen_frames(2, seed=3))[0]
    language_model = lm.model.model.language_model

    def drop(module, args, kwargs):
        return args, {**kwargs, "deepstack_visual_embeds": None}

    with_ds = StreamingSession(lm, HermesConfig(budget=100_000, chunk_frames=2, fps=FPS), policy="full")
    with_ds.ingest(chunk)
    without = StreamingSession(lm, HermesConfig(budget=100_000, chunk_frames=2, fps=FPS), policy="full")
    handle = language_model.register_forward_pre_hook(drop, with_kwargs=True)
    try:
        without.ingest(chunk)
    finally:
        handle.remove()
    (k0, _), (k1, _) = with_ds.memory.kv()[1], without.memory.kv()[1]  # layer 0's output feeds layer 1
    assert (k0 - k1).abs().max().item() > 1e-3


def test_frames_and_timestamps_of_a_padded_chunk(qwen3_lm):
    """An odd chunk repeats its last frame (and time): every token maps to a real frame."""
    lm = qwen3_lm
    frames = qwen_frames(3, seed=4, size=64)
    inputs = lm.chunk_inputs(np.concatenate([frames, frames[-1:]]), FPS, np.array([10.0, 11.0, 12.0]))
    text = lm.tokenizer.decode(inputs.input_ids[0], skip_special_tokens=False)
    assert text.startswith("<10.5 seconds><|vision_start|>") and "<12.0 seconds><|vision_start|>" in text
    assert inputs.frames.unique().tolist() == [0, 2]
    with pytest.raises(ValueError, match="even number"):
        lm.chunk_inputs(frames, FPS)


def test_eager_reindexing_gives_the_models_own_keys(qwen3_lm):
    """After evictions and eager compactions, every cached key of layer 0 is what the model's own
    interleaved rotary embedding gives the token at its new (t, h, w) position."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

    lm = qwen3_lm
    attn = lm.attention_modules()[0]
    session = StreamingSession(lm, HermesConfig(budget=100, chunk_frames=2, fps=FPS, reindex="eager"))
    calls: list[torch.Tensor] = []

    def grab(module, args, kwargs):
        calls.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).detach().clone())

    raw: dict[int, torch.Tensor] = {}  # stream id -> the key before RoPE
    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for chunk in pair_chunks(qwen_frames(10, seed=5, size=64)):
            calls.clear()
            first = session.memory.tokens_seen
            report = session.ingest(chunk)
            hidden = calls[0][0]  # the chunk's prefill comes first, then the guidance pass
            with torch.inference_mode():
                k = attn.k_norm(attn.k_proj(hidden).view(hidden.shape[0], -1, attn.head_dim)).transpose(0, 1)
            raw.update({first + i: k[:, i] for i in range(report.tokens)})
    finally:
        handle.remove()
    assert report.reindexed and session.memory.compactions >= 3  # eager: compacted after every eviction
    layer = session.memory.layers[0]
    ids, positions = layer.video_ids, layer.positions[:, layer.video_offset :]
    assert int(positions.max()) < int(layer.origins[:, layer.video_offset :].max())  # really moved
    keys = torch.stack([raw[int(i)] for i in ids], dim=1)[None]  # (1, heads, n, head_dim)
    cached = layer.keys[..., layer.prefix_len + layer.video_offset :, :]
    rotary = lm.language_model.rotary_emb

    def at(pos: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            cos, sin = rotary(keys, pos[:, None, :])
            return apply_rotary_pos_emb(keys, keys, cos, sin)[0]

    assert (cached - at(positions)).abs().max().item() < 1e-4
    # The control: the same keys with the h and w positions swapped are far off.
    assert (cached - at(positions[[0, 2, 1]])).abs().max().item() > 1e-2


def _stream(clip, *args: str, capsys) -> list[dict]:
    argv = ["stream", str(clip), "--model", "tiny-qwen3", "--json", "--chunk-frames", "2", "--max-new-tokens", "2"]
    assert main([*argv, "--ask", f"8:{QUESTION}", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_cli_stream_holds_the_budget_and_equals_full_below_it(clips, capsys):
    events = _stream(clips["short"], "--policy", "hermes", "--budget", "64", capsys=capsys)
    chunks = [e for e in events if e["event"] == "chunk"]
    assert chunks[-1]["frames_seen"] == 8  # the 8 s clip at the paper's 1 fps for Qwen3-VL
    assert all(max(c["video_tokens_per_layer"]) <= 65 for c in chunks)
    full_from = next(i for i, c in enumerate(chunks) if c["evicted"])
    assert len({c["cache_bytes"] for c in chunks[full_from:]}) == 1 and len(chunks) - full_from >= 3

    def first_token(policy: str) -> list:
        out = _stream(clips["short"], "--policy", policy, "--budget", "100000", capsys=capsys)
        (answer,) = [e for e in out if e["event"] == "answer"]
        return answer["top_logprobs"]

    assert first_token("hermes") == first_token("full")
