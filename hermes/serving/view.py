"""What the UI reads of a live stream: the immutable view the model thread publishes, the status.

A `LiveView` is replaced, never changed, after each model job; `with_chunk` and `with_answers`
build the next one. No Gradio and no model here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from hermes.engine.chunk import Chunk, padded_frames
from hermes.engine.methods import PolicySpec
from hermes.engine.metrics import MemoryReading
from hermes.engine.session import AnswerUpdate, ChunkReport
from hermes.engine.watch import MAX_STANDING, WatchCheck
from hermes.memory.snapshot import MemorySnapshot
from hermes.runtime.feed import Feed
from hermes.runtime.network import NetworkNumbers
from hermes.runtime.settings import StreamSettings
from hermes.serving.answers import AnswerEvent
from hermes.serving.state import Lifecycle, StreamState
from hermes.video.errors import skipped_summary

# Everything a view keeps per chunk is bounded, so that a stream's host memory stays flat however
# long it runs (docs/limits.md, "Long streams"): the last HISTORY_LIMIT chunks' metrics, the checks
# of that many chunks, ANSWER_LIMIT answers and ALERT_LIMIT alerts with their small frames.
THUMB_SIDE = 360
ALERT_SIDE = 160  # an alert's frame, as the chat shows it
HISTORY_LIMIT = 1000
ANSWER_LIMIT = 200
ALERT_LIMIT = 50
WATCH_LIMIT = MAX_STANDING * HISTORY_LIMIT  # checks kept for the plot: every standing question per chunk
GAP_LIMIT = 20  # holes in the stream time kept for the retained-token map
# Stream time missing between two chunks beyond one frame interval that the map marks as a hole: a
# network stream that dropped, a model that skipped to the live edge, a webcam that fell silent.
GAP_S = 2.0

# Per layer: (stream ids, guidance weights) over the layer's video slots, or None where not probed.
AttentionLayers = tuple[tuple[np.ndarray, np.ndarray] | None, ...]


@dataclass(frozen=True)
class ChunkRecord:
    """One row of a stream's history, taken after a chunk: each memory's `ChunkReport` of it (its
    numbers: the attention record and the standing checks are kept apart, bounded), and beside
    them what serving measured."""

    wall_s: float  # wall-clock seconds since the stream started (at_s always means stream time)
    reports: dict[PolicySpec, ChunkReport]
    rss_bytes: int
    gpu_allocated_bytes: int | None

    @property
    def frames_seen(self) -> int:
        return next(iter(self.reports.values())).frames_seen

    @property
    def stream_time_s(self) -> float:
        return next(iter(self.reports.values())).stream_time_s

    def per_policy(self, name: str) -> dict[PolicySpec, Any]:
        """One number of every memory's report, by policy (`cache_bytes`, `prefill_ms`, ...)."""
        return {policy: getattr(report, name) for policy, report in self.reports.items()}


@dataclass(frozen=True)
class WatchPoint:
    """One standing question read from one policy's memory after a chunk: the engine's check, and
    beside it the prefill time of the chunk just before, for scale."""

    policy: PolicySpec
    check: WatchCheck
    prefill_ms: float


@dataclass(frozen=True)
class Alert:
    """A standing question that fired: the engine's check and the short answer it wrote, the frame
    the memory had just seen, and the alert's number in the stream (the page shows each once)."""

    policy: PolicySpec
    check: WatchCheck
    answer: AnswerUpdate
    frame: np.ndarray = field(repr=False, compare=False)  # the chunk's last frame, ALERT_SIDE at most
    number: int = 0


@dataclass(frozen=True)
class FrameTokens:
    """How many tokens each frame of the stream had when prefilled (the retained-token map's
    denominator), run-length encoded: a new run starts only when a chunk's tokens per frame differ
    from the last chunk's (a short tail chunk), so a stream of any length holds a few runs."""

    runs: tuple[tuple[int, float], ...] = ()  # (first frame, tokens per frame), in frame order
    frames: int = 0

    def __len__(self) -> int:
        return self.frames

    def extended(self, n: int, per_frame: float) -> FrameTokens:
        """These frames, then `n` more of `per_frame` tokens each."""
        runs = self.runs if self.runs and self.runs[-1][1] == per_frame else (*self.runs, (self.frames, per_frame))
        return FrameTokens(runs, self.frames + n)

    def sums(self, edges: np.ndarray) -> np.ndarray:
        """Tokens of the frames in each bin [edges[i], edges[i + 1])."""
        if not self.runs:
            return np.zeros(max(0, len(edges) - 1))
        starts = np.array([s for s, _ in self.runs], dtype=float)
        ends = np.append(starts[1:], self.frames)
        per = np.array([p for _, p in self.runs])
        before = ((np.clip(np.asarray(edges, dtype=float)[:, None], starts, ends) - starts) * per).sum(axis=1)
        return np.diff(before)


@dataclass(frozen=True)
class LiveView:
    """Everything the UI draws, as published after the last job; never mutated."""

    version: int
    settings: StreamSettings
    snapshots: dict[str, MemorySnapshot] = field(default_factory=dict)
    frame_tokens: FrameTokens = field(default_factory=FrameTokens)
    frames_seen: int = 0
    stream_time_s: float = 0.0
    chunks: int = 0
    frame_image: np.ndarray | None = None  # the last frame the model consumed, downscaled
    history: tuple[ChunkRecord, ...] = ()
    answers: tuple[AnswerEvent, ...] = ()
    frames_in_memory: dict[str, int] = field(default_factory=dict)
    # Per policy: the guidance attention of its last compression (policies without guidance: absent).
    attention: dict[str, AttentionLayers] = field(default_factory=dict)
    # Per policy: the cache bytes its memory holds once the budget is reached (full: at its bound).
    budget_bytes: dict[str, int] = field(default_factory=dict)
    # Standing questions: every check (for the plot), the latest alerts, and the alerts published
    # so far, resets included (the numbers of the next ones).
    watch_history: tuple[WatchPoint, ...] = ()
    alerts: tuple[Alert, ...] = ()
    alert_count: int = 0
    # Holes in what the memory saw: (the first frame after the hole, its seconds), the latest GAP_LIMIT.
    gaps: tuple[tuple[int, float], ...] = ()

    def model_fps(self, last: int = 8) -> float | None:
        """Frames the model reads per second of its own work (prefill and compression, every
        memory of the stream), over the last `last` chunks; None before the second chunk."""
        recent = self.history[-last - 1 :]
        if len(recent) < 2:
            return None
        frames = recent[-1].frames_seen - recent[0].frames_seen
        ms = sum(r.prefill_ms + r.compress_ms for record in recent[1:] for r in record.reports.values())
        return frames / (ms / 1000) if ms > 0 else None

    def next(self, **changes: object) -> LiveView:
        """A copy with `changes` and the next version."""
        return dataclasses.replace(self, version=self.version + 1, **changes)

    def with_chunk(
        self,
        chunk: Chunk,
        reports: dict[PolicySpec, ChunkReport],
        snapshots: dict[PolicySpec, MemorySnapshot],
        frame_multiple: int,
        wall_s: float,
        reading: MemoryReading,
    ) -> LiveView:
        """The view after every memory ingested `chunk` (`reports` and `snapshots` by policy)."""
        report = next(iter(reports.values()))
        # Tokens each frame had when prefilled (the engine pads a chunk to the frame multiple):
        # the denominator of the retained-token map.
        prefilled = padded_frames(chunk.num_frames, frame_multiple)
        numbers = {p: r.numbers() for p, r in reports.items()}
        record = ChunkRecord(wall_s, numbers, reading.rss_bytes, reading.gpu_allocated_bytes)
        frame = thumbnail(chunk.pixels[-1])
        points, alerts = watch_records(reports, thumbnail(frame, ALERT_SIDE), self.alert_count)
        return self.next(
            gaps=(*self.gaps, *self._holes(chunk))[-GAP_LIMIT:],
            snapshots=snapshots,
            frame_tokens=self.frame_tokens.extended(chunk.num_frames, report.tokens / prefilled),
            frames_seen=report.frames_seen,
            stream_time_s=report.stream_time_s,
            chunks=self.chunks + 1,
            frame_image=frame,
            watch_history=(*self.watch_history, *points)[-WATCH_LIMIT:],
            alerts=(*self.alerts, *alerts)[-ALERT_LIMIT:],
            alert_count=self.alert_count + len(alerts),
            history=(*self.history, record)[-HISTORY_LIMIT:],
            frames_in_memory={p: s.frames_in_memory() for p, s in snapshots.items()},
            attention={**self.attention, **{p: r.attention for p, r in reports.items() if measured(r.attention)}},
        )

    def _holes(self, chunk: Chunk) -> list[tuple[int, float]]:
        """Where `chunk`, after the frames before it, leaves out more than GAP_S of stream time: (the
        frame after the hole, the seconds left out)."""
        before = [self.stream_time_s] if self.frames_seen else []
        steps = np.diff([*before, *chunk.timestamps.tolist()]) - 1.0 / self.settings.fps
        first = self.frames_seen - len(before) + 1  # the frame after the first step
        return [(first + int(i), float(steps[i])) for i in np.flatnonzero(steps > GAP_S)]

    def fresh(self, settings: StreamSettings) -> LiveView:
        """The next view of a stream that starts over with `settings`: nothing drawn yet, and the
        alerts numbered on from this one's."""
        return LiveView(version=self.version + 1, settings=settings, alert_count=self.alert_count)

    def with_answers(self, records: list[AnswerEvent]) -> LiveView:
        """The view with the finished answers `records` added to the latest ones."""
        return self.next(answers=(*self.answers, *records)[-ANSWER_LIMIT:])


@dataclass(frozen=True)
class StreamStatus:
    """What the stream is doing right now (cheap to read on every UI tick)."""

    state: StreamState
    source: str | None
    speed: str
    frames_read: int
    queued_chunks: int
    dropped_frames: int
    error: str | None
    note: str | None = None  # why the stream stopped by itself, when it was not an error
    skipped_frames: int = 0  # frames of the file that could not be decoded, and where, in words
    skipped: str | None = None
    # Where in the video a viewer would be now, at the source's pace (None: unpaced or not started).
    position_s: float | None = None
    duration_s: float | None = None  # a file's total length (None: a webcam, or no source)
    network: NetworkNumbers | None = None  # a network stream's link, skips and latency


def stream_status(life: Lifecycle, fed_by: Feed, queued: int) -> StreamStatus:
    """The status of a stream in `life`, fed by `fed_by`, with `queued` chunks on their way: a
    source that ended with chunks still queued is finishing."""
    state = life.state
    if state in (StreamState.FINISHED, StreamState.STOPPED) and queued:
        state = StreamState.FINISHING
    feed = fed_by.source
    skips = list(feed.skipped) if feed is not None else []
    return StreamStatus(
        state=state,
        source=fed_by.name,
        speed=fed_by.speed,
        frames_read=feed.frames_read if feed is not None else 0,
        queued_chunks=queued,
        dropped_frames=feed.dropped_frames if feed is not None else 0,
        error=life.error,
        note=life.note,
        skipped_frames=sum(s.frames for s in skips),
        skipped=skipped_summary(skips),
        position_s=feed.position_s() if feed is not None and state is StreamState.STREAMING else None,
        duration_s=fed_by.duration_s,
        network=fed_by.network.numbers() if fed_by.network is not None else None,
    )


def watch_records(
    reports: dict[PolicySpec, ChunkReport], frame: np.ndarray, first: int
) -> tuple[list[WatchPoint], list[Alert]]:
    """The standing questions' checks and alerts of one chunk, for every policy's memory; the
    alerts numbered from `first`."""
    points: list[WatchPoint] = []
    alerts: list[Alert] = []
    for policy, r in reports.items():
        points += [WatchPoint(policy, check, r.prefill_ms) for check in r.watches]
        fired = [c for c in r.watches if c.fired]
        alerts += [Alert(policy, c, a, frame) for c, a in zip(fired, r.alerts, strict=True)]
    return points, [dataclasses.replace(a, number=first + i) for i, a in enumerate(alerts)]


def measured(attention: AttentionLayers) -> bool:
    """Whether a chunk's compression measured guidance attention in any layer."""
    return any(layer is not None for layer in attention)


def thumbnail(image: np.ndarray, side: int = THUMB_SIDE) -> np.ndarray:
    """A copy of an RGB frame whose longer side is at most `side` pixels."""
    h, w = image.shape[:2]
    if max(h, w) <= side:
        return image.copy()
    scale = side / max(h, w)
    return np.asarray(Image.fromarray(image).resize((max(1, round(w * scale)), max(1, round(h * scale)))))
