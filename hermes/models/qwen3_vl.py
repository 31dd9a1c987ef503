"""Qwen3-VL (interleaved M-RoPE, a textual timestamp before each frame pair, DeepStack)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from hermes.models.qwen_vl import QwenVL


class Qwen3VL(QwenVL):
    """Each frame pair becomes `<t seconds><|vision_start|>` pads `<|vision_end|>`.

    The timestamps are the frames' stream times, so a chunk's tokens are exactly those that
    transformers' processor builds for the same frames inside the whole video. Positions: text
    advances on all three axes; a frame pair sits at the current position on t, and spans the
    current position plus its row and column on h and w (`get_rope_index`). DeepStack needs
    nothing from the engine: the chunk's pixels go to the model's forward, which adds the vision
    tower's intermediate features to the first decoder layers at the video tokens.
    """

    arch: ClassVar[str] = "qwen3_vl"
    model_class: ClassVar[str] = "Qwen3VLForConditionalGeneration"
    name: ClassVar[str] = "Qwen3-VL"
    # Every frame pair carries its own <|vision_start|> and <|vision_end|>, as Qwen3-VL's own
    # processing lays out a video: nothing wraps the video as a whole.
    video_open: ClassVar[str] = ""
    video_close: ClassVar[str] = ""
    # DeepStack adds the vision tower's intermediate features to the first decoder layers at the
    # video tokens inside the model's own forward; embeddings with tokens dropped would lose them.
    no_input_filter: ClassVar[str | None] = (
        "Qwen3-VL cannot take an input filter: DeepStack feeds visual features into its first decoder "
        "layers inside the model's forward, which a chunk with dropped tokens would bypass"
    )

    def video_metadata(self, n: int, fps: float, timestamps: np.ndarray | None) -> VideoMetadata:
        times = np.arange(n) / fps if timestamps is None else np.asarray(timestamps, dtype=float)
        if len(times) < n:  # the engine repeated the last frame to make a pair: so does its time
            times = np.concatenate([times, np.repeat(times[-1:], n - len(times))])
        # The processor writes frame index / fps as each pair's time (the mean of the pair's two
        # frames); indices in units of 1/fps give the stream times exactly.
        return VideoMetadata(total_num_frames=n, fps=fps, frames_indices=(times[:n] * fps).tolist())

    def frame_pair_of_token(self, ids: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        # Frame pair g owns its timestamp, its <|vision_start|>, its pads and its <|vision_end|>.
        ends = (ids[0] == self.model.config.vision_end_token_id).long()
        return torch.cumsum(ends, dim=0) - ends
