"""Tiny random-weight checkpoints load and run through the real transformers paths."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers
from packaging import version
from transformers import AutoModelForImageTextToText, AutoProcessor

from hermes.models import tiny

ARCHS = ("llava_onevision", "qwen2_5_vl", "qwen3_vl")
LAYERS = 3


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {a: tiny.build_tiny(a, root / a, num_layers=LAYERS) for a in ARCHS}


def _video_prompt(processor) -> str:
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    return processor.apply_chat_template(msgs, add_generation_prompt=True)


def _frames(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _load(path: Path, **kw):
    return AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path, **kw)


def test_unknown_arch_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"llava_onevision.*qwen2_5_vl.*qwen3_vl"):
        tiny.build_tiny("gpt2", tmp_path)
    with pytest.raises(ValueError, match="supported"):
        tiny.default_tiny_dir("nope", 4)


@pytest.mark.parametrize(
    ("arch", "proc_cls", "model_cls"),
    [
        ("llava_onevision", "LlavaOnevisionProcessor", "LlavaOnevisionForConditionalGeneration"),
        ("qwen2_5_vl", "Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration"),
        ("qwen3_vl", "Qwen3VLProcessor", "Qwen3VLForConditionalGeneration"),
    ],
)
def test_loads_through_auto_classes(tiny_dirs, arch: str, proc_cls: str, model_cls: str) -> None:
    processor, model = _load(tiny_dirs[arch])
    assert type(processor).__name__ == proc_cls
    assert type(model).__name__ == model_cls
    assert model.dtype == torch.float32
    text = model.config.text_config
    assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads) == (64, 4, 2)
    assert text.num_hidden_layers == LAYERS == len(model.model.language_model.layers)
    assert text.vocab_size == len(processor.tokenizer)
    size = sum(f.stat().st_size for f in tiny_dirs[arch].iterdir())
    assert size < 5_000_000


def test_llava_video_tokens_and_forward(tiny_dirs) -> None:
    processor, model = _load(tiny_dirs["llava_onevision"])
    inputs = processor(text=_video_prompt(processor), videos=[_frames(4, 64, 80)], return_tensors="pt")
    # Every frame is resized to 384x384: 27x27 SigLIP patches pooled to 14x14 = 196,
    # plus one image_newline token after the last frame of the video.
    assert inputs["pixel_values_videos"].shape == (1, 4, 3, 384, 384)
    n_video = int((inputs["input_ids"] == model.config.video_token_id).sum())
    assert n_video == 4 * tiny.LLAVA_TOKENS_PER_FRAME + 1 == 785
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(out.logits).all()
    assert out.video_outputs.pooler_output.shape == (1, n_video, 64)


@pytest.mark.parametrize(("h", "w", "grid_hw"), [(224, 224, (16, 16)), (64, 80, (16, 18))])
def test_qwen_video_tokens_and_forward(tiny_dirs, h: int, w: int, grid_hw: tuple[int, int]) -> None:
    processor, model = _load(tiny_dirs["qwen2_5_vl"])
    meta = [{"fps": 1.0, "total_num_frames": 4}]
    inputs = processor(
        text=_video_prompt(processor), videos=[_frames(4, h, w)], video_metadata=meta, return_tensors="pt"
    )
    # smart_resize to ~224*224 px (64x80 -> 224x252), 14 px patches, 2 frames per temporal patch.
    assert inputs["video_grid_thw"].tolist() == [[2, *grid_hw]]
    assert inputs["second_per_grid_ts"].tolist() == [2.0]  # temporal_patch_size / fps
    n_video = int((inputs["input_ids"] == model.config.video_token_id).sum())
    assert n_video == 2 * grid_hw[0] * grid_hw[1] // 4
    if (h, w) == (224, 224):
        assert n_video == 2 * tiny.QWEN_TOKENS_PER_FRAME_PAIR_224
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[1] == inputs["input_ids"].shape[1]
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize(
    ("n", "h", "w", "grid_hw"), [(2, 64, 64, (14, 14)), (4, 224, 224, (14, 14)), (2, 120, 160, (14, 18))]
)
def test_qwen3_video_tokens_and_forward(tiny_dirs, n: int, h: int, w: int, grid_hw: tuple[int, int]) -> None:
    processor, model = _load(tiny_dirs["qwen3_vl"])
    meta = [{"fps": 1.0, "total_num_frames": n, "frames_indices": list(range(n))}]
    inputs = processor(
        text=_video_prompt(processor),
        videos=[_frames(n, h, w)],
        video_metadata=meta,
        do_sample_frames=False,
        return_tensors="pt",
    )
    # 16 px patches, 2 frames per temporal patch; a chunk's pixel volume is raised to at least
    # 2 x 224 x 224 (64x64 and 120x160 frame pairs are upscaled), and 224x224 frames stay as they are.
    assert inputs["video_grid_thw"].tolist() == [[n // 2, *grid_hw]]
    ids = inputs["input_ids"][0]
    n_video = int((ids == model.config.video_token_id).sum())
    assert n_video == (n // 2) * grid_hw[0] * grid_hw[1] // 4
    # Each frame pair: its timestamp (the mean time of its two frames), then its own vision block.
    text = processor.tokenizer.decode(ids, skip_special_tokens=False)
    # From transformers 5.25 the processor drops the chat template's wrapper around the whole video
    # (each pair has its own, the layout the adapter writes for a chunk); before, it wrapped them all.
    wrapper = 0 if version.parse(transformers.__version__) >= version.parse("5.25") else 1
    assert text.count("<|vision_start|>") == n // 2 + wrapper
    assert "<0.5 seconds><|vision_start|><|video_pad|>" in text
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[1] == ids.shape[0] and torch.isfinite(out.logits).all()
    assert len(out.video_outputs.deepstack_features) == len(tiny.QWEN3_DEEPSTACK)


def test_qwen_get_rope_index_facts(tiny_dirs) -> None:
    """Pin the transformers behaviour the M-RoPE re-indexing relies on."""
    processor, model = _load(tiny_dirs["qwen2_5_vl"])
    prompt = _video_prompt(processor)
    frames = _frames(8, 224, 224)
    inputs = processor(
        text=prompt, videos=[frames], video_metadata=[{"fps": 1.0, "total_num_frames": 8}], return_tensors="pt"
    )
    pos, deltas = model.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=inputs["attention_mask"],
    )
    ids = inputs["input_ids"][0]
    assert pos.shape == (3, 1, ids.shape[0])
    vid = (ids == model.config.video_token_id).nonzero()[:, 0]
    start = int(pos[0, 0, vid[0] - 1]) + 1
    # t advances tokens_per_second * temporal_patch / fps = 2 * 2 / 1 = 4 per frame pair.
    assert pos[0, 0, vid].unique().tolist() == [start + 4 * i for i in range(4)]
    assert pos[1, 0, vid].unique().tolist() == list(range(start, start + 8))
    # Quirk of 5.24: text after the video restarts at start + max(h, w) / merge, ignoring
    # the temporal extent, while rope_deltas use the true maximum.
    assert pos[:, 0, vid[-1] + 1].tolist() == [start + 8] * 3
    assert int(deltas) == int(pos.max()) + 1 - ids.shape[0]
    # Without video_metadata the processor assumes 24 fps and t collapses to 0/1 steps.
    no_meta = processor(text=prompt, videos=[frames], return_tensors="pt")
    assert no_meta["second_per_grid_ts"].tolist() == pytest.approx([2 / 24])


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_roundtrip_and_specials(tiny_dirs, arch: str) -> None:
    processor = AutoProcessor.from_pretrained(tiny_dirs[arch])
    tok = processor.tokenizer
    text = "Hello, world! ünïcode"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))  # byte-level, no merges: id == byte
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [256, 257, 258]
    placeholder = "<video>" if arch == "llava_onevision" else "<|video_pad|>"  # Qwen2.5-VL and Qwen3-VL
    assert processor.video_token_id == tok.convert_tokens_to_ids(placeholder)
    assert tok.encode(f"<|im_start|>{placeholder}") == [257, processor.video_token_id]
    assert placeholder in _video_prompt(processor)


def _attention_entropy_ratio(path: Path) -> float:
    """Mean attention entropy over a 50-token text / mean entropy of uniform causal attention."""
    processor, model = _load(path, attn_implementation="eager")
    ids = processor.tokenizer("The quick brown fox jumps over the lazy dog, then naps.", return_tensors="pt")
    ids = ids["input_ids"][:, :50]
    n = ids.shape[1]
    assert n == 50
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == LAYERS
    uniform = torch.log(torch.arange(2, n + 1, dtype=torch.float32)).mean()
    ratios = []
    for att in out.attentions:
        p = att[0, :, 1:].clamp_min(1e-12)  # heads x queries x keys, query 0 is trivially 0
        ratios.append(float(-(p * p.log()).sum(-1).mean() / uniform))
    return max(ratios)


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_not_uniform(tiny_dirs, arch: str, tmp_path: Path) -> None:
    assert _attention_entropy_ratio(tiny_dirs[arch]) < 0.6
    # The default init (std 0.02) would give near-uniform attention: the check discriminates.
    flat = tiny.build_tiny(arch, tmp_path / "flat", num_layers=LAYERS, qk_std=0.02)
    assert _attention_entropy_ratio(flat) > 0.95


@pytest.mark.parametrize("arch", ARCHS)
def test_rope_is_relative_and_matters(tiny_dirs, arch: str) -> None:
    """Shifting all positions keeps logits (RoPE is relative); changing the spacing does not."""
    _, model = _load(tiny_dirs[arch])
    ids = torch.arange(40, 80).unsqueeze(0)
    base = torch.arange(40).unsqueeze(0)

    def logits(pos: torch.Tensor) -> torch.Tensor:
        if arch != "llava_onevision":  # M-RoPE: text at the same position on t, h and w
            pos = pos.unsqueeze(0).expand(3, -1, -1)
        with torch.no_grad():
            return model(input_ids=ids, position_ids=pos).logits

    ref = logits(base)
    assert torch.allclose(logits(base + 1000), ref, atol=1e-3)
    assert (logits(base * 3) - ref).abs().max() > 1e-2


def test_build_is_deterministic(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    def weights(seed: int, name: str) -> dict[str, torch.Tensor]:
        path = tiny.build_tiny("qwen2_5_vl", tmp_path / name, num_layers=2, seed=seed)
        return load_file(path / "model.safetensors")

    a, b, c = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Saved in the hub key layout (e.g. "model.layers.0..." for Qwen2.5-VL), like real checkpoints.
    (q,) = [k for k in a if k.endswith("layers.0.self_attn.q_proj.weight")]
    assert not torch.equal(a[q], c[q])
    assert 0.2 < float(a[q].std()) < 0.3  # the documented QK_INIT_STD


def test_ensure_tiny_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_CACHE", str(tmp_path / "cache"))
    expected = tmp_path / "cache" / "tiny" / f"llava_onevision-L2-s0-v{tiny.TINY_VERSION}"
    assert tiny.default_tiny_dir("llava_onevision", 2) == expected
    assert tiny.default_tiny_dir("qwen2_5_vl", 2) != expected
    path = tiny.ensure_tiny("llava_onevision", num_layers=2)
    assert path == expected and (path / "config.json").is_file()
    assert [p.name for p in expected.parent.iterdir()] == [expected.name]  # no temp dir left

    def boom(*args, **kwargs):
        raise AssertionError("rebuilt an existing checkpoint")

    monkeypatch.setattr(tiny, "build_tiny", boom)
    assert tiny.ensure_tiny("llava_onevision", num_layers=2) == expected


def test_another_seed_gets_its_own_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is keyed by the seed too: a second seed must not get the first one's weights back."""
    from safetensors.torch import load_file

    monkeypatch.setenv("HERMES_CACHE", str(tmp_path / "cache"))
    first, second = (tiny.ensure_tiny("llava_onevision", num_layers=1, seed=s) for s in (0, 1))
    assert first != second
    a, b = (load_file(p / "model.safetensors") for p in (first, second))
    (q,) = [k for k in a if "language_model" in k and k.endswith("layers.0.self_attn.q_proj.weight")]
    assert not torch.equal(a[q], b[q])


def test_random_weight_answers_are_printable_noise_words(lm) -> None:
    """Offline answers read as noise words, not as the mojibake that random bytes decode to."""
    from hermes.engine.chunk import Chunk
    from hermes.engine.session import StreamingSession
    from hermes.memory.config import HermesConfig

    session = StreamingSession(lm, HermesConfig(budget=512, chunk_frames=2, fps=1.0))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    session.ingest(Chunk(pixels, np.arange(2.0), np.arange(2), np.arange(2)))
    for question in ("What is happening?", "Describe the scene.", "Who is there?"):
        text = session.ask(question, max_new_tokens=24).text
        assert text and set(text) <= set("abcdefghijklmnopqrstuvwxyz .,?"), repr(text)
