"""Qwen3.5 and Qwen3.6 (hybrid: Gated DeltaNet layers and gated full attention; Qwen3-VL's video
processing and interleaved M-RoPE, with a partial rotary)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

import torch
from transformers.cache_utils import Cache

from hermes.memory.cache import HermesCache
from hermes.models.qwen3_vl import Qwen3VL

LINEAR_ATTENTION = "linear_attention"
# Thinking is on by default in Qwen3.5's chat template; a streaming answer wants it off. With
# `enable_thinking=False` the template opens the answer with an empty thinking block, as here.
ANSWER_OPENING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
# Without the fla kernels (on a CPU), transformers runs Gated DeltaNet's chunked rule in its reference
# PyTorch code, which pads the sequence to chunks of this many tokens. A shorter pass (a guidance
# prompt, a question) runs as one chunk of its own length instead: the same arithmetic without the
# padding, which at the 0.8B shapes and 25 tokens took 1.4 ms a layer instead of 3.7 (one thread).
REFERENCE_CHUNK = 64
# The chunk size the running pass asks for (None: the rule's own), and how many of its leading tokens
# the state keeps, the others riding on it (`Qwen35.riding`; None: all). Context variables, so that
# two streams served from two threads each get their own.
_CHUNK: ContextVar[int | None] = ContextVar("hermes_qwen35_chunk", default=None)
_KEEP: ContextVar[int | None] = ContextVar("hermes_qwen35_keep", default=None)


def _with_chunk_size(rule: Callable) -> Callable:
    """transformers' chunked rule, taking the chunk size from `_CHUNK` when a pass set one (the
    models' forward passes only its own arguments down to the rule), and run in two parts when
    tokens after the first `_KEEP` ride on the pass: the state it returns is the one before them."""

    def rule_with_chunk(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> Any:
        size = _CHUNK.get()
        if size is not None:
            kwargs["chunk_size"] = size  # dropped by transformers when a fused kernel has no such argument
        keep = _KEEP.get()
        if keep is None or not 0 < keep < query.shape[1]:
            return rule(query, key, value, **kwargs)
        tail = query.shape[1] - keep
        g, beta = kwargs.pop("g"), kwargs.pop("beta")

        def part(cut: slice, **extra: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            tensors = (t[:, cut] for t in (query, key, value))
            return rule(*tensors, g=g[:, cut], beta=beta[:, cut], **(kwargs | extra))

        head, state = part(slice(None, keep), output_final_state=True)
        short = {"chunk_size": tail} if query.device.type == "cpu" and tail < REFERENCE_CHUNK else {}
        out, _ = part(slice(keep, None), initial_state=state, output_final_state=False, **short)
        return torch.cat([head, out], dim=1), state

    rule_with_chunk.hermes_chunked = True
    return rule_with_chunk


def _install_chunk_choice() -> None:
    """Let a pass pick the chunk size of Qwen3.5's and Qwen3.5-MoE's linear-attention layers (once)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    for modeling in (modeling_qwen3_5, modeling_qwen3_5_moe):
        rule = modeling.torch_chunk_gated_delta_rule
        if not getattr(rule, "hermes_chunked", False):
            modeling.torch_chunk_gated_delta_rule = _with_chunk_size(rule)


class Qwen35(Qwen3VL):
    """The video side is Qwen3-VL's (timestamped frame pairs, `get_rope_index`), without DeepStack.

    Only every fourth decoder layer (by default) is attention with keys and values; the others are
    linear attention and keep a fixed-size state, so the memory has a HERMES layer for each
    attention layer and a state layer for each of the others (`linear_layers`). Attention keys
    turn on their first 64 of 256 channels only; the rotary module says which (`rope_spec`).
    """

    arch: ClassVar[str] = "qwen3_5"
    model_class: ClassVar[str] = "Qwen3_5ForConditionalGeneration"
    name: ClassVar[str] = "Qwen3.5"

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.text_config.layer_types) if kind == LINEAR_ATTENTION]

    @property
    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """A linear-attention layer's states: the convolution's last kernel-size inputs (queries, keys
        and values side by side, in the model's dtype) and the recurrent state (fp32, as the model keeps it)."""
        c = self.text_config
        key_dim = c.linear_num_key_heads * c.linear_key_head_dim
        value_dim = c.linear_num_value_heads * c.linear_value_head_dim
        return {
            "conv": ((1, 2 * key_dim + value_dim, c.linear_conv_kernel_dim), self.dtype),
            "recurrent": ((1, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim), torch.float32),
        }

    @property
    def state_bytes(self) -> int:
        """Bytes of the linear-attention states a memory commits (`state_shapes`, in every linear layer)."""
        per_layer = sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.state_shapes.values())
        return len(self.linear_layers) * per_layer

    def attention_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn for layer in self.language_model.layers if hasattr(layer, "self_attn")]

    @contextmanager
    def riding(self, cache: HermesCache, keep: int) -> Iterator[HermesCache]:
        """As `VideoLM.riding`; the linear-attention layers' recurrent rule runs in two parts, the
        riding tokens after the state the others leave, which is the one kept."""
        _install_chunk_choice()
        token = _KEEP.set(keep)
        try:
            with cache.riding(keep):
                yield cache
        finally:
            _KEEP.reset(token)

    def question_ids(self, question: str) -> torch.Tensor:
        return self.encode(f"{self.video_close}{question}<|im_end|>\n{ANSWER_OPENING}")

    def forward(
        self,
        cache: Cache,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_to_keep: int = 1,
        **model_kwargs: Any,
    ) -> torch.Tensor:
        """As `VideoLM.forward`; a pass shorter than the reference rule's chunk, on a CPU, runs the
        linear-attention layers as one chunk of its own length (see REFERENCE_CHUNK)."""
        n = positions.shape[-1]
        if self.device.type != "cpu" or not 1 < n < REFERENCE_CHUNK:
            return super().forward(cache, input_ids, positions, logits_to_keep, **model_kwargs)
        _install_chunk_choice()
        token = _CHUNK.set(n)
        try:
            return super().forward(cache, input_ids, positions, logits_to_keep, **model_kwargs)
        finally:
            _CHUNK.reset(token)


class Qwen35Moe(Qwen35):
    """Qwen3.5 and Qwen3.6 mixture-of-experts checkpoints: the same layers and cache, expert MLPs."""

    arch: ClassVar[str] = "qwen3_5_moe"
    model_class: ClassVar[str] = "Qwen3_5MoeForConditionalGeneration"
