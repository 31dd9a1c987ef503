"""The benchmark says where a chunk's time goes: vision, language model, guidance, and the GEMM peak."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.bench import BenchResult, BenchSettings, Point, headline, run_bench, synthetic_chunk
from hermes.bench.peak import VisionTimer, chunk_flops, vision_modules
from hermes.bench.report import compressing, render_comparison, render_markdown, time_split
from hermes.memory.config import HermesConfig
from hermes.models.gemm import gemm_peak


def test_a_run_times_the_vision_encoder_and_counts_the_flops(llava_lm) -> None:
    settings = BenchSettings(
        policies=("hermes",),
        frames=(4, 8),
        config=HermesConfig(budget=256, chunk_frames=2, fps=0.5),
        repeats=1,
        max_new_tokens=2,
        frame_size=384,
    )
    result = run_bench(llava_lm, settings, progress=False)
    meta = result.meta
    assert meta["gemm_peak_gflops"]["bf16"] > 0 and meta["gemm_peak_gflops"]["fp32"] > 0
    assert meta["chunk_flops"]["vision"] > 0 and meta["chunk_flops"]["language_model"] > 0
    for point in result.points:
        assert len(point.vision_ms) == len(point.prefill_ms) > 0
        assert all(0 < v < p for v, p in zip(point.vision_ms, point.prefill_ms, strict=True))
    split = time_split(result)
    assert split is not None and 0 < split.vision_ms < split.prefill_ms and split.peak_dtype == "fp32"
    table = render_markdown(result)
    assert "Where a hermes chunk's time goes" in table and "GEMM peak" in table
    # Every chunk compresses (392 tokens a chunk, a budget of 256): every other one runs the guidance
    # pass on its own, so that the riding prompt's cost is measured against them.
    assert [s for p in result.points for s in p.separate] == [False, True, False, True]
    guidance = next(h for h in headline(result) if h["name"].startswith("hermes guidance ms / prefill ms"))
    assert "the prompt riding on the prefill" in guidance["text"]


def test_the_flop_count_splits_vision_from_the_language_model(llava_lm) -> None:
    """The tiny SigLIP at 384 px: its FLOPs are at least its matrix multiplies over 729 patches a frame."""
    chunk = synthetic_chunk(np.random.default_rng(0), 0, 2, 384, 0.5, 0)
    flops = chunk_flops(llava_lm, HermesConfig(budget=64, chunk_frames=2), chunk)
    tower = llava_lm.model.model.vision_tower
    linear = sum(m.weight.numel() for m in tower.modules() if isinstance(m, torch.nn.Linear))
    assert flops["vision"] >= 2 * linear * 729 * 2
    lm_linear = sum(m.weight.numel() for m in llava_lm.language_model.modules() if isinstance(m, torch.nn.Linear))
    tokens = 2 * 196 + 1
    assert flops["language_model"] >= 2 * lm_linear * tokens


def test_the_vision_timer_sees_only_the_vision_encoder(qwen_lm) -> None:
    from transformers import DynamicCache

    assert [type(m).__name__ for m in vision_modules(qwen_lm)] == ["Qwen2_5_VisionTransformerPretrainedModel"]
    ids = qwen_lm.encode("hello")
    with VisionTimer(qwen_lm) as timer:
        qwen_lm.forward(DynamicCache(), ids, torch.arange(ids.shape[-1])[None])
    assert timer.take() == 0.0  # text only: the vision encoder never ran


def test_gemm_peak_is_a_rate() -> None:
    assert gemm_peak(torch.float32, "cpu", side=128) > 1e6  # at least a MFLOP/s


def _point(policy: str, guidance: float, vision: float = 40.0) -> Point:
    return Point(
        policy,
        16,
        ttft_ms=[10.0],
        prefill_ms=[100.0],
        compress_ms=[guidance + 1],
        guidance_ms=[guidance],
        vision_ms=[vision],
        evicted=[1],
        ingested_frames=4,
        cache_bytes=1,
    )


def _result(model: str, guidance: float) -> BenchResult:
    meta = {
        "model": model,
        "layers": 24,
        "kv_layers": 24,
        "state_bytes": 0,
        "tokens_per_frame": 196.0,
        "kv_bytes_per_token": 1,
        "budget": 64,
        "chunk_frames": 4,
        "device_type": "cpu",
        "dtype": "bfloat16",
        "chunk_flops": {"vision": 8 * 10**9, "language_model": 6 * 10**9},
        "gemm_peak_gflops": {"bf16": 200.0, "fp32": 50.0},
    }
    return BenchResult(meta, [_point("hermes", guidance)])


def test_the_split_and_the_verdicts_from_made_up_points() -> None:
    fast, slow = _result("a", guidance=4.0), _result("b", guidance=30.0)
    split = time_split(fast)
    # 8 GFLOP in 40 ms, 6 GFLOP in 60 ms, 14 GFLOP in 100 ms: 140 of a 200 GFLOP/s bf16 peak.
    assert (split.vision_gflops, split.lm_gflops, split.prefill_gflops) == pytest.approx((200.0, 100.0, 140.0))
    assert split.peak_share == pytest.approx(0.7)
    guidance = {h["name"].split(" (")[0]: h for h in headline(slow)}["hermes guidance pass ms / prefill ms per chunk"]
    assert guidance["value"] == pytest.approx(0.3) and guidance["met"] is False
    table = render_comparison([fast, slow])
    assert "| a |" in table and "4.0% (met)" in table and "30.0% (missed)" in table and "70% of bf16" in table
    assert "40%" in table  # the vision encoder's share of the prefill


def test_a_riding_prompt_is_costed_against_the_comparison_chunks() -> None:
    """Every other compressing chunk ran the guidance pass on its own: the riding prompt's cost is
    the difference of the two prefills, and the ingest rate leaves the comparison chunks out."""
    point = Point(
        "hermes",
        16,
        ttft_ms=[10.0],
        prefill_ms=[90.0, 103.0, 100.0, 104.0, 100.0],
        compress_ms=[0.0, 2.0, 31.0, 2.0, 31.0],
        guidance_ms=[0.0, 0.5, 30.0, 0.5, 30.0],
        vision_ms=[40.0] * 5,
        evicted=[0, 1, 1, 1, 1],
        chunk_frames=[4] * 5,
        separate=[False, False, True, False, True],
        ingested_frames=20,
        cache_bytes=1,
    )
    result = BenchResult(_result("a", 0.0).meta, [point])
    steady = compressing(result)
    assert (steady.prefill, steady.alone_prefill, steady.count, steady.alone_count) == (103.5, 100.0, 2, 2)
    assert steady.guidance_cost == pytest.approx(4.0)  # 3.5 ms more prefill, 0.5 ms reading it
    guidance = next(h for h in headline(result) if h["target"].startswith("<=") and "guidance" in h["name"])
    assert guidance["value"] == pytest.approx(0.04) and guidance["met"] is True
    assert "the pass on its own took 30.0 ms" in guidance["text"]
    assert point.ingest_fps == pytest.approx(12 / ((90 + 105 + 106) / 1000))
    assert time_split(result).guidance_ms == pytest.approx(4.0)
