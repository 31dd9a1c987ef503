"""Eviction policies behind one interface: hermes, fifo and full (kvpress-style small classes).

A policy says how many slots a layer keeps (`capacity`), whether a layer folds evictions into a
summary slot, and how its video slots are scored (`score`). `HermesMemory.compress` does the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from hermes.memory.config import HermesConfig
from hermes.memory.scoring import layer_score, recency
from hermes.memory.smoothing import smooth
from hermes.memory.tiers import Tier

if TYPE_CHECKING:
    from hermes.memory.cache import HermesMemory


@dataclass
class Policy:
    """Base class: never evicts."""

    config: HermesConfig
    name: ClassVar[str] = "full"
    needs_guidance: ClassVar[bool] = False

    def capacity(self) -> int | None:
        """Slots after the prefix that each layer keeps; None for no limit."""
        return None

    def summarises(self, tier: Tier) -> bool:
        """Whether layers of this tier fold evicted tokens into a summary slot."""
        return False

    def score(self, memory: HermesMemory, attention: Sequence[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Importance of each layer's video slots (higher is kept)."""
        raise NotImplementedError(f"the {self.name} policy never evicts")


@dataclass
class FullPolicy(Policy):
    """No eviction: the cache grows with the stream (the memory cost HERMES avoids)."""


@dataclass
class FifoPolicy(Policy):
    """Sliding window: the newest |M| video tokens in every layer."""

    name: ClassVar[str] = "fifo"

    def capacity(self) -> int | None:
        return self.config.budget

    def score(self, memory: HermesMemory, attention: Sequence[torch.Tensor | None] | None) -> list[torch.Tensor]:
        return [layer.video_ids.float() for layer in memory.layers]


@dataclass
class HermesPolicy(Policy):
    """Hierarchical memory: recency in shallow layers, attention anchors in deep ones, a blend
    in between, smoothed across layers, with a summary slot of everything evicted."""

    name: ClassVar[str] = "hermes"
    needs_guidance: ClassVar[bool] = True

    def capacity(self) -> int | None:
        # The summary slot, or in layers without one an extra video slot, keeps lengths equal.
        return self.config.budget + (0 if self.config.summary == "none" else 1)

    def summarises(self, tier: Tier) -> bool:
        mode = self.config.summary
        return mode == "all" or (mode == "deep" and tier is Tier.LONG_TERM)

    def raw_scores(self, memory: HermesMemory, attention: Sequence[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """S^l before smoothing, per layer over its video slots."""
        cfg, tiers = self.config, memory.tiers
        out = []
        for i, layer in enumerate(memory.layers):
            n = layer.video_ids.numel()
            att = None
            if attention is not None and attention[i] is not None:
                att = attention[i][layer.video_offset :].float().cpu()
                if att.numel() != n:
                    raise ValueError(f"layer {i}: attention covers {att.numel()} video slots, the layer has {n}")
            out.append(layer_score(i, tiers, recency(n, cfg.recency_k), att, cfg.omega0, cfg.gamma))
        return out

    def score(self, memory: HermesMemory, attention: Sequence[torch.Tensor | None] | None) -> list[torch.Tensor]:
        strengths = {Tier.SENSORY: 0, Tier.WORKING: 1, Tier.LONG_TERM: 2}
        lambdas = [self.config.smoothing[strengths[t]] for t in memory.tiers.tiers]
        ids = [layer.video_ids for layer in memory.layers]
        return smooth(self.raw_scores(memory, attention), ids, lambdas, self.config.alignment)


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (HermesPolicy, FifoPolicy, FullPolicy)}


def make_policy(name: str, config: HermesConfig) -> Policy:
    """The policy called `name` (hermes, fifo or full)."""
    try:
        return POLICIES[name](config)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
