"""Importance scores per layer: recency (eq. 1), attention (eq. 2) and their blend (omega^l)."""

from __future__ import annotations

import torch

from hermes.memory.config import HermesConfig
from hermes.memory.tiers import Tier, TierMap


def minmax(x: torch.Tensor) -> torch.Tensor:
    """alpha: rescale to [0, 1] so that recency and attention mix on one scale.

    A constant vector carries no preference and maps to zeros (ties then go to the newer token).
    """
    x = x.float()
    if x.numel() == 0:
        return x
    lo, hi = x.min(), x.max()
    span = hi - lo
    if span <= 0:
        return torch.zeros_like(x)
    return (x - lo) / span


def recency(num_slots: int, k: float) -> torch.Tensor:
    """Eq. 1, R_i = exp(-k d_i) with d_i = (T-1-i)/(T-1), min-max normalised (alpha): 1 for the newest
    slot, 0 for the oldest (e^-k before the normalisation)."""
    if num_slots == 1:
        return torch.ones(1)
    d = (num_slots - 1 - torch.arange(num_slots, dtype=torch.float32)) / (num_slots - 1)
    return minmax(torch.exp(-k * d))


def omega(layer: int, tiers: TierMap, omega0: float = HermesConfig.omega0, gamma: float = HermesConfig.gamma) -> float:
    """Recency weight of a middle layer, falling linearly from omega0 at l_s towards l_d."""
    l_s, l_d = tiers.first_middle, tiers.first_deep
    return omega0 - gamma * (layer - l_s) / (l_d - l_s)


def layer_score(
    layer: int,
    tiers: TierMap,
    recency_scores: torch.Tensor,
    attention: torch.Tensor | None,
    omega0: float = HermesConfig.omega0,
    gamma: float = HermesConfig.gamma,
) -> torch.Tensor:
    """S^l for one layer's video slots, by the layer's tier.

    Sensory layers use recency alone; long-term layers the normalised attention A; working layers
    (1 - omega^l) A + omega^l R.
    """
    tier = tiers[layer]
    if tier is Tier.SENSORY:
        return recency_scores
    if attention is None:
        raise ValueError(f"layer {layer} ({tier.value}) needs guidance attention to be scored")
    a = minmax(attention)
    if tier is Tier.LONG_TERM:
        return a
    w = omega(layer, tiers, omega0, gamma)
    return (1.0 - w) * a + w * recency_scores
