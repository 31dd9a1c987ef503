"""Qwen2.5-VL (M-RoPE: temporal, height and width positions; frame pairs merged)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from hermes.models.base import ChunkInputs
from hermes.models.qwen_vl import QwenVL


class Qwen25VL(QwenVL):
    """Video tokens carry 3D positions; text after the video continues on all three axes."""

    arch: ClassVar[str] = "qwen2_5_vl"
    model_class: ClassVar[str] = "Qwen2_5_VLForConditionalGeneration"
    name: ClassVar[str] = "Qwen2.5-VL"
    video_open: ClassVar[str] = "<|vision_start|>"
    video_close: ClassVar[str] = "<|vision_end|>"
    no_input_filter: ClassVar[str | None] = None  # +dtd: video features scattered, then dropped

    def video_metadata(self, n: int, fps: float, timestamps: np.ndarray | None) -> VideoMetadata:
        # The real fps matters: without it the processor assumes 24 fps and the temporal
        # positions of a 0.5 fps stream collapse onto each other.
        return VideoMetadata(total_num_frames=n, fps=fps)

    def rope_index_kwargs(self, proc: Any) -> dict[str, Any]:
        return {"second_per_grid_ts": torch.as_tensor(proc["second_per_grid_ts"])}

    def frame_pair_of_token(self, ids: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        # The pads of one frame pair are contiguous: (h / merge) x (w / merge) of them.
        _, h, w = (int(x) for x in grid[0])
        merge = self.model.config.vision_config.spatial_merge_size
        return torch.arange(ids.shape[-1]) // ((h // merge) * (w // merge))

    def video_features(self, inputs: ChunkInputs) -> torch.Tensor:
        kw = inputs.model_kwargs
        out = self.model.model.get_video_features(kw["pixel_values_videos"], kw["video_grid_thw"], return_dict=True)
        return torch.cat(list(out.pooler_output), dim=0)
