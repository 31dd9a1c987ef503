"""Questions about a toy-world clip, drawn from its events: about the present, the past and the future.

Three kinds, named as OVO-Bench names its groups, each with OVO-Bench's task codes:

- real-time, about the newest frame: OJR "What shape is on screen?", ATR "What colour is the
  square?", STU "Is the square on the left or the right?";
- backward, about frames before the newest one: EPM "What colour was the square?" (or "... at
  first?" when it changed colour), HLD "Did you see a red square?";
- forward: standing questions "Is there a red square?", read after every chunk (OVO-Bench's SSR
  layout: is this under way now?), right when they say yes exactly while it is on screen.

A question is asked after `at` steps (the newest frame is step at - 1) and answered in one word;
`evidence` is the span of steps [first, end) that holds its answer, so that a backward question's
evidence can be placed early, in the middle or late in what the stream has shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hermes.toyworld.world import COLOURS, SHAPES, Clip

REAL_TIME, BACKWARD, FORWARD = "real-time", "backward", "forward"
RECALL = "recall"  # a description answered in several words (the second world's REC and NOW)
KINDS = (REAL_TIME, BACKWARD, FORWARD)
TASKS: dict[str, tuple[str, ...]] = {REAL_TIME: ("OJR", "ATR", "STU"), BACKWARD: ("EPM", "HLD"), FORWARD: ("SSR",)}
AGES = ("early", "middle", "late")  # where a backward question's evidence ends, in thirds of what was shown
SIDES = ("left", "right")
YES_NO = ("yes", "no")
NOTHING = "nothing"  # what is on screen when no object is

# The wording of each question, one source for the training data, the held-out set and the vocabulary.
TEMPLATES = {
    "OJR": "What shape is on screen?",
    "ATR": "What colour is the {shape}?",
    "STU": "Is the {shape} on the left or the right?",
    "EPM": "What colour was the {shape}?",
    "EPM-first": "What colour was the {shape} at first?",
    "HLD": "Did you see a {colour} {shape}?",
    "SSR": "Is there a {colour} {shape}?",
}
OPTIONS: dict[str, tuple[str, ...]] = {
    "OJR": SHAPES,
    "ATR": tuple(COLOURS),
    "STU": SIDES,
    "EPM": tuple(COLOURS),
    "HLD": YES_NO,
    "SSR": YES_NO,
}


@dataclass(frozen=True)
class Question:
    """One question about a clip, asked after `at` steps, with its answer and its evidence span."""

    kind: str
    task: str
    text: str
    answer: str
    at: int
    evidence: tuple[int, int]
    wording: str | None = None  # the second world's wording set ("train" or "heldout"); None in the first
    choices: tuple[str, ...] | None = None  # the options, where they are not the first world's

    @property
    def options(self) -> tuple[str, ...]:
        return self.choices if self.choices is not None else OPTIONS[self.task]

    @property
    def age(self) -> str | None:
        """Where the evidence ends in what the stream has shown when asked (backward questions only):
        early, middle or late third."""
        if self.kind != BACKWARD:
            return None
        share = (self.evidence[1] - 1) / max(1, self.at - 1)
        return AGES[min(2, int(3 * share))]


@dataclass(frozen=True)
class StandingQuestion:
    """A forward question, read after every chunk: `true_at` are the steps at which its answer is yes."""

    text: str
    colour: str
    shape: str
    true_at: frozenset[int]

    def answer_at(self, at: int) -> str:
        """The right answer after `at` steps: whether the newest frame (step at - 1) shows it."""
        return "yes" if at - 1 in self.true_at else "no"

    def onsets(self) -> list[int]:
        """Steps at which it becomes true (the events a forward question should fire at)."""
        return sorted(t for t in self.true_at if t - 1 not in self.true_at)


def vocabulary() -> list[str]:
    """Every word a question or an answer of the toy world can use."""
    words = {NOTHING, *SHAPES, *COLOURS, *SIDES, *YES_NO, "color"}  # "color": the other spelling people type
    for template in TEMPLATES.values():
        words |= set(template.replace("?", " ? ").replace("{shape}", "").replace("{colour}", "").split())
    return sorted(words)


# -- what a clip shows ------------------------------------------------------------------------------


def shown(clip: Clip, colour: str, shape: str) -> frozenset[int]:
    """The steps at which a `colour` `shape` is on screen."""
    v = clip.visit_of(shape)
    if v is None:
        return frozenset()
    return frozenset(t for t in range(v.enter, v.leave) if v.colour_at(t) == colour)


def real_time(clip: Clip, task: str, at: int, rng: np.random.Generator) -> Question | None:
    """A real-time question about step at - 1, or None when the newest frame shows nothing to ask about
    (OJR is asked of an empty screen too: its answer is "nothing")."""
    now = at - 1
    v = clip.visible(now)
    if task == "OJR":
        return Question(REAL_TIME, task, TEMPLATES[task], v.shape if v else NOTHING, at, (now, at))
    if v is None:
        return None
    if task == "ATR":
        first = next(s for c, s, e in v.spans() if s <= now < e)
        return Question(REAL_TIME, task, TEMPLATES[task].format(shape=v.shape), v.colour_at(now), at, (first, at))
    side = v.side_at(now)
    if task != "STU" or side is None:
        return None
    return Question(REAL_TIME, task, TEMPLATES[task].format(shape=v.shape), side, at, (now, at))


def backward(clip: Clip, at: int, rng: np.random.Generator) -> list[Question]:
    """Every backward question whose evidence left the screen (or changed) before step at - 1: the
    colour of each earlier object (its first colour when it changed), and "did you see" for each of
    its colours and for one colour it never had."""
    out = []
    for v in clip.visits:
        spans = [(c, s, e) for c, s, e in v.spans() if e <= at - 1]
        if not spans:
            continue
        template = "EPM" if v.change is None else "EPM-first"
        out.append(_ask("EPM", template, v.shape, "", v.colour, at, (spans[0][1], spans[0][2])))
        for colour, s, e in spans:
            out.append(_ask("HLD", "HLD", v.shape, colour, "yes", at, (s, e)))
        if v.leave <= at - 1:
            never = [c for c in COLOURS if c not in (v.colour, v.new_colour)]
            colour = never[int(rng.integers(len(never)))]
            out.append(_ask("HLD", "HLD", v.shape, colour, "no", at, (v.enter, v.leave)))
    return out


def never_seen(clip: Clip, at: int, rng: np.random.Generator) -> Question | None:
    """A "did you see" question about a shape that has not appeared by step at - 1 (answer no, no evidence)."""
    unseen = [s for s in SHAPES if (v := clip.visit_of(s)) is None or v.enter > at - 1]
    if not unseen:
        return None
    shape = unseen[int(rng.integers(len(unseen)))]
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    return Question(BACKWARD, "HLD", TEMPLATES["HLD"].format(colour=colour, shape=shape), "no", at, (0, 0))


def is_there(clip: Clip, at: int, rng: np.random.Generator) -> Question:
    """The standing question asked once, about step at - 1: half of the time about what is on screen
    (yes), else about another colour of it, or another shape, perhaps one seen before (no)."""
    now = at - 1
    v = clip.visible(now)
    if v is not None and rng.random() < 0.5:
        colour, shape = v.colour_at(now), v.shape
    else:
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        colours = [c for c in COLOURS if v is None or (c, shape) != (v.colour_at(now), v.shape)]
        colour = colours[int(rng.integers(len(colours)))]
    answer = "yes" if now in shown(clip, colour, shape) else "no"
    return Question(REAL_TIME, "SSR", TEMPLATES["SSR"].format(colour=colour, shape=shape), answer, at, (now, at))


def _ask(task: str, template: str, shape: str, colour: str, answer: str, at: int, span: tuple[int, int]) -> Question:
    return Question(BACKWARD, task, TEMPLATES[template].format(shape=shape, colour=colour), answer, at, span)


def standing(clip: Clip, colour: str, shape: str) -> StandingQuestion:
    return StandingQuestion(
        TEMPLATES["SSR"].format(colour=colour, shape=shape), colour, shape, shown(clip, colour, shape)
    )
