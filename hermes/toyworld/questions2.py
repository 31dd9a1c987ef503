"""Questions about a clip of the second world, in many wordings, some kept out of training.

The tasks are the first world's (OVO-Bench's codes), each about one object among those on screen:
OJR asks what is in a lane ("What shape is at the top?"), ATR and STU the colour and the side of a
named shape now, EPM and HLD its colour before, SSR (standing) whether a colour and shape is on
screen. Two description tasks answer in several words: REC, the recall task, asks what happened
and is answered with the event list so far ("red square , blue ring , square turned green"); NOW
asks what is on screen ("red square , blue ring", top lane first). HERMES's guidance prompts
(`hermes.engine.guidance`: GLOBAL_PROMPT for the long-term tier, LOCAL_PROMPT for the working one)
are training wordings of REC and NOW, so that a memory guided by them is guided by questions the
model can read.

Every task has several wordings (synonyms, word order). `TRAIN_WORDINGS` are used in training;
`HELDOUT_WORDINGS` are never: they recombine the training words (no new word, since a word never
trained means nothing to the model) and are scored apart. `EXTRA_WORDINGS`, in the training words
too, join the training ones in the recipe's last stage only (the polish, `train2.Polish`), so that
each cue word ("now", "tell me", "which") is asked of more tasks than one.
"""

from __future__ import annotations

import numpy as np

from hermes.engine.guidance import GLOBAL_PROMPT, LOCAL_PROMPT
from hermes.toyworld.questions import (
    BACKWARD,
    NOTHING,
    REAL_TIME,
    RECALL,
    SIDES,
    YES_NO,
    Question,
    StandingQuestion,
)
from hermes.toyworld.world import COLOURS
from hermes.toyworld.world2 import LANES, SHAPES2, Clip2

TRAIN, HELDOUT, WIDE = "train", "heldout", "wide"  # WIDE: the training wordings and the extra ones
# How a lane is named inside a question.
WHERE = {"top": "at the top", "middle": "in the middle", "bottom": "at the bottom"}

TRAIN_WORDINGS: dict[str, tuple[str, ...]] = {
    "OJR": ("What shape is {where}?", "Which shape do you see {where}?", "What object is {where} now?"),
    "ATR": ("What colour is the {shape}?", "Which colour is the {shape} now?", "Tell me the colour of the {shape}."),
    "STU": (
        "Is the {shape} on the left or the right?",
        "Is the {shape} on the right or the left?",
        "Which side is the {shape} on?",
    ),
    "EPM": ("What colour was the {shape}?", "Tell me the colour the {shape} had."),
    "EPM-first": (
        "What colour was the {shape} at first?",
        "Which colour did the {shape} have at first?",
        "Tell me the colour the {shape} had at first.",
    ),
    "HLD": (
        "Did you see a {colour} {shape}?",
        "Was there a {colour} {shape} before?",
        "Have you seen a {colour} {shape}?",
    ),
    "SSR": ("Is there a {colour} {shape}?", "Is a {colour} {shape} on screen?", "Do you see a {colour} {shape} now?"),
    "REC": ("What happened?", "Tell me what happened so far.", GLOBAL_PROMPT),
    "NOW": ("What is on screen?", "What is happening right now?", "What do you see now?", LOCAL_PROMPT),
}
HELDOUT_WORDINGS: dict[str, tuple[str, ...]] = {
    "OJR": ("Which object do you see {where} now?", "What shape do you see {where}?"),
    "ATR": ("What is the colour of the {shape} now?", "Tell me which colour the {shape} is."),
    "STU": ("Which side is the {shape} on now?", "Is the {shape} on the left or on the right?"),
    "EPM": ("Which colour was the {shape}?", "What colour did the {shape} have?"),
    "EPM-first": ("What colour did the {shape} have at first?", "Which colour was the {shape} at first?"),
    "HLD": ("Did you see a {colour} {shape} before?", "Have you seen a {colour} {shape} before?"),
    "SSR": ("Do you see a {colour} {shape} on screen?", "Is a {colour} {shape} there now?"),
    "REC": ("What happened so far?",),
    "NOW": ("What is on screen now?", "What do you see?"),
}
# Written after the held-out scores showed which cues a model had tied to one task (docs/toyworld.md):
# "now" was never asked of the side, "tell me" never of a lane's shape or a side.
EXTRA_WORDINGS: dict[str, tuple[str, ...]] = {
    "OJR": ("Which shape is {where} now?", "Tell me the shape {where}."),
    "ATR": ("What colour is the {shape} now?", "Tell me the colour of the {shape} now."),
    "STU": ("Is the {shape} on the left or the right now?", "Tell me which side the {shape} is on."),
    "EPM": ("Which colour did the {shape} have?",),
    "EPM-first": ("Tell me which colour the {shape} had at first.",),
    "HLD": ("Was there a {colour} {shape}?", "Have you seen a {colour} {shape} so far?"),
    "SSR": ("Is there a {colour} {shape} now?", "Do you see a {colour} {shape}?"),
    "REC": ("Tell me what happened.",),
    "NOW": ("What is happening?", "Tell me what is on screen."),
}
WORDINGS = {
    TRAIN: TRAIN_WORDINGS,
    HELDOUT: HELDOUT_WORDINGS,
    WIDE: {task: (*ts, *EXTRA_WORDINGS[task]) for task, ts in TRAIN_WORDINGS.items()},
}
OPTIONS2: dict[str, tuple[str, ...]] = {
    "OJR": (*SHAPES2, NOTHING),
    "ATR": tuple(COLOURS),
    "STU": SIDES,
    "EPM": tuple(COLOURS),
    "HLD": YES_NO,
    "SSR": YES_NO,
}
TURNED = "turned"  # the recall answer's word for a colour change


def vocabulary2() -> list[str]:
    """Every word a question or an answer of the second world can use, in either wording set."""
    words = {NOTHING, *SHAPES2, *COLOURS, *SIDES, *YES_NO, TURNED, "color"}
    for wordings in WORDINGS.values():
        for template in (t for ts in wordings.values() for t in ts):
            text = template.format(where=" ".join(WHERE.values()), shape="", colour="")
            words |= set(text.replace("?", " ? ").replace(".", " . ").replace(",", " , ").replace(":", " : ").split())
    return sorted(words)


def word(template: str, rng: np.random.Generator, wording: str) -> str:
    """One of the wordings of `template` (a key of the wording tables) in the set `wording`."""
    options = WORDINGS[wording][template]
    return options[int(rng.integers(len(options)))]


def _q(kind: str, task: str, text: str, answer: str, at: int, span: tuple[int, int], wording: str) -> Question:
    return Question(kind, task, text, answer, at, span, wording=wording, choices=OPTIONS2.get(task))


def real_time2(clip: Clip2, task: str, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question | None:
    """A real-time question about step at - 1, or None when the newest frame offers none: OJR about
    a random lane (its answer "nothing" when the lane is empty), ATR and STU about a random object on
    screen (STU only when it is clearly on one side)."""
    now = at - 1
    if task == "OJR":
        lane = list(LANES)[int(rng.integers(len(LANES)))]
        v = clip.in_lane(now, lane)
        text = word("OJR", rng, wording).format(where=WHERE[lane])
        return _q(REAL_TIME, task, text, v.shape if v else NOTHING, at, (now, at), wording)
    on = clip.on_screen(now)
    if not on:
        return None
    v = on[int(rng.integers(len(on)))]
    text = word(task, rng, wording).format(shape=v.shape)
    if task == "ATR":
        first = next(s for c, s, e in v.spans() if s <= now < e)
        return _q(REAL_TIME, task, text, v.colour_at(now), at, (first, at), wording)
    side = v.side_at(now)
    return None if side is None else _q(REAL_TIME, task, text, side, at, (now, at), wording)


def backward2(clip: Clip2, at: int, rng: np.random.Generator, wording: str = TRAIN) -> list[Question]:
    """Every backward question whose evidence left the screen (or changed) before step at - 1: each
    earlier object's first colour, and "did you see" for each of its colours and one it never had."""
    out = []
    for v in clip.visits:
        spans = [(c, s, e) for c, s, e in v.spans() if e <= at - 1]
        if not spans:
            continue
        template = "EPM" if v.change is None else "EPM-first"
        text = word(template, rng, wording).format(shape=v.shape)
        out.append(_q(BACKWARD, "EPM", text, v.colour, at, (spans[0][1], spans[0][2]), wording))
        for colour, s, e in spans:
            text = word("HLD", rng, wording).format(colour=colour, shape=v.shape)
            out.append(_q(BACKWARD, "HLD", text, "yes", at, (s, e), wording))
        if v.leave <= at - 1:
            never = [c for c in COLOURS if c not in (v.colour, v.new_colour)]
            text = word("HLD", rng, wording).format(colour=never[int(rng.integers(len(never)))], shape=v.shape)
            out.append(_q(BACKWARD, "HLD", text, "no", at, (v.enter, v.leave), wording))
    return out


def never_seen2(clip: Clip2, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question | None:
    """A "did you see" question about a shape that has not appeared by step at - 1 (answer no)."""
    unseen = [s for s in SHAPES2 if (v := clip.visit_of(s)) is None or v.enter > at - 1]
    if not unseen:
        return None
    shape, colour = unseen[int(rng.integers(len(unseen)))], list(COLOURS)[int(rng.integers(len(COLOURS)))]
    return _q(BACKWARD, "HLD", word("HLD", rng, wording).format(colour=colour, shape=shape), "no", at, (0, 0), wording)


def shown2(clip: Clip2, colour: str, shape: str) -> frozenset[int]:
    """The steps at which a `colour` `shape` is on screen."""
    v = clip.visit_of(shape)
    if v is None:
        return frozenset()
    return frozenset(t for t in range(v.enter, v.leave) if v.colour_at(t) == colour)


def is_there2(clip: Clip2, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question:
    """The standing question asked once, about step at - 1: half of the time about an object on
    screen (yes), else about another colour of a shape, perhaps one seen before or on screen (no)."""
    now = at - 1
    on = clip.on_screen(now)
    if on and rng.random() < 0.5:
        v = on[int(rng.integers(len(on)))]
        colour, shape = v.colour_at(now), v.shape
    else:
        shape = SHAPES2[int(rng.integers(len(SHAPES2)))]
        here = {(v.colour_at(now), v.shape) for v in on}
        colours = [c for c in COLOURS if (c, shape) not in here]
        colour = colours[int(rng.integers(len(colours)))]
    answer = "yes" if now in shown2(clip, colour, shape) else "no"
    text = word("SSR", rng, wording).format(colour=colour, shape=shape)
    return _q(REAL_TIME, "SSR", text, answer, at, (now, at), wording)


def standing2(clip: Clip2, colour: str, shape: str, rng: np.random.Generator, wording: str) -> StandingQuestion:
    text = word("SSR", rng, wording).format(colour=colour, shape=shape)
    return StandingQuestion(text, colour, shape, shown2(clip, colour, shape))


def story(clip: Clip2, at: int) -> str:
    """The recall task's answer after `at` steps: every appearance ("red square") and colour change
    ("square turned green") so far, in order, comma-separated; "nothing" before the first."""
    parts = []
    for e in clip.events():
        if e["t"] <= at - 1 and e["event"] == "appear":
            parts.append(f"{e['colour']} {e['shape']}")
        elif e["t"] <= at - 1 and e["event"] == "change":
            parts.append(f"{e['shape']} {TURNED} {e['colour']}")
    return " , ".join(parts) or NOTHING


def recall(clip: Clip2, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question:
    """The recall question after `at` steps, its answer the story so far (evidence: the whole stream)."""
    return Question(RECALL, "REC", word("REC", rng, wording), story(clip, at), at, (0, at), wording=wording)


def scene(clip: Clip2, at: int, rng: np.random.Generator, wording: str = TRAIN) -> Question:
    """What is on screen after `at` steps: each object as colour and shape, top lane first."""
    now = at - 1
    answer = " , ".join(f"{v.colour_at(now)} {v.shape}" for v in clip.on_screen(now)) or NOTHING
    return Question(RECALL, "NOW", word("NOW", rng, wording), answer, at, (now, at), wording=wording)
