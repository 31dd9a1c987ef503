"""The paper's layer-wise analysis, as a command: where a question's attention goes, layer by layer.

With the full cache (nothing evicted), each held-out question is read after the memory at its time,
and each layer's attention from the question's tokens over the video slots (softmax over every key,
mean over heads and question tokens, then renormalised over the video slots) is compared with the
share of the slots each part of the stream holds: the *lift* of the newest frame is the attention it
draws over its share of the video tokens, and a backward question's evidence lift is the same for
the frames that answer it. A lift of 1 is attention spread evenly; the paper's hierarchy expects
recency (a large newest lift) in shallow layers and retrieval (a large evidence lift) in deep ones.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hermes.engine.guidance import probe_attention
from hermes.engine.methods import FULL
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.runtime.driver import play
from hermes.toyworld.bench import HeldOut, ToyQuestion
from hermes.toyworld.questions import BACKWARD, REAL_TIME
from hermes.toyworld.world import WORLD_FPS
from hermes.video.frames_folder import iter_video


def question_lifts(session: StreamingSession, q: ToyQuestion) -> dict:
    """Per HERMES layer of `session`'s memory (its full cache): the newest frame's lift and, for a
    backward question, its evidence's lift, from the attention of `q`'s tokens read after the memory."""
    lm, memory = session.lm, session.memory
    ids = lm.question_ids(q.text)
    layers = memory.kv_layer_indices
    weights = probe_attention(lm, memory, ids, {layer: slice(0, ids.shape[-1]) for layer in layers})
    newest, lifts, evidence = session.frames_seen - 1, [], []
    for n, layer in enumerate(memory.kv_layers):
        frames = layer.frames[layer.video_offset :]
        start = layer.prefix_len + layer.video_offset
        w = weights[layers[n]][start : start + frames.numel()].float()
        w = w / w.sum()
        lifts.append(_lift(w, frames == newest))
        if q.kind == BACKWARD and q.evidence is not None:
            evidence.append(_lift(w, (frames >= q.evidence[0]) & (frames < q.evidence[1])))
    return {"kind": q.kind, "newest_lift": lifts, "evidence_lift": evidence or None}


def _lift(weights: torch.Tensor, part: torch.Tensor) -> float:
    share = float(part.float().mean())
    return float(weights[part].sum()) / share if share > 0 else float("nan")


def layer_lifts(
    lm: VideoLM, held: HeldOut, videos: int | None = None, progress: Callable[[str], None] | None = None
) -> list[dict]:
    """`question_lifts` of every real-time and backward question of the first `videos` clips."""
    rows = []
    chosen = held.videos[:videos] if videos else held.videos
    config = HermesConfig(budget=1, chunk_frames=held.chunk_frames, fps=WORLD_FPS)
    for i, video in enumerate(chosen):
        session = StreamingSession(lm, config, policy=FULL)
        questions = [q for q in held.questions if q.video == video]
        # The runtime's driver asks each question once the memory holds its first `at` frames, as the bench does.
        for event in play(session, iter_video(held.root / video, WORLD_FPS), questions, lambda q: q.at - 1):
            if isinstance(event, ToyQuestion):
                rows.append(question_lifts(session, event))
        if progress is not None:
            progress(f"clip {i + 1}/{len(chosen)}: {video}")
    return rows


def summarize_lifts(rows: list[dict]) -> dict[str, list[float]]:
    """Mean lift per layer: the newest frame's for real-time questions and for all, the evidence's."""

    def mean(values: list[list[float]]) -> list[float]:
        return [float(x) for x in np.nanmean(np.asarray(values, dtype=float), axis=0)] if values else []

    return {
        "newest (real-time questions)": mean([r["newest_lift"] for r in rows if r["kind"] == REAL_TIME]),
        "newest (every question)": mean([r["newest_lift"] for r in rows]),
        "evidence (backward questions)": mean([r["evidence_lift"] for r in rows if r["evidence_lift"]]),
    }


def render_lifts(summary: dict[str, list[float]], tiers: list[str]) -> str:
    """A markdown table: a row per layer (with its tier), a column per lift."""
    names = list(summary)
    lines = ["| layer | tier | " + " | ".join(names) + " |", "|---:|---|" + "---:|" * len(names)]
    for layer, tier in enumerate(tiers):
        lines.append(f"| {layer} | {tier} | " + " | ".join(f"{summary[n][layer]:.2f}" for n in names) + " |")
    return "\n".join(lines)


def lifts_svg(summary: dict[str, list[float]], title: str) -> str:
    """A line chart of the lifts per layer, as a standalone SVG (no plotting library needed)."""
    width, height, pad = 560, 300, 48
    layers = len(next(iter(summary.values())))
    top = max(1.0, *(v for values in summary.values() for v in values if np.isfinite(v))) * 1.1
    colours = ("#4f46e5", "#93c5fd", "#ea580c")

    def x(i: int) -> float:
        return pad + i * (width - 2 * pad) / max(1, layers - 1)

    def y(v: float) -> float:
        return height - pad - v / top * (height - 2 * pad)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{pad}" y1="{y(1)}" x2="{width - pad}" y2="{y(1)}" stroke="#999" stroke-dasharray="4 3"/>',
        f'<text x="{width - pad + 4}" y="{y(1) + 4}" fill="#666">1</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#333"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#333"/>',
        f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">layer</text>',
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">lift</text>',
    ]
    out += [f'<text x="{x(i)}" y="{height - pad + 16}" text-anchor="middle">{i}</text>' for i in range(layers)]
    out += [f'<text x="{pad - 6}" y="{y(t) + 4}" text-anchor="end">{t}</text>' for t in range(int(top) + 1)]
    for k, (name, values) in enumerate(summary.items()):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values) if np.isfinite(v))
        colour = colours[k % len(colours)]
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{pad + 8}" y="{pad + 14 * k}" fill="{colour}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
