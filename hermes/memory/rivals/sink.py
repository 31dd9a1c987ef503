"""`sink`: attention sinks plus a recent window (StreamingLLM; StreamingVLM's training-free part).

StreamingLLM (Xiao et al., ICLR 2024), section 3.2: keep the KV of the first few tokens of the
stream (the attention sinks, four in the paper) and a rolling window of the most recent ones;
everything in between is evicted. Here the sinks are the stream's first S *video* tokens: the
text prefix before the video is always kept by the engine, as StreamingVLM keeps its text
window apart from its vision window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.tiers import Tier


@dataclass(frozen=True)
class SinkWindow:
    """The first `sinks` video tokens of the stream outrank every other; the rest rank by recency."""

    sinks: int = 4  # StreamingLLM section 3.2: four initial tokens suffice as sinks

    def __post_init__(self) -> None:
        if self.sinks < 0:
            raise ValueError(f"sink.sinks must be 0 or more video tokens, got {self.sinks}")

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        inputs.need("stream_ids")
        recency = torch.arange(inputs.num_slots, dtype=torch.float32)
        # A sink is a token among the stream's first S, whichever slot it has come to occupy.
        return recency + inputs.num_slots * (inputs.stream_ids < self.sinks).float()
