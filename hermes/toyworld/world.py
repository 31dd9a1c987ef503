"""The toy world: clips of plain shapes that appear, move, change colour and leave, fixed by a seed.

A clip is a sequence of visits, one object on screen at a time: a shape (each shape visits at most
once, so "the square" names one object) of a colour enters at a whole second, glides across the
frame, may change colour once, and leaves; the screen may stay empty between visits. Everything
that happens is an event with its time, so every question about the clip has a known answer and a
known span of frames holding its evidence (`hermes.toyworld.questions`).

Time runs in world steps of one second: the model samples one frame a step (`WORLD_FPS`), events
happen on whole seconds, and a file written at a higher rate (`hermes.toyworld.files`) shows the
motion in between, so a viewer sees objects glide rather than jump.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

WORLD_FPS = 1.0  # world steps per second: the rate the model samples and the events keep
FRAME_SIDE = 112  # pixels, the side of a square frame; the model's processor resizes to its own
SHAPES = ("circle", "square", "triangle", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 175, 70),
    "blue": (45, 85, 225),
    "yellow": (240, 210, 40),
}
# Backgrounds are dull greys and browns, so that no object colour blends into one.
BACKGROUNDS: tuple[tuple[int, int, int], ...] = ((128, 128, 128), (85, 85, 95), (165, 160, 145), (60, 62, 60))
TEXTURES = ("plain", "noise", "stripes")
TEXTURE_CONTRAST = 14  # intensity swing of a textured background, out of 255
# Every object's bounding square, as a fraction of the side: one size for all, so that shapes differ
# in their outline and their area, and the model need not tell a small square from a large circle.
OBJECT_SIZE = 0.42
# An object's centre stays this far from the edges (fractions of the side), so it is always whole.
MARGIN = 0.24
# "Left" and "right" only where the centre is clearly on one side: outside the middle band.
SIDE_BAND = (0.42, 0.58)


class WorldError(ValueError):
    """World settings or a clip description that cannot be used, with the reason."""


@dataclass(frozen=True)
class WorldSpec:
    """What clips the generator makes: their length in world steps and the shape of their visits."""

    frames: int = 32
    min_visits: int = 3
    max_visits: int = 4
    min_stay: int = 4  # steps an object stays on screen
    max_stay: int = 8
    max_gap: int = 3  # empty steps between visits (at most)
    change_rate: float = 0.35  # share of visits (of at least 5 steps) in which the object changes colour

    def __post_init__(self) -> None:
        if not 1 <= self.min_visits <= self.max_visits <= len(SHAPES):
            raise WorldError(
                f"visits must lie in 1..{len(SHAPES)} (one per shape), got {self.min_visits}..{self.max_visits}"
            )
        if not 1 <= self.min_stay <= self.max_stay:
            raise WorldError(f"stays must be at least 1 step, got {self.min_stay}..{self.max_stay}")
        if self.frames < self.min_visits * self.min_stay:
            raise WorldError(
                f"{self.frames} steps cannot hold {self.min_visits} visits of {self.min_stay} steps; lengthen the clips"
            )
        if self.max_gap < 0 or not 0.0 <= self.change_rate <= 1.0:
            raise WorldError("max_gap must be >= 0 and change_rate in [0, 1]")


@dataclass(frozen=True)
class Visit:
    """One object's time on screen: steps [enter, leave), gliding from `start` to `end` (centres, as
    fractions of the side); from step `change` on (when set) its colour is `new_colour`."""

    shape: str
    colour: str
    enter: int
    leave: int
    start: tuple[float, float]
    end: tuple[float, float]
    size: float  # side of its bounding square, as a fraction of the frame side
    change: int | None = None
    new_colour: str | None = None

    def on_screen(self, t: float) -> bool:
        return self.enter <= t < self.leave

    def colour_at(self, t: float) -> str:
        return self.new_colour if self.change is not None and t >= self.change else self.colour

    def centre_at(self, t: float) -> tuple[float, float]:
        """The centre at time t: linear from `start` at `enter` to `end` at the last step on screen."""
        span = max(1, self.leave - 1 - self.enter)
        a = min(1.0, max(0.0, (t - self.enter) / span))
        return (self.start[0] + a * (self.end[0] - self.start[0]), self.start[1] + a * (self.end[1] - self.start[1]))

    def side_at(self, t: float) -> str | None:
        """Which side of the frame the centre is on at time t ("left", "right"), None in the middle band."""
        x = self.centre_at(t)[0]
        return "left" if x < SIDE_BAND[0] else "right" if x > SIDE_BAND[1] else None

    def spans(self) -> list[tuple[str, int, int]]:
        """(colour, first step, end step) of each colour the object shows, in order."""
        if self.change is None:
            return [(self.colour, self.enter, self.leave)]
        return [(self.colour, self.enter, self.change), (self.new_colour, self.change, self.leave)]


@dataclass(frozen=True)
class Clip:
    """A clip of the toy world: its seed, length in steps, background and visits."""

    seed: int
    frames: int
    background: tuple[int, int, int]
    texture: str
    visits: tuple[Visit, ...]
    _canvas: dict = field(default_factory=dict, compare=False, repr=False)  # rendered backgrounds by side

    @property
    def duration_s(self) -> float:
        return self.frames / WORLD_FPS

    def visible(self, t: float) -> Visit | None:
        """The object on screen at time t (seconds), or None."""
        return next((v for v in self.visits if v.on_screen(t)), None)

    def visit_of(self, shape: str) -> Visit | None:
        return next((v for v in self.visits if v.shape == shape), None)

    def events(self) -> list[dict]:
        """Everything that happens, in time order: appear, change and leave, each at its second."""
        out = []
        for v in self.visits:
            out.append({"t": v.enter, "event": "appear", "shape": v.shape, "colour": v.colour})
            if v.change is not None:
                out.append(
                    {"t": v.change, "event": "change", "shape": v.shape, "colour": v.new_colour, "was": v.colour}
                )
            if v.leave < self.frames:
                out.append({"t": v.leave, "event": "leave", "shape": v.shape, "colour": v.colour_at(v.leave - 1)})
        return sorted(out, key=lambda e: (e["t"], e["event"] != "leave"))

    def render(self, t: float, side: int = FRAME_SIDE) -> np.ndarray:
        """The frame on screen at time t: (side, side, 3) uint8 RGB."""
        if side not in self._canvas:
            self._canvas[side] = background(self.background, self.texture, self.seed, side)
        frame = self._canvas[side].copy()
        v = self.visible(t)
        if v is not None:
            cx, cy = v.centre_at(t)
            draw(frame, v.shape, COLOURS[v.colour_at(t)], cx * side, cy * side, v.size * side)
        return frame

    def render_steps(self, side: int = FRAME_SIDE, steps: int | None = None) -> np.ndarray:
        """The frames the model samples, one per step: (steps, side, side, 3) uint8."""
        n = self.frames if steps is None else steps
        return np.stack([self.render(k / WORLD_FPS, side) for k in range(n)])

    def to_dict(self) -> dict:
        return {
            "seed": self.seed,
            "frames": self.frames,
            "fps": WORLD_FPS,
            "background": list(self.background),
            "texture": self.texture,
            "visits": [asdict(v) for v in self.visits],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Clip:
        """The clip a `to_dict` describes; WorldError naming the first thing that does not fit."""
        try:
            visits = tuple(Visit(**{**v, "start": tuple(v["start"]), "end": tuple(v["end"])}) for v in data["visits"])
            clip = cls(int(data["seed"]), int(data["frames"]), tuple(data["background"]), data["texture"], visits)
        except (KeyError, TypeError, ValueError) as exc:
            raise WorldError(f"not a toy-world clip description ({type(exc).__name__}: {exc})") from None
        check_clip(clip)
        return clip


def check_clip(clip: Clip) -> None:
    """WorldError unless the clip is one the world could make: known shapes and colours, visits in
    order without overlap, inside the clip, each shape at most once, changes inside their visit."""
    if clip.frames < 1 or clip.texture not in TEXTURES or len(clip.background) != 3:
        raise WorldError(f"clip {clip.seed}: bad length, texture or background")
    seen: set[str] = set()
    last = 0
    for v in clip.visits:
        if v.shape not in SHAPES or v.colour not in COLOURS or v.shape in seen:
            raise WorldError(
                f"clip {clip.seed}: visit of {v.shape!r} ({v.colour!r}): unknown or repeated shape or colour"
            )
        if not last <= v.enter < v.leave <= clip.frames:
            raise WorldError(f"clip {clip.seed}: the {v.shape} visits [{v.enter}, {v.leave}), out of order or outside")
        if v.change is not None and (not v.enter < v.change < v.leave or v.new_colour not in COLOURS):
            raise WorldError(f"clip {clip.seed}: the {v.shape} changes colour outside its visit or to an unknown one")
        seen.add(v.shape)
        last = v.leave


def make_clip(seed: int, spec: WorldSpec | None = None) -> Clip:
    """The clip of `seed`: the same seed and spec always give the same clip."""
    spec = spec or WorldSpec()
    rng = np.random.default_rng(seed)
    n = int(rng.integers(spec.min_visits, spec.max_visits + 1))
    stays, gaps = _timeline(rng, spec, n)
    shapes = rng.permutation(len(SHAPES))[:n]
    visits = []
    t = int(gaps[0])
    for i in range(n):
        visits.append(_visit(rng, spec, SHAPES[shapes[i]], t, min(spec.frames, t + int(stays[i]))))
        t += int(stays[i]) + int(gaps[i + 1])
    background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
    return Clip(seed, spec.frames, background, texture, tuple(visits))


def _timeline(rng: np.random.Generator, spec: WorldSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Stays of the n visits and the gaps before each (and after the last), filling the clip exactly:
    an excess is taken from the longest gap, then the longest stay; spare steps lengthen random stays."""
    stays = rng.integers(spec.min_stay, spec.max_stay + 1, n)
    gaps = rng.integers(0, spec.max_gap + 1, n + 1)
    while stays.sum() + gaps.sum() > spec.frames:
        parts = gaps if gaps.sum() > 0 else stays
        parts[int(np.argmax(parts))] -= 1
    for _ in range(spec.frames - int(stays.sum() + gaps.sum())):
        stays[int(rng.integers(n))] += 1
    return stays, gaps


def _visit(rng: np.random.Generator, spec: WorldSpec, shape: str, enter: int, leave: int) -> Visit:
    colour_names = list(COLOURS)
    colour = colour_names[int(rng.integers(len(colour_names)))]
    size = OBJECT_SIZE
    xs = rng.uniform(MARGIN, 1 - MARGIN, 2)
    ys = rng.uniform(0.36, 0.64, 2)
    change = new_colour = None
    if leave - enter >= 5 and rng.random() < spec.change_rate:
        change = int(rng.integers(enter + 2, leave - 1))
        new_colour = colour_names[int(rng.choice([i for i, c in enumerate(colour_names) if c != colour]))]
    return Visit(
        shape,
        colour,
        enter,
        leave,
        (round(float(xs[0]), 4), round(float(ys[0]), 4)),
        (round(float(xs[1]), 4), round(float(ys[1]), 4)),
        size,
        change,
        new_colour,
    )


# -- drawing ----------------------------------------------------------------------------------------


def background(colour: tuple[int, int, int], texture: str, seed: int, side: int) -> np.ndarray:
    """A static background: plain, blocky noise, or diagonal stripes, at low contrast."""
    base = np.broadcast_to(np.asarray(colour, dtype=np.float32), (side, side, 3)).copy()
    if texture == "noise":
        block = max(1, side // 14)
        cells = np.random.default_rng(seed + 7).uniform(-1, 1, (math.ceil(side / block),) * 2)
        base += TEXTURE_CONTRAST * np.kron(cells, np.ones((block, block)))[:side, :side, None]
    elif texture == "stripes":
        y, x = np.mgrid[0:side, 0:side]
        base += TEXTURE_CONTRAST * np.sign(np.sin((x + y) * 2 * math.pi / max(4, side / 8)))[:, :, None]
    return np.clip(np.rint(base), 0, 255).astype(np.uint8)


def _coverage(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of a shape of half-size r, at offsets (dx, dy) from its centre
    (pixel units): 1 inside, 0 outside, a one-pixel ramp across the edge."""
    if shape == "circle":
        return np.clip(r - np.hypot(dx, dy) + 0.5, 0, 1)
    if shape == "square":
        s = r
        return np.clip(s - np.abs(dx) + 0.5, 0, 1) * np.clip(s - np.abs(dy) + 0.5, 0, 1)
    if shape == "cross":
        arm, width = r, 0.3 * r
        bar = lambda a, b: np.clip(arm - np.abs(a) + 0.5, 0, 1) * np.clip(width - np.abs(b) + 0.5, 0, 1)  # noqa: E731
        return np.maximum(bar(dx, dy), bar(dy, dx))
    if shape == "diamond":  # a square on its corner
        return np.clip(r - (np.abs(dx) + np.abs(dy)) + 0.5, 0, 1)
    if shape == "ring":  # a circle with a hole of half its radius (the second world's shapes)
        d = np.hypot(dx, dy)
        return np.clip(r - d + 0.5, 0, 1) * np.clip(d - 0.5 * r + 0.5, 0, 1)
    if shape == "triangle":  # pointing up, its three edges as half-planes
        cover = np.clip(0.5 * r - dy + 0.5, 0, 1)  # the base
        for sx in (-1.0, 1.0):  # the sides from the apex (0, -r) to the corners (+-0.87 r, r / 2)
            nx, ny = sx * 0.866, -0.5
            cover = cover * np.clip(0.5 * r - (nx * dx + ny * dy) + 0.5, 0, 1)
        return cover
    raise WorldError(f"unknown shape {shape!r}")


def draw(frame: np.ndarray, shape: str, rgb: tuple[int, int, int], cx: float, cy: float, size: float) -> None:
    """Draw a shape of bounding side `size` centred at (cx, cy) into `frame` (in place)."""
    side = frame.shape[0]
    r = size / 2
    x0, x1 = max(0, int(cx - r - 2)), min(side, math.ceil(cx + r + 2))
    y0, y1 = max(0, int(cy - r - 2)), min(side, math.ceil(cy + r + 2))
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    cover = _coverage(shape, xx + 0.5 - cx, yy + 0.5 - cy, r)[:, :, None]
    patch = frame[y0:y1, x0:x1].astype(np.float32)
    frame[y0:y1, x0:x1] = np.rint(patch * (1 - cover) + np.asarray(rgb, np.float32) * cover).astype(np.uint8)
