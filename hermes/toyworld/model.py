"""The toy model: LLaVA-OneVision's real classes, processor and chat template at a small size, with a
word-level tokenizer that knows the toy world's words.

LLaVA-OneVision was chosen because a frame is its own tokens there (1D RoPE, no frame pairs), so a
question's evidence sits in whole frames, as in the paper's main model. Frames are resized to
`IMAGE_SIDE` pixels: 4 x 4 SigLIP patches of 14 px, pooled 2 x 2 by the model, give 4 tokens a
frame, plus one newline token a chunk. A 32-step clip is then 136 video tokens in 4-frame chunks.

The tokenizer is a `tokenizers` WordLevel model in a PreTrainedTokenizerFast: the chat template's
special tokens (with the ids the configs name), the words of the system prompt, every word of the
world's questions and answers (each also capitalised), "\\n" and punctuation. Anything else is
`<unk>`: the guidance prompt's words too (docs/toyworld.md says why that is kept so).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hermes.models.base import SYSTEM_PROMPT
from hermes.models.card import ModelCard
from hermes.models.llava_onevision import SIGLIP_NORM
from hermes.models.tiny import LLAVA_CHAT_TEMPLATE
from hermes.toyworld.heldout import HeldOutSpec
from hermes.toyworld.questions import TEMPLATES, vocabulary
from hermes.toyworld.world import WORLD_FPS

IMAGE_SIDE = 56  # px the processor resizes frames to: 4 x 4 patches, 2 x 2 tokens after pooling
PATCH = 14
TOKENS_PER_FRAME = ((IMAGE_SIDE // PATCH + 1) // 2) ** 2  # 4
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>", "<unk>")
PUNCTUATION = ("?", ".", ",", ":", ";", "!", "\n")


@dataclass(frozen=True)
class ModelSpec:
    """The sizes of the toy model (all of them go into the settings hash of a training run)."""

    layers: int = 4  # the fewest with every tier: 0 sensory, 1-2 working, 3 long-term
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vision_hidden: int = 64
    vision_layers: int = 2
    vision_heads: int = 2
    rope_theta: float = 10_000.0
    max_positions: int = 32768

    def to_dict(self) -> dict:
        return asdict(self)


def tokens_per_frame(image_side: int, patch: int) -> int:
    """Tokens a frame of `image_side` px gives in SigLIP patches of `patch` px, pooled 2 x 2."""
    return ((image_side // patch + 1) // 2) ** 2


def frame_tokens(config: Any) -> int:
    """Tokens a frame of the LLaVA-OneVision `config` is pooled to."""
    vision = config.vision_config
    return tokens_per_frame(vision.image_size, vision.patch_size)


def words(world: list[str] | None = None) -> list[str]:
    """The tokenizer's words after the special tokens: prompt and world words (`world`, the toy
    world's vocabulary by default), each also capitalised."""
    world = vocabulary() if world is None else world
    base = set(world) | set(SYSTEM_PROMPT.replace(".", " ").split()) | {"system", "user", "assistant"}
    out = (set(base) | {w.capitalize() for w in base}) - set(PUNCTUATION)
    return sorted(out) + list(PUNCTUATION)


def build_tokenizer(world: list[str] | None = None) -> Any:
    """The word-level tokenizer: specials first (ids 0-5), then `words(world)`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words(world)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"),
            pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[t for t in SPECIALS if t not in ("<|endoftext|>", "<unk>")],
    )
    tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    return tokenizer


def image_geometry(spec: ModelSpec) -> tuple[int, int]:
    """(image side, patch side) in px of a spec: the first world's 56 and 14 unless the spec says."""
    return getattr(spec, "image_side", IMAGE_SIDE), getattr(spec, "patch", PATCH)


def _config(spec: ModelSpec, tokenizer: Any) -> Any:
    """The LlavaOnevisionConfig of `spec`: a Qwen2 language model and a SigLIP tower at 56 px."""
    from transformers import LlavaOnevisionConfig, Qwen2Config, SiglipVisionConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    side, patch = image_geometry(spec)
    text = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = SiglipVisionConfig(
        hidden_size=spec.vision_hidden,
        intermediate_size=4 * spec.vision_hidden,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        patch_size=patch,
        image_size=side,
        vision_use_head=False,
    )
    return LlavaOnevisionConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=ids["<image>"],
        video_token_index=ids["<video>"],
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=[[side, side]],
        tie_word_embeddings=False,
    )


def _processor(tokenizer: Any, side: int = IMAGE_SIDE, patch: int = PATCH) -> Any:
    """LLaVA-OneVision's processor for `side` px frames, with SigLIP's normalisation (mean = std = 0.5)."""
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    size = {"height": side, "width": side}
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(
            image_mean=SIGLIP_NORM, image_std=SIGLIP_NORM, size=size, image_grid_pinpoints=[[side, side]]
        ),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(image_mean=SIGLIP_NORM, image_std=SIGLIP_NORM, size=size),
        num_image_tokens=(side // patch) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=LLAVA_CHAT_TEMPLATE,
    )


def build_model(spec: ModelSpec, seed: int, world: list[str] | None = None) -> tuple[Any, Any]:
    """(model, processor): a freshly initialised LlavaOnevisionForConditionalGeneration of `spec` and
    its processor (its tokenizer knowing `world`'s words), deterministic given `seed`."""
    from transformers import GenerationConfig, LlavaOnevisionForConditionalGeneration

    tokenizer = build_tokenizer(world)
    config = _config(spec, tokenizer)
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).to(torch.float32)
    model.config.dtype = torch.float32
    text = config.text_config
    model.generation_config = GenerationConfig(
        bos_token_id=text.bos_token_id,
        eos_token_id=[text.eos_token_id, text.pad_token_id],
        pad_token_id=text.pad_token_id,
        do_sample=False,
    )
    return model, _processor(tokenizer, *image_geometry(spec))


ABOUT = "trained here on synthetic clips of shapes (docs/toyworld.md): it knows shapes and colours, nothing else"
# The page's suggestions: its training templates filled in (any other wording is noise to it).
QUESTIONS = (
    TEMPLATES["OJR"],
    TEMPLATES["ATR"].format(shape="circle"),
    TEMPLATES["EPM-first"].format(shape="square"),
    TEMPLATES["HLD"].format(colour="red", shape="triangle"),
)


def card() -> ModelCard:
    """The toy model's card: what it knows, and the stream it was trained for (one frame a world
    step, the held-out set's chunks, and a budget of a quarter of a held-out stream, which forces
    eviction), with HERMES beside FIFO as the pair to compare."""
    held = HeldOutSpec()
    tokens = held.frames * TOKENS_PER_FRAME + len(held.cuts)  # every frame's tokens and a newline per chunk
    stream = {"fps": WORLD_FPS, "chunk_frames": held.chunk_frames, "budget": tokens // 4}
    return ModelCard(
        about=ABOUT, stream={**stream, "compare_policies": ["hermes", "fifo"]}, samples=True, questions=QUESTIONS
    )


def save(model: Any, processor: Any, out: str | Path, model_card: ModelCard | None = None) -> Path:
    """Write the checkpoint as any transformers checkpoint is written, with its card (the toy model's
    by default)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (model_card or card()).write(out)
    return out
