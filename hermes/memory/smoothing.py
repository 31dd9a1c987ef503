"""Cross-layer memory smoothing: pull each layer's scores towards the layer below it (deeper)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hermes.memory.config import Alignment, HermesConfig
from hermes.memory.tiers import Tier, TierMap


def _aligned(deeper: torch.Tensor, deeper_ids: torch.Tensor, ids: torch.Tensor, mode: Alignment) -> torch.Tensor:
    """The deeper layer's smoothed score for each of this layer's tokens (0 where it has none)."""
    if mode == "slot":
        out = torch.zeros(ids.numel())
        n = min(ids.numel(), deeper.numel())
        out[:n] = deeper[:n]
        return out
    # By identity: layers keep different tokens, so slot i of two layers is not the same token.
    size = int(max(ids.max().item() if ids.numel() else -1, deeper_ids.max().item() if deeper_ids.numel() else -1)) + 1
    table = torch.zeros(size)
    table[deeper_ids] = deeper
    return table[ids]


def smooth(
    scores: Sequence[torch.Tensor],
    token_ids: Sequence[torch.Tensor],
    strengths: Sequence[float],
    mode: Alignment = "identity",
) -> list[torch.Tensor]:
    """S~^l = (1 - lambda_l) S^l + lambda_l S~^{l+1}, from the deepest layer upward.

    `token_ids[l]` are the global stream indices of layer l's video slots, in the same order as
    `scores[l]`. The last layer is left unchanged.
    """
    n = len(scores)
    if not (len(token_ids) == len(strengths) == n):
        raise ValueError("scores, token_ids and strengths need one entry per layer")
    out: list[torch.Tensor] = [torch.empty(0)] * n
    out[-1] = scores[-1].float()
    for layer in range(n - 2, -1, -1):
        lam = strengths[layer]
        below = _aligned(out[layer + 1], token_ids[layer + 1], token_ids[layer], mode)
        out[layer] = (1.0 - lam) * scores[layer].float() + lam * below
    return out


@dataclass(frozen=True)
class CrossLayerSmoothing:
    """Smoothing with one strength per tier: (sensory, working, long-term)."""

    strengths: tuple[float, float, float] = HermesConfig.smoothing
    alignment: Alignment = HermesConfig.alignment

    def __call__(
        self, scores: Sequence[torch.Tensor], token_ids: Sequence[torch.Tensor], tiers: TierMap
    ) -> list[torch.Tensor]:
        order = {Tier.SENSORY: 0, Tier.WORKING: 1, Tier.LONG_TERM: 2}
        lambdas = [self.strengths[order[t]] for t in tiers.tiers]
        return smooth(scores, token_ids, lambdas, self.alignment)
