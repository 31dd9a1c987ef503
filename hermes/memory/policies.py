"""Memory policies, kvpress-style: a policy is an optional input filter, a scorer, an optional
smoothing and a selection.

A scorer turns one layer's inputs (`hermes.memory.scorer.LayerInputs`: its slots' keys, values,
stream ids, frames and patches, its tier, the probe attention over it) into scores, and says
which probe query each tier reads. Smoothing (across layers) and selection (Top-K plus the
summary slot, or StreamMem's frame prototypes) are separate steps;
`hermes.memory.compression.compress` runs them in order on a `HermesCache`. An input filter
(`+dtd`) acts before the prefill, on the chunk's tokens. A question-time step (ReKV's retrieval
from a host store) is one more optional part, read where the engine prefills a question.

Names: a method (`hermes`, `fifo`, `full`, `sink`, `infinipot-v`, `streammem`, `rekv`,
`simplestream`), optionally followed by `+` and an input filter (`dtd`): `hermes+dtd`. Each
method's constants live in its scorer's dataclass, once; `params` overrides them by
`method.field` (`infinipot-v.tar_ratio`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hermes.memory.config import HermesConfig
from hermes.memory.rivals.dtd import DifferentialDrop
from hermes.memory.rivals.infinipot import TarVan
from hermes.memory.rivals.rekv import FrameRetrieval, FrameWindow
from hermes.memory.rivals.simplestream import RecentFrames, RecentWindow
from hermes.memory.rivals.sink import SinkWindow
from hermes.memory.rivals.streammem import FramePrototypes, ProxyAttention
from hermes.memory.scorer import Guidance, LayerInputs, Scorer
from hermes.memory.scoring import layer_score, recency
from hermes.memory.selection import TopK
from hermes.memory.smoothing import CrossLayerSmoothing
from hermes.memory.tiers import Tier

__all__ = [
    "Guidance",
    "LayerInputs",
    "MemoryPolicy",
    "PolicyError",
    "Scorer",
    "check_policies",
    "make_policy",
    "params_for",
    "parse_policy",
]


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
    selection: TopK | FramePrototypes | FrameWindow | RecentFrames | None = None
    input_filter: DifferentialDrop | None = None
    retrieval: FrameRetrieval | None = None  # the question-time step: frames brought back per question

    @property
    def capacity(self) -> int | None:
        """Slots after the prefix each layer keeps; None for no limit."""
        return None if self.selection is None else self.selection.capacity

    def guidance(self, tier: Tier) -> Guidance | None:
        return None if self.scorer is None else self.scorer.guidance(tier)


class PolicyError(ValueError):
    """A policy name or parameter the engine will not take, with the choices."""


def _hermes(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    """Hierarchical memory, smoothed across layers, with a summary of everything evicted."""
    smoothing = CrossLayerSmoothing(config.smoothing, config.alignment)
    return MemoryPolicy("hermes", scorer, smoothing, TopK.with_summary(config.budget, config.summary))


def _fifo(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    """Sliding window: the newest |M| video tokens in every layer."""
    return MemoryPolicy("fifo", scorer, None, TopK(config.budget))


def _full(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    """No eviction: the cache grows with the stream (the memory cost HERMES avoids)."""
    return MemoryPolicy("full")


def _sink(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    if scorer.sinks >= config.budget:
        raise PolicyError(f"sink.sinks ({scorer.sinks}) must be below the budget ({config.budget})")
    return MemoryPolicy("sink", scorer, None, TopK(config.budget))


def _infinipot(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    return MemoryPolicy("infinipot-v", scorer, None, TopK(config.budget))


def _streammem(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    return MemoryPolicy("streammem", scorer, None, FramePrototypes(config.budget))


def _rekv(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    """A window of the newest whole frames on the device (the budget), every frame in host
    memory, the question's best frames brought back per layer."""
    return MemoryPolicy("rekv", scorer, None, FrameWindow(config.budget), retrieval=scorer)


def _simplestream(config: HermesConfig, scorer: Any) -> MemoryPolicy:
    """The newest frames whole, nothing else: the token budget does not apply."""
    return MemoryPolicy("simplestream", scorer, None, RecentFrames(window=scorer.frames))


# Each method: its scorer's dataclass (the one home of its constants; None for `full`, which
# scores nothing) built from the config where HERMES's own constants live, and how to compose it.
_Builder = Callable[[HermesConfig, Any], MemoryPolicy]
METHODS: dict[str, tuple[Callable[[HermesConfig], Any] | None, _Builder]] = {
    "hermes": (lambda c: TieredScorer(c.recency_k, c.omega0, c.gamma), _hermes),
    "fifo": (lambda c: StreamOrder(), _fifo),
    "full": (None, _full),
    "sink": (lambda c: SinkWindow(), _sink),
    "infinipot-v": (lambda c: TarVan(), _infinipot),
    "streammem": (lambda c: ProxyAttention(), _streammem),
    "rekv": (lambda c: FrameRetrieval(), _rekv),
    "simplestream": (lambda c: RecentWindow(), _simplestream),
}
FILTERS: dict[str, Callable[[], DifferentialDrop]] = {"dtd": DifferentialDrop}
# The names a viewer picks from: every method, and every method with each filter.
POLICY_NAMES = tuple(METHODS) + tuple(f"{m}+{f}" for f in FILTERS for m in METHODS)


def _choices() -> str:
    return f"methods {', '.join(METHODS)}; input filters (after a method and '+') {', '.join(FILTERS)}"


def parse_policy(name: str) -> tuple[str, tuple[str, ...]]:
    """(method, input filters) of a policy name such as `hermes+dtd`; PolicyError listing the
    choices for an unknown method or filter, a filter on its own, or a filter named twice."""
    parts = [p.strip() for p in str(name).strip().lower().split("+")]
    method, filters = parts[0], tuple(parts[1:])
    if method in FILTERS or (not method and filters):
        raise PolicyError(
            f"{name!r}: an input filter needs a method before it (say hermes+{method or filters[0]}); "
            f"choose from {_choices()}"
        )
    if method not in METHODS:
        raise PolicyError(f"unknown policy {name!r}; choose from {_choices()}")
    for f in filters:
        if f not in FILTERS:
            raise PolicyError(f"unknown input filter {f!r} in {name!r}; choose from {_choices()}")
    if len(set(filters)) != len(filters):
        raise PolicyError(f"{name!r} names an input filter twice; choose from {_choices()}")
    return method, filters


def _with_params(obj: Any, prefix: str, params: dict[str, Any]) -> Any:
    """`obj` (a dataclass) with the `prefix.field` entries of `params` applied (and removed)."""
    fields = {f.name: f.type for f in dataclasses.fields(obj)} if obj is not None else {}
    changes = {}
    for key in [k for k in params if k.split(".", 1)[0] == prefix]:
        field = key.split(".", 1)[1] if "." in key else ""
        if field not in fields:
            known = ", ".join(f"{prefix}.{f}" for f in fields) or "none"
            raise PolicyError(f"unknown parameter {key!r}; {prefix} takes {known}")
        try:
            changes[field] = type(getattr(obj, field))(params.pop(key))
        except (TypeError, ValueError) as e:
            raise PolicyError(f"parameter {key!r}: {e}") from None
    try:
        return dataclasses.replace(obj, **changes) if changes else obj
    except ValueError as e:
        raise PolicyError(str(e)) from None


def make_policy(name: str, config: HermesConfig, params: Mapping[str, Any] | None = None) -> MemoryPolicy:
    """The policy called `name` (`hermes`, `fifo+dtd`, ...), with `params` (`method.field`: value)
    overriding its methods' constants; PolicyError for anything it cannot build."""
    method, filters = parse_policy(name)
    rest = dict(params or {})
    scorer_of, build = METHODS[method]
    scorer = _with_params(None if scorer_of is None else scorer_of(config), method, rest)
    policy = build(config, scorer)
    input_filter = None
    for f in filters:
        input_filter = _with_params(FILTERS[f](), f, rest)
    if rest:
        raise PolicyError(f"parameter {next(iter(rest))!r} is for no part of {name!r}; choose from {_choices()}")
    name = "+".join((method, *filters))
    return dataclasses.replace(policy, name=name, input_filter=input_filter)


def params_for(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entries of `params` that concern the parts of policy `name` (several policies side by
    side share one set of parameters)."""
    method, filters = parse_policy(name)
    return {k: v for k, v in (params or {}).items() if k.split(".", 1)[0] in (method, *filters)}


def check_policies(names: Sequence[str], config: HermesConfig, params: Mapping[str, Any] | None = None) -> list[str]:
    """The policies `names`, each built once to check it, as canonical names; PolicyError for any
    it cannot build, for a name given twice, or for a parameter that concerns none of them."""
    out = [make_policy(n, config, params_for(n, params)).name for n in names]
    twice = [n for n in dict.fromkeys(out) if out.count(n) > 1]
    if twice:
        raise PolicyError(f"policy {twice[0]!r} is named twice; give each policy once")
    used = {k for n in out for k in params_for(n, params)}
    for key in params or {}:
        if key not in used:
            raise PolicyError(f"parameter {key!r} is for no part of {', '.join(out)}; choose from {_choices()}")
    return out
