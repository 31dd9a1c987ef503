"""The second toy world: two or three objects on screen at once, each in its own lane, in long clips.

The first world (`hermes.toyworld.world`) shows one flat shape at a time, so a frame's mean token
holds all of it. Here a frame holds up to three objects, one per horizontal lane (top, middle,
bottom), so the frame's tokens hold different objects and its mean holds none of them; a question
is about one object among the others on screen (the distractors). Clips are 64 steps, twice the
first world's, so a quarter of a stream's tokens holds fewer tokens than the stream has frames.
About half the objects stand still for their whole visit, so long stretches of frames repeat.

Objects stand on the model's grid of tokens: a frame is 4 x 4 tokens (112 px in 14 px patches,
pooled 2 x 2), each lane is a row of that grid and an object moves from column to column, so each
object stands whole inside one token's cell and a token shows at most one object. Where objects
straddled cells, a token showed pieces of two or three of them and no one token said which shape
it showed, so a question could not find its object among the others (docs/toyworld.md).

A `Visit2` describes an object (its lane is the height of its centre); each of six shapes visits at
most once a clip, so "the ring" names one object. Clips are written and read as files
by `hermes.toyworld.files`, their description marked as this world's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from hermes.toyworld.world import (
    BACKGROUNDS,
    COLOURS,
    FRAME_SIDE,
    TEXTURES,
    Clip,
    Visit,
    WorldError,
    background,
    draw,
)

WORLD = 2  # the mark of this world's clip descriptions
SHAPES2 = ("circle", "square", "triangle", "cross", "diamond", "ring")
GRID = 4  # the model's tokens across (and down) a frame: 112 px in 14 px patches, pooled 2 x 2
# lane -> height of its centre: the middle of one row of the grid each (the fourth row stays empty)
LANES: dict[str, float] = {"top": 0.125, "middle": 0.375, "bottom": 0.625}
OBJECT_SIZE2 = 0.2  # every object's bounding square, as a fraction of the side: inside one cell
X_MARGIN = 0.16  # a path's ends stay this far from the left and right edges


@dataclass(frozen=True)
class WorldSpec2:
    """What clips the second world makes."""

    frames: int = 64
    min_visits: int = 5
    max_visits: int = 6
    min_stay: int = 10
    max_stay: int = 28
    min_gap: int = 2  # steps between one object's entrance and the next one's
    max_gap: int = 10
    change_rate: float = 0.35
    still_rate: float = 0.5  # share of objects that stand still for their whole visit

    def __post_init__(self) -> None:
        if not 1 <= self.min_visits <= self.max_visits <= len(SHAPES2):
            raise WorldError(f"visits must lie in 1..{len(SHAPES2)} (one per shape)")
        if not 1 <= self.min_stay <= self.max_stay or not 0 <= self.min_gap <= self.max_gap or self.frames < 1:
            raise WorldError("stays and clips must be at least a step long, and gaps in order")
        if not 0.0 <= self.change_rate <= 1.0 or not 0.0 <= self.still_rate <= 1.0:
            raise WorldError("change_rate and still_rate must lie in [0, 1]")


def cell_centre(x: float) -> float:
    """The centre of the grid column that x (a fraction of the side) falls in."""
    return (min(GRID - 1, math.floor(x * GRID)) + 0.5) / GRID


@dataclass(frozen=True)
class Visit2(Visit):
    """An object of the second world: it runs along its path as a `Visit` does, but stands in the
    middle of the column it is over, so it moves from cell to cell of the token grid."""

    def centre_at(self, t: float) -> tuple[float, float]:
        x, y = super().centre_at(t)
        return cell_centre(x), y


def lane_of(visit: Visit) -> str:
    """The lane a visit's centre runs in; WorldError when it is in none."""
    for lane, y in LANES.items():
        if abs(visit.start[1] - y) < 1e-6 and abs(visit.end[1] - y) < 1e-6:
            return lane
    raise WorldError(f"the {visit.shape} does not run in a lane (height {visit.start[1]})")


@dataclass(frozen=True)
class Clip2(Clip):
    """A clip of the second world: the first world's clip with several objects on screen at once."""

    def visible(self, t: float) -> Visit | None:
        """The top-most object on screen at time t, or None (`on_screen` lists them all)."""
        on = self.on_screen(t)
        return on[0] if on else None

    def on_screen(self, t: float) -> list[Visit]:
        """Every object on screen at time t, top lane first."""
        return sorted((v for v in self.visits if v.on_screen(t)), key=lambda v: LANES[lane_of(v)])

    def in_lane(self, t: float, lane: str) -> Visit | None:
        return next((v for v in self.visits if v.on_screen(t) and lane_of(v) == lane), None)

    def render(self, t: float, side: int = FRAME_SIDE) -> np.ndarray:
        """The frame on screen at time t: (side, side, 3) uint8 RGB."""
        if side not in self._canvas:
            self._canvas[side] = background(self.background, self.texture, self.seed, side)
        frame = self._canvas[side].copy()
        for v in self.on_screen(t):
            cx, cy = v.centre_at(t)
            draw(frame, v.shape, COLOURS[v.colour_at(t)], cx * side, cy * side, v.size * side)
        return frame

    def to_dict(self) -> dict:
        return {**super().to_dict(), "world": WORLD}

    @classmethod
    def from_dict(cls, data: dict) -> Clip2:
        """The clip a `to_dict` describes; WorldError naming the first thing that does not fit."""
        try:
            visits = tuple(Visit2(**{**v, "start": tuple(v["start"]), "end": tuple(v["end"])}) for v in data["visits"])
            clip = cls(int(data["seed"]), int(data["frames"]), tuple(data["background"]), data["texture"], visits)
        except (KeyError, TypeError, ValueError) as exc:
            raise WorldError(f"not a toy-world clip description ({type(exc).__name__}: {exc})") from None
        check_clip2(clip)
        return clip


def check_clip2(clip: Clip2) -> None:
    """WorldError unless the second world could make the clip: known shapes (each at most once) and
    colours, each object in a lane that no other holds while it is on screen, inside the clip."""
    if clip.frames < 1 or clip.texture not in TEXTURES or len(clip.background) != 3:
        raise WorldError(f"clip {clip.seed}: bad length, texture or background")
    shapes = [v.shape for v in clip.visits]
    if len(set(shapes)) != len(shapes) or any(s not in SHAPES2 for s in shapes):
        raise WorldError(f"clip {clip.seed}: unknown or repeated shape in {shapes}")
    for i, v in enumerate(clip.visits):
        lane = lane_of(v)
        if v.colour not in COLOURS or not 0 <= v.enter < v.leave <= clip.frames:
            raise WorldError(f"clip {clip.seed}: the {v.shape} has an unknown colour or is outside the clip")
        if v.change is not None and (not v.enter < v.change < v.leave or v.new_colour not in COLOURS):
            raise WorldError(f"clip {clip.seed}: the {v.shape} changes colour outside its visit or to an unknown one")
        for w in clip.visits[:i]:
            if lane_of(w) == lane and w.enter < v.leave and v.enter < w.leave:
                raise WorldError(f"clip {clip.seed}: the {w.shape} and the {v.shape} share the {lane} lane")


def make_clip2(seed: int, spec: WorldSpec2 | None = None) -> Clip2:
    """The clip of `seed` in the second world: the same seed and spec always give the same clip.
    Objects enter one after another (`min_gap` to `max_gap` steps apart), each into a lane free for
    its stay, waiting for one when all three are taken."""
    spec = spec or WorldSpec2()
    rng = np.random.default_rng(seed)
    n = int(rng.integers(spec.min_visits, spec.max_visits + 1))
    shapes = [SHAPES2[i] for i in rng.permutation(len(SHAPES2))[:n]]
    busy = dict.fromkeys(LANES, 0)  # lane -> the step it is free from
    visits: list[Visit] = []
    t = int(rng.integers(0, min(3, spec.frames)))
    for shape in shapes:
        t = max(t, min(busy.values()))
        if t >= spec.frames:
            break
        stay = int(rng.integers(spec.min_stay, spec.max_stay + 1))
        free = [lane for lane, at in busy.items() if at <= t]
        lane = free[int(rng.integers(len(free)))]
        leave = min(spec.frames, t + stay)
        visits.append(_visit2(rng, spec, shape, lane, t, leave))
        busy[lane] = leave
        t += int(rng.integers(spec.min_gap, spec.max_gap + 1))
    colour = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
    return Clip2(seed, spec.frames, colour, texture, tuple(visits))


def _visit2(rng: np.random.Generator, spec: WorldSpec2, shape: str, lane: str, enter: int, leave: int) -> Visit2:
    names = list(COLOURS)
    colour = names[int(rng.integers(len(names)))]
    xs = rng.uniform(X_MARGIN, 1 - X_MARGIN, 2)
    if rng.random() < spec.still_rate:
        xs[1] = xs[0]
    change = new_colour = None
    if leave - enter >= 5 and rng.random() < spec.change_rate:
        change = int(rng.integers(enter + 2, leave - 1))
        new_colour = names[int(rng.choice([i for i, c in enumerate(names) if c != colour]))]
    y = LANES[lane]
    start, end = (round(float(xs[0]), 4), y), (round(float(xs[1]), 4), y)
    return Visit2(shape, colour, enter, leave, start, end, OBJECT_SIZE2, change, new_colour)


def spec_facts(spec: WorldSpec2 | None = None) -> dict:
    """The world's settings and constants, for a training run's settings hash."""
    return {"spec": asdict(spec or WorldSpec2()), "shapes": SHAPES2, "lanes": LANES, "size": OBJECT_SIZE2, "grid": GRID}
