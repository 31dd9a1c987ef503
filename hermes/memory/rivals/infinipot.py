"""`infinipot-v`: temporal-axis redundancy (TaR) and value norm (VaN), InfiniPot-V (Kim et al.,
NeurIPS 2025).

Section 3.2 (TaR): the newest frames (a `query_ratio` share of the frames held) serve as the
reference. An older token's score is minus the cosine similarity of its key with the keys at the
same patch position in each reference frame, averaged over them: a token that repeats what the
newest frames show is redundant. The reference frames are all kept, and the TaR budget, a
`tar_ratio` share of the layer's slots, is filled up with the least redundant older tokens.
Section 3.3 (VaN): the rest of the budget goes by the L2 norm of the value, with the TaR picks
pinned. Section 3.4: compression runs whenever the cache reaches the budget, which is when the
engine calls the policy.

Difference from the original: InfiniPot-V selects per KV head. This memory keeps one set of
slots per layer (positions, stream ids and the attention mask are per layer), so the per-head
TaR and VaN scores are averaged over the heads before the selection (docs/design.md, "Rivals").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.tiers import Tier


@dataclass(frozen=True)
class TarVan:
    """TaR picks and the newest frames pinned, the rest ranked by value norm."""

    tar_ratio: float = 0.5  # share of the budget chosen by TaR (reference frames included)
    query_ratio: float = 0.25  # share of the held frames, newest first, used as TaR's reference

    def __post_init__(self) -> None:
        if not 0.0 <= self.tar_ratio <= 1.0:
            raise ValueError(f"infinipot-v.tar_ratio must lie in [0, 1], got {self.tar_ratio}")
        if not 0.0 < self.query_ratio <= 1.0:
            raise ValueError(f"infinipot-v.query_ratio must lie in (0, 1], got {self.query_ratio}")

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def reference(self, frames: torch.Tensor) -> torch.Tensor:
        """Which slots belong to the newest `query_ratio` of the frames held (at least one frame)."""
        held = torch.unique(frames)
        n = max(1, int(held.numel() * self.query_ratio))
        return frames >= held[-n]

    def redundancy(self, inputs: LayerInputs, reference: torch.Tensor) -> torch.Tensor:
        """TaR per slot: minus the mean cosine similarity, over heads and reference frames, of the
        slot's key with the key at its patch in each reference frame (0 where no reference frame
        has that patch; the reference slots themselves score 0)."""
        keys = inputs.keys[0].float()  # (heads, slots, dim)
        unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
        patches, frames = inputs.patches.to(keys.device), inputs.frames.to(keys.device)
        reference = reference.to(keys.device)
        total = torch.zeros(inputs.num_slots, device=keys.device)
        count = torch.zeros(inputs.num_slots, device=keys.device)
        for frame in torch.unique(frames[reference]):
            at = (frames == frame).nonzero().squeeze(1)
            table = torch.full((int(patches.max()) + 1,), -1, dtype=torch.long, device=keys.device)
            table[patches[at]] = at
            match = table[patches]
            has = (match >= 0) & ~reference
            cos = (unit * unit[:, match.clamp(min=0)]).sum(-1).mean(0)  # mean over heads
            total += torch.where(has, cos, 0.0)
            count += has.float()
        return -(total / count.clamp(min=1)).cpu()

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        inputs.need("keys", "values", "frames", "patches", "slots_kept")
        reference = self.reference(inputs.frames)
        van = inputs.values[0].float().norm(dim=-1).mean(0).cpu()  # (slots,), mean over heads
        tar_budget = inputs.slots_kept - round((1.0 - self.tar_ratio) * inputs.slots_kept)
        older = (~reference).nonzero().squeeze(1)
        picks = max(0, min(tar_budget - int(reference.sum()), older.numel()))
        pinned = reference.clone()
        if picks:
            tar = self.redundancy(inputs, reference)[older]
            pinned[older[torch.topk(tar, picks).indices]] = True
        # Pinned slots outrank every other; among themselves and among the rest, VaN decides.
        return van + pinned.float() * (float(van.max()) + 1.0)
