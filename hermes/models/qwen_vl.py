"""What the Qwen-VL family shares: frame pairs, M-RoPE positions from the model's own
`get_rope_index`, and the processor call that turns a chunk's pixels into tokens."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from transformers.video_utils import VideoMetadata

from hermes.models.base import ChunkInputs, VideoLM


class QwenVL(VideoLM):
    """A chunk's tokens, positions and frame of each token, the way the family's processor and
    `get_rope_index` lay them out; each member says how its frames are timed and grouped."""

    name: ClassVar[str]
    default_fps: ClassVar[float] = 1.0  # the paper's sampling rate for this family
    mrope: ClassVar[bool] = True
    frame_multiple: ClassVar[int] = 2  # the vision tower merges frame pairs

    def chunk_inputs(self, pixels: np.ndarray, fps: float, timestamps: np.ndarray | None = None) -> ChunkInputs:
        if len(pixels) % self.frame_multiple:
            raise ValueError(f"{self.name} needs an even number of frames per chunk, got {len(pixels)}")
        proc = self.processor(
            text=self.processor.video_token,
            videos=[list(pixels)],
            video_metadata=[self.video_metadata(len(pixels), fps, timestamps)],
            do_sample_frames=False,
            return_tensors="pt",
        )
        ids, grid = proc["input_ids"], proc["video_grid_thw"]
        # A chunk alone starts at 0 on every axis; the engine adds the stream's next position.
        rel, _ = self.model.model.get_rope_index(
            ids, mm_token_type_ids=proc["mm_token_type_ids"], video_grid_thw=grid, **self.rope_index_kwargs(proc)
        )
        return ChunkInputs(
            input_ids=ids.to(self.device),
            model_kwargs={
                "pixel_values_videos": proc["pixel_values_videos"].to(self.device, self.dtype),
                "video_grid_thw": grid.to(self.device),
            },
            frames=self.frame_pair_of_token(ids, grid) * self.frame_multiple,
            rel_positions=rel[:, 0, :].cpu(),
        )

    @abstractmethod
    def video_metadata(self, n: int, fps: float, timestamps: np.ndarray | None) -> VideoMetadata:
        """What the processor is told of the chunk's `n` frames sampled at `fps`."""

    def rope_index_kwargs(self, proc: Any) -> dict[str, Any]:
        """Extra arguments of the model's `get_rope_index` for this processor output."""
        return {}

    @abstractmethod
    def frame_pair_of_token(self, ids: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """For each of the chunk's tokens (ids (1, n)), the frame pair it belongs to."""
