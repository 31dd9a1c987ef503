"""The second world's held-out set: 64-step clips with several objects at once, half of the questions
in wordings never used in training.

Laid out as the first world's (`hermes.toyworld.heldout`: OVO-Bench's fields beside the toy
world's, picked by the same rules), with one more field, `wording`: "train" or "heldout". In clip i
the real-time questions are in the held-out wordings when i is odd and the backward ones when i is
even, so each kind has both halves over the set and each clip asks in both; standing questions
alternate. The benchmark scores the held-out wordings apart.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hermes.toyworld.files import write_clip
from hermes.toyworld.heldout import (
    ANNOTATIONS,
    MANIFEST,
    HeldOutSpec,
    ovo_entry,
    ovo_forward_entry,
    pick_backward,
    pick_real_time,
    video_name,
)
from hermes.toyworld.questions import KINDS, StandingQuestion
from hermes.toyworld.questions2 import HELDOUT, TRAIN, backward2, real_time2, shown2, standing2
from hermes.toyworld.world import COLOURS
from hermes.toyworld.world2 import SHAPES2, Clip2, WorldSpec2, make_clip2


@dataclass(frozen=True)
class HeldOutSpec2(HeldOutSpec):
    """The second world's held-out set: its own seeds (no training or validation stream uses them)."""

    seed0: int = 32_000_000
    clips: int = 30
    frames: int = 64


def pick_forward2(clip: Clip2, spec: HeldOutSpec, rng: np.random.Generator, index: int) -> list[StandingQuestion]:
    """Standing questions: up to `per_kind` - 1 about objects that come on screen after the first
    chunk, the rest about a seen shape in a colour it never has; wordings alternate."""
    later = sorted({(c, v.shape) for v in clip.visits for c, s, _ in v.spans() if s >= spec.chunk_frames})
    seen = {v.shape for v in clip.visits}
    never = [(c, s) for s in SHAPES2 for c in COLOURS if not shown2(clip, c, s) and s in seen]
    picked = [later[i] for i in rng.permutation(len(later))[: spec.per_kind - 1]]
    picked += [never[i] for i in rng.permutation(len(never))[: spec.per_kind - len(picked)]]
    return [standing2(clip, c, s, rng, (TRAIN, HELDOUT)[(index + j) % 2]) for j, (c, s) in enumerate(picked)]


def clip_entries(clip: Clip2, spec: HeldOutSpec, index: int, counts: Counter) -> list[dict]:
    """Every entry of clip `index`: its real-time, backward and standing questions."""
    video = video_name(index)
    rng = np.random.default_rng(spec.seed0 + index)
    now, past = (HELDOUT, TRAIN) if index % 2 else (TRAIN, HELDOUT)
    entries = []
    ask_now = lambda c, task, at, r: real_time2(c, task, at, r, now)  # noqa: E731
    for j, q in enumerate(pick_real_time(clip, spec, index, rng, ask_now)):
        entries.append(ovo_entry(q, f"toy2{index:03d}-rt{j}", video))
    ask_past = lambda c, at, r: backward2(c, at, r, past)  # noqa: E731
    for j, q in enumerate(pick_backward(clip, spec, rng, counts, ask_past)):
        entries.append(ovo_entry(q, f"toy2{index:03d}-bw{j}", video))
    for j, q in enumerate(pick_forward2(clip, spec, rng, index)):
        entry = ovo_forward_entry(q, f"toy2{index:03d}-fw{j}", video, spec.cuts)
        entries.append({**entry, "wording": (TRAIN, HELDOUT)[(index + j) % 2]})
    return entries


def build2(out: str | Path, spec: HeldOutSpec | None = None) -> Path:
    """Write the second world's held-out set into `out`: videos with their events, the annotations
    and the manifest."""
    spec = spec or HeldOutSpec2()
    out = Path(out)
    world = WorldSpec2(frames=spec.frames)
    entries: list[dict] = []
    counts: Counter = Counter()
    for i in range(spec.clips):
        clip = make_clip2(spec.seed0 + i, world)
        write_clip(clip, out / video_name(i))
        entries += clip_entries(clip, spec, i, counts)
    (out / ANNOTATIONS).write_text("[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n")
    kinds = Counter(e["kind"] for e in entries)
    manifest = {"spec": asdict(spec), "world": asdict(world), "questions": {k: kinds[k] for k in KINDS}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out
