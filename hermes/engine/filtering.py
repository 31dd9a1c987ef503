"""A policy's input filter in the engine: the chunk's tokens it drops taken out before the prefill."""

from __future__ import annotations

from hermes.memory.cache import rank_within_frame
from hermes.memory.policies import PolicyError
from hermes.memory.rivals.dtd import DifferentialDrop, Previous
from hermes.models.base import ChunkInputs, VideoLM


def check_input_filter(lm: VideoLM, policy: str) -> None:
    """PolicyError when `lm`'s backbone cannot hand its chunks to an input filter."""
    if lm.no_input_filter is not None:
        raise PolicyError(f"{policy}: {lm.no_input_filter}")


class FilteredInputs:
    """One stream's input filter, with what it remembers between chunks (the last frame seen)."""

    def __init__(self, lm: VideoLM, rule: DifferentialDrop) -> None:
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
        keep, self.last_frame = self.rule.keep(
            embeds[0], inputs.frames, patches, self.lm.visual_tokens(inputs), self.last_frame
        )
        return ChunkInputs(
            input_ids=inputs.input_ids[:, keep.to(inputs.input_ids.device)],
            model_kwargs={"inputs_embeds": embeds[:, keep.to(embeds.device)]},
            frames=inputs.frames[keep],
            rel_positions=inputs.rel_positions[:, keep],
            patches=patches[keep],
        )
