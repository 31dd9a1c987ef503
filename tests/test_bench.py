"""The efficiency benchmark: output schema, memory cap, headline ratios, and the random 7B builders."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes import bench
from hermes.bench import BenchResult, BenchSettings, Point, headline, prefill_bytes, run_bench
from hermes.cli.bench import add_bench_parser, parse_bytes, parse_ints
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models import random7b
from hermes.models.loading import ModelLoadError

BUDGET = 1000
CHUNK = 8


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_kv_bytes_per_token_matches_the_cache(lm) -> None:
    memory = StreamingSession(lm, HermesConfig(budget=BUDGET)).memory
    assert lm.kv_bytes_per_token * memory.prefix_len + lm.state_bytes == memory.cache_bytes()


def test_several_models_in_one_run_are_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--model a,b`: each model's table and files, then one table of both, a hybrid model's
    key-value layers and constant states named."""
    out = tmp_path / "bench.json"
    args = _parser().parse_args(
        [
            "bench",
            *("--model", "tiny,tiny-qwen35", "--frames", "4", "--budget", "50", "--chunk-frames", "2"),
            *("--policies", "hermes", "--repeats", "1", "--max-new-tokens", "1", "--json", str(out), "--no-progress"),
        ]
    )
    assert args.func(args) == 0
    table = capsys.readouterr().out
    hybrid = json.loads((tmp_path / "bench-tiny-qwen35.json").read_text())["meta"]
    assert json.loads((tmp_path / "bench-tiny.json").read_text())["meta"]["kv_layers"] == 4
    assert hybrid["layers"] == 12 and hybrid["kv_layers"] == 3 and hybrid["state_bytes"] > 0
    side = table[table.index("Models side by side") :]
    assert "| tiny | 4 layers |" in side
    assert "| tiny-qwen35 | 12 layers: 3 with keys and values, 9 with states (" in side
    assert side.count("frames/s") == 1 and len(side.strip().splitlines()) == 5


def test_prefill_bytes() -> None:
    # The old and the grown cache side by side, plus a (new x all) mask at 4 bytes an entry.
    assert prefill_bytes(10, 100, 20) == 10 * (100 + 120) + 4 * 20 * 120


def test_bench_cli_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two frame counts, all three policies: the table, the JSON file and the HTML figure."""
    out, html = tmp_path / "bench.json", tmp_path / "bench.html"
    args = _parser().parse_args(
        [
            "bench",
            *("--model", "tiny", "--frames", "16,8", "--budget", str(BUDGET), "--chunk-frames", str(CHUNK)),
            *("--repeats", "2", "--max-new-tokens", "3", "--json", str(out), "--html", str(html), "--no-progress"),
        ]
    )
    assert args.func(args) == 0
    table = capsys.readouterr().out
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["model"] == "tiny" and meta["budget"] == BUDGET and meta["chunk_frames"] == CHUNK
    assert meta["tokens_per_frame"] == pytest.approx(196, abs=0.2)  # 384 px frames, as in the paper
    assert meta["memory_kind"].startswith("peak RSS") and meta["full_max_frames"] == bench.CPU_FULL_MAX_FRAMES
    points = {(p["policy"], p["frames"]): p for p in data["points"]}
    assert set(points) == {(p, f) for p in ("hermes", "fifo", "full") for f in (8, 16)}
    for p in points.values():
        assert p["status"] == "ok"
        assert len(p["ttft_ms"]) == 2 * len(bench.QUESTIONS)
        assert set(p["ttft_ms_stats"]) == {"median", "min", "max", "n"}
        assert p["ttft_ms_stats"]["min"] <= p["ttft_ms_stats"]["median"] <= p["ttft_ms_stats"]["max"]
        assert len(p["prefill_ms"]) == len(p["compress_ms"]) == 1  # one chunk between the frame counts
        assert p["memory_bytes"] > 0
    # HERMES and FIFO hold the budget (plus the summary slot or its spare) once past it; full holds everything.
    assert points["hermes", 16]["video_tokens_per_layer"] == points["hermes", 8]["video_tokens_per_layer"] == BUDGET + 1
    assert points["hermes", 16]["cache_bytes"] == points["hermes", 8]["cache_bytes"]
    assert points["full", 16]["cache_bytes"] > points["full", 8]["cache_bytes"] > points["hermes", 8]["cache_bytes"]
    names = [h["name"] for h in data["headline"]]
    assert names[0] == "hermes TTFT at 16 frames / at 8 frames"
    assert names[1].startswith("full / hermes TTFT at 16 frames") and data["headline"][1]["met"] is None
    assert names[2] == "hermes cache bytes past the budget (8, 16 frames)" and data["headline"][2]["met"] is True
    assert names[3].startswith("hermes compression ms / prefill ms")
    assert "| policy | frames | TTFT ms median (min-max) |" in table and "| full | 16 |" in table
    assert "Headline ratios" in table and "(target identical: met)" in table
    assert "plotly" in html.read_text()[:5000].lower()


def test_full_stops_at_the_memory_cap(llava_lm) -> None:
    """A cap between what HERMES and full need for their second chunk: full records "out of memory"."""
    frames = np.zeros((CHUNK, 384, 384, 3), dtype=np.uint8)
    new = llava_lm.chunk_inputs(frames, 0.5).num_tokens
    prefix = StreamingSession(llava_lm, HermesConfig(budget=BUDGET)).memory.prefix_len
    per_token = llava_lm.kv_bytes_per_token
    hermes_needs = prefill_bytes(per_token, prefix + BUDGET + 1, new)
    full_needs = prefill_bytes(per_token, prefix + new, new)
    assert hermes_needs < full_needs
    settings = BenchSettings(
        frames=(8, 16, 24),
        config=HermesConfig(budget=BUDGET, chunk_frames=CHUNK),
        repeats=1,
        max_new_tokens=2,
        memory_cap=(hermes_needs + full_needs) // 2,
    )
    result = run_bench(llava_lm, settings, progress=False)
    status = {(p.policy, p.frames): p.status for p in result.points}
    assert status == {
        **{(p, f): "ok" for p in ("hermes", "fifo") for f in (8, 16, 24)},
        ("full", 8): "ok",
        ("full", 16): "out of memory",
        ("full", 24): "out of memory",
    }
    oom = result.point("full", 16)
    assert "MiB cap" in oom.note and oom.ttft_ms == [] and oom.cache_bytes is None
    # full reached only 8 frames, so that is where it is compared with HERMES.
    assert [h["name"] for h in headline(result)][1] == "full / hermes TTFT at 8 frames (the largest count full reached)"


def test_full_max_frames_skips(llava_lm) -> None:
    settings = BenchSettings(
        policies=("full",),
        frames=(8, 16),
        config=HermesConfig(budget=BUDGET, chunk_frames=CHUNK),
        repeats=1,
        max_new_tokens=2,
        full_max_frames=8,
    )
    result = run_bench(llava_lm, settings, progress=False)
    assert [(p.frames, p.status, p.note) for p in result.points] == [
        (8, "ok", ""),
        (16, "skipped", "past --full-max-frames 8"),
    ]


def test_headline_verdicts() -> None:
    """The ratios and their verdicts, from made-up points."""

    def point(
        policy: str, frames: int, ttft: float, cache: int, prefill: float = 100.0, compress: float = 5.0
    ) -> Point:
        return Point(
            policy,
            frames,
            ttft_ms=[ttft],
            prefill_ms=[prefill],
            compress_ms=[compress],
            guidance_ms=[compress / 2],
            evicted=[int(compress > 0)],
            ingested_frames=16,
            cache_bytes=cache,
        )

    meta = {"tokens_per_frame": 196.0, "budget": 4096, "chunk_frames": 16, "device_type": "cpu"}
    result = BenchResult(
        meta,
        [
            point("hermes", 16, 10.0, 100),
            point("hermes", 512, 10.4, 200),
            point("hermes", 1024, 10.6, 201, compress=20.0),
            point("full", 16, 11.0, 100, compress=0.0),
            point("full", 512, 120.0, 9000, compress=0.0),
            Point("full", 1024, status="out of memory"),
        ],
    )
    lines = {h["name"].split(" (")[0]: h for h in headline(result)}
    ratio = lines["hermes TTFT at 1024 frames / at 16 frames"]
    assert ratio["value"] == pytest.approx(1.06) and ratio["met"] is False
    full = lines["full / hermes TTFT at 512 frames"]
    assert full["value"] == pytest.approx(120 / 10.4) and full["met"] is True
    cache = lines["hermes cache bytes past the budget"]
    assert cache["value"] == [200, 201] and cache["met"] is False  # 16 frames are under the budget
    compress = lines["hermes compression ms / prefill ms per chunk"]
    assert compress["value"] == pytest.approx(0.05) and compress["met"] is True
    assert "the guidance: 2.5 ms" in compress["text"]
    ingest = lines["hermes ingest frames/s"]
    assert ingest["value"] == pytest.approx(3 * 16 / 0.33) and ingest["met"] is True  # 48 frames in 330 ms


def test_settings_and_option_errors() -> None:
    with pytest.raises(ValueError, match="unknown policy 'lru'"):
        BenchSettings(policies=("hermes", "lru"))
    with pytest.raises(ValueError, match="positive frame counts"):
        BenchSettings(frames=(0, 16))
    assert BenchSettings(frames=(64, 16, 64)).frames == (16, 64)
    assert parse_bytes("8GB") == 8 * 10**9 and parse_bytes("512MiB") == 512 * 2**20 and parse_bytes("auto") is None
    for bad in ("lots", "-1GB", "8XB"):
        with pytest.raises(ValueError, match="--memory-cap"):
            parse_bytes(bad)
    assert parse_ints("16, 64,256", "--frames") == (16, 64, 256)
    with pytest.raises(ValueError, match="--frames wants comma-separated whole numbers"):
        parse_ints("16,x", "--frames")
    # Options are checked before the model loads (minutes for a 7B one): this model does not exist.
    for bad, message in (
        (["--frames", "16,many"], "--frames"),
        (["--policies", "lru"], "lru"),
        (["--fps", "0"], "fps"),
    ):
        args = _parser().parse_args(["bench", "--model", "no/such-model", *bad])
        with pytest.raises(ValueError, match=message):
            args.func(args)


# -- the random-weight 7B architectures --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "billions", "max_positions"),
    [("llava-ov-7b-random", 8.03, 32768), ("qwen2.5-vl-7b-random", 8.29, 128000)],
)
def test_random_7b_is_the_real_architecture(llava_lm, qwen_lm, name: str, billions: float, max_positions: int) -> None:
    tokenizer = (llava_lm if "llava" in name else qwen_lm).tokenizer
    config = random7b.random_config(name, tokenizer)
    text = config.get_text_config(decoder=True)
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        3584,
        28,
        28,
        4,
    )
    assert (text.intermediate_size, text.vocab_size, text.max_position_embeddings) == (18944, 152064, max_positions)
    assert config.video_token_id < len(tokenizer)  # the tiny tokenizer's ids stay valid
    assert random7b.parameter_count(config) / 1e9 == pytest.approx(billions, abs=0.01)
    if "qwen" in name:
        vision = config.vision_config
        assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (32, 1280, 3584)
        assert text.rope_parameters["mrope_section"] == [16, 24, 24]
    else:
        assert (config.vision_config.hidden_size, config.vision_config.num_hidden_layers) == (1152, 26)


def test_random_05b_is_the_real_architecture_and_runs_on_a_cpu(llava_lm) -> None:
    config = random7b.random_config("llava-ov-0.5b-random", llava_lm.tokenizer)
    text = config.get_text_config(decoder=True)
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        896,
        24,
        14,
        2,
    )
    assert (text.intermediate_size, text.vocab_size, text.tie_word_embeddings) == (4864, 151936, True)
    assert (config.vision_config.hidden_size, config.vision_config.num_hidden_layers) == (1152, 26)
    # Qwen2-0.5B (0.49B) and SigLIP-so400m without its head (0.40B): below the CPU refusal.
    assert random7b.parameter_count(config) / 1e9 == pytest.approx(0.89, abs=0.01)
    assert random7b.parameter_count(config) / 1e9 < random7b.CPU_MAX_BILLIONS


def test_random_7b_refuses_a_cpu() -> None:
    with pytest.raises(ModelLoadError, match=r"8\.0B-parameter.*--allow-cpu-7b"):
        bench.load_bench_model("llava-ov-7b-random", device="cpu")
    with pytest.raises(ModelLoadError, match="unknown random-weight model"):
        random7b.load_random_model("gpt-7b-random", device="cpu")


@pytest.mark.parametrize("name", sorted(random7b.RANDOM_MODELS))
def test_random_7b_builder_streams_when_shrunk(name: str) -> None:
    """The same builder with small sizes: bf16 weights, the tiny tokenizer's ids, real frame costs."""
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4}
    text["num_key_value_heads"] = 2
    hybrid = name.startswith("qwen3.5")
    if hybrid:  # 12 layers: every fourth full attention, so three key-value layers as in the others
        linear = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16}
        text |= {"num_hidden_layers": 12, "head_dim": 64, "linear_value_head_dim": 16, **linear}
        text["rope_parameters"] = {
            **{"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            **{"mrope_section": [3, 3, 2], "mrope_interleaved": True},
        }
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    elif "qwen" in name:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
        vision["fullatt_block_indexes"] = [1]
    else:
        vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    lm = random7b.load_random_model(name, device="cpu", allow_cpu=True, text=text, vision=vision)
    assert lm.dtype == torch.bfloat16 and lm.random_weights and lm.source == name
    assert lm.text_config.vocab_size == (151936 if "0.5b" in name else 248320 if hybrid else 152064)
    frames = np.random.default_rng(0).integers(0, 256, (4, 384, 384, 3), dtype=np.uint8)
    inputs = lm.chunk_inputs(frames, lm.default_fps)
    if hybrid:  # 144 video tokens per 384 px frame pair (16 px patches, 2 x 2 merged), and timestamps
        assert int((inputs.input_ids == lm.model.config.video_token_id).sum()) == 2 * 144
    else:  # 196 tokens per 384 px frame (LLaVA-OV, plus the newline), 196 per frame pair (Qwen2.5-VL)
        assert inputs.num_tokens == (4 * 196 + 1 if "llava" in name else 2 * 196)
    session = StreamingSession(lm, HermesConfig(budget=300, chunk_frames=4, fps=lm.default_fps))
    chunk = bench.synthetic_chunk(np.random.default_rng(0), 0, 4, 384, lm.default_fps, 0)
    assert session.ingest(chunk).video_tokens_per_layer == [301, 301, 300]
    assert session.ask("What is happening?", max_new_tokens=2).ttft_ms > 0
