"""`streammem`: proxy-query attention, top-k per layer and frame prototypes, StreamMem (Yang et
al., 2025, arXiv 2508.15717).

Section 3.2: after each clip the KV cache is compressed to a fixed size, query-agnostically. The
saliency of a visual token is the attention that the chat template's tokens after the video (the
end of the user turn and the start of the assistant turn) pay to it, averaged over heads and
template tokens, used as a proxy for the unknown question. Section 3.3: each layer keeps its
top-k visual tokens by that saliency. Section 3.4, Eq. 2: the tokens of a frame that are evicted
are merged into one prototype KV of that frame, which stays in the memory: K = sum_j a_j K_j and
V = sum_j a_j V_j, where a_j is token j's saliency normalised over the frame's merged tokens. The
paper's ablation (its Table 5) ranks that weighted merge above a plain mean above no merge, so
`streammem.prototype` takes all three: `weighted` (the paper's, the default), `mean` and `none`.

Differences from the paper: the prototype takes the slot (and position) of the frame's best
evicted token, keys rotated there before averaging, so that the memory keeps its fixed length
(prototypes count against the budget); a prototype evicted later is merged again like any
token. Input frame filtering (section 3.1) is left to the `+dtd` filter; the YaRN position
extension (section 3.5) is not needed, since the engine re-indexes positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.selection import Merge, TopK, top_k
from hermes.memory.tiers import Tier

PROTOTYPES = ("weighted", "mean", "none")


@dataclass(frozen=True)
class ProxyAttention:
    """Saliency: the attention the chat template's tokens pay to each slot. `prototype` says how a
    frame's evicted tokens are merged: by saliency (Eq. 2), as a plain mean, or not at all."""

    prototype: str = "weighted"

    def __post_init__(self) -> None:
        if self.prototype not in PROTOTYPES:
            raise ValueError(f"streammem.prototype must be one of {', '.join(PROTOTYPES)}; got {self.prototype!r}")

    def selection(self, budget: int) -> TopK:
        """Top-k by saliency, with this prototype merge."""
        if self.prototype == "none":
            return TopK(budget)
        return FramePrototypes(budget, weighted=self.prototype == "weighted")

    def guidance(self, tier: Tier) -> Guidance | None:
        return "template"

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        inputs.need("attention")
        att = inputs.attention.float().cpu()
        if att.numel() != inputs.num_slots:
            raise ValueError(f"layer {inputs.layer}: attention covers {att.numel()} slots, not {inputs.num_slots}")
        return att


@dataclass(frozen=True)
class FramePrototypes(TopK):
    """Top-k by score, plus one prototype per frame that loses tokens, `capacity` slots in all (no
    summary slot: the prototypes are StreamMem's memory of the evicted). `weighted`: each token
    weighs in by its score, normalised over the frame's merged tokens (Eq. 2); else a plain mean."""

    weighted: bool = True

    def plan(
        self, scores: torch.Tensor, ids: torch.Tensor, frames: torch.Tensor, tier: Tier
    ) -> tuple[torch.Tensor, list[Merge]]:
        """The slots kept (stream order) and the merge groups, each led by its kept representative.

        The largest k is chosen such that the k best tokens plus one prototype per frame among
        the others fit in `capacity`. When even k = 0 does not fit (more frames than slots), it
        falls back to plain top-k without prototypes.
        """
        n, cap = scores.numel(), self.capacity
        if n <= cap:
            return torch.arange(n), []
        saliency, scores = scores, self.ranked(scores, frames)
        newest_first = torch.argsort(ids, descending=True)
        _, by_score = torch.sort(scores.float()[newest_first], descending=True, stable=True)
        order = newest_first[by_score]  # best first, ties to the newer token, as top_k
        rank = torch.empty(n, dtype=torch.long)
        rank[order] = torch.arange(n)
        _, code = torch.unique(frames, return_inverse=True)
        worst = torch.zeros(int(code.max()) + 1, dtype=torch.long).scatter_reduce(0, code, rank, "amax")
        # Frames with a token among ranks >= k: those whose worst rank is >= k.
        frames_from = torch.flip(torch.cumsum(torch.flip(torch.bincount(worst, minlength=n), [0]), 0), [0])
        k_all = torch.arange(cap + 1)
        fits = (k_all + frames_from[k_all] <= cap).nonzero()
        if fits.numel() == 0:
            return top_k(scores, ids, cap), []  # `scores` as ranked: the newest frame first if guarded
        k = int(fits.max())
        evicted = order[k:]  # best first
        grouped = evicted[torch.sort(code[evicted], stable=True).indices]
        _, counts = torch.unique_consecutive(code[grouped], return_counts=True)
        groups = list(torch.split(grouped, counts.tolist()))
        keep = torch.cat([order[:k], torch.stack([g[0] for g in groups])]).sort().values
        return keep, [Merge(g, self._weights(saliency[g])) for g in groups if g.numel() > 1]

    def _weights(self, saliency: torch.Tensor) -> torch.Tensor | None:
        """Eq. 2's a_j, the saliency normalised over the group; None (a plain mean) when unweighted or
        when the group has no saliency to share out."""
        total = saliency.float().clamp(min=0).sum()
        if not self.weighted or float(total) <= 0.0:
            return None
        return saliency.float().clamp(min=0) / total
