"""What a scorer sees of one layer, and what it must answer (kvpress-style: tensors in, scores out).

Every memory policy, HERMES and its rivals alike, scores a layer's video slots from a
`LayerInputs`: the keys and values of those slots (views of the cache's storage, never copies),
each slot's stream id, frame and patch index within its frame, the layer's tier, the slots a
layer keeps, the attention a probe query paid to each slot where the layer was probed, and what
it takes to read a key before RoPE (its origin key, origin position and the rotary frequencies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from hermes.memory.rope import RopeSpec, rotate_keys
from hermes.memory.tiers import Tier, TierMap

# The probe queries a scorer may ask the engine for: HERMES's global and hybrid guidance prompts,
# or the chat template's own tokens after the video (StreamMem's proxy query).
Guidance = Literal["global", "hybrid", "template"]


@dataclass(frozen=True)
class LayerInputs:
    """What a scorer sees of one layer. Everything but the first four fields is optional, so that a
    scorer that only needs the slot count (FIFO, HERMES) can be tested on its own."""

    layer: int
    tiers: TierMap
    num_slots: int  # video slots, in stream order
    attention: torch.Tensor | None  # probe attention over those slots, where the layer was probed
    keys: torch.Tensor | None = None  # (1, kv heads, num_slots, head dim), a view of the cache
    values: torch.Tensor | None = None  # same shape
    stream_ids: torch.Tensor | None = None  # (num_slots,) global token index in the stream
    frames: torch.Tensor | None = None  # (num_slots,) frame index in the stream
    patches: torch.Tensor | None = None  # (num_slots,) token index within its frame (the adapter's layout)
    slots_kept: int | None = None  # video slots the layer keeps after this step
    origin_keys: torch.Tensor | None = None  # like keys: each slot's key as the model wrote it, at its origin
    origins: torch.Tensor | None = None  # (axes, num_slots) positions those keys were computed at
    rope: RopeSpec | None = None  # the model's rotary frequencies

    @property
    def tier(self) -> Tier:
        return self.tiers[self.layer]

    def keys_before_rope(self) -> torch.Tensor:
        """(1, kv heads, num_slots, head dim) fp32: each slot's key with RoPE taken off, rotated back
        from its origin (one rotation from the key as the model wrote it, whatever re-indexing did)."""
        self.need("origin_keys", "origins", "rope")
        return rotate_keys(self.origin_keys.float(), -self.origins, self.rope)

    def need(self, *fields: str) -> None:
        """Fail clearly when a scorer is handed inputs without the fields its rule reads."""
        missing = [f for f in fields if getattr(self, f) is None]
        if missing:
            raise ValueError(f"layer {self.layer}: this scorer needs {', '.join(missing)} in its LayerInputs")


class Scorer(Protocol):
    """Scores one layer's video slots (higher is kept).

    A scorer whose guidance prompt carries the conversation may also have `history_tokens`: how many
    tokens of the last question, and of its answer, lead the prompt (`MemoryPolicy.history_tokens`).
    """

    def guidance(self, tier: Tier) -> Guidance | None:
        """The probe query layers of `tier` need, or None when they score without attention."""

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        """One score per video slot."""
