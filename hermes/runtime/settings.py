"""What a live stream's memories are built with, the one place they become a HermesConfig, and
the bounds the app holds them to where they come from outside (`SETTING_BOUNDS`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hermes.engine.methods import (
    DEFAULT_POLICY,
    HERMES,
    PolicyError,
    PolicySpec,
    parse_params,
    parse_policies,
    policy_names,
)
from hermes.engine.watch import DEFAULT_THRESHOLD, check_threshold
from hermes.memory.config import HermesConfig
from hermes.memory.tiers import Tier, TierMap
from hermes.models.base import VideoLM

COMPARE_POLICIES = (HERMES, "fifo")  # the default pair
MAX_COMPARED = 3  # policies side by side: each holds its own cache
# Pace of a file stream: times real time; None reads as fast as the model takes the chunks.
SPEEDS: dict[str, float | None] = {"1x": 1.0, "2x": 2.0, "4x": 4.0, "max": None}


@dataclass(frozen=True)
class Bound:
    """The range of a setting that comes from outside the server: a viewer's Settings (the sliders,
    and the API calls that set them) or a memory file loaded into a stream."""

    low: float
    high: float

    def check(self, name: str, value: object) -> None:
        """ValueError naming the setting and its range, unless `value` is a number within it (NaN is not)."""
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not self.low <= value <= self.high:
            raise ValueError(f"{name} takes a number from {self.low:g} to {self.high:g}; got {value!r}")


# The one table of these bounds: the Settings sliders (ui/panels.py) and the memory files loaded
# into a stream (hermes.serving.memory_files) read it, by `StreamSettings` field.
SETTING_BOUNDS: dict[str, Bound] = {
    "budget": Bound(128, 10240),
    "chunk_frames": Bound(1, 32),
    "fps": Bound(0.25, 4),
    "watch_threshold": Bound(0.05, 0.95),
}


def setting_bounds(defaults: StreamSettings) -> dict[str, Bound]:
    """`SETTING_BOUNDS` on a server whose streams start with `defaults`: the budget goes down to
    the default's where that is lower (the toy model's streams are 136 video tokens: its budget of
    34 sits far below a real model's)."""
    budget = SETTING_BOUNDS["budget"]
    return SETTING_BOUNDS | {"budget": Bound(min(budget.low, defaults.budget), budget.high)}


@dataclass(frozen=True)
class StreamSettings:
    """What a stream's memories are built with; applied when the stream is (re)started.

    The policy names are parsed here, once, into `PolicySpec`s, with `params` (`rekv.top_k=8`, as the
    command line's `--param` takes them) applied to the policies they concern; `params` then reads the
    parameters the policies carry, written the same way, so that the settings of a loaded memory or a
    spec passed in say them too."""

    policy: str = DEFAULT_POLICY
    budget: int = 1024
    chunk_frames: int = 4
    fps: float = 1.0
    reindex: str = "lazy"
    compare: bool = False
    # The policies compare mode runs side by side, two or three of `policy_names()`.
    compare_policies: tuple[str, ...] = COMPARE_POLICIES
    # Positions the memories may use (None: the model's max_position_embeddings). The full policy
    # stops there; lower it to bound full streams sooner.
    max_positions: int | None = None
    # p(yes) above which a standing question fires.
    watch_threshold: float = DEFAULT_THRESHOLD
    # Whether the last question and answer lead HERMES's guidance prompt (`HermesConfig.history_tokens`
    # each); off, every compression is guided as before the first question, and costs less.
    guidance_history: bool = True
    # Host memory a retrieval policy (rekv) may keep every frame in, in MB; the stream stops there.
    # None: admission control's CPU allowance (`hermes.serving.admission.host_memory_cap`).
    host_cap_mb: float | None = None
    # Constants of the policies' parts, `part.field=value` each (`rekv.top_k=8`); each concerns a policy run.
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_threshold(self.watch_threshold)
        if self.host_cap_mb is not None and self.host_cap_mb <= 0:
            raise ValueError(f"the host memory cap must be positive, got {self.host_cap_mb} MB")
        config = self.config()  # HermesConfig validates the numbers, with clear messages
        params = parse_params(self.params or ())
        compared = tuple(self.compare_policies or ())
        if self.compare and not 2 <= len(compared) <= MAX_COMPARED:
            raise PolicyError(
                f"compare runs 2 to {MAX_COMPARED} policies side by side; got {len(compared)} "
                f"({', '.join(map(str, compared)) or 'none'}); choose from {', '.join(policy_names())}"
            )
        # The choice of compared policies only matters, and is only checked, in compare mode.
        run = parse_policies(compared if self.compare else [self.policy], config, params)
        policy = run[0] if not self.compare else parse_policies([self.policy], config)[0]
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "compare_policies", run if self.compare else compared)
        object.__setattr__(self, "params", tuple(dict.fromkeys(a for spec in run for a in spec.param_args)))

    @classmethod
    def from_controls(cls, **controls: Any) -> StreamSettings:
        """The settings of a form (or an API call) whose controls are named as the fields, each value
        as its control holds it (a slider's float for a whole number, a list for a tuple), parsed
        strictly into its field's type: ValueError naming the field and what it takes otherwise
        ("false" is no boolean, "hermes" no list of policies, "abc" no number); `params` may be one
        text of `part.field=value` items."""
        unknown = sorted(set(controls) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"no such setting: {', '.join(unknown)}")
        if isinstance(controls.get("params"), str):  # a text box: `rekv.top_k=8, sink.sinks=4`
            controls = controls | {"params": controls["params"].replace(",", " ").split()}
        given = [f for f in fields(cls) if f.name in controls]
        return cls(**{f.name: _parsed(f.name, str(f.type), controls[f.name]) for f in given})

    @property
    def policies(self) -> tuple[PolicySpec, ...]:
        """The policies to run: the compared ones side by side in compare mode (HERMES and FIFO by
        default), else the one policy."""
        return self.compare_policies if self.compare else (self.policy,)

    def config(self) -> HermesConfig:
        """The memory configuration of these settings (every memory of the stream uses it)."""
        return HermesConfig(
            budget=int(self.budget),
            chunk_frames=int(self.chunk_frames),
            fps=float(self.fps),
            reindex=self.reindex,
            max_positions=self.max_positions,
            history_tokens=HermesConfig.history_tokens if self.guidance_history else 0,
        )


def _parsed(name: str, kind: str, value: Any) -> Any:
    """`value` as the field `name` of type `kind` (its annotation) takes it, or ValueError saying what it takes."""
    if value is None and ("None" in kind or kind.startswith("tuple")):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind.startswith("int") and number and float(value).is_integer():
        return int(value)
    if kind.startswith("float") and number:
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind.startswith("tuple") and isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    takes = {
        "bool": "true or false",
        "int": "a whole number",
        "float": "a number",
        "str": "one name (a string)",
        "tuple": 'a list of names, e.g. ["hermes", "fifo"]',
    }
    raise ValueError(f"{name} takes {takes[kind.split('[')[0].split(' ')[0]]}; got {value!r}")


def layer_tiers(lm: VideoLM, settings: StreamSettings) -> tuple[Tier, ...]:
    """The memory tier of each key-value layer (every decoder layer but a hybrid model's linear ones), as
    the stream's memories partition them."""
    return TierMap.for_config(lm.kv_layers, settings.config()).tiers
