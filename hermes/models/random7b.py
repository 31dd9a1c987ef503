"""The real architectures with random weights, for timing without downloading a checkpoint.

Speed and memory depend on the shapes, not on the values of the weights, so `llava-ov-7b-random`,
`qwen2.5-vl-7b-random` and `qwen3.5-9b-random` (for a GPU), and `llava-ov-0.5b-random` and
`qwen3.5-0.8b-random` (the small checkpoints' shapes, which a CPU can run) build
`LlavaOnevisionForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration` and
`Qwen3_5ForConditionalGeneration` from the published hyperparameters of
llava-hf/llava-onevision-qwen2-7b-ov-hf, Qwen/Qwen2.5-VL-7B-Instruct and Qwen/Qwen3.5-0.8B and
-9B, initialise them randomly
in bf16 directly on the target device, and pair them with each family's real tokenizer (its real
vocabulary, special tokens and chat template, `hermes.models.vocab`), so that a prompt costs the
tokens it costs the real checkpoint. Answers are noise.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.utils import logging as hf_logging

from hermes.models.base import VideoLM
from hermes.models.loading import ADAPTERS, ModelLoadError, pick_device, resolve_dtype
from hermes.models.tiny import PROCESSORS
from hermes.models.vocab import real_tokenizer

# Qwen2-7B, the language model of LLaVA-OneVision-7B.
QWEN2_7B_TEXT: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}
# Qwen2-0.5B, the language model of LLaVA-OneVision-0.5B.
QWEN2_05B_TEXT: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}
# SigLIP-so400m at 384 px. It has 27 layers; the llava-hf checkpoint keeps 26, because LLaVA-OV
# reads the penultimate layer's features, and the 27th layer is never computed.
SIGLIP_SO400M: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 26,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 384,
    "vision_use_head": False,
}
# Qwen2.5-VL-7B-Instruct: the text model and the windowed ViT.
QWEN25_VL_7B_TEXT: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
}
QWEN25_VL_7B_VISION: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "tokens_per_second": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
# Qwen3.5, from the published config.json of Qwen/Qwen3.5-0.8B and Qwen/Qwen3.5-9B on the Hugging
# Face hub: hybrid layers (every fourth full attention), gated attention of head_dim 256 with a
# partial interleaved M-RoPE, Gated DeltaNet with 16 key heads of 128 and a kernel-4 convolution.
QWEN35_TEXT_COMMON: dict[str, Any] = {
    "vocab_size": 248320,
    "head_dim": 256,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
}
QWEN35_08B_TEXT: dict[str, Any] = {
    **QWEN35_TEXT_COMMON,
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "linear_num_value_heads": 16,
}
QWEN35_9B_TEXT: dict[str, Any] = {
    **QWEN35_TEXT_COMMON,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "linear_num_value_heads": 32,
}
QWEN35_VISION_COMMON: dict[str, Any] = {
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
}
QWEN35_08B_VISION: dict[str, Any] = {
    **QWEN35_VISION_COMMON,
    "depth": 12,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_heads": 12,
    "out_hidden_size": 1024,
}
QWEN35_9B_VISION: dict[str, Any] = {
    **QWEN35_VISION_COMMON,
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "out_hidden_size": 4096,
}
# name -> (text, vision, tied embeddings), for the Qwen3.5 random-weight models.
QWEN35_SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    "qwen3.5-0.8b-random": (QWEN35_08B_TEXT, QWEN35_08B_VISION, True),
    "qwen3.5-9b-random": (QWEN35_9B_TEXT, QWEN35_9B_VISION, False),
}
# The released Qwen2.5-VL video processor's pixel bounds (128 to 768 merged tokens per frame), so
# that a frame costs as many tokens as with the real checkpoint: a 384x384 pair gives 196.
QWEN_VIDEO_PIXELS = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}

RANDOM_MODELS: dict[str, str] = {
    "llava-ov-0.5b-random": "llava_onevision",
    "llava-ov-7b-random": "llava_onevision",
    "qwen2.5-vl-7b-random": "qwen2_5_vl",
    "qwen3.5-0.8b-random": "qwen3_5",
    "qwen3.5-9b-random": "qwen3_5",
}
# Past this size a CPU is refused unless asked for: minutes per chunk.
CPU_MAX_BILLIONS = 2.0


def random_config(name: str, tokenizer: Any, text: dict | None = None, vision: dict | None = None) -> Any:
    """The transformers config of `name`, special-token ids taken from `tokenizer`.

    `text` and `vision` override hyperparameters (tests shrink the model to run it on a CPU).
    """
    from transformers import LlavaOnevisionConfig, Qwen2_5_VLConfig, Qwen2Config, Qwen3_5Config, SiglipVisionConfig

    ids = tokenizer.convert_tokens_to_ids
    special = {
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
    }
    if RANDOM_MODELS.get(name) == "llava_onevision":
        sizes = QWEN2_05B_TEXT if name == "llava-ov-0.5b-random" else QWEN2_7B_TEXT
        return LlavaOnevisionConfig(
            text_config=Qwen2Config(**{**sizes, **special, **(text or {})}),
            vision_config=SiglipVisionConfig(**{**SIGLIP_SO400M, **(vision or {})}),
            image_token_index=ids("<image>"),
            video_token_index=ids("<video>"),
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_9",
        )
    if RANDOM_MODELS.get(name) == "qwen2_5_vl":
        return Qwen2_5_VLConfig(
            text_config={**QWEN25_VL_7B_TEXT, **special, **(text or {})},
            vision_config={**QWEN25_VL_7B_VISION, **(vision or {})},
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
        )
    if RANDOM_MODELS.get(name) == "qwen3_5":
        sizes, tower, tied = QWEN35_SHAPES[name]
        return Qwen3_5Config(
            text_config={**sizes, **special, **(text or {})},
            vision_config={**tower, **(vision or {})},
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
            tie_word_embeddings=tied,
        )
    raise ModelLoadError(f"unknown random-weight model {name!r}; choose one of {', '.join(RANDOM_MODELS)}")


def _processor(arch: str) -> Any:
    """The processor around the family's real tokenizer; for Qwen2.5-VL with the real video pixel bounds."""
    processor = PROCESSORS[arch](real_tokenizer(arch))
    if arch == "qwen2_5_vl":
        from transformers import Qwen2VLVideoProcessor

        processor.video_processor = Qwen2VLVideoProcessor(
            size=QWEN_VIDEO_PIXELS, cap_pixels_per_frame=False, patch_size=14, temporal_patch_size=2, merge_size=2
        )
    return processor


def _model_class(arch: str) -> type:
    import transformers

    return getattr(transformers, ADAPTERS[arch].model_class)


def parameter_count(config: Any) -> int:
    """Parameters of the model `config` describes, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = _model_class(config.model_type)._from_config(config)
    return sum(p.numel() for p in model.parameters())


def load_random_model(
    name: str,
    device: str | None = None,
    *,
    allow_cpu: bool = False,
    text: dict | None = None,
    vision: dict | None = None,
    dtype: str | torch.dtype | None = None,
) -> VideoLM:
    """Build `name` with random weights on `device` (default: cuda when available), in bf16 unless
    `dtype` says otherwise ('auto', 'bf16', 'fp16', 'fp32', as `resolve_dtype` reads them).

    A CPU is refused for the 7B ones unless `allow_cpu`: 8B parameters take 16 GB even in bf16,
    and every chunk would take minutes.
    """
    if name not in RANDOM_MODELS:
        raise ModelLoadError(f"unknown random-weight model {name!r}; choose one of {', '.join(RANDOM_MODELS)}")
    arch = RANDOM_MODELS[name]
    dev = pick_device(device)
    try:
        processor = _processor(arch)
    except ModuleNotFoundError as exc:
        raise ModelLoadError(str(exc)) from exc
    config = random_config(name, processor.tokenizer, text, vision)
    billions = parameter_count(config) / 1e9
    if dev.type == "cpu" and not allow_cpu and billions > CPU_MAX_BILLIONS:
        raise ModelLoadError(
            f"{name} is the real {billions:.1f}B-parameter architecture: {2 * billions:.0f} GB of "
            "weights even in bf16, and minutes per chunk on a CPU. "
            "Run it on a GPU, or pass --allow-cpu-7b to try anyway."
        )
    hf_logging.disable_progress_bar()
    try:
        # Created on the device in bf16 and initialised there: no 30 GB fp32 copy in host memory.
        with torch.device(dev):
            model = _model_class(arch)._from_config(
                config, dtype=torch.bfloat16 if dtype is None else resolve_dtype(dtype, dev)
            )
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        raise ModelLoadError(f"Cannot build {name} on {dev}: {exc}") from exc
    return ADAPTERS[arch](model, processor, source=name, random_weights=True)
