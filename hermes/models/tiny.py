"""Tiny random-weight checkpoints of the real backbones, for tests and offline use.

`build_tiny` writes a directory that loads through exactly the same path as a real
checkpoint: `AutoProcessor.from_pretrained(d)` and
`AutoModelForImageTextToText.from_pretrained(d)`. Only the sizes are tiny; the classes,
processors, placeholder logic, RoPE flavour (1D for LLaVA-OneVision, M-RoPE for
Qwen2.5-VL, interleaved M-RoPE for Qwen3-VL), GQA and chat templates are the real ones. Answers are noise; the cache and
attention dynamics are real.

Token layout (ids are the tiny tokenizer's, not the real 151k vocabulary):
- ids 0..255 are the 256 byte symbols (id == byte value), no merges;
- special tokens follow at 256+, in the same order as in the real vocabularies.

Tokens per frame:
- LLaVA-OneVision: every frame is resized to 384x384 -> 27x27 SigLIP patches ->
  bilinear pooling to 14x14 = 196 tokens, plus ONE `image_newline` token appended after the
  last frame of each video passed to the processor/model (so F frames -> 196*F + 1 `<video>`
  placeholders).
- Qwen2.5-VL: frames are resized by `smart_resize` to about 224x224 pixels (min = max =
  224*224 here), 14 px patches, 2x2 spatial merge, 2 frames per temporal patch. A 224x224
  frame pair gives 8x8 = 64 `<|video_pad|>` tokens; in general ceil(F/2)*(H/28)*(W/28) for the
  resized H, W (F padded up to even by repeating the last frame). No newline token.
- Qwen3-VL: 16 px patches, 2x2 spatial merge, 2 frames per temporal patch, as in the real
  checkpoints. The video processor bounds the pixels of the whole chunk (frames x height x width),
  not of one frame: at least QWEN3_MIN_VIDEO_PIXELS (so a 2-frame chunk of small frames is
  upscaled to about 224x224, 7x7 = 49 tokens per frame pair), at most the real processor's
  default. Each frame pair is preceded by a textual timestamp, "<1.5 seconds>", and wrapped in
  `<|vision_start|>` ... `<|vision_end|>`.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

import torch

from hermes.models.cachedir import cache_root

SUPPORTED_ARCHS: tuple[str, ...] = ("llava_onevision", "qwen2_5_vl", "qwen3_vl", "qwen3_5")

# Bump when the builder output changes, so cached checkpoints are rebuilt, not reused.
TINY_VERSION = 2

# What a random-weight model may say: its answers are noise, and should read as noise words, not as
# the broken UTF-8 that the byte vocabulary's other tokens decode to (see `_printable_head`).
PRINTABLE = string.ascii_lowercase + " .,?"
# The space's output row is scaled up by this much, so that it wins the argmax often enough to
# split the noise into words.
SPACE_GAIN = 1.5

# Std of the re-initialised q_proj/k_proj weights of every LM decoder layer. With the
# default init (std 0.02) and RMS-normalised inputs of width 64, q and k elements have std
# sqrt(64) * 0.02 = 0.16 and the logits q.k / sqrt(16) have std 64 * 0.02^2 = 0.026:
# softmax is then almost uniform and tests cannot tell a right cache from a wrong one.
# At std 0.25 the logit std is 64 * 0.25^2 = 4, so attention is peaked and depends on
# content and (through RoPE) on relative position.
QK_INIT_STD = 0.25

LM_HIDDEN = 64
LM_HEADS = 4
LM_KV_HEADS = 2  # GQA: 2 query heads per KV head, so the grouped-query paths are exercised
LM_HEAD_DIM = LM_HIDDEN // LM_HEADS  # 16
LM_INTERMEDIATE = 128
ROPE_THETA = 1_000_000.0  # as in the real Qwen2 / Qwen2.5-VL checkpoints
MAX_POSITIONS = 32768

# LLaVA-OneVision vision side (SigLIP): real patch and image size, tiny width/depth.
SIGLIP_IMAGE_SIZE = 384
SIGLIP_PATCH = 14
LLAVA_NUM_IMAGE_TOKENS = (SIGLIP_IMAGE_SIZE // SIGLIP_PATCH) ** 2  # 729 = 27 x 27
LLAVA_TOKENS_PER_FRAME = ((SIGLIP_IMAGE_SIZE // SIGLIP_PATCH + 1) // 2) ** 2  # 196 = 14 x 14

# Qwen2.5-VL vision side: real patch/merge/temporal sizes, tiny width/depth.
QWEN_PATCH = 14
QWEN_MERGE = 2
QWEN_TEMPORAL_PATCH = 2
QWEN_FRAME_PIXELS = 224 * 224  # smart_resize target (min = max) for video frames
QWEN_TOKENS_PER_FRAME_PAIR_224 = (224 // (QWEN_PATCH * QWEN_MERGE)) ** 2  # 64
QWEN_MROPE_SECTION = [2, 3, 3]  # sums to LM_HEAD_DIM / 2 = 8 (real: [16, 24, 24] at 128)
QWEN_TOKENS_PER_SECOND = 2  # as in the real Qwen2.5-VL vision config

# Qwen3-VL: real patch/merge/temporal sizes, tiny width/depth, DeepStack into the first 2 layers.
QWEN3_PATCH = 16
QWEN3_MROPE_SECTION = [4, 2, 2]  # interleaved: h on channels 1, 4; w on 2, 5; t on the rest (real: [24, 20, 20])
QWEN3_ROPE_THETA = 5_000_000.0  # as in the real Qwen3-VL checkpoints
QWEN3_DEEPSTACK = [0, 1]  # vision blocks whose features are added to decoder layers 0 and 1 (real: [8, 16, 24])
QWEN3_MIN_VIDEO_PIXELS = 2 * 224 * 224  # frames x height x width of a chunk, at least
QWEN3_MAX_VIDEO_PIXELS = 32 * 32 * 768  # the real video processor's default bound

# Qwen3.5: the real layer pattern (every fourth layer full attention, the others Gated DeltaNet),
# gated attention with a partial rotary: 16 of 64 channels per head turn (real: 64 of 256), in
# interleaved M-RoPE sections [3, 3, 2] (real: [11, 11, 10]).
QWEN35_FULL_ATTENTION_INTERVAL = 4  # as in every released Qwen3.5 checkpoint
QWEN35_HEAD_DIM = 64
QWEN35_PARTIAL_ROTARY = 0.25  # as in the real checkpoints
QWEN35_MROPE_SECTION = [3, 3, 2]
QWEN35_ROPE_THETA = 10_000_000.0  # as in the real checkpoints
QWEN35_LINEAR = {  # Gated DeltaNet sizes, tiny (real 0.8B: 16 key and 16 value heads of 128)
    "linear_conv_kernel_dim": 4,  # the real kernel
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}

# Special tokens, in the order of the real vocabularies (real ids start at 151643).
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAVA_SPECIALS = [*CHAT_SPECIALS, "<image>", "<video>"]
QWEN_VL_SPECIALS = [
    *CHAT_SPECIALS,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# The llava-hf LLaVA-OneVision chat template (role, then images, videos, then text).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\\n' + content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The Qwen2.5-VL-Instruct chat template (default system prompt, vision_start/pad/end).
QWEN_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# The Qwen3-VL-Instruct chat template, reduced to what a video chat uses (no default system prompt;
# the processor expands <|video_pad|> into timestamped frame groups).
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3.5 thinks before it answers unless told not to: its template opens the answer with an empty
# <think></think> block when `enable_thinking` is false, as the model card describes.
_QWEN35_TINY_SPECIALS = [*QWEN_VL_SPECIALS, "<think>", "</think>"]
QWEN35_CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}",
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte -> printable unicode map (what the ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _build_tokenizer(specials: list[str], chat_template: str) -> Any:
    """Byte-level Qwen2Tokenizer: 256 byte symbols (id == byte), no merges, then specials."""
    from transformers import Qwen2Tokenizer

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for i, tok in enumerate(specials):
        vocab[tok] = 256 + i
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,  # every byte is in the vocabulary, so nothing is ever unknown
        bos_token=None,  # Qwen2 adds no BOS
        eos_token="<|im_end|>",  # end of an assistant turn, as in the real instruct tokenizers
        pad_token="<|endoftext|>",
        extra_special_tokens=[t for t in specials if t != "<|endoftext|>"],
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def _scale_qk(layers: torch.nn.ModuleList, seed: int, std: float) -> None:
    """Re-initialise q_proj/k_proj weights so attention is far from uniform (see QK_INIT_STD).

    Qwen3 normalises q and k per head (RMSNorm) right after the projections, which undoes their
    scale; there the norms' weights carry it instead: sqrt(hidden) * std, the element std that
    q_proj alone gives the other backbones (2 at the default std, so logits of std 2^2 = 4).
    """
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in layers:
            attn = getattr(layer, "self_attn", None)
            if attn is None:  # a hybrid model's linear-attention layer: no queries and keys to scale
                continue
            for proj in (attn.q_proj, attn.k_proj):
                w = torch.randn(proj.weight.shape, generator=gen, dtype=torch.float32) * std
                proj.weight.copy_(w)
                norm = getattr(attn, "q_norm" if proj is attn.q_proj else "k_norm", None)
                if norm is not None:
                    _set_norm_gain(norm, std * proj.in_features**0.5)


def _set_norm_gain(norm: torch.nn.Module, gain: float) -> None:
    """Make an RMSNorm scale its output by `gain`: its weight is the gain (Qwen3), or the gain minus
    one where the norm multiplies by (1 + weight) (Qwen3.5), which the norm's own output tells."""
    norm.weight.fill_(gain)
    unit = torch.ones(norm.weight.shape[-1])
    if abs(float(norm(unit)[0]) - gain) > 1e-3 * gain:
        norm.weight.fill_(gain - 1.0)


def _printable_head(model: Any) -> None:
    """Zero the output rows of every token but the printable ones (PRINTABLE).

    A zero row gives a logit of 0, while the largest of the 30 random logits of the printable
    tokens is positive but with probability 2^-30, so greedy decoding picks from them: the answers
    are the model's own, in noise words, and run to their token limit (the end of a turn is never
    the likeliest token). The log-probabilities stay a real softmax over the whole vocabulary.
    """
    keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
    keep[[ord(c) for c in PRINTABLE]] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
        model.lm_head.weight[ord(" ")] *= SPACE_GAIN


def _text_kwargs(vocab_size: int, num_layers: int, specials: list[str]) -> dict[str, Any]:
    """LM hyper-parameters shared by both backbones."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": LM_HIDDEN,
        "intermediate_size": LM_INTERMEDIATE,
        "num_hidden_layers": num_layers,
        "num_attention_heads": LM_HEADS,
        "num_key_value_heads": LM_KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": 256 + specials.index("<|endoftext|>"),
        "eos_token_id": 256 + specials.index("<|im_end|>"),
        "pad_token_id": 256 + specials.index("<|endoftext|>"),
    }


def _build_llava(num_layers: int) -> tuple[Any, Any]:
    """(model, processor) for LLaVA-OneVision with a tiny Qwen2 LM and a tiny SigLIP."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        Qwen2Config,
        SiglipVisionConfig,
    )

    tokenizer = _build_tokenizer(LLAVA_SPECIALS, LLAVA_CHAT_TEMPLATE)
    text_config = Qwen2Config(
        **_text_kwargs(len(tokenizer), num_layers, LLAVA_SPECIALS),
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
    )
    vision_config = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        patch_size=SIGLIP_PATCH,
        image_size=SIGLIP_IMAGE_SIZE,
        vision_use_head=False,
    )
    config = LlavaOnevisionConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_index=256 + LLAVA_SPECIALS.index("<image>"),
        video_token_index=256 + LLAVA_SPECIALS.index("<video>"),
        # Real llava-hf OneVision values: last layer, all 729 patches (SigLIP has no CLS).
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        # Untied, unlike the real 0.5B: with tied random embeddings the residual stream is
        # dominated by the input embedding, so greedy decoding just repeats the last token.
        tie_word_embeddings=False,
    )
    return LlavaOnevisionForConditionalGeneration(config), _llava_processor(tokenizer)


def _llava_processor(tokenizer: Any) -> Any:
    """LLaVA-OneVision's processor around `tokenizer`: 384 px frames, SigLIP normalisation."""
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    # SigLIP normalisation (mean = std = 0.5), as the real checkpoints' processors use.
    half = [0.5, 0.5, 0.5]
    size = {"height": SIGLIP_IMAGE_SIZE, "width": SIGLIP_IMAGE_SIZE}
    image_processor = LlavaOnevisionImageProcessor(image_mean=half, image_std=half, size=size)
    video_processor = LlavaOnevisionVideoProcessor(image_mean=half, image_std=half, size=size)
    return LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=LLAVA_NUM_IMAGE_TOKENS,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=tokenizer.chat_template,
    )


def _qwen_vision_token_ids() -> dict[str, int]:
    """The Qwen configs' ids of the image, video and vision-delimiter tokens in the tiny tokenizer."""
    ids = {t: 256 + i for i, t in enumerate(QWEN_VL_SPECIALS)}
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def _qwen_processor(
    processor_class: type,
    video_processor_class: type,
    tokenizer: Any,
    *,
    patch: int,
    image_min_pixels: int,
    video_pixels: tuple[int, int],
) -> Any:
    """A Qwen-VL processor: the tiny tokenizer, images up to the tiny frame size and video frames
    between `video_pixels` (min, max)."""
    from transformers import Qwen2VLImageProcessor

    common = {"patch_size": patch, "temporal_patch_size": QWEN_TEMPORAL_PATCH, "merge_size": QWEN_MERGE}
    return processor_class(
        image_processor=Qwen2VLImageProcessor(
            size={"shortest_edge": image_min_pixels, "longest_edge": QWEN_FRAME_PIXELS}, **common
        ),
        tokenizer=tokenizer,
        video_processor=video_processor_class(
            size={"shortest_edge": video_pixels[0], "longest_edge": video_pixels[1]},
            cap_pixels_per_frame=False,
            **common,
        ),
        chat_template=tokenizer.chat_template,
    )


def _build_qwen(num_layers: int) -> tuple[Any, Any]:
    """(model, processor) for Qwen2.5-VL with a tiny LM (M-RoPE) and a tiny windowed ViT."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = _build_tokenizer(QWEN_VL_SPECIALS, QWEN_CHAT_TEMPLATE)
    text_config = {
        **_text_kwargs(len(tokenizer), num_layers, QWEN_VL_SPECIALS),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "mrope_section": QWEN_MROPE_SECTION,
        },
    }
    vision_config = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": QWEN_PATCH,
        "spatial_merge_size": QWEN_MERGE,
        "temporal_patch_size": QWEN_TEMPORAL_PATCH,
        "tokens_per_second": QWEN_TOKENS_PER_SECOND,
        "window_size": 112,  # real value: 4x4 merged-token windows
        "fullatt_block_indexes": [1],  # block 0 windowed, block 1 full, like the real mix
        "out_hidden_size": LM_HIDDEN,
    }
    config = Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        **_qwen_vision_token_ids(),
        tie_word_embeddings=False,  # as in the real 7B checkpoint
    )
    return Qwen2_5_VLForConditionalGeneration(config), _qwen25_processor(tokenizer)


def _qwen25_processor(tokenizer: Any) -> Any:
    """Qwen2.5-VL's processor around `tokenizer`.

    min = max pixels: every frame of a stream gets the same small grid (~224x224 px), whatever its
    resolution. The per-frame pixel cap is irrelevant at this size; setting it explicitly keeps
    token counts predictable and silences the deprecation warning.
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

    return _qwen_processor(
        Qwen2_5_VLProcessor,
        Qwen2VLVideoProcessor,
        tokenizer,
        patch=QWEN_PATCH,
        image_min_pixels=56 * 56,
        video_pixels=(QWEN_FRAME_PIXELS, QWEN_FRAME_PIXELS),
    )


def _build_qwen3(num_layers: int) -> tuple[Any, Any]:
    """(model, processor) for Qwen3-VL with a tiny LM (interleaved M-RoPE, q/k norms) and a tiny ViT
    whose DeepStack features feed the first decoder layers."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tokenizer = _build_tokenizer(QWEN_VL_SPECIALS, QWEN3_CHAT_TEMPLATE)
    text_config = {
        **_text_kwargs(len(tokenizer), num_layers, QWEN_VL_SPECIALS),
        "head_dim": LM_HEAD_DIM,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": QWEN3_ROPE_THETA,
            "mrope_section": QWEN3_MROPE_SECTION,
            "mrope_interleaved": True,
        },
    }
    vision_config = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": QWEN3_PATCH,
        "spatial_merge_size": QWEN_MERGE,
        "temporal_patch_size": QWEN_TEMPORAL_PATCH,
        "out_hidden_size": LM_HIDDEN,
        "num_position_embeddings": 256,  # a 16x16 grid of learned position embeddings, interpolated per frame
        "deepstack_visual_indexes": QWEN3_DEEPSTACK,
    }
    config = Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        **_qwen_vision_token_ids(),
        tie_word_embeddings=False,  # as in the real 8B checkpoint
    )
    return Qwen3VLForConditionalGeneration(config), _qwen3_processor(tokenizer)


def _qwen3_processor(tokenizer: Any) -> Any:
    """Qwen3-VL's processor around `tokenizer` (Qwen3.5 uses it too)."""
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

    return _qwen_processor(
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
        tokenizer,
        patch=QWEN3_PATCH,
        image_min_pixels=64 * 64,
        video_pixels=(QWEN3_MIN_VIDEO_PIXELS, QWEN3_MAX_VIDEO_PIXELS),
    )


def _build_qwen35(num_layers: int) -> tuple[Any, Any]:
    """(model, processor) for Qwen3.5: a tiny hybrid LM (Gated DeltaNet layers, every fourth layer
    gated full attention with a partial interleaved M-RoPE) and a tiny ViT; Qwen3-VL's processor,
    as the real checkpoints use."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = _build_tokenizer(_QWEN35_TINY_SPECIALS, QWEN35_CHAT_TEMPLATE)
    text_config = {
        **_text_kwargs(len(tokenizer), num_layers, _QWEN35_TINY_SPECIALS),
        **QWEN35_LINEAR,
        "head_dim": QWEN35_HEAD_DIM,
        "full_attention_interval": QWEN35_FULL_ATTENTION_INTERVAL,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": QWEN35_ROPE_THETA,
            "partial_rotary_factor": QWEN35_PARTIAL_ROTARY,
            "mrope_section": QWEN35_MROPE_SECTION,
            "mrope_interleaved": True,
        },
    }
    vision_config = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": QWEN3_PATCH,
        "spatial_merge_size": QWEN_MERGE,
        "temporal_patch_size": QWEN_TEMPORAL_PATCH,
        "out_hidden_size": LM_HIDDEN,
        "num_position_embeddings": 256,
    }
    config = Qwen3_5Config(
        text_config=text_config,
        vision_config=vision_config,
        **_qwen_vision_token_ids(),
        tie_word_embeddings=False,  # as in the real 9B checkpoint
    )
    return Qwen3_5ForConditionalGeneration(config), _qwen3_processor(tokenizer)


# arch -> its processor around a tokenizer (the tiny byte-level one, or a real vocabulary).
PROCESSORS = {
    "llava_onevision": _llava_processor,
    "qwen2_5_vl": _qwen25_processor,
    "qwen3_vl": _qwen3_processor,
    "qwen3_5": _qwen3_processor,
}

_BUILDERS = {
    "llava_onevision": _build_llava,
    "qwen2_5_vl": _build_qwen,
    "qwen3_vl": _build_qwen3,
    "qwen3_5": _build_qwen35,
}


def build_tiny(
    arch: str,
    out_dir: str | Path,
    num_layers: int = 4,
    seed: int = 0,
    *,
    qk_std: float = QK_INIT_STD,
) -> Path:
    """Build a tiny random-weight checkpoint of `arch` into `out_dir` and return the path.

    Deterministic given `seed`. `qk_std` exists so tests can show that the default init
    gives near-uniform attention; leave it alone otherwise.
    """
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model, processor = _BUILDERS[arch](num_layers)
    _scale_qk(model.model.language_model.layers, seed, qk_std)
    _printable_head(model)
    model = model.to(torch.float32).eval()
    model.config.dtype = torch.float32  # saved as "dtype": "float32"

    text = model.config.text_config
    # Greedy by default; stop on <|im_end|> or <|endoftext|> like the real generation configs.
    model.generation_config = GenerationConfig(
        bos_token_id=text.bos_token_id,
        eos_token_id=[text.eos_token_id, text.pad_token_id],
        pad_token_id=text.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def default_tiny_dir(arch: str, num_layers: int, seed: int = 0) -> Path:
    """Where `ensure_tiny` keeps the tiny checkpoint for (arch, num_layers, seed)."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    return cache_root() / "tiny" / f"{arch}-L{num_layers}-s{seed}-v{TINY_VERSION}"


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def ensure_tiny(arch: str, num_layers: int = 4, seed: int = 0) -> Path:
    """Return the cached tiny checkpoint for (arch, num_layers, seed), building it if missing.

    Builds into a temporary sibling directory and renames it into place, so a reader never
    sees a half-written checkpoint; if another process wins the race, its copy is kept.
    """
    final = default_tiny_dir(arch, num_layers, seed)
    if _is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build_tiny(arch, tmp, num_layers=num_layers, seed=seed)
        if final.exists() and not _is_complete(final):
            shutil.rmtree(final, ignore_errors=True)  # leftover of an older, broken layout
        try:
            os.rename(tmp, final)
        except OSError:
            if not _is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
