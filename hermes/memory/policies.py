"""Memory policies, kvpress-style: a policy is a scorer, an optional smoothing and a selection.

A scorer turns one layer's inputs (its tier, how many video slots it has, the guidance attention
over them) into scores, and says which guidance query each tier reads. It never sees the cache.
Smoothing (across layers) and selection (Top-K plus the summary slot) are separate steps;
`hermes.memory.compression.compress` runs them in order on a `HermesCache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from hermes.memory.config import HermesConfig
from hermes.memory.scoring import layer_score, recency
from hermes.memory.selection import TopK
from hermes.memory.smoothing import CrossLayerSmoothing
from hermes.memory.tiers import Tier, TierMap

Guidance = Literal["global", "hybrid"]


@dataclass(frozen=True)
class LayerInputs:
    """What a scorer sees of one layer."""

    layer: int
    tiers: TierMap
    num_slots: int  # video slots, in stream order
    attention: torch.Tensor | None  # guidance attention W over those slots, where the layer was probed

    @property
    def tier(self) -> Tier:
        return self.tiers[self.layer]


class Scorer(Protocol):
    """Scores one layer's video slots (higher is kept)."""

    def guidance(self, tier: Tier) -> Guidance | None:
        """The guidance query layers of `tier` need, or None when they score without attention."""

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        """One score per video slot."""


@dataclass(frozen=True)
class StreamOrder:
    """FIFO: the newer the slot, the higher its score."""

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        return torch.arange(inputs.num_slots, dtype=torch.float32)


@dataclass(frozen=True)
class TieredScorer:
    """HERMES: recency in sensory layers, guidance attention in long-term layers, a blend in
    working layers, whose recency weight omega^l falls with depth."""

    recency_k: float = HermesConfig.recency_k
    omega0: float = HermesConfig.omega0
    gamma: float = HermesConfig.gamma

    def guidance(self, tier: Tier) -> Guidance | None:
        # Long-term layers read the global prompt (the story so far); working layers the hybrid
        # one (the story, then the current scene); sensory layers need no attention at all.
        return {Tier.SENSORY: None, Tier.WORKING: "hybrid", Tier.LONG_TERM: "global"}[tier]

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        att = None if inputs.attention is None else inputs.attention.float().cpu()
        if att is not None and att.numel() != inputs.num_slots:
            raise ValueError(
                f"layer {inputs.layer}: attention covers {att.numel()} video slots, the layer has {inputs.num_slots}"
            )
        r = recency(inputs.num_slots, self.recency_k)
        return layer_score(inputs.layer, inputs.tiers, r, att, self.omega0, self.gamma)


@dataclass(frozen=True)
class MemoryPolicy:
    """A named composition. No scorer means the policy never evicts (the full cache)."""

    name: str
    scorer: Scorer | None = None
    smoothing: CrossLayerSmoothing | None = None
    selection: TopK | None = None

    @property
    def capacity(self) -> int | None:
        """Slots after the prefix each layer keeps; None for no limit."""
        return None if self.selection is None else self.selection.capacity

    def guidance(self, tier: Tier) -> Guidance | None:
        return None if self.scorer is None else self.scorer.guidance(tier)


def hermes_policy(config: HermesConfig) -> MemoryPolicy:
    """Hierarchical memory, smoothed across layers, with a summary of everything evicted."""
    return MemoryPolicy(
        "hermes",
        TieredScorer(config.recency_k, config.omega0, config.gamma),
        CrossLayerSmoothing(config.smoothing, config.alignment),
        TopK.with_summary(config.budget, config.summary),
    )


def fifo_policy(config: HermesConfig) -> MemoryPolicy:
    """Sliding window: the newest |M| video tokens in every layer."""
    return MemoryPolicy("fifo", StreamOrder(), None, TopK(config.budget))


def full_policy(config: HermesConfig) -> MemoryPolicy:
    """No eviction: the cache grows with the stream (the memory cost HERMES avoids)."""
    return MemoryPolicy("full")


POLICIES = {"hermes": hermes_policy, "fifo": fifo_policy, "full": full_policy}


def make_policy(name: str, config: HermesConfig) -> MemoryPolicy:
    """The policy called `name` (hermes, fifo or full)."""
    try:
        return POLICIES[name](config)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
