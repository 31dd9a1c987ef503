"""A policy's input filter in the engine: the chunk's tokens it drops taken out before the prefill."""

from __future__ import annotations

from typing import Protocol

import torch

from hermes.memory.cache import rank_within_frame
from hermes.memory.rivals.dtd import Previous
from hermes.models.base import ChunkInputs, VideoLM


class InputFilter(Protocol):
    """A rule over a chunk's tokens before the prefill (`+dtd`: `DifferentialDrop`)."""

    def select(
        self,
        features: torch.Tensor,
        frames: torch.Tensor,
        patches: torch.Tensor,
        visual: torch.Tensor,
        previous: Previous = None,
    ) -> tuple[torch.Tensor, Previous]:
        """Which tokens go on (n,) bool, and what the next chunk needs of this one."""


class Unfiltered:
    """A stream without an input filter: every token of a chunk goes on."""

    last_frame: Previous = None  # nothing seen, nothing to carry to the next chunk

    def __call__(self, inputs: ChunkInputs) -> ChunkInputs:
        return inputs

    def reset(self) -> None:
        """Nothing to forget."""


class FilteredInputs:
    """One stream's input filter, with what it remembers between chunks (the last frame seen)."""

    def __init__(self, lm: VideoLM, rule: InputFilter) -> None:
        self.lm = lm
        self.rule = rule
        self.last_frame: Previous = None

    def reset(self) -> None:
        self.last_frame = None

    def __call__(self, inputs: ChunkInputs) -> ChunkInputs:
        """The chunk without the tokens the rule drops: the model then gets the remaining tokens'
        embeddings (video features scattered by the adapter), each at its own position."""
        embeds = self.lm.chunk_embeddings(inputs)
        patches = rank_within_frame(inputs.frames)
        kept, self.last_frame = self.rule.select(
            embeds[0], inputs.frames, patches, self.lm.visual_tokens(inputs), self.last_frame
        )
        return ChunkInputs(
            input_ids=inputs.input_ids[:, kept.to(inputs.input_ids.device)],
            model_kwargs={"inputs_embeds": embeds[:, kept.to(embeds.device)]},
            frames=inputs.frames[kept],
            rel_positions=inputs.rel_positions[:, kept],
            patches=patches[kept],
        )
