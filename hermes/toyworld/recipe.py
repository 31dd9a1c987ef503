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
from collections.abc import Callable
from pathlib import Path

import torch

from hermes.models.loading import load_video_lm
from hermes.toyworld import bench
from hermes.toyworld.train import Trainer, TrainSpec

RECORD = "training.json"


def score_heldout(model_dir: str | Path, heldout: str | Path, clips: int | None = None) -> dict:
    """The full cache's accuracy on the held-out set (the benchmark's `full` row), with chance."""
    lm = load_video_lm(str(model_dir), dtype="fp32")
    held = bench.load_heldout(heldout)
    results = bench.run(lm, held, [bench.FULL], [], videos=clips)
    summary = bench.summarize(held, results[(bench.FULL, None)])
    keep = (*bench.COLUMNS, "on_time", "text", "questions")
    return {"full": {k: summary[k] for k in keep}, "chance": bench.chance(held)}


def train_and_score(
    out: str | Path,
    heldout: str | Path,
    threads: int = 1,
    log: Callable[[str], None] = print,
    spec: TrainSpec | None = None,
    clips: int | None = None,
) -> dict:
    """Train with `spec` (the recipe's settings by default) into `out`, score the held-out set (its
    first `clips` clips, or all), write `training.json`; the record."""
    torch.set_num_threads(threads)
    spec = spec or TrainSpec()
    load_before = os.getloadavg()
    started = time.monotonic()
    trainer = Trainer(spec, log=log)
    curve = trainer.run(out)
    seconds = time.monotonic() - started
    report = {
        "settings_hash": spec.settings_hash(),
        "settings": spec.to_dict(),
        "train_seconds": round(seconds, 1),
        "threads": threads,
        "load_average": {"start": load_before, "end": os.getloadavg()},
        "curve": curve,
        "heldout": score_heldout(out, heldout, clips),
    }
    Path(out, RECORD).write_text(json.dumps(report, indent=1) + "\n")
    return report
