"""The two toy worlds by name, with what each is benchmarked and trained with by default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hermes.toyworld.paths import HELDOUT2_DIR, HELDOUT_DIR


@dataclass(frozen=True)
class World:
    """A toy world: its model's alias, its held-out set, and its training settings."""

    name: str
    model: str
    heldout: Path

    def spec(self) -> object:
        """The recipe's training settings for this world (imported here: they pull in torch)."""
        if self.name == "v2":
            from hermes.toyworld.train2 import TrainSpec2

            return TrainSpec2()
        from hermes.toyworld.train import TrainSpec

        return TrainSpec()


WORLDS = {
    "v1": World("v1", "toy", HELDOUT_DIR),  # one object at a time (the easy world)
    "v2": World("v2", "toy2", HELDOUT2_DIR),  # two or three objects at once, 64-step clips
}
