"""The app's toy-world samples: a few clips, each with suggested questions of the three kinds.

`python -m hermes toyworld samples --out DIR` writes them with `samples.json`, which the app reads
(`hermes.serving.samples` reads them). The clips come from their own seeds (no training, validation or
held-out stream uses them). Among the first candidates, the ones kept are those where something is
on screen at the end and a memory makes a visible difference: streamed whole at the toy model's
own settings (its card: 4-frame chunks at 1 fps, a budget of a quarter of the stream), the full
cache and HERMES answer an early-evidence backward question right where FIFO, which holds only the
last frames, cannot. The choice is made by this script, in the open, and `samples.json` records
every memory's answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hermes.engine.session import StreamingSession
from hermes.eval.policies import PolicyGroup
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.models.loading import SAMPLES_FILE
from hermes.runtime.driver import play
from hermes.toyworld.files import write_clip
from hermes.toyworld.questions import BACKWARD, FORWARD, REAL_TIME, Question, backward, real_time, standing
from hermes.toyworld.world import Clip, make_clip
from hermes.video.frames_folder import iter_video

SAMPLES_SEED0 = 40_000_000  # clip i of the candidates has seed SAMPLES_SEED0 + i
SHOWN = ("full", "hermes", "fifo")  # the memories whose answers decide the choice and are recorded


def suggestions(clip: Clip, rng: np.random.Generator) -> list[Question]:
    """What to ask at the end of `clip`: what is on screen now, and each backward question whose
    evidence is early in the stream."""
    now = [q for task in ("OJR", "ATR") if (q := real_time(clip, task, clip.frames, rng)) and q.answer in q.options]
    early = [q for q in backward(clip, clip.frames, rng) if q.age == "early"]
    return [*now, *early]


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


def _sample(clip: Clip, name: str, asked: list[Question], said: dict[str, list[str]]) -> dict:
    visit = clip.visits[0]
    watch = standing(clip, visit.colour, visit.shape)
    return {
        "file": name,
        "title": f"Toy world: shapes that come and go ({clip.frames} s, seed {clip.seed})",
        "questions": [
            {"kind": q.kind, "task": q.task, "text": q.text, "answer": q.answer, "age": q.age}
            | {"answers": {p: said[p][i] for p in SHOWN}}
            for i, q in enumerate(asked)
        ],
        "watch": {"kind": FORWARD, "text": watch.text, "true_at_s": sorted(watch.true_at)},
    }


def build_samples(out: str | Path, lm: VideoLM, card: dict, keep: int = 3, candidates: int = 40) -> Path:
    """Write `keep` sample clips (of the first `candidates` seeds) and samples.json into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kept: list[dict] = []
    for i in range(candidates):
        if len(kept) == keep:
            break
        clip = make_clip(SAMPLES_SEED0 + i)
        rng = np.random.default_rng(clip.seed)
        asked = suggestions(clip, rng)
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
            kept.append(_sample(clip, name, asked, said))
        else:
            for path in out.glob(f"{Path(name).stem}.*"):
                path.unlink()
    if len(kept) < keep:
        raise RuntimeError(f"only {len(kept)} of {candidates} candidate clips show the memories differ")
    (out / SAMPLES_FILE).write_text(json.dumps(kept, indent=1) + "\n")
    return out
