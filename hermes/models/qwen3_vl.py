"""Qwen3-VL (interleaved M-RoPE, a textual timestamp before each frame pair, DeepStack)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from hermes.models.base import ChunkInputs, VideoLM


class Qwen3VL(VideoLM):
    """Each frame pair becomes `<t seconds><|vision_start|>` pads `<|vision_end|>`.

    The timestamps are the frames' stream times, so a chunk's tokens are exactly those that
    transformers' processor builds for the same frames inside the whole video. Positions: text
    advances on all three axes; a frame pair sits at the current position on t, and spans the
    current position plus its row and column on h and w (`get_rope_index`). DeepStack needs
    nothing from the engine: the chunk's pixels go to the model's forward, which adds the vision
    tower's intermediate features to the first decoder layers at the video tokens.
    """

    arch: ClassVar[str] = "qwen3_vl"
    # The paper runs the Qwen family at 1 fps (Qwen2.5-VL in Table 1); Qwen3-VL alike.
    default_fps: ClassVar[float] = 1.0
    mrope: ClassVar[bool] = True
    frame_multiple: ClassVar[int] = 2  # the vision tower merges frame pairs
    # Every frame pair carries its own <|vision_start|> and <|vision_end|>, as Qwen3-VL's own
    # processing lays out a video: nothing wraps the video as a whole.
    video_open: ClassVar[str] = ""
    video_close: ClassVar[str] = ""

    def chunk_inputs(self, pixels: np.ndarray, fps: float, timestamps: np.ndarray | None = None) -> ChunkInputs:
        n = len(pixels)
        if n % self.frame_multiple:
            raise ValueError(f"Qwen3-VL needs an even number of frames per chunk, got {n}")
        times = np.arange(n) / fps if timestamps is None else np.asarray(timestamps, dtype=float)
        if len(times) < n:  # the engine repeated the last frame to make a pair: so does its time
            times = np.concatenate([times, np.repeat(times[-1:], n - len(times))])
        # The processor writes frame index / fps as each pair's time (the mean of the pair's two
        # frames); indices in units of 1/fps give the stream times exactly.
        meta = VideoMetadata(total_num_frames=n, fps=fps, frames_indices=(times[:n] * fps).tolist())
        proc = self.processor(
            text=self.processor.video_token,
            videos=[list(pixels)],
            video_metadata=[meta],
            do_sample_frames=False,
            return_tensors="pt",
        )
        ids = proc["input_ids"]
        grid = proc["video_grid_thw"]
        # A chunk alone starts at 0 on every axis; the engine adds the stream's next position.
        rel, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=proc["mm_token_type_ids"], video_grid_thw=grid)
        # Frame pair g owns its timestamp, its <|vision_start|>, its pads and its <|vision_end|>.
        ends = (ids[0] == self.model.config.vision_end_token_id).long()
        pair = torch.cumsum(ends, dim=0) - ends
        kwargs = {
            "pixel_values_videos": proc["pixel_values_videos"].to(self.device, self.dtype),
            "video_grid_thw": grid.to(self.device),
        }
        return ChunkInputs(
            input_ids=ids.to(self.device),
            model_kwargs=kwargs,
            frames=pair * self.frame_multiple,
            rel_positions=rel[:, 0, :].cpu(),
        )
