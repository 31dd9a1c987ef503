"""What the engine needs from a video LLM, whatever its backbone.

An adapter wraps a `transformers` model and its processor. It turns frames into the tokens of one
chunk, the question into the tail of the chat template, and runs the language model on a cache
with explicit positions: the HERMES memory, not the cache length, decides where tokens sit.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from transformers.cache_utils import Cache

from hermes.memory.cache import HermesCache, kv_bytes_per_token
from hermes.memory.rope import RopeSpec
from hermes.models.card import ModelCard
from hermes.models.gemm import flush_denormals

SYSTEM_PROMPT = "You are a helpful assistant."


def execution_device(module: torch.nn.Module) -> torch.device:
    """Where `module` computes: its accelerate hook's execution device when it has one (weights
    offloaded to the CPU or disk are brought there to run), else the device of its weights."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", [hook]):
        device = getattr(h, "execution_device", None)
        if device is not None:
            return torch.device(device)  # an int is an accelerator index
    return next(module.parameters()).device


@torch.no_grad()
def rotary_channel_axes(rotary: torch.nn.Module) -> list[int]:
    """For each frequency channel of an M-RoPE rotary module, the axis (0 t, 1 h, 2 w) that drives
    it, read from the module itself: token j sits at 1 on axis j and 0 on the others, so channel c
    turns (sin != 0) for the one token whose axis drives it."""
    device = rotary.inv_freq.device
    n = rotary.inv_freq.numel()
    positions = torch.eye(3, dtype=torch.long, device=device)[:, None, :]  # (axes, batch 1, tokens 3)
    _, sin = rotary(torch.zeros(1, device=device), positions)
    moved = sin[0, :, :n] != 0  # (tokens, channels); the second half repeats the first
    if not bool((moved.sum(dim=0) == 1).all()):
        raise ValueError("the rotary module does not give each channel exactly one position axis")
    return moved.long().argmax(dim=0).tolist()


@dataclass
class ChunkInputs:
    """One chunk of video as model inputs, plus what the memory records per token."""

    input_ids: torch.Tensor  # (1, n)
    model_kwargs: dict[str, Any]  # pixel values and grids, on the model's device
    frames: torch.Tensor  # (n,) index of each token's frame within the chunk
    rel_positions: torch.Tensor  # (axes, n) positions relative to the chunk's start
    patches: torch.Tensor | None = None  # (n,) index within the frame, when an input filter dropped tokens

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[-1]


def _cache_argument(model: Any) -> str:
    """The name the model's forward takes the cache by: transformers renamed `past_key_values`
    to `cache` during 5.x, and the GPU machines may run a release from before the rename."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class VideoLM(ABC):
    """A video LLM behind the narrow interface the streaming engine uses."""

    arch: ClassVar[str]  # the transformers model_type
    model_class: ClassVar[str]  # the transformers class that loads it
    default_fps: ClassVar[float] = 0.5
    # Frames per chunk must be a multiple of this (Qwen2.5-VL merges frame pairs).
    frame_multiple: ClassVar[int] = 1

    def __init__(self, model: Any, processor: Any, source: str, random_weights: bool = False) -> None:
        self.model = model.eval()
        # The name the model's forward takes the cache by (see `_cache_argument`).
        self.cache_argument = _cache_argument(model)
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.source = source
        self.random_weights = random_weights
        # What a checkpoint made for HERMES Live says about itself (set by the loader; empty otherwise).
        self.card = ModelCard()
        # Where inputs go: the device of the input embeddings (with a device_map, the first GPU).
        self.device = execution_device(model.get_input_embeddings())
        self.dtype = next(model.parameters()).dtype
        self.text_config = model.config.get_text_config(decoder=True)
        self.check_config()

    def check_config(self) -> None:
        """ValueError, in one line, for a config that cannot describe these weights: a layer count
        other than the decoder's, a layer kind per layer that does not add up, or a rotary that turns
        no channel or more than a head has. Computing on such a model would only give garbage."""
        layers = len(self.language_model.layers)
        if self.num_layers != layers:
            raise ValueError(f"its config says {self.num_layers} decoder layers, its weights have {layers}")
        kinds = getattr(self.text_config, "layer_types", None)
        if kinds is not None and len(kinds) != layers:
            raise ValueError(f"its config lists {len(kinds)} layer kinds for {layers} decoder layers")
        if self.kv_layers < 1:
            raise ValueError("it has no attention layer: a HERMES memory has nothing to keep")
        rotary, head_dim = self.rope_spec().rotary_dim, self.head_dim
        if not 0 < rotary <= head_dim:
            raise ValueError(f"its rotary turns {rotary} channels of a {head_dim}-channel head")

    # -- structure -----------------------------------------------------------------------
    @property
    def dtype_name(self) -> str:
        """The weights' and the cache's precision as the options spell it: bf16, fp16 or fp32."""
        names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        return names.get(self.dtype, str(self.dtype).removeprefix("torch."))

    @property
    def language_model(self) -> torch.nn.Module:
        return self.model.model.language_model

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def linear_layers(self) -> list[int]:
        """Decoder layers that are linear attention (a fixed-size state, no keys and values): none
        here; a hybrid backbone lists them."""
        return []

    @property
    def kv_layers(self) -> int:
        """Decoder layers that keep keys and values: the layers the HERMES memory manages."""
        return self.num_layers - len(self.linear_layers)

    @property
    def state_bytes(self) -> int:
        """Bytes of the linear-attention states a memory holds, constant whatever the stream's length."""
        return 0

    @property
    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Each state a linear-attention layer of a memory holds, by name: its shape and dtype (none here)."""
        return {}

    @property
    def max_positions(self) -> int:
        return int(self.text_config.max_position_embeddings)

    @property
    def head_dim(self) -> int:
        """Channels of one attention head (its key and value)."""
        c = self.text_config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token takes in a HermesCache of this model, over all its key-value layers."""
        return kv_bytes_per_token(self.kv_layers, self.text_config.num_key_value_heads, self.head_dim, self.dtype)

    def riding(self, cache: HermesCache, keep: int) -> AbstractContextManager[HermesCache]:
        """Within: the tokens of a forward pass after its first `keep` ride on it
        (`HermesCache.riding`): they read what comes before them and leave the memory as if they had
        not been there. A model of attention layers needs nothing more than the cache does; a hybrid
        one also stops its recurrent rule's state before them."""
        if self.linear_layers:
            raise NotImplementedError(f"{self.name}: its linear-attention layers cannot carry riding tokens")
        return cache.riding(keep)

    def attention_modules(self) -> list[torch.nn.Module]:
        """The self-attention module of each key-value layer, in order (every decoder layer here)."""
        return [layer.self_attn for layer in self.language_model.layers]

    def layer_devices(self) -> list[torch.device]:
        """The device each decoder layer runs on, and so where its part of the memory lives.

        One device unless the model was loaded with a device_map; then layers that accelerate
        offloads to the CPU or disk still run (and keep their keys) on their execution device.
        """
        return [execution_device(layer) for layer in self.language_model.layers]

    @property
    def devices(self) -> list[torch.device]:
        """The distinct devices of the decoder layers, in layer order."""
        return list(dict.fromkeys(self.layer_devices()))

    def rope_spec(self) -> RopeSpec:
        """The frequencies the model really uses (any rope scaling already applied), and for M-RoPE
        which axis drives each channel, read from the model's own rotary module."""
        rotary = self.language_model.rotary_emb
        inv_freq = rotary.inv_freq.detach().float().cpu()
        if getattr(rotary, "mrope_section", None) is None:
            return RopeSpec(inv_freq)
        return RopeSpec.from_channel_axes(inv_freq, rotary_channel_axes(rotary))

    @property
    def eos_token_ids(self) -> set[int]:
        ids = {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # -- text ------------------------------------------------------------------------------
    def encode(self, text: str) -> torch.Tensor:
        """Token ids (1, n) of `text`, special tokens parsed, nothing added."""
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        return ids.to(self.device)

    def prefix_ids(self) -> torch.Tensor:
        """The fixed text before the video: system prompt and the start of the user turn."""
        return self.encode(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{self.video_open}")

    def question_ids(self, question: str) -> torch.Tensor:
        """The chat-template tail that follows the video: the question, then the assistant turn."""
        return self.encode(f"{self.video_close}{question}<|im_end|>\n<|im_start|>assistant\n")

    def template_ids(self) -> torch.Tensor:
        """The chat template's tokens after the video with no question in them: StreamMem's proxy
        query for what a viewer will ask."""
        return self.question_ids("")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    mrope: ClassVar[bool] = False  # positions on three axes (t, h, w), as the Qwen-VL family has
    video_open: ClassVar[str] = ""
    video_close: ClassVar[str] = ""

    # -- model -----------------------------------------------------------------------------
    @abstractmethod
    def chunk_inputs(self, pixels: np.ndarray, fps: float, timestamps: np.ndarray | None = None) -> ChunkInputs:
        """Model inputs for frame pixels (F, H, W, 3) uint8 RGB sampled at `fps`.

        `timestamps` (F,) are the frames' stream times in seconds (default: 0, 1/fps, ...); a backbone
        that writes the time into its prompt (Qwen3-VL) uses them, the others need only `fps`.
        """

    # Why this backbone cannot take an input filter (+dtd), or None when it can.
    no_input_filter: ClassVar[str | None] = "this backbone cannot drop visual tokens before the prefill"

    def video_features(self, inputs: ChunkInputs) -> torch.Tensor:
        """The vision encoder's output for each video placeholder of `inputs` (n_video, hidden), as
        the model would scatter it into the input embeddings."""
        raise NotImplementedError(self.no_input_filter)

    def visual_tokens(self, inputs: ChunkInputs) -> torch.Tensor:
        """(n,) bool: which of the chunk's tokens are visual patches an input filter may drop."""
        return (inputs.input_ids[0] == self.model.config.video_token_id).cpu()

    @torch.inference_mode()
    def chunk_embeddings(self, inputs: ChunkInputs) -> torch.Tensor:
        """The chunk's input embeddings (1, n, hidden), video features in their placeholders: what
        the model's forward would build from `inputs`, for an input filter to drop tokens from."""
        embeds = self.model.get_input_embeddings()(inputs.input_ids)
        placeholders = inputs.input_ids[0] == self.model.config.video_token_id
        embeds[0, placeholders] = self.video_features(inputs).to(embeds.dtype)
        return embeds

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        """The model's position_ids argument for (axes, n) absolute positions: (1, n) for RoPE;
        (3, 1, n) for M-RoPE, where text (one axis given) advances on all three axes."""
        if not self.mrope:
            return positions[:1]
        if positions.shape[0] == 1:
            positions = positions.expand(3, -1)
        return positions[:, None, :]

    @torch.inference_mode()
    def forward(
        self,
        cache: Cache,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_to_keep: int = 1,
        **model_kwargs: Any,
    ) -> torch.Tensor:
        """Run the model on new tokens at explicit positions, appending to `cache`.

        Returns the logits of the last `logits_to_keep` tokens (1, k, vocab); prefills keep one,
        since full logits of a 3K-token chunk over a 150K vocabulary would be gigabytes.
        """
        flush_denormals()
        # An input filter hands over the chunk's embeddings (with its tokens dropped) instead of ids.
        if "inputs_embeds" in model_kwargs:
            input_ids = None
        out = self.model(
            input_ids=input_ids,
            position_ids=self.position_ids(positions.to(self.device)),
            **{self.cache_argument: cache},
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **model_kwargs,
        )
        return out.logits
