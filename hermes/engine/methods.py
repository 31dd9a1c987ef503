"""The registry of memory policies: every method and input filter by name, how it is composed, and
the label, colour and plots the front ends show it with.

A policy name is a method, optionally followed by `+` and an input filter: `hermes`, `fifo+dtd`.
Each method's constants live once, in one dataclass (its scorer's, or its filter's); `params`
override them by `method.field` (`infinipot-v.tar_ratio`). Names are parsed once, where they come
in (the CLI, the app's settings, the API, a library caller), into a `PolicySpec`: a frozen value
of the method, filter and parameters (equal and hashed by all of them, never equal to a bare
name: `spec.name` is the name), which builds its `Policy` for a memory configuration.

A new method is one `Method`: in `METHODS` here, or `register`ed from outside (a plug-in, a test),
with its composition and, if it has one, its question-time step (`hermes.engine.policy`). Every
front end (stream, bench, eval, the app's Compare and API) then runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from hermes.engine.policy import Policy
from hermes.engine.retrieval import Retrieval
from hermes.memory.config import HermesConfig
from hermes.memory.policies import PolicyError, StreamOrder, TieredScorer, typed_value, with_params
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
    "parse_params",
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


class PolicySpec:
    """A policy, parsed: its method, input filters and the parameters that concern them
    (`part.field`: value, typed as the part's constants are). A frozen value, equal to another spec,
    and hashed, by its canonical name (`hermes+dtd`) and parameters together: a spec is never equal
    to a bare name (compare `spec.name`), and `hermes` with `history_tokens=0` is not `hermes`.
    `build` makes its `Policy` for a memory configuration; `label`, `colour` and `plots` say how the
    front ends show it.

    `PolicySpec("rekv", top_k=8)` names a parameter of the method by its field; `params` may name
    any part's (`{"dtd.threshold": 0.1}`). PolicyError for an unknown part, field or value."""

    __slots__ = ("filters", "method", "name", "params")
    method: Method
    filters: tuple[Filter, ...]
    params: Mapping[str, Any]
    name: str

    def __init__(self, name: str, params: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        method, filters = _parts(name)
        given = dict(params or {}) | {f"{method.name}.{k}": v for k, v in fields.items()}
        mine = _concerning([method.name, *(f.name for f in filters)], given)
        for key in given:
            if key not in mine:
                raise PolicyError(f"parameter {key!r} is for no part of {name!r}; choose from {_choices()}")
        typed = _typed(method, filters, mine)
        for slot, value in (
            ("method", method),
            ("filters", tuple(filters)),
            ("params", MappingProxyType(dict(sorted(typed.items())))),
            ("name", "+".join((method.name, *(f.name for f in filters)))),
        ):
            object.__setattr__(self, slot, value)
        self.build(HermesConfig(budget=1 << 30))  # the parameters' names, types and ranges, checked now

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a PolicySpec is frozen; make another (setting {name!r})")

    def _key(self) -> tuple:
        return self.name, tuple(self.params.items())

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, PolicySpec) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        params = f", {dict(self.params)!r}" if self.params else ""
        return f"PolicySpec({self.name!r}{params})"

    def __reduce__(self) -> tuple:
        return PolicySpec, (self.name, dict(self.params))

    def __copy__(self) -> PolicySpec:
        return self

    def __deepcopy__(self, memo: dict) -> PolicySpec:
        return self  # frozen

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
    def param_args(self) -> tuple[str, ...]:
        """The parameters as the command line's `--param` takes them (`rekv.top_k=8`)."""
        return tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.params.items())

    @property
    def base(self) -> PolicySpec:
        """The method alone, without its input filters."""
        own = {k: v for k, v in self.params.items() if k.split(".", 1)[0] == self.method.name}
        return PolicySpec(self.method.name, own)

    def build(self, config: HermesConfig) -> Policy:
        """The policy's parts for `config`, its parameters applied; PolicyError for one it refuses."""
        method = self.method
        constants = None if method.constants is None else method.constants(config)
        policy = method.compose(config, with_params(constants, method.name, self.params))
        rules = [with_params(f.rule(), f.name, self.params) for f in self.filters]
        return replace(policy, name=self, input_filter=rules[0] if rules else None)


def _typed(method: Method, filters: Sequence[Filter], params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` typed as the constants they set (a command line's "8" is 8, "false" is False), those
    equal to their default left out, so that two specs of the same policy are equal; a value that does
    not convert is left for `build` to refuse with its message."""
    constants = None if method.constants is None else method.constants(HermesConfig(budget=1 << 30))
    parts = {method.name: constants, **{f.name: f.rule() for f in filters}}
    typed = {}
    for key, value in params.items():
        part, _, field = key.partition(".")
        default = getattr(parts[part], field, None) if parts[part] is not None else None
        with suppress(TypeError, ValueError):
            value = value if default is None else typed_value(default, value)
        if default is None or value != default:  # a default set again is the same policy
            typed[key] = value
    return typed


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


def parse_params(items: Iterable[str]) -> dict[str, str]:
    """{`part.field`: value} from items written as the command line's `--param` takes them
    (`rekv.top_k=8`); ValueError for one without `=` or a part."""
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip() or "." not in key:
            raise ValueError(f"a parameter is METHOD.FIELD=VALUE, for example infinipot-v.tar_ratio=0.3; got {item!r}")
        out[key.strip().lower()] = value.strip()
    return out


def parse_policy(name: str, params: Mapping[str, Any] | None = None) -> PolicySpec:
    """The spec of policy `name` (`hermes`, `fifo+dtd`, ...) with `params` (`part.field`: value),
    every one of which must concern its method or filter; PolicyError otherwise."""
    return PolicySpec(name, params)


def parse_policies(
    names: Sequence[str], config: HermesConfig, params: Mapping[str, Any] | None = None
) -> tuple[PolicySpec, ...]:
    """The specs of policies `names` (names or specs), sharing `params`, each built once for `config`
    to check it; PolicyError for any that cannot be built, a policy given twice, or a parameter that
    concerns none."""
    specs = []
    for name in names:
        own = dict(name.params) if isinstance(name, PolicySpec) else {}
        method, filters = _parts(str(name))
        spec = PolicySpec(str(name), own | _concerning([method.name, *(f.name for f in filters)], params))
        spec.build(config)
        specs.append(spec)
    twice = [n for n in dict.fromkeys(specs) if specs.count(n) > 1]
    if twice:
        raise PolicyError(f"policy {twice[0].name!r} is named twice; give each policy once")
    used = {k for spec in specs for k in spec.params}
    for key in params or {}:
        if key not in used:
            named = ", ".join(s.name for s in specs)
            raise PolicyError(f"parameter {key!r} is for no part of {named}; choose from {_choices()}")
    return tuple(specs)


def as_spec(policy: str | PolicySpec, params: Mapping[str, Any] | None = None) -> PolicySpec:
    """`policy` if it is already parsed (then `params` must be None), else its spec."""
    if isinstance(policy, PolicySpec):
        if params:
            raise ValueError("the parameters of a parsed policy travel with it: pass them to parse_policy")
        return policy
    return parse_policy(policy, params)


def make_policy(name: str, config: HermesConfig, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy called `name`, built for `config` with `params`; PolicyError for anything it cannot build."""
    return as_spec(name, params).build(config)
