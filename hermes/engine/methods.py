"""The registry of memory policies: every method and input filter by name, how it is composed, and
the label, colour and plots the front ends show it with.

A policy name is a method, optionally followed by `+` and an input filter: `hermes`, `fifo+dtd`.
Each method's constants live once, in one dataclass (its scorer's, or its filter's); `params`
override them by `method.field` (`infinipot-v.tar_ratio`). Names are parsed once, where they come
in (the CLI, the app's settings, the API, a library caller), into a `PolicySpec`: a `str` equal
to the canonical name, so that it stands wherever a name does (dict keys, JSON, tables), which
knows its method, filter and parameters and builds its `Policy` for a memory configuration.

A new method is one `Method`: in `METHODS` here, or `register`ed from outside (a plug-in, a test),
with its composition and, if it has one, its question-time step (`hermes.engine.policy`). Every
front end (stream, bench, eval, the app's Compare and API) then runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from hermes.engine.policy import Policy
from hermes.engine.retrieval import Retrieval
from hermes.memory.config import HermesConfig
from hermes.memory.policies import PolicyError, StreamOrder, TieredScorer, with_params
from hermes.memory.rivals.dtd import DifferentialDrop
from hermes.memory.rivals.infinipot import TarVan
from hermes.memory.rivals.rekv import FrameRetrieval, FrameWindow
from hermes.memory.rivals.simplestream import RecentFrames, RecentWindow
from hermes.memory.rivals.sink import SinkWindow
from hermes.memory.rivals.streammem import FramePrototypes, ProxyAttention
from hermes.memory.selection import TopK
from hermes.memory.smoothing import CrossLayerSmoothing

__all__ = [
    "ATTENTION",
    "BUDGET",
    "DEFAULT_POLICY",
    "FILTERS",
    "FULL",
    "HERMES",
    "HOST",
    "METHODS",
    "Filter",
    "Method",
    "PolicyError",
    "PolicySpec",
    "as_spec",
    "make_policy",
    "parse_policies",
    "parse_policy",
    "policy_help",
    "policy_names",
    "register",
    "unregister",
]

# The plots a policy can feed (`Method.plots`).
ATTENTION = "attention"  # it measures attention over its slots: the attention profile
BUDGET = "budget"  # its device cache is held at the budget |M|: the budget line, the bench's rival target
HOST = "host memory"  # it keeps frames in host memory: a line of its own in the memory plot


@dataclass(frozen=True)
class Method:
    """One memory method: its name, how its parts are composed for a memory configuration and the
    dataclass of its constants (None: it has none), and how the front ends show it."""

    name: str
    label: str
    colour: str
    summary: str  # what it does, in a few words (the app's policy help)
    compose: Callable[[HermesConfig, Any], Policy]  # the parts, given the config and its constants
    constants: Callable[[HermesConfig], Any] | None = None
    plots: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Filter:
    """One input filter: its name, its rule's dataclass (its constants) and how it is shown."""

    name: str
    label: str
    summary: str
    rule: Callable[[], Any]


def _hermes(config: HermesConfig, scorer: TieredScorer) -> Policy:
    """Hierarchical memory, smoothed across layers, with a summary of everything evicted (or, as the
    `hermes.prototypes` variant, a plain-mean prototype per frame that loses tokens)."""
    smoothing = CrossLayerSmoothing(config.smoothing, config.alignment)
    if scorer.prototypes:
        selection = FramePrototypes(config.budget, keep_newest=scorer.keep_newest, weighted=False)
    else:
        selection = replace(TopK.with_summary(config.budget, config.summary), keep_newest=scorer.keep_newest)
    return Policy(scorer=scorer, smoothing=smoothing, selection=selection)


def _sink(config: HermesConfig, scorer: SinkWindow) -> Policy:
    if scorer.sinks >= config.budget:
        raise PolicyError(f"sink.sinks ({scorer.sinks}) must be below the budget ({config.budget})")
    return Policy(scorer=scorer, selection=TopK(config.budget))


def _rekv(config: HermesConfig, rule: FrameRetrieval) -> Policy:
    """A window of the newest whole frames on the device (the budget), every frame in host
    memory, the question's best frames brought back per layer."""
    return Policy(scorer=rule, selection=FrameWindow(config.budget), question=Retrieval(rule))


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "hermes",
            "HERMES",
            "#4f46e5",
            "hierarchical memory",
            _hermes,
            lambda c: TieredScorer(c.recency_k, c.omega0, c.gamma, c.history_tokens),
            frozenset({ATTENTION, BUDGET}),
        ),
        Method(
            "fifo",
            "FIFO",
            "#ea580c",
            "newest tokens only",
            lambda c, scorer: Policy(scorer=scorer, selection=TopK(c.budget)),
            lambda c: StreamOrder(),
            frozenset({BUDGET}),
        ),
        Method("full", "Full cache", "#0f766e", "no eviction", lambda c, _: Policy()),
        Method(
            "sink",
            "Sink + window",
            "#a16207",
            "first tokens + window",
            _sink,
            lambda c: SinkWindow(),
            frozenset({BUDGET}),
        ),
        Method(
            "infinipot-v",
            "InfiniPot-V",
            "#be185d",
            "redundancy + value norm",
            lambda c, scorer: Policy(scorer=scorer, selection=TopK(c.budget)),
            lambda c: TarVan(),
            frozenset({BUDGET}),
        ),
        Method(
            "streammem",
            "StreamMem",
            "#15803d",
            "template attention + frame prototypes",
            lambda c, scorer: Policy(scorer=scorer, selection=scorer.selection(c.budget)),
            lambda c: ProxyAttention(),
            frozenset({ATTENTION, BUDGET}),
        ),
        Method(
            "rekv",
            "ReKV",
            "#7c3aed",
            "a window, every frame in host memory, retrieval per question",
            _rekv,
            lambda c: FrameRetrieval(),
            frozenset({HOST}),
        ),
        Method(
            "simplestream",
            "SimpleStream",
            "#57534e",
            "the last 4 frames only",
            lambda c, window: Policy(scorer=window, selection=RecentFrames(window=window.frames)),
            lambda c: RecentWindow(),
        ),
    )
}
FILTERS: dict[str, Filter] = {"dtd": Filter("dtd", "DTD", "drop static patches before the model", DifferentialDrop)}
# HERMES, the method the others are measured against, and the full cache it is meant to beat.
HERMES, FULL = "hermes", "full"
DEFAULT_POLICY = HERMES


def register(method: Method) -> None:
    """Add `method` to the registry (ValueError for a name taken by a method or a filter)."""
    if method.name in METHODS or method.name in FILTERS or "+" in method.name:
        raise ValueError(f"{method.name!r} is taken or not a name; a method's name is new and has no '+'")
    METHODS[method.name] = method


def unregister(name: str) -> None:
    """Take method `name` out of the registry again."""
    del METHODS[name]


def policy_names() -> tuple[str, ...]:
    """The names a viewer picks from: every method, and every method with each input filter."""
    return tuple(METHODS) + tuple(f"{m}+{f}" for f in FILTERS for m in METHODS)


def policy_help() -> str:
    """One line on what each method and input filter does, for a viewer choosing."""
    return " · ".join(
        [f"{m.name}: {m.summary}" for m in METHODS.values()] + [f"+{f.name}: {f.summary}" for f in FILTERS.values()]
    )


def _choices() -> str:
    return f"methods {', '.join(METHODS)}; input filters (after a method and '+') {', '.join(FILTERS)}"


class PolicySpec(str):
    """A policy name, parsed: equal to its canonical name (`hermes+dtd`), and knowing its method,
    input filters and the parameters that concern them. `build` makes its `Policy` for a memory
    configuration; `label`, `colour` and `plots` say how the front ends show it."""

    method: Method
    filters: tuple[Filter, ...]
    params: Mapping[str, Any]

    def __new__(cls, method: Method, filters: Sequence[Filter] = (), params: Mapping[str, Any] | None = None):
        spec = super().__new__(cls, "+".join((method.name, *(f.name for f in filters))))
        spec.method, spec.filters, spec.params = method, tuple(filters), MappingProxyType(dict(params or {}))
        return spec

    def __reduce__(self) -> tuple:
        return parse_policy, (str(self), dict(self.params))

    def __copy__(self) -> PolicySpec:
        return self

    def __deepcopy__(self, memo: dict) -> PolicySpec:
        return self  # immutable

    @property
    def label(self) -> str:
        return " + ".join((self.method.label, *(f.label for f in self.filters)))

    @property
    def colour(self) -> str:
        return self.method.colour

    @property
    def plots(self) -> frozenset[str]:
        return self.method.plots

    @property
    def base(self) -> PolicySpec:
        """The method alone, without its input filters."""
        own = {k: v for k, v in self.params.items() if k.split(".", 1)[0] == self.method.name}
        return PolicySpec(self.method, (), own)

    def build(self, config: HermesConfig) -> Policy:
        """The policy's parts for `config`, its parameters applied; PolicyError for one it refuses."""
        method = self.method
        constants = None if method.constants is None else method.constants(config)
        policy = method.compose(config, with_params(constants, method.name, self.params))
        rules = [with_params(f.rule(), f.name, self.params) for f in self.filters]
        return replace(policy, name=self, input_filter=rules[0] if rules else None)


def _parts(name: str) -> tuple[Method, list[Filter]]:
    """The method and input filters of `name`; PolicyError listing the choices for an unknown
    method or filter, a filter on its own, or a filter named twice."""
    parts = [p.strip() for p in str(name).strip().lower().split("+")]
    method, filters = parts[0], parts[1:]
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
    if len(filters) > 1:
        raise PolicyError(f"{name!r}: one input filter at a time; choose from {_choices()}")
    return METHODS[method], [FILTERS[f] for f in filters]


def _concerning(parts: Iterable[str], params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entries of `params` (`part.field`: value) that concern `parts`."""
    names = set(parts)
    return {k: v for k, v in (params or {}).items() if k.split(".", 1)[0] in names}


def parse_policy(name: str, params: Mapping[str, Any] | None = None) -> PolicySpec:
    """The spec of policy `name` (`hermes`, `fifo+dtd`, ...) with `params` (`part.field`: value),
    every one of which must concern its method or filter; PolicyError otherwise."""
    method, filters = _parts(name)
    mine = _concerning([method.name, *(f.name for f in filters)], params)
    for key in params or {}:
        if key not in mine:
            raise PolicyError(f"parameter {key!r} is for no part of {name!r}; choose from {_choices()}")
    spec = PolicySpec(method, filters, mine)
    spec.build(HermesConfig(budget=1 << 30))  # the parameters' names, types and ranges, checked now
    return spec


def parse_policies(
    names: Sequence[str], config: HermesConfig, params: Mapping[str, Any] | None = None
) -> tuple[PolicySpec, ...]:
    """The specs of policies `names`, sharing `params`, each built once for `config` to check it;
    PolicyError for any that cannot be built, a name given twice, or a parameter that concerns none."""
    specs = []
    for name in names:
        method, filters = _parts(name)
        spec = PolicySpec(method, filters, _concerning([method.name, *(f.name for f in filters)], params))
        spec.build(config)
        specs.append(spec)
    twice = [n for n in dict.fromkeys(specs) if specs.count(n) > 1]
    if twice:
        raise PolicyError(f"policy {str(twice[0])!r} is named twice; give each policy once")
    used = {k for spec in specs for k in spec.params}
    for key in params or {}:
        if key not in used:
            raise PolicyError(f"parameter {key!r} is for no part of {', '.join(specs)}; choose from {_choices()}")
    return tuple(specs)


def as_spec(policy: str, params: Mapping[str, Any] | None = None) -> PolicySpec:
    """`policy` if it is already parsed (then `params` must be None), else its spec."""
    if isinstance(policy, PolicySpec):
        if params:
            raise ValueError("the parameters of a parsed policy travel with it: pass them to parse_policy")
        return policy
    return parse_policy(policy, params)


def make_policy(name: str, config: HermesConfig, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy called `name`, built for `config` with `params`; PolicyError for anything it cannot build."""
    return as_spec(name, params).build(config)
