"""Qwen2.5-VL (M-RoPE: temporal, height and width positions; frame pairs merged)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from hermes.models.base import ChunkInputs, VideoLM


class Qwen25VL(VideoLM):
    """Video tokens carry 3D positions; text after the video continues on all three axes."""

    arch: ClassVar[str] = "qwen2_5_vl"
    default_fps: ClassVar[float] = 1.0  # the paper's sampling rate for this family
    mrope: ClassVar[bool] = True
    frame_multiple: ClassVar[int] = 2
    video_open: ClassVar[str] = "<|vision_start|>"
    video_close: ClassVar[str] = "<|vision_end|>"

    def chunk_inputs(self, pixels: np.ndarray, fps: float, timestamps: np.ndarray | None = None) -> ChunkInputs:
        if len(pixels) % self.frame_multiple:
            raise ValueError(f"Qwen2.5-VL needs an even number of frames per chunk, got {len(pixels)}")
        # The real fps matters: without it the processor assumes 24 fps and the temporal
        # positions of a 0.5 fps stream collapse onto each other.
        meta = VideoMetadata(total_num_frames=len(pixels), fps=fps)
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
        rel, _ = self.model.model.get_rope_index(
            ids,
            mm_token_type_ids=proc["mm_token_type_ids"],
            video_grid_thw=grid,
            second_per_grid_ts=torch.as_tensor(proc["second_per_grid_ts"]),
        )
        _, h, w = (int(x) for x in grid[0])
        merge = self.model.config.vision_config.spatial_merge_size
        per_step = (h // merge) * (w // merge)
        steps = torch.arange(ids.shape[-1]) // per_step
        kwargs = {
            "pixel_values_videos": proc["pixel_values_videos"].to(self.device, self.dtype),
            "video_grid_thw": grid.to(self.device),
        }
        return ChunkInputs(
            input_ids=ids.to(self.device),
            model_kwargs=kwargs,
            frames=steps * self.frame_multiple,
            rel_positions=rel[:, 0, :].cpu(),
        )
