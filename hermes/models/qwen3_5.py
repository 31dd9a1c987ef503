"""Qwen3.5 and Qwen3.6 (hybrid: Gated DeltaNet layers and gated full attention; Qwen3-VL's video
processing and interleaved M-RoPE, with a partial rotary)."""

from __future__ import annotations

from typing import ClassVar

import torch

from hermes.models.qwen3_vl import Qwen3VL

LINEAR_ATTENTION = "linear_attention"
# Thinking is on by default in Qwen3.5's chat template; a streaming answer wants it off. With
# `enable_thinking=False` the template opens the answer with an empty thinking block, as here.
ANSWER_OPENING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


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
    def state_bytes(self) -> int:
        """Bytes of the linear-attention states a memory commits: per layer, the convolution's last
        kernel-size inputs (in the model's dtype) and the recurrent state (fp32, as the model keeps it)."""
        c = self.text_config
        key_dim = c.linear_num_key_heads * c.linear_key_head_dim
        value_dim = c.linear_num_value_heads * c.linear_value_head_dim
        conv = (2 * key_dim + value_dim) * c.linear_conv_kernel_dim * self.dtype.itemsize
        recurrent = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
        return len(self.linear_layers) * (conv + recurrent)

    def attention_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn for layer in self.language_model.layers if hasattr(layer, "self_attn")]

    def question_ids(self, question: str) -> torch.Tensor:
        return self.encode(f"{self.video_close}{question}<|im_end|>\n{ANSWER_OPENING}")


class Qwen35Moe(Qwen35):
    """Qwen3.5 and Qwen3.6 mixture-of-experts checkpoints: the same layers and cache, expert MLPs."""

    arch: ClassVar[str] = "qwen3_5_moe"
    model_class: ClassVar[str] = "Qwen3_5MoeForConditionalGeneration"
