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

CI streams SOAK_CHUNKS chunks, enough to see a leak of 0.1 MiB per chunk (90 MiB an hour) many
times over; the hour itself:
    HERMES_SOAK_HOURS=1 python -m pytest -q -s tests/test_soak.py
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

import numpy as np
import pytest

from hermes.engine.methods import PolicySpec
from hermes.engine.metrics import process_rss
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.runtime.settings import StreamSettings
from hermes.serving import chat, view
from hermes.serving.jobs import Priority
from hermes.serving.links import MAX_CHUNK_BACKLOG
from hermes.serving.live import LiveStream
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
_libc = ctypes.CDLL(ctypes.util.find_library("c"))


@pytest.fixture(autouse=True)
def bounded_histories_fill_in_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kept history at a bound that the warm-up reaches (see the module docstring)."""
    for module, name, bound in [
        (view, "HISTORY_LIMIT", 4),
        (view, "WATCH_LIMIT", 4),
        (view, "ANSWER_LIMIT", 1),
        (view, "ALERT_LIMIT", 2),
        (chat, "MAX_MESSAGES", 4),
        (chat, "MAX_MEDIA", 1),
    ]:
        monkeypatch.setattr(module, name, bound)


@pytest.fixture
def frozen_gc():
    """Objects alive at the first reading are moved out of the collector's sight (gc.freeze), so
    that each reading collects only what the stream made since: seconds less per reading with a
    model, transformers and gradio loaded, and nothing the stream makes is exempt."""
    yield gc.freeze
    gc.unfreeze()


def rss_mib() -> float:
    """What the process really holds: freed objects collected and freed heap given back first."""
    gc.collect()
    _libc.malloc_trim(0)
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


def test_the_engine_alone_keeps_its_host_memory_flat(qwen_lm, frozen_gc):
    session = StreamingSession(qwen_lm, HermesConfig(budget=BUDGET, chunk_frames=CHUNK, fps=FPS))
    chunker = Chunker(CHUNK)
    images = frames(CHUNK * 8)
    sizes, readings, i = set(), [], 0
    while session.chunks_seen < WARMUP + SOAK_CHUNKS:
        chunk = chunker.push(images[i % len(images)], t=i / FPS)
        i += 1
        if chunk is None:
            continue
        report_ = session.ingest(chunk)
        if session.chunks_seen == WARMUP:
            frozen_gc()
        if session.chunks_seen > WARMUP:
            sizes.add(report_.cache_bytes)
            readings.append(rss_mib())
        if asks_at(session.chunks_seen):
            session.ask("What changed?", max_new_tokens=4)
    slope = slope_per_hour(readings)
    print(report("engine", readings, slope))
    assert len(sizes) == 1, "cache bytes must be exactly constant past the budget"
    assert session.ask("What is happening?", max_new_tokens=4).done
    assert slope < slope_bound(len(readings)), report("engine", readings, slope)


def test_a_webcam_stream_keeps_its_host_memory_flat(worker, qwen_lm, frozen_gc):
    """A headless LiveStream fed webcam frames as fast as the model takes them (none dropped),
    with a standing question checked after every chunk and a question now and then."""
    stream = LiveStream(worker, qwen_lm, StreamSettings(budget=BUDGET, chunk_frames=CHUNK, fps=FPS), key="cam")
    try:
        stream.watch("Is the pattern moving?")
        images = frames(CHUNK * 8)
        readings, cache_bytes = [], set()
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
                frozen_gc()
            if chunk > WARMUP:
                assert worker.wait_idle("cam", 60)
                readings.append(rss_mib())
                cache_bytes.add(stream.view().snapshots[PolicySpec("hermes")].cache_bytes)
        assert worker.wait_idle("cam", 60)
        status, view = stream.status(), stream.view()
        assert status.dropped_frames == 0 and view.chunks == WARMUP + SOAK_CHUNKS
        assert len(cache_bytes) == 1, "cache bytes must be exactly constant past the budget"
        assert list(stream.ask("What is happening?", max_new_tokens=4).events())[-1].done
        slope = slope_per_hour(readings)
        print(report("live stream", readings, slope))
        assert slope < slope_bound(len(readings)), report("live stream", readings, slope)
    finally:
        stream.close()
