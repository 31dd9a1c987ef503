"""LLaVA-OneVision (Qwen2 language model, 1D RoPE, SigLIP vision tower)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from hermes.models.base import ChunkInputs, VideoLM

SIGLIP_NORM = [0.5, 0.5, 0.5]


class LlavaOnevision(VideoLM):
    """Each frame becomes 196 tokens at 384 px, and each chunk ends with one newline token."""

    arch: ClassVar[str] = "llava_onevision"
    model_class: ClassVar[str] = "LlavaOnevisionForConditionalGeneration"
    default_fps: ClassVar[float] = 0.5  # the paper's sampling rate for this family
    video_close: ClassVar[str] = "\n"
    no_input_filter: ClassVar[str | None] = None  # +dtd: video features scattered, then dropped

    def chunk_inputs(self, pixels: np.ndarray, fps: float, timestamps: np.ndarray | None = None) -> ChunkInputs:
        # SigLIP was trained on [-1, 1] inputs; the hub's video processor config for these
        # checkpoints does not always say so, hence mean = std = 0.5 here.
        proc = self.processor(
            text=self.processor.video_token,
            videos=[list(pixels)],
            image_mean=SIGLIP_NORM,
            image_std=SIGLIP_NORM,
            return_tensors="pt",
        )
        ids = proc["input_ids"].to(self.device)
        n = ids.shape[-1]
        per_frame = (n - 1) // len(pixels)
        # Frame f owns tokens [f*per_frame, (f+1)*per_frame); the trailing newline belongs to the last frame.
        local = torch.clamp(torch.arange(n) // per_frame, max=len(pixels) - 1)
        kwargs = {"pixel_values_videos": proc["pixel_values_videos"].to(self.device, self.dtype)}
        if "image_sizes_videos" in proc:
            kwargs["image_sizes_videos"] = proc["image_sizes_videos"]
        return ChunkInputs(
            input_ids=ids,
            model_kwargs=kwargs,
            frames=local,
            rel_positions=torch.arange(n)[None],
        )

    def video_features(self, inputs: ChunkInputs) -> torch.Tensor:
        config = self.model.config
        out = self.model.model.get_video_features(
            inputs.model_kwargs["pixel_values_videos"],
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            return_dict=True,
        )
        return out.pooler_output.flatten(0, 1)

    def visual_tokens(self, inputs: ChunkInputs) -> torch.Tensor:
        # The chunk's last placeholder holds the learned newline, not a patch: never dropped.
        visual = super().visual_tokens(inputs)
        visual[-1] = False
        return visual
