"""Layer -> memory tier partition: sensory (shallow), working (middle), long-term (deep)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from hermes.memory.config import HermesConfig


class Tier(str, Enum):
    """The three memory tiers of the paper (section 2)."""

    SENSORY = "sensory"
    WORKING = "working"
    LONG_TERM = "long-term"


def _round_half_up(x: float) -> int:
    # Python's round() is banker's rounding; the paper's 10/60/30 split wants ordinary rounding.
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class TierMap:
    """Which tier each decoder layer belongs to."""

    tiers: tuple[Tier, ...]

    @classmethod
    def partition(
        cls,
        num_layers: int,
        shallow_fraction: float = HermesConfig.shallow_fraction,
        deep_fraction: float = HermesConfig.deep_fraction,
    ) -> TierMap:
        """Split `num_layers` into 10% shallow / 60% middle / 30% deep, each tier non-empty."""
        if num_layers < 3:
            raise ValueError(f"HERMES needs at least 3 decoder layers (one per tier), got {num_layers}")
        n_shallow = max(1, _round_half_up(shallow_fraction * num_layers))
        n_deep = max(1, _round_half_up(deep_fraction * num_layers))
        n_middle = num_layers - n_shallow - n_deep
        if n_middle < 1:
            # Tiny models: give the working tier one layer taken from the larger neighbour.
            if n_deep > 1:
                n_deep -= 1
            else:
                n_shallow -= 1
            n_middle = 1
        tiers = (Tier.SENSORY,) * n_shallow + (Tier.WORKING,) * n_middle + (Tier.LONG_TERM,) * n_deep
        return cls(tiers)

    @classmethod
    def for_config(cls, num_layers: int, config: HermesConfig) -> TierMap:
        """The partition a memory with `config` uses: the one place the tiers are decided."""
        return cls.partition(num_layers, config.shallow_fraction, config.deep_fraction)

    def __len__(self) -> int:
        return len(self.tiers)

    def __getitem__(self, layer: int) -> Tier:
        return self.tiers[layer]

    @property
    def first_middle(self) -> int:
        """l_s: the first layer of working memory."""
        return self.tiers.index(Tier.WORKING)

    @property
    def first_deep(self) -> int:
        """l_d: the first layer of long-term memory."""
        return self.tiers.index(Tier.LONG_TERM)

    def layers(self, tier: Tier) -> list[int]:
        """Indices of the layers in `tier`."""
        return [i for i, t in enumerate(self.tiers) if t is tier]
