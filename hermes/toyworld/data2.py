"""Training data of the second world: streams with their questions, in the training wordings (in the
held-out ones only for validation, never for a training step).

Streams are packed by the first world's `Packer` (one pass, many questions, each seeing what the
full cache would show it); only the clips, the questions and the frame probe's labels differ.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from hermes.toyworld.data import NO_SIDE, Stream, sampled
from hermes.toyworld.questions import SIDES, Question
from hermes.toyworld.questions2 import TRAIN, backward2, is_there2, never_seen2, real_time2, recall, scene
from hermes.toyworld.world import COLOURS
from hermes.toyworld.world2 import GRID, LANES, SHAPES2, Clip2, WorldSpec2, make_clip2

COVER_MARGIN = 0.03  # an object covers a cell when its box overlaps it by more than this (a side's share)

# How often each kind of training question is drawn (relative weights).
TASK_WEIGHTS2: dict[str, float] = {
    "OJR": 1.5,
    "ATR": 1.5,
    "STU": 1.0,
    "SSR": 1.5,
    "EPM": 2.0,
    "HLD": 2.0,
    "HLD-never": 0.5,
    "REC": 0.5,
    "NOW": 0.5,
}


def world_for2(frames: int) -> WorldSpec2:
    """The world of clips `frames` steps long: the held-out world's for 48 steps and more; for
    shorter clips, shorter stays and entrances closer together, so that two or three objects are on
    screen from the first steps."""
    if frames >= 48:
        return WorldSpec2(frames=frames)
    stay = max(2, frames * 28 // 64)
    return WorldSpec2(
        frames=frames,
        min_visits=min(3, max(1, frames // 4)),
        max_visits=6,
        min_stay=max(1, min(stay, frames // 4 + 1)),
        max_stay=stay,
        min_gap=0 if frames < 16 else 2,
        max_gap=max(2, frames * 10 // 64),
    )


def draw_question2(clip: Clip2, task: str, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question | None:
    """A question of `task` in the wording set `wording`, asked after `at` steps, or None when the clip
    offers none then."""
    if task in ("OJR", "ATR", "STU"):
        return real_time2(clip, task, at, rng, wording)
    if task == "SSR":
        return is_there2(clip, at, rng, wording)
    if task == "HLD-never":
        return never_seen2(clip, at, rng, wording)
    if task == "REC":
        return recall(clip, at, rng, wording)
    if task == "NOW":
        return scene(clip, at, rng, wording)
    pool = [q for q in backward2(clip, at, rng, wording) if q.task == task]
    return pool[int(rng.integers(len(pool)))] if pool else None


def sample_stream2(
    seed: int, frames: int, n_questions: int, weights: dict[str, float] = TASK_WEIGHTS2, wording: str = TRAIN
) -> Stream:
    """The training stream of `seed` in the second world: its clip, chunking and questions, asked in the
    wording set `wording` (the clip and chunking are the same in either; the questions are not)."""
    draw = partial(draw_question2, wording=wording)
    return sampled(make_clip2(seed, world_for2(frames)), seed, frames, n_questions, weights, draw)


def frame_label2(clip: Clip2, t: int) -> tuple[int, ...]:
    """What step t shows in each lane (top first), as class indices: shape and colour (0 where the
    lane is empty) and side (NO_SIDE where there is none); then, per lane, the cells of the
    `GRID` x `GRID` grid of tokens its object covers, as a bit mask (bit r * grid + c; 0 where the lane is empty)."""
    out: list[int] = []
    cells: list[int] = []
    for lane in LANES:
        v = clip.in_lane(t, lane)
        if v is None:
            out += [0, 0, NO_SIDE]
            cells.append(0)
            continue
        side = v.side_at(t)
        out += [
            1 + SHAPES2.index(v.shape),
            1 + list(COLOURS).index(v.colour_at(t)),
            NO_SIDE if side is None else SIDES.index(side),
        ]
        cells.append(covered_cells(*v.centre_at(t), v.size))
    return (*out, *cells)


def covered_cells(cx: float, cy: float, size: float, grid: int = GRID) -> int:
    """The cells of a `grid` x `grid` frame that a box of side `size` centred at (cx, cy) overlaps by
    more than `COVER_MARGIN`, as a bit mask (bit r * grid + c); all in fractions of the side."""

    def spans(centre: float) -> list[int]:
        lo, hi = centre - size / 2, centre + size / 2
        return [i for i in range(grid) if min(hi, (i + 1) / grid) - max(lo, i / grid) > COVER_MARGIN]

    return sum(1 << (r * grid + c) for r in spans(cy) for c in spans(cx))
