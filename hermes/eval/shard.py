"""Evaluation sharded across processes started by an existing launcher (torchrun, accelerate launch).

The launcher starts N copies of `python -m hermes eval` and gives each its RANK and WORLD_SIZE.
Each process takes every N-th video (in the order of first appearance in the annotation file,
whatever is done already, so a shard's share never changes between runs), streams only those,
and appends its records to its own part file next to --out, so that each shard resumes on its own.
Questions are grouped by video, so no video is decoded twice.

The processes never talk to each other: no process group, no barrier that would time out while
one shard still streams an hour of video. Whichever process finds every part complete when it
finishes (under a file lock) merges them: the merged results file lists the records in the order
one process writes them, and its summary is the one a single process computes.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Process `rank` of `world`; Shard() is the whole evaluation in one process."""

    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of {self.world} processes is not a shard")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Shard:
        """The shard a launcher gave this process: RANK and WORLD_SIZE, as torchrun and
        accelerate launch set them; one process when they are absent."""
        env = os.environ if env is None else env
        try:
            return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)))
        except ValueError:
            raise ValueError(
                f"RANK={env.get('RANK')!r} and WORLD_SIZE={env.get('WORLD_SIZE')!r} do not name a shard"
            ) from None

    @property
    def sharded(self) -> bool:
        return self.world > 1

    def take(self, units: Sequence[T]) -> list[T]:
        """This shard's share of `units`: every world-th one, starting at rank."""
        return list(units[self.rank :: self.world])

    def owner(self, index: int) -> int:
        """The rank that takes unit `index`."""
        return index % self.world

    def local_device(self, env: dict[str, str] | None = None) -> str | None:
        """This process's GPU, cuda:LOCAL_RANK (modulo the GPUs there are), when there are GPUs:
        N processes on one machine share its GPUs one each. None without a GPU."""
        import torch

        if not torch.cuda.is_available():
            return None
        env = os.environ if env is None else env
        return f"cuda:{int(env.get('LOCAL_RANK', self.rank)) % torch.cuda.device_count()}"

    def part(self, out: str | Path) -> Path:
        """The results file this shard appends to: `out` itself when there is one process."""
        out = Path(out)
        return out if not self.sharded else part_path(out, self.rank, self.world)


def part_path(out: Path, rank: int, world: int) -> Path:
    """results.jsonl -> results.part-1-of-4.jsonl"""
    return out.with_name(f"{out.stem}.part-{rank}-of-{world}{out.suffix}")


@contextmanager
def merge_lock(out: Path) -> Iterator[None]:
    """Held while a shard checks the parts and merges them, so that a shard that finishes later
    merges after (and over) one that merged before it."""
    lock = out.with_name(out.name + ".lock")
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_parts(
    out: Path,
    world: int,
    parts: Sequence[dict[str, dict]],
    first: Sequence[str],
    groups: Sequence[Sequence[str]],
) -> dict[str, dict]:
    """Write `out` from the shards' records, in the order one process writes them: the `first` qids
    (malformed entries, which shard 0 records), then group by group (group i from shard i mod
    world), each group's records in its shard's order. Returns the merged records."""
    position = [{qid: i for i, qid in enumerate(part)} for part in parts]
    rows = [(q, parts[0][q]) for q in first if q in parts[0]]
    for i, group in enumerate(groups):
        owner = i % world
        mine = sorted((q for q in group if q in parts[owner]), key=position[owner].__getitem__)
        rows += [(q, parts[owner][q]) for q in mine]
    tmp = out.with_name(out.name + ".merging")
    tmp.write_text("".join(json.dumps(record) + "\n" for _, record in rows), encoding="utf-8")
    tmp.replace(out)  # readers see the old file or the whole new one
    return dict(rows)
