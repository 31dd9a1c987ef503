"""The model-free part of a memory policy, kvpress-style: a scorer, an optional smoothing and a
selection, composed as a `MemoryPolicy`; `hermes.memory.compression.compress` runs them in order.

A scorer turns one layer's inputs (`hermes.memory.scorer.LayerInputs`: its slots' keys, values,
stream ids, frames and patches, its tier, the probe attention over it) into scores, and says
which probe query each tier reads. Smoothing (across layers) and selection (Top-K plus the
summary slot, StreamMem's frame prototypes, ReKV's frame window) are separate steps. The parts a
policy adds around the memory (an input filter before the prefill, a question-time step) and the
names that pick a policy live in the engine: `hermes.engine.policy` and `hermes.engine.methods`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hermes.memory.config import HermesConfig, check_history_tokens
from hermes.memory.scorer import Guidance, LayerInputs, Scorer
from hermes.memory.scoring import layer_score, recency
from hermes.memory.selection import Merge
from hermes.memory.tiers import Tier, TierMap

__all__ = [
    "Guidance",
    "LayerInputs",
    "MemoryPolicy",
    "PolicyError",
    "Scorer",
    "Selection",
    "Smoothing",
    "StreamOrder",
    "TieredScorer",
    "with_params",
]


class PolicyError(ValueError):
    """A policy name or parameter the engine will not take, with the choices."""


class Smoothing(Protocol):
    """Mixes each layer's scores with other layers' (HERMES's cross-layer smoothing)."""

    def __call__(
        self, scores: Sequence[torch.Tensor], token_ids: Sequence[torch.Tensor], tiers: TierMap
    ) -> list[torch.Tensor]: ...


class Selection(Protocol):
    """Which video slots a layer keeps after scoring, and whether it folds the rest into a summary."""

    capacity: int  # slots after the prefix every layer holds once past it (the summary included)

    def summarises(self, tier: Tier) -> bool: ...

    def video_slots(self, tier: Tier) -> int:
        """Video slots a layer of `tier` keeps."""

    def slot_bound(self, block_tokens: int, frames_per_block: int) -> int:
        """The most slots a layer holds once full, when a frame block (`frames_per_block` frames)
        takes at most `block_tokens` tokens (a window counted in frames reads them)."""

    def plan(
        self, scores: torch.Tensor, ids: torch.Tensor, frames: torch.Tensor, tier: Tier
    ) -> tuple[torch.Tensor, list[Merge]]:
        """The slots a layer keeps (stream order) and its merge groups, each led by a kept slot."""


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
    history_tokens: int = HermesConfig.history_tokens  # of the last question and of its answer, each
    # Variants, measured against the paper's HERMES (both off): the newest frame kept whole in every
    # layer, and one prototype per frame that loses tokens in place of the single summary slot.
    keep_newest: bool = False
    prototypes: bool = False

    def __post_init__(self) -> None:
        check_history_tokens(self.history_tokens)

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
    """What a memory does once it holds more than it keeps: score, smooth, select. No scorer (or no
    selection) means it never evicts: the full cache."""

    scorer: Scorer | None = None
    smoothing: Smoothing | None = None
    selection: Selection | None = None

    @property
    def capacity(self) -> int | None:
        """Slots after the prefix each layer keeps; None for no limit."""
        return None if self.selection is None else self.selection.capacity

    def guidance(self, tier: Tier) -> Guidance | None:
        return None if self.scorer is None else self.scorer.guidance(tier)

    @property
    def history_tokens(self) -> int:
        """How many tokens of the last question, and of its answer, lead a guidance prompt: the
        scorer's `history_tokens`, the protocol's one optional member (`Scorer`); 0 without it."""
        return getattr(self.scorer, "history_tokens", 0)

    def over_capacity(self, slots: int) -> bool:
        """Whether a memory holding `slots` slots after the prefix must be compressed."""
        return self.scorer is not None and self.capacity is not None and slots > self.capacity


_TRUTH = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def typed_value(default: Any, value: Any) -> Any:
    """`value` (as given: a command line's string, or a typed value) as the type of `default`; a bool
    from true/false (bool("false") would be True)."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() not in _TRUTH:
            raise ValueError(f"takes true or false, got {value!r}")
        return _TRUTH[str(value).strip().lower()]
    return type(default)(value)


def with_params(obj: Any, prefix: str, params: Mapping[str, Any]) -> Any:
    """`obj` (a dataclass of constants, or None for a part without any) with the `prefix.field`
    entries of `params` applied; PolicyError for a field it does not have or a value it refuses."""
    fields = [f.name for f in dataclasses.fields(obj)] if obj is not None else []
    changes = {}
    for key in [k for k in params if k.split(".", 1)[0] == prefix]:
        field = key.split(".", 1)[1] if "." in key else ""
        if field not in fields:
            known = ", ".join(f"{prefix}.{f}" for f in fields) or "none"
            raise PolicyError(f"unknown parameter {key!r}; {prefix} takes {known}")
        try:
            changes[field] = typed_value(getattr(obj, field), params[key])
        except (TypeError, ValueError) as e:
            raise PolicyError(f"parameter {key!r}: {e}") from None
    try:
        return dataclasses.replace(obj, **changes) if changes else obj
    except ValueError as e:
        raise PolicyError(str(e)) from None
