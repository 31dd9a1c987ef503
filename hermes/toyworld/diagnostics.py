"""What a memory still held when a question was asked, layer by layer: the table's reading aid.

An accuracy says whether a memory answered; these shares say why. For each question and each
HERMES layer (in depth order): the share of the newest frame's tokens that the layer holds, and
for a backward question the share of its evidence frames' tokens, and the share of its evidence
frames that keep at least one slot. A merged token (a summary or a frame prototype) counts for the
frame whose slot it took, as one token: a memory of prototypes holds few of the evidence's tokens
but touches every evidence frame.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hermes.memory.cache import HermesCache


def held_shares(memory: HermesCache, newest: int, evidence: tuple[int, int] | None, per_frame: int) -> dict:
    """Per layer, the share (0 to 1) of frame `newest`'s `per_frame` tokens that the memory holds, and
    of the frames `evidence` = [start, end) (None: no evidence share)."""
    newest_held, evidence_held, touched = [], [], []
    for layer in memory.kv_layers:
        frames = layer.frames[layer.video_offset :]
        newest_held.append(min(1.0, int((frames == newest).sum()) / per_frame))
        if evidence is not None:
            start, end = evidence
            inside = frames[(frames >= start) & (frames < end)]
            evidence_held.append(min(1.0, inside.numel() / (per_frame * max(1, end - start))))
            touched.append(inside.unique().numel() / max(1, end - start))
    if evidence is None:
        return {"newest_held": newest_held, "evidence_held": None, "evidence_frames": None}
    return {"newest_held": newest_held, "evidence_held": evidence_held, "evidence_frames": touched}


def mean_shares(rows: list[dict], key: str) -> list[float] | None:
    """The mean share per layer of `key` over the rows that have it; None when none does."""
    values = [r[key] for r in rows if r.get(key)]
    return [float(x) for x in np.mean(values, axis=0)] if values else None


def render_held(rows: list[dict]) -> str:
    """A markdown table: per policy and budget, the mean share per layer (%, layer 0 first) of the newest
    frame's tokens held (all questions), of the evidence's tokens held and of the evidence frames kept
    (backward questions)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["policy"], r["budget"])].append(r)
    lines = [
        "| budget | policy | newest frame's tokens held | evidence's tokens held | evidence frames kept |",
        "|---:|---|---|---|---|",
    ]
    for (policy, budget), group in groups.items():
        newest = mean_shares(group, "newest_held")
        backward = [r for r in group if r["kind"] == "backward"]
        evidence, touched = mean_shares(backward, "evidence_held"), mean_shares(backward, "evidence_frames")
        lines.append(
            f"| {'all' if budget is None else budget} | {policy} | {_layers(newest)} | {_layers(evidence)} "
            f"| {_layers(touched)} |"
        )
    return "\n".join(lines)


def _layers(shares: list[float] | None) -> str:
    return "-" if shares is None else " / ".join(f"{100 * s:.0f}" for s in shares)
