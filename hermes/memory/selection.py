"""Selection: which video slots a layer keeps after scoring, and whether it keeps a summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from hermes.memory.config import SummaryMode
from hermes.memory.tiers import Tier


def top_k(scores: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores, ties going to the newer token, returned in stream order."""
    if k >= scores.numel():
        return torch.arange(scores.numel())
    newest_first = torch.argsort(ids, descending=True)
    _, order = torch.sort(scores.float()[newest_first], descending=True, stable=True)
    return newest_first[order[:k]].sort().values


class Merge(NamedTuple):
    """Video slots that become one prototype, held in the slot of the first (which is kept): the
    mean of their keys and values, weighed by `weights` (one per slot, summing to 1) if given."""

    slots: torch.Tensor
    weights: torch.Tensor | None = None


@dataclass(frozen=True)
class TopK:
    """Keep the best slots up to `capacity` per layer. Layers that summarise give one of those
    slots to the summary, so that every layer keeps the same length. `keep_newest`: the newest
    frame's slots rank above every other in every layer (a guard for the present)."""

    capacity: int
    summary: SummaryMode = "none"
    keep_newest: bool = False

    @classmethod
    def with_summary(cls, budget: int, summary: SummaryMode) -> TopK:
        """|M| video slots plus the summary slot; layers without a summary keep that slot as one
        more video slot."""
        return cls(budget + (0 if summary == "none" else 1), summary)

    def summarises(self, tier: Tier) -> bool:
        """Whether layers of `tier` fold evicted tokens into a summary slot."""
        return self.summary == "all" or (self.summary == "deep" and tier is Tier.LONG_TERM)

    def video_slots(self, tier: Tier) -> int:
        """Video slots a layer of `tier` keeps."""
        return self.capacity - (1 if self.summarises(tier) else 0)

    @property
    def frames_kept(self) -> int | None:
        """Frames a layer keeps, for a selection that counts frames, not slots; None here."""
        return None

    def slot_bound(self, block_tokens: int, frames_per_block: int) -> int:
        """The most slots a layer holds once full, when a frame block (`frames_per_block` frames)
        takes at most `block_tokens` tokens: here the capacity, whatever the frames."""
        return self.capacity

    def plan(
        self, scores: torch.Tensor, ids: torch.Tensor, frames: torch.Tensor, tier: Tier
    ) -> tuple[torch.Tensor, list[Merge]]:
        """The video slots a layer keeps (stream order), and no merge groups."""
        return top_k(self.ranked(scores, frames), ids, self.video_slots(tier)), []

    def ranked(self, scores: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """The scores the slots are ranked by: `scores`, the newest frame's lifted above the rest
        when `keep_newest` (finite, so that a merge weighing by them stays finite)."""
        if not self.keep_newest or scores.numel() == 0:
            return scores
        lifted = scores.float().clone()
        top = float(lifted.max()) - float(lifted.min()) + 1.0
        lifted[frames == frames.max()] += top
        return lifted
