"""The two toy worlds by name, with what each is benchmarked and trained with by default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hermes.toyworld.paths import HELDOUT2_DIR, HELDOUT_DIR, SAMPLES2_DIR, SAMPLES_DIR


def _recipe1() -> object:
    from hermes.toyworld.train import TrainSpec  # here: the recipes pull in torch

    return TrainSpec()


def _recipe2() -> object:
    from hermes.toyworld.train2 import TrainSpec2

    return TrainSpec2()


@dataclass(frozen=True)
class World:
    """A toy world: its model's alias, its held-out set, its recipe's training settings (`spec()`) and
    the folder of the app's sample clips for it."""

    name: str
    model: str
    heldout: Path
    spec: Callable[[], object]
    samples: Path


WORLDS = {
    "v1": World("v1", "toy", HELDOUT_DIR, _recipe1, SAMPLES_DIR),  # one object at a time (the easy world)
    "v2": World("v2", "toy2", HELDOUT2_DIR, _recipe2, SAMPLES2_DIR),  # two or three objects at once, 64-step clips
}
