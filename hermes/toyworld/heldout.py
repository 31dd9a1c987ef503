"""The held-out set: its own seeds, clips written as MP4 with their events, questions in OVO-Bench's layout.

Each clip gets a fixed number of questions of each kind, all asked at chunk ends (a question after
`at` steps has OVO-Bench's `realtime` = at - 1 seconds, the newest frame's time):

- real-time: one of OJR, ATR and STU each, at chunk ends where the newest frame shows an object;
- backward: one whose evidence ends early, one in the middle and one late in what the stream has
  shown when it is asked (where the clip allows; the others fill in), half EPM and half HLD;
- forward: standing questions read after every chunk, two about things that come on screen after
  the first chunk and one about something that never does, as OVO-Bench's SSR entries (a test
  point per chunk end, type 1 while it is on screen).

Entries carry OVO-Bench's fields (id, task, video, realtime, question, options, gt; forward:
test_info) and the toy world's own (kind, answer, evidence, age, at), so that `hermes eval --bench
ovobench` reads the file as well as the toy benchmark does.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hermes.toyworld.files import read_events, write_clip
from hermes.toyworld.questions import (
    FORWARD,
    KINDS,
    REAL_TIME,
    TASKS,
    Question,
    StandingQuestion,
    backward,
    real_time,
    shown,
    standing,
)
from hermes.toyworld.world import COLOURS, SHAPES, Clip, WorldSpec, make_clip

ANNOTATIONS = "toyworld.json"  # the questions, in OVO-Bench's layout
MANIFEST = "manifest.json"  # the settings the set was made with


@dataclass(frozen=True)
class HeldOutSpec:
    """What the held-out set is made of."""

    seed0: int = 30_000_000  # clip i has seed seed0 + i: no training or validation stream uses these
    clips: int = 90
    frames: int = 32
    chunk_frames: int = 4
    per_kind: int = 4  # questions of each kind per clip (4 standing questions: the most a stream takes)

    @property
    def cuts(self) -> list[int]:
        return list(range(self.chunk_frames, self.frames + 1, self.chunk_frames))


def video_name(index: int) -> str:
    return f"videos/toy_{index:03d}.mp4"


def pick_real_time(
    clip: Clip, spec: HeldOutSpec, index: int, rng: np.random.Generator, ask: Callable = real_time
) -> list[Question]:
    """`per_kind` real-time questions, their tasks in turn (starting where the clip's index says), each
    at a chunk end that allows it and that no earlier pick of the clip took; `ask(clip, task, at, rng)`
    makes them (the first world's questions by default)."""
    tasks = TASKS[REAL_TIME]
    out: list[Question] = []
    for j in range(spec.per_kind):
        task = tasks[(index + j) % len(tasks)]
        taken = {q.at for q in out}
        pool = [q for at in spec.cuts if (q := ask(clip, task, at, rng)) is not None and q.answer != "nothing"]
        pool = [q for q in pool if q.at not in taken] or pool
        if pool:
            out.append(pool[int(rng.integers(len(pool)))])
    return out


def pick_backward(
    clip: Clip, spec: HeldOutSpec, rng: np.random.Generator, counts: Counter, ask: Callable = backward
) -> list[Question]:
    """`per_kind` backward questions, each time of the evidence age and task that are scarcest in the
    set so far (HLD's yes and no kept even), as far as the clip allows; `ask(clip, at, rng)` lists
    the candidates (the first world's by default)."""
    pool = [q for at in spec.cuts if at >= 3 * spec.chunk_frames for q in ask(clip, at, rng)]
    out: list[Question] = []
    while len(out) < spec.per_kind and pool:
        wanted = "yes" if counts["HLD:yes"] <= counts["HLD:no"] else "no"

        def rank(q: Question, wanted: str = wanted) -> tuple[int, int, bool]:
            return (counts[q.age], counts[q.task], q.task == "HLD" and q.answer != wanted)

        best = min(rank(q) for q in pool)
        choice = [q for q in pool if rank(q) == best]
        q = choice[int(rng.integers(len(choice)))]
        out.append(q)
        counts.update([q.age, q.task] + ([f"HLD:{q.answer}"] if q.task == "HLD" else []))
        pool = [p for p in pool if p.text != q.text]
    return out


def pick_forward(clip: Clip, spec: HeldOutSpec, rng: np.random.Generator) -> list[StandingQuestion]:
    """Standing questions: up to `per_kind` - 1 about things that come on screen after the first chunk,
    the rest about things that never do (a seen shape in a colour it never has, where there is one)."""
    later = sorted({(c, v.shape) for v in clip.visits for c, s, _ in v.spans() if s >= spec.chunk_frames})
    seen = {v.shape for v in clip.visits}
    never = [(c, s) for s in SHAPES for c in COLOURS if not shown(clip, c, s) and s in seen]
    picked = [later[i] for i in rng.permutation(len(later))[: spec.per_kind - 1]]
    for i in rng.permutation(len(never))[: spec.per_kind - len(picked)]:
        picked.append(never[i])
    return [standing(clip, c, s) for c, s in picked]


def ovo_entry(q: Question, qid: str, video: str) -> dict:
    """A real-time or backward question as an OVO-Bench entry, with the toy world's fields."""
    return {
        "id": qid,
        "task": q.task,
        "video": video,
        "realtime": q.at - 1,
        "question": q.text,
        "options": list(q.options),
        "gt": q.options.index(q.answer),
        "kind": q.kind,
        "answer": q.answer,
        "at": q.at,
        "evidence": list(q.evidence),
        "age": q.age,
        **({"wording": q.wording} if q.wording else {}),
    }


def ovo_forward_entry(q: StandingQuestion, qid: str, video: str, cuts: list[int]) -> dict:
    """A standing question as an OVO-Bench SSR entry: a test point per chunk end."""
    return {
        "id": qid,
        "task": "SSR",
        "video": video,
        "kind": FORWARD,
        "question": q.text,
        "onsets": q.onsets(),
        "test_info": [{"realtime": at - 1, "step": q.text, "type": int(q.answer_at(at) == "yes")} for at in cuts],
    }


def build(out: str | Path, spec: HeldOutSpec | None = None) -> Path:
    """Write the held-out set into `out`: videos with their events, the annotations, the manifest."""
    spec = spec or HeldOutSpec()
    out = Path(out)
    world = WorldSpec(frames=spec.frames)
    entries: list[dict] = []
    counts: Counter = Counter()
    for i in range(spec.clips):
        clip = make_clip(spec.seed0 + i, world)
        video = video_name(i)
        write_clip(clip, out / video)
        rng = np.random.default_rng(spec.seed0 + i)
        for j, q in enumerate(pick_real_time(clip, spec, i, rng)):
            entries.append(ovo_entry(q, f"toy{i:03d}-rt{j}", video))
        for j, q in enumerate(pick_backward(clip, spec, rng, counts)):
            entries.append(ovo_entry(q, f"toy{i:03d}-bw{j}", video))
        for j, q in enumerate(pick_forward(clip, spec, rng)):
            entries.append(ovo_forward_entry(q, f"toy{i:03d}-fw{j}", video, spec.cuts))
    # One entry a line: compact, and a change to one question is a change to one line.
    (out / ANNOTATIONS).write_text("[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n")
    kinds = Counter(e["kind"] for e in entries)
    manifest = {"spec": asdict(spec), "world": asdict(world), "questions": {k: kinds[k] for k in KINDS}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def check_videos(root: str | Path, entries: list[dict]) -> dict[str, Clip]:
    """Each video's clip, read from its events file (ToyWorldError for a missing or broken one)."""
    return {video: read_events(Path(root) / video) for video in dict.fromkeys(e["video"] for e in entries)}
