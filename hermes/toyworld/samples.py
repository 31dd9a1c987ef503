"""The app's toy-world samples: a few clips, each with suggested questions of the three kinds.

`python -m hermes toyworld samples [--world v2]` writes them with `samples.json` beside the world's
model, where the app reads them (`hermes.serving.samples`). The clips come from their own seeds (no
training, validation or held-out stream uses them). Among the first candidates, the ones kept are
those where a memory makes a visible difference: streamed whole at the toy model's own settings
(its card: 4-frame chunks at 1 fps, a budget of a quarter of the stream), the full cache and HERMES
answer an early-evidence backward question right where FIFO, which holds only the last frames,
cannot, and the full cache answers every question about the present right. The choice is made by
this script, in the open, and `samples.json` records every memory's answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hermes.engine.session import StreamingSession
from hermes.eval.policies import PolicyGroup
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.models.loading import SAMPLES_FILE
from hermes.runtime.driver import play
from hermes.toyworld.files import write_clip
from hermes.toyworld.questions import (
    BACKWARD,
    FORWARD,
    NOTHING,
    REAL_TIME,
    Question,
    StandingQuestion,
    backward,
    real_time,
    standing,
)
from hermes.toyworld.questions2 import TRAIN, backward2, real_time2, standing2
from hermes.toyworld.world import Clip, make_clip
from hermes.toyworld.world2 import Clip2, make_clip2
from hermes.video.frames_folder import iter_video

SHOWN = ("full", "hermes", "fifo")  # the memories whose answers decide the choice and are recorded
AnyClip = Clip | Clip2


def suggestions(clip: AnyClip, rng: np.random.Generator) -> list[Question]:
    """What to ask at the end of a first-world clip: what is on screen now, and each backward question
    whose evidence is early in the stream."""
    now = [q for task in ("OJR", "ATR") if (q := real_time(clip, task, clip.frames, rng)) and q.answer in q.options]
    early = [q for q in backward(clip, clip.frames, rng) if q.age == "early"]
    return [*now, *early]


def suggestions2(clip: AnyClip, rng: np.random.Generator) -> list[Question]:
    """The same for a second-world clip, in training wordings: what a lane shows, and the colour and
    side of a shape on screen now (none when nothing is); each backward question whose evidence is early."""
    asked = [real_time2(clip, task, clip.frames, rng) for task in ("OJR", "ATR", "STU")]
    now = [q for q in asked if q is not None and q.answer != NOTHING]
    early = [q for q in backward2(clip, clip.frames, rng) if q.age == "early"]
    return [*now, *early]


@dataclass(frozen=True)
class SampleWorld:
    """How samples of one toy world are made: the candidates' seeds and clips, what to ask at the end,
    the standing question to watch (about the first object), and the clips' title."""

    seed0: int  # candidate i has seed seed0 + i
    candidates: int  # how many seeds to try (few of world v2's clips end with something on screen)
    make: Callable[[int], AnyClip]
    suggest: Callable[[AnyClip, np.random.Generator], list[Question]]
    watch: Callable[[AnyClip, np.random.Generator], StandingQuestion]
    title: str

    def titled(self, clip: AnyClip) -> str:
        return f"{self.title} ({clip.frames} s, seed {clip.seed})"


SAMPLE_WORLDS = {
    "v1": SampleWorld(
        40_000_000,
        40,
        make_clip,
        suggestions,
        lambda clip, rng: standing(clip, clip.visits[0].colour, clip.visits[0].shape),
        "Toy world: shapes that come and go",
    ),
    "v2": SampleWorld(
        41_000_000,
        400,
        make_clip2,
        suggestions2,
        lambda clip, rng: standing2(clip, clip.visits[0].colour, clip.visits[0].shape, rng, TRAIN),
        "Toy world v2: shapes in three lanes",
    ),
}


def answers(lm: VideoLM, video: Path, questions: list[Question], card: dict) -> dict[str, list[str]]:
    """Each memory of SHOWN, streamed the whole clip at the card's settings, asked every question at the
    end: its answer words (the option with the highest first-token log-probability)."""
    config = HermesConfig(budget=card["budget"], chunk_frames=card["chunk_frames"], fps=card["fps"])
    group = PolicyGroup({p: StreamingSession(lm, config, policy=p) for p in SHOWN})
    frames = list(iter_video(video, card["fps"]))
    for _ in play(group, frames, [], lambda _: None):
        pass
    out: dict[str, list[str]] = {}
    for policy, session in group.sessions.items():
        words = []
        for q in questions:
            logp = session.first_token_logprobs(q.text)
            ids = [int(lm.tokenizer.convert_tokens_to_ids(o)) for o in q.options]
            words.append(q.options[int(np.argmax([float(logp[i]) for i in ids]))])
        out[policy] = words
    return out


def _sample(world: SampleWorld, clip: AnyClip, name: str, asked: list[Question], said: dict[str, list[str]]) -> dict:
    watch = world.watch(clip, np.random.default_rng(clip.seed + 1))
    return {
        "file": name,
        "title": world.titled(clip),
        "questions": [
            {"kind": q.kind, "task": q.task, "text": q.text, "answer": q.answer, "age": q.age}
            | {"answers": {p: said[p][i] for p in SHOWN}}
            for i, q in enumerate(asked)
        ],
        "watch": {"kind": FORWARD, "text": watch.text, "true_at_s": sorted(watch.true_at)},
    }


def build_samples(out: str | Path, lm: VideoLM, card: dict, keep: int = 3, world: str = "v1") -> Path:
    """Write `keep` sample clips of toy world `world` (of its first candidate seeds) and samples.json
    into `out`."""
    sampler = SAMPLE_WORLDS[world]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kept: list[dict] = []
    for i in range(sampler.candidates):
        if len(kept) == keep:
            break
        clip = sampler.make(sampler.seed0 + i)
        rng = np.random.default_rng(clip.seed)
        asked = sampler.suggest(clip, rng)
        if not any(q.kind == REAL_TIME for q in asked):  # nothing on screen at the end: nothing to ask now
            continue
        name = f"toy_sample_{len(kept) + 1}.mp4"
        write_clip(clip, out / name)
        said = answers(lm, out / name, asked, card)
        shows = [
            q.kind == BACKWARD and said["full"][j] == said["hermes"][j] == q.answer != said["fifo"][j]
            for j, q in enumerate(asked)
        ]
        now = [said["full"][j] == q.answer for j, q in enumerate(asked) if q.kind == REAL_TIME]
        real_time_right = bool(now) and all(now)
        if any(shows) and real_time_right:
            kept.append(_sample(sampler, clip, name, asked, said))
        else:
            for path in out.glob(f"{Path(name).stem}.*"):
                path.unlink()
    if len(kept) < keep:
        raise RuntimeError(f"only {len(kept)} of {sampler.candidates} candidate clips show the memories differ")
    (out / SAMPLES_FILE).write_text(json.dumps(kept, indent=1) + "\n")
    return out
