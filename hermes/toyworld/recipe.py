"""The recorded training run: train with the recipe's settings, save, score the held-out set, write it all.

`python -m hermes toyworld train --out DIR` runs this. The folder then holds a transformers
checkpoint (loadable by `load_video_lm`, as `--model toy` once it is the committed one) and
`training.json`: the settings and their hash, the training curve, the wall time with the machine's
load, and the held-out accuracy of the full cache, measured through the engine as the benchmark
measures it.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from hermes.models.loading import load_video_lm
from hermes.toyworld import bench
from hermes.toyworld.data import Packer, Stream
from hermes.toyworld.data2 import frame_label2
from hermes.toyworld.files import read_events
from hermes.toyworld.questions import Question
from hermes.toyworld.train import RECORD, Trainer, TrainSpec, target_logits
from hermes.toyworld.train2 import Trainer2, TrainSpec2
from hermes.toyworld.world import WORLD_FPS
from hermes.toyworld.world2 import Clip2
from hermes.video.frames_folder import iter_video


def score_heldout(model_dir: str | Path, heldout: str | Path, clips: int | None = None) -> dict:
    """The full cache's accuracy on the held-out set (the benchmark's `full` row), with chance."""
    lm = load_video_lm(str(model_dir), dtype="fp32")
    held = bench.load_heldout(heldout)
    results = bench.run(lm, held, [bench.FULL], [], videos=clips)
    summary = bench.summarize(held, results[(bench.FULL, None)])
    keep = (*bench.COLUMNS, "on_time", "text", "questions")
    return {"full": {k: summary[k] for k in keep}, "chance": bench.chance(held)}


def packed_scores(model_dir: str | Path, heldout: str | Path, clips_per_pass: int = 8) -> dict[str, float]:
    """The full cache's accuracy on the held-out real-time and backward questions, from the training's
    packed pass over the clips decoded from their files: each question sees the stream up to its
    time, as the engine's full cache would show it (the tests check the two agree to 1e-4), and the
    whole set scores in seconds instead of minutes. Forward questions need the engine's checks."""
    lm = load_video_lm(str(model_dir), dtype="fp32")
    held = bench.load_heldout(heldout)
    clip = read_events(held.root / held.videos[0])
    # The frame probe's labels go unused here, but a batch reads them from each clip in its world's way.
    packer = Packer(lm, frame_label2 if isinstance(clip, Clip2) else None)
    hits: dict[str, list[bool]] = defaultdict(list)
    for i in range(0, len(held.videos), clips_per_pass):
        videos = held.videos[i : i + clips_per_pass]
        asked = [[q for q in held.questions if q.video == v] for v in videos]
        streams = [
            Stream(read_events(held.root / v), held.chunk_frames, [_as_question(q) for q in qs])
            for v, qs in zip(videos, asked, strict=True)
        ]
        frames = np.stack([f.image for v in videos for f in iter_video(held.root / v, WORLD_FPS)])
        batch = packer.pack(streams, None, frames)
        with torch.no_grad():
            logits = target_logits(lm.model, batch)[0][batch.answer_targets]
        for row, q in zip(logits, (q for qs in asked for q in qs), strict=True):
            ids = [packer.answer_id(o) for o in q.options]
            hits[q.kind].append(q.options[int(row[ids].argmax())] == q.answer)
    return {kind: float(np.mean(ok)) for kind, ok in sorted(hits.items())}


def _as_question(q: bench.ToyQuestion) -> Question:
    """A held-out question as the packer lays questions out (its evidence span is not needed)."""
    return Question(q.kind, q.task, q.text, q.answer, q.at, (0, 0))


def train_and_score(
    out: str | Path,
    heldout: str | Path,
    threads: int = 1,
    log: Callable[[str], None] = print,
    spec: TrainSpec | None = None,
    clips: int | None = None,
    start: str | Path | None = None,
) -> dict:
    """Train with `spec` (the recipe's settings by default) into `out`, score the held-out set (its
    first `clips` clips, or all), write `training.json`; the record. With `start` (the second world
    only), polish that checkpoint of the same stages instead of training them again; the record then
    counts its time too, and says how each part ran."""
    torch.set_num_threads(threads)
    spec = spec or TrainSpec()
    if start is not None and not isinstance(spec, TrainSpec2):
        raise ValueError("only the second world's recipe can start from a checkpoint (it has a polish)")
    load_before = os.getloadavg()
    started = time.monotonic()
    curve = Trainer2(spec, log=log).run(out, start) if isinstance(spec, TrainSpec2) else Trainer(spec, log=log).run(out)
    seconds = round(time.monotonic() - started, 1)
    parts = [{"part": "polish" if start else "all", "train_seconds": seconds, "threads": threads}]
    if start is not None:
        before = json.loads(Path(start, RECORD).read_text())
        parts.insert(0, {"part": "stages", "train_seconds": before["train_seconds"], "threads": before["threads"]})
    report = {
        "settings_hash": spec.settings_hash(),
        "settings": spec.to_dict(),
        "train_seconds": round(sum(p["train_seconds"] for p in parts), 1),
        "threads": threads,
        "parts": parts,
        "load_average": {"start": load_before, "end": os.getloadavg()},
        "curve": curve,
        "heldout": score_heldout(out, heldout, clips),
    }
    Path(out, RECORD).write_text(json.dumps(report, indent=1) + "\n")
    return report
