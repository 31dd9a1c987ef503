"""Long streams keep their host memory flat: the slope of RSS against chunks, not a percentage.

At the app's defaults (1 fps, 4-frame chunks, budget 1,024 tokens per layer) an hour of video is
900 chunks. After a warm-up, the process RSS is read after every chunk (garbage collected and
trimmed, so that the reading is what is really held), and the slope of RSS against chunks, in MiB
per hour of stream, must stay under SLOPE_BOUND: a stream of an hour may grow by a few MiB at
most, for the engine alone and for a headless LiveStream fed like a webcam at full speed. A shorter
run is held to one heap step over its length (`slope_bound`).

What a stream keeps on purpose (the plots' last 1,000 chunks, the last answers and alerts, the
chat) is bounded, and its ceiling is measured by scripts/stream_footprint.py (docs/limits.md). A
test of a few hundred chunks would see those bounded structures fill and take it for a leak, so
here they are shrunk to fill within the warm-up: what still grows after it grows without bound.
The slope is Theil-Sen's (the median of the slopes between every two readings), which a single
step of the heap near the end does not tilt the way it tilts a least-squares line.

Each run goes in a fresh interpreter of its own (`alone`), so that the RSS holds the stream and its
model only; objects alive at the end of the warm-up are then moved out of the collector's sight
(gc.freeze), so each reading collects only what the stream made since (seconds less a reading).

CI streams SOAK_CHUNKS chunks, enough to see a leak of 0.1 MiB per chunk (90 MiB an hour) many
times over; the hour itself:
    HERMES_SOAK_HOURS=1 python -m pytest -q -s tests/test_soak.py
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from hermes.engine.methods import PolicySpec
from hermes.engine.metrics import process_rss, trim_host_memory
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models.loading import load_video_lm
from hermes.runtime.settings import StreamSettings
from hermes.serving import chat, view
from hermes.serving.jobs import Priority
from hermes.serving.links import MAX_CHUNK_BACKLOG
from hermes.serving.live import LiveStream
from hermes.serving.worker import ModelWorker
from hermes.video.chunking import Chunker
from tests.helpers import wait_for

FPS, CHUNK, BUDGET = 1.0, 4, 1024  # the app's defaults (StreamSettings)
CHUNKS_PER_HOUR = int(3600 * FPS / CHUNK)
HOURS = float(os.environ.get("HERMES_SOAK_HOURS", "0"))
SOAK_CHUNKS = round(HOURS * CHUNKS_PER_HOUR) if HOURS else 100
WARMUP = 16  # chunks before the first reading: the budget fills, buffers reach their size
ASK_EVERY = 50  # chunks between questions; the first comes in the warm-up (its first-time setup
# stays allocated, about 1 MiB, and is no leak)


def asks_at(chunk: int) -> bool:
    return chunk == WARMUP // 2 or chunk % ASK_EVERY == 0


SLOPE_BOUND = 4.0  # MiB per hour of stream, over an hour of it
# The heap moves in steps of a MiB or two (glibc's arenas and the top of its heap), whatever a stream
# does. Over a tenth of an hour (CI's 100 chunks) one such step in the middle of the readings is a
# slope of 10 to 30 MiB per hour, so a short run is held to what STEP_MIB over its length gives.
STEP_MIB = 4.0


def slope_bound(readings: int) -> float:
    """The bound on the slope of `readings` readings, one a chunk: SLOPE_BOUND over an hour or more;
    over fewer, one heap step across them (36 MiB per hour over 100 chunks, under half the 90 MiB
    per hour that a leak of 0.1 MiB a chunk makes)."""
    return max(SLOPE_BOUND, STEP_MIB * CHUNKS_PER_HOUR / max(readings, 1))


MIB = 2**20

pytestmark = [pytest.mark.soak, pytest.mark.timeout(300 + 3600 * HOURS)]  # an hour of stream takes minutes


def rss_mib() -> float:
    """What the process really holds: freed objects collected and freed heap given back first."""
    gc.collect()
    trim_host_memory()
    return process_rss() / MIB


def frames(n: int) -> list[np.ndarray]:
    """`n` different frames of a moving pattern, made once (a stream's frames are not kept)."""
    base = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    return [np.roll(base, 4 * i, axis=1) for i in range(n)]


def slope_per_hour(readings: list[float]) -> float:
    """Theil-Sen's slope of RSS (MiB) against chunks, in MiB per hour of stream."""
    y = np.asarray(readings)
    i, j = np.triu_indices(len(y), k=1)
    return float(np.median((y[j] - y[i]) / (j - i)) * CHUNKS_PER_HOUR)


def report(what: str, readings: list[float], slope: float) -> str:
    return (
        f"{what}: RSS {readings[0]:.1f} -> {readings[-1]:.1f} MiB over {len(readings)} chunks after warm-up; "
        f"slope {slope:+.2f} MiB per hour of stream (bound {slope_bound(len(readings)):.1f})"
    )


def test_the_slope_sees_a_leak_and_not_a_step():
    """A leak of 0.1 MiB per chunk is far over the bound; in flat readings, the heap growing once
    by 3 MiB near the end, or a few readings 3 MiB high, are not (a least-squares line through
    the late step would be); over 100 chunks, neither is one step of 3 MiB in the middle."""
    n = 100
    flat = 100 + np.random.default_rng(0).normal(0, 0.05, n)
    assert slope_per_hour(list(flat + 0.1 * np.arange(n))) > 2 * slope_bound(n) > 16 * SLOPE_BOUND
    assert slope_bound(CHUNKS_PER_HOUR) == SLOPE_BOUND
    middle = flat.copy()
    middle[50:] += 3
    assert SLOPE_BOUND < slope_per_hour(list(middle)) < slope_bound(n)
    late_step, spikes = flat.copy(), flat.copy()
    late_step[80:] += 3
    spikes[[20, 21, 60, 61, 62]] += 3
    assert (
        abs(slope_per_hour(list(late_step))) < SLOPE_BOUND < np.polyfit(np.arange(n), late_step, 1)[0] * CHUNKS_PER_HOUR
    )
    assert abs(slope_per_hour(list(spikes))) < SLOPE_BOUND


@dataclass
class Soak:
    """What one soak run saw: RSS after each chunk past the warm-up, the cache's sizes then, the
    chunks streamed and frames dropped, and whether the question at the end was answered."""

    what: str
    readings: list[float] = field(default_factory=list)
    cache_bytes: set[int] = field(default_factory=set)
    chunks: int = 0
    dropped_frames: int = 0
    answered: bool = False

    def check(self) -> None:
        slope = slope_per_hour(self.readings)
        print(report(self.what, self.readings, slope))
        assert len(self.cache_bytes) == 1, "cache bytes must be exactly constant past the budget"
        assert self.chunks == WARMUP + SOAK_CHUNKS and self.dropped_frames == 0
        assert self.answered, "the question after the stream got no answer"
        assert slope < slope_bound(len(self.readings)), report(self.what, self.readings, slope)


def alone(run: Callable[[], Soak]) -> Soak:
    """`run` in a fresh interpreter of its own (spawned, so nothing forked along): there the RSS is
    the stream's and its model's, not the heap that the suite's earlier tests left behind (about
    3 GB, in many threads' arenas), whose steps once read as a leak in CI."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run).result()


def shorten_histories(put: Callable[[Any, str, int], None] = setattr) -> None:
    """Every kept history at a bound that the warm-up reaches (see the module docstring), each set
    by `put` (a test's monkeypatch where the process lives on)."""
    for module, name, bound in [
        (view, "HISTORY_LIMIT", 4),
        (view, "WATCH_LIMIT", 4),
        (view, "ANSWER_LIMIT", 1),
        (view, "ALERT_LIMIT", 2),
        (chat, "MAX_MESSAGES", 4),
        (chat, "MAX_MEDIA", 1),
    ]:
        put(module, name, bound)


def tiny_qwen_with_short_histories() -> Any:
    """In the fresh process: the histories shortened and the tiny Qwen2.5-VL through the real
    loading path."""
    shorten_histories()
    return load_video_lm("tiny-qwen", dtype="fp32")


def soak_the_engine() -> Soak:
    """A StreamingSession fed chunk after chunk, with a question now and then."""
    lm = tiny_qwen_with_short_histories()
    session = StreamingSession(lm, HermesConfig(budget=BUDGET, chunk_frames=CHUNK, fps=FPS))
    chunker = Chunker(CHUNK)
    images = frames(CHUNK * 8)
    soak, i = Soak("engine"), 0
    while session.chunks_seen < WARMUP + SOAK_CHUNKS:
        chunk = chunker.push(images[i % len(images)], t=i / FPS)
        i += 1
        if chunk is None:
            continue
        report_ = session.ingest(chunk)
        if session.chunks_seen == WARMUP:
            gc.freeze()
        if session.chunks_seen > WARMUP:
            soak.cache_bytes.add(report_.cache_bytes)
            soak.readings.append(rss_mib())
        if asks_at(session.chunks_seen):
            session.ask("What changed?", max_new_tokens=4)
    soak.chunks = session.chunks_seen
    soak.answered = session.ask("What is happening?", max_new_tokens=4).done
    return soak


def soak_a_webcam_stream() -> Soak:
    """A headless LiveStream fed webcam frames as fast as the model takes them (none dropped),
    with a standing question checked after every chunk and a question now and then."""
    lm = tiny_qwen_with_short_histories()
    worker = ModelWorker()
    stream = LiveStream(worker, lm, StreamSettings(budget=BUDGET, chunk_frames=CHUNK, fps=FPS), key="cam")
    soak = Soak("live stream")
    try:
        stream.watch("Is the pattern moving?")
        images = frames(CHUNK * 8)
        for i in range(CHUNK * (WARMUP + SOAK_CHUNKS)):
            assert wait_for(lambda: worker.backlog("cam", Priority.CHUNK) < MAX_CHUNK_BACKLOG, 60)
            stream.push_frame(images[i % len(images)], t=i / FPS)
            if (i + 1) % CHUNK:
                continue
            chunk = (i + 1) // CHUNK
            if asks_at(chunk):
                assert list(stream.ask("What changed?", max_new_tokens=4).events())[-1].done
            if chunk == WARMUP:
                assert worker.wait_idle("cam", 60)
                gc.freeze()
            if chunk > WARMUP:
                assert worker.wait_idle("cam", 60)
                soak.readings.append(rss_mib())
                soak.cache_bytes.add(stream.view().snapshots[PolicySpec("hermes")].cache_bytes)
        assert worker.wait_idle("cam", 60)
        soak.chunks, soak.dropped_frames = stream.view().chunks, stream.status().dropped_frames
        soak.answered = list(stream.ask("What is happening?", max_new_tokens=4).events())[-1].done
        return soak
    finally:
        stream.close()
        worker.stop()


def test_the_engine_alone_keeps_its_host_memory_flat():
    alone(soak_the_engine).check()


def test_a_webcam_stream_keeps_its_host_memory_flat():
    alone(soak_a_webcam_stream).check()
