"""Running the efficiency benchmark: stream each policy and measure it at each frame count.

One session per policy streams synthetic frames chunk by chunk; each time the stream passes one of
the requested frame counts, a fixed set of questions is asked `repeats` times, and TTFT, TPOT, the
prefill and compression cost of the chunks since the previous frame count, the cache size and the
memory are recorded. Streaming once to the largest count and measuring on the way is the same
stream a fresh session per count would see, at a fraction of the time.

The frame content does not matter for speed: random 384x384 frames give LLaVA-OneVision the
paper's 196 tokens per frame. `full` never evicts, so it stops cleanly, recorded as "out of
memory", before a chunk whose estimated cost would pass the memory cap.
"""

from __future__ import annotations

import contextlib
import math
import platform
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from hermes.bench.peak import VisionTimer, chunk_flops, gemm_peaks
from hermes.engine.chunk import Chunk, padded_frames
from hermes.engine.methods import FULL, HERMES, PolicySpec, parse_policies, policy_names
from hermes.engine.metrics import free_cached_memory, memory_reading
from hermes.engine.session import ChunkReport, StreamBound, StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.models.loading import load_video_lm
from hermes.serving.admission import host_memory_cap, memory_cap_for

DEFAULT_BENCH_MODEL = "tiny"
DEFAULT_POLICIES = (HERMES, "fifo", FULL)
DEFAULT_FRAMES = (16, 64, 256, 512, 1024)
DEFAULT_REPEATS = 5  # x 3 questions: 15 samples per point, so that the median shrugs off a noisy neighbour
DEFAULT_MAX_NEW_TOKENS = 16
FRAME_SIZE = 384  # SigLIP's input size: 27x27 patches pooled to 196 tokens per frame, as in the paper
# On a CPU, `full` past 512 frames (Table 3's largest count) only adds minutes of quadratic prefill.
CPU_FULL_MAX_FRAMES = 512
# Positions for `full`: past the model's trained context, which does not change its speed.
UNBOUNDED_POSITIONS = 1 << 40
QUESTIONS = (
    "What is happening in the video right now?",
    "Which objects have appeared so far, and in what order?",
    "Describe the person in the scene and what they are doing.",
)
OK, OOM, SKIPPED = "ok", "out of memory", "skipped"


def load_bench_model(
    name: str,
    device: str | None = None,
    allow_cpu_7b: bool = False,
    dtype: str | torch.dtype | None = None,
    device_map: str | None = None,
) -> VideoLM:
    """A random-weight real architecture (`hermes.models.random7b.RANDOM_MODELS`) built from its
    config, anything else (a tiny alias, a checkpoint) via load_video_lm; in `dtype`, on `device` or
    spread by `device_map`."""
    from hermes.models.random7b import RANDOM_MODELS, load_random_model

    if name in RANDOM_MODELS:
        if device_map is not None:
            raise ValueError(f"{name} is built on one device; --device-map applies to checkpoints")
        return load_random_model(name, device, allow_cpu=allow_cpu_7b, dtype=dtype)
    return load_video_lm(name, device=device, dtype=dtype, device_map=device_map)


def prefill_bytes(per_token: int, cached: int, new: int) -> int:
    """Estimated peak bytes of prefilling `new` tokens after `cached` ones: the old and the grown cache
    side by side (transformers concatenates) plus a (new x all) attention mask at up to 4 bytes."""
    total = cached + new
    return per_token * (cached + total) + 4 * new * total


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, min and max of `values` (None when empty)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class Point:
    """One policy at one frame count."""

    policy: str
    frames: int
    status: str = OK
    note: str = ""
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)  # chunks since the previous frame count
    compress_ms: list[float] = field(default_factory=list)
    guidance_ms: list[float] = field(default_factory=list)  # the guidance pass, part of compress_ms
    vision_ms: list[float] = field(default_factory=list)  # the vision encoder, part of prefill_ms
    evicted: list[int] = field(default_factory=list)  # tokens evicted per chunk (0: nothing to compress)
    tokens: list[int] = field(default_factory=list)  # tokens prefilled per chunk
    dropped: list[int] = field(default_factory=list)  # tokens the input filter dropped per chunk
    # Per chunk: its frames, and whether it is one of the bench's comparison chunks, which run the
    # guidance pass on its own where a stream's prompt rides on the prefill (`PolicyRun`).
    chunk_frames: list[int] = field(default_factory=list)
    separate: list[bool] = field(default_factory=list)
    ingested_frames: int = 0  # frames of those chunks
    cache_bytes: int | None = None
    memory_bytes: int | None = None  # GPU peak on CUDA, process RSS on CPU
    video_tokens_per_layer: int | None = None
    # A retrieval policy (rekv): TTFT's retrieval part, the device bytes of the frames brought back
    # at their peak (all layers), and the host store's bytes.
    retrieval_ms: list[float] = field(default_factory=list)
    retrieved_bytes: int | None = None
    host_bytes: int | None = None

    @property
    def device_bytes(self) -> int | None:
        """The cache on the device at its peak: the memory plus any frames brought back."""
        return None if self.cache_bytes is None else self.cache_bytes + (self.retrieved_bytes or 0)

    def summary(self) -> dict:
        """The stored numbers plus their median/min/max."""
        out = asdict(self)
        for key in ("ttft_ms", "tpot_ms", "prefill_ms", "compress_ms", "guidance_ms", "vision_ms", "retrieval_ms"):
            out[f"{key}_stats"] = spread(getattr(self, key))
        out["ingest_fps"] = self.ingest_fps
        out["device_bytes"] = self.device_bytes
        return out

    def as_streamed(self) -> tuple[int, float]:
        """Frames, and seconds of prefill plus compression, of the chunks that ran as a stream runs
        them (the comparison chunks left out)."""
        separate = self.separate or [False] * len(self.prefill_ms)
        left_out = sum(f for f, s in zip(self.chunk_frames, separate, strict=False) if s)
        ms = sum(p + c for p, c, s in zip(self.prefill_ms, self.compress_ms, separate, strict=True) if not s)
        return self.ingested_frames - left_out, ms / 1000

    @property
    def ingest_fps(self) -> float | None:
        """Frames per second of wall time spent on prefill plus compression, since the previous count."""
        frames, seconds = self.as_streamed()
        return frames / seconds if seconds > 0 else None


@dataclass
class BenchSettings:
    """Everything a run depends on besides the model."""

    policies: tuple[str, ...] = DEFAULT_POLICIES  # parsed into `PolicySpec`s
    frames: tuple[int, ...] = DEFAULT_FRAMES
    config: HermesConfig = field(default_factory=HermesConfig)
    repeats: int = DEFAULT_REPEATS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    questions: tuple[str, ...] = QUESTIONS
    frame_size: int = FRAME_SIZE
    memory_cap: int | None = None  # bytes; None: the server's cap for the model's devices (memory_cap_for)
    full_max_frames: int | None = None  # None: no limit
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)  # the methods' constants, `method.field`: value
    static: bool = False  # every frame the same picture (what an input filter drops), not random ones

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError(f"--policies needs at least one of {', '.join(policy_names())}")
        self.policies = parse_policies(self.policies, self.config, self.params)
        if not self.frames or min(self.frames) < 1:
            raise ValueError("--frames needs positive frame counts, for example 16,64,256")
        self.frames = tuple(sorted(set(self.frames)))
        if self.repeats < 1:
            raise ValueError("--repeats must be at least 1")
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        if self.frame_size < 28:
            raise ValueError("--frame-size must be at least 28 pixels")


@dataclass
class BenchResult:
    """All points of a run, with what it ran on."""

    meta: dict
    points: list[Point]

    def point(self, policy: str, frames: int) -> Point | None:
        return next((p for p in self.points if p.policy == policy and p.frames == frames), None)


def synthetic_chunk(
    rng: np.random.Generator, start: int, n: int, size: int, fps: float, index: int, static: bool = False
) -> Chunk:
    """`n` random frames as the chunk that starts at global frame `start`; with `static`, every
    frame of the stream is the same picture (one drawn from a fresh generator of seed 0)."""
    source = np.random.default_rng(0) if static else rng
    frames = source.integers(0, 256, (1 if static else n, size, size, 3), dtype=np.uint8)
    if static:
        frames = np.repeat(frames, n, axis=0)
    idx = np.arange(start, start + n)
    return Chunk(frames, idx / fps, idx, idx, index)


_STATUS = Path("/proc/self/status")


def _reset_peak(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics, or Linux's peak RSS (VmHWM, via clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # not Linux: the current RSS is reported instead
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int | None:
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", _STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def memory_kind(device: torch.device) -> str:
    """What the memory column measures on this device."""
    if device.type == "cuda":
        return "GPU peak (torch.cuda.max_memory_allocated, since the policy started)"
    return "peak RSS (VmHWM, since the policy started)" if _peak_rss() is not None else "process RSS"


def _memory(device: torch.device) -> int:
    """Peak memory since `_reset_peak`: GPU allocations on CUDA, resident set size on a CPU."""
    reading = memory_reading(device)
    if reading.gpu_peak_bytes is not None:
        return reading.gpu_peak_bytes
    return _peak_rss() or reading.rss_bytes


def warm_up(lm: VideoLM, settings: BenchSettings) -> None:
    """One chunk and one question on a throwaway session: first-call costs (lazy init, allocator
    growth) belong to no frame count."""
    session = StreamingSession(lm, settings.config, policy="fifo")
    n = min(settings.config.chunk_frames, settings.frames[0])
    session.ingest(synthetic_chunk(np.random.default_rng(0), 0, n, settings.frame_size, settings.config.fps, 0))
    session.ask(settings.questions[0], max_new_tokens=2)


class PolicyRun:
    """One policy's stream through the benchmark: its session, and what the chunks since the last
    measured frame count cost."""

    def __init__(
        self,
        lm: VideoLM,
        policy: PolicySpec,
        settings: BenchSettings,
        memory_cap: int,
        on_frames: Callable[[int], None],
    ) -> None:
        self.lm, self.settings, self.memory_cap, self.on_frames = lm, settings, memory_cap, on_frames
        built = policy.build(settings.config)
        self.unbounded = built.capacity is None  # it never evicts: --full-max-frames applies
        self.keeps_host_store = built.question.keeps_host_store
        self.config = settings.config
        if built.positions_grow:  # positions never compacted: run past the trained context, as speed allows
            self.config = self.config.with_(max_positions=UNBOUNDED_POSITIONS)
        self.session = StreamingSession(lm, self.config, policy=policy, host_cap_bytes=host_memory_cap())
        # A stream's guidance prompt rides on the prefill, where its cost cannot be timed apart: every
        # other compressing chunk runs the pass on its own instead (the same attention, the same
        # memory), and the report compares the two prefills.
        memory = self.session.memory
        self.compares = self.session.guidance.rider(memory, self.session.policy, None, 0) is not None
        self.rng = np.random.default_rng(settings.seed)
        self.window: list[ChunkReport] = []
        self.separate: list[bool] = []  # per chunk of the window: a comparison chunk
        self.frames: list[int] = []  # per chunk of the window: its frames
        self.vision: list[float] = []  # the vision encoder's ms in each chunk of the window
        self.window_start = 0  # frames streamed when the window began
        self.tokens_per_frame = 0.0  # measured on the previous chunk, to size the next one

    def stream_to(self, target: int) -> None:
        """Ingest chunks until `target` frames are in; MemoryError before a chunk whose estimated
        prefill would pass the memory cap, StreamBound at a bound of the policy."""
        session, lm, settings = self.session, self.lm, self.settings
        while session.frames_seen < target:
            n = min(self.config.chunk_frames, target - session.frames_seen)
            padded = padded_frames(n, lm.frame_multiple)
            cached = session.memory.prefix_len + session.memory.slots
            need = prefill_bytes(lm.kv_bytes_per_token, cached, math.ceil(self.tokens_per_frame * padded))
            if need > self.memory_cap:
                raise MemoryError(
                    f"the next chunk would need about {need / 2**20:,.0f} MiB, "
                    f"over the {self.memory_cap / 2**20:,.0f} MiB cap"
                )
            chunk = synthetic_chunk(
                self.rng,
                session.frames_seen,
                n,
                settings.frame_size,
                self.config.fps,
                session.chunks_seen,
                settings.static,
            )
            with VisionTimer(lm) as timer:
                report = session.ingest(chunk)
            compared = self.compares and report.evicted > 0
            self.separate.append(compared and not session.guidance_rides)
            self.frames.append(n)
            if compared:
                session.guidance_rides = not session.guidance_rides
            self.window.append(report)
            self.vision.append(timer.take())
            self.tokens_per_frame = (report.tokens + report.dropped) / padded
            self.on_frames(n)

    def ask(self, point: Point) -> int:
        """Ask every question `repeats` times into `point`; the most device bytes a question's
        step brought in."""
        retrieved = 0
        for _ in range(self.settings.repeats):
            for question in self.settings.questions:
                answer = self.session.ask(question, max_new_tokens=self.settings.max_new_tokens)
                point.ttft_ms.append(answer.ttft_ms)
                if answer.retrieval_ms is not None:
                    point.retrieval_ms.append(answer.retrieval_ms)
                retrieved = max(retrieved, answer.retrieved_bytes)
                if answer.tpot_ms is not None:
                    point.tpot_ms.append(answer.tpot_ms)
        return retrieved

    def record(self, point: Point, retrieved: int) -> None:
        """What the chunks since the last frame count cost, and the memory now, into `point`; the
        next window starts."""
        session, window = self.session, self.window
        point.prefill_ms = [r.prefill_ms for r in window]
        point.compress_ms = [r.compress_ms for r in window]
        point.guidance_ms = [r.guidance_ms for r in window]
        point.vision_ms = self.vision
        point.evicted = [r.evicted for r in window]
        point.tokens = [r.tokens for r in window]
        point.dropped = [r.dropped for r in window]
        point.chunk_frames, point.separate = self.frames, self.separate
        point.ingested_frames = session.frames_seen - self.window_start
        point.cache_bytes = session.memory.cache_bytes()
        if self.keeps_host_store:
            point.retrieved_bytes, point.host_bytes = retrieved, session.host_bytes()
        point.memory_bytes = _memory(self.lm.device)
        point.video_tokens_per_layer = max(session.memory.video_tokens_per_layer())
        self.window, self.vision, self.separate, self.frames = [], [], [], []
        self.window_start = session.frames_seen


def run_policy(
    lm: VideoLM,
    policy: PolicySpec,
    settings: BenchSettings,
    memory_cap: int,
    on_frames: Callable[[int], None] = lambda n: None,
) -> list[Point]:
    """Stream one policy to its largest frame count, measuring at each requested count."""
    device = lm.device
    free_cached_memory(device)
    _reset_peak(device)
    run: PolicyRun | None = PolicyRun(lm, policy, settings, memory_cap, on_frames)
    limit = settings.full_max_frames if run.unbounded else None
    points: list[Point] = []
    stopped: tuple[str, str] | None = None  # (status, note) that every later frame count inherits
    for target in settings.frames:
        point = Point(policy.name, target)
        points.append(point)
        if stopped is None and limit is not None and target > limit:
            stopped = (SKIPPED, f"past --full-max-frames {limit}")
        if stopped is not None:
            point.status, point.note = stopped
            continue
        try:
            run.stream_to(target)
            retrieved = run.ask(point)
        except (MemoryError, torch.OutOfMemoryError) as exc:
            stopped = (OOM, (str(exc).splitlines() or ["out of memory"])[0])
        except StreamBound as exc:
            stopped = (OOM, str(exc))
        if stopped is not None:
            # Drop the cache (outside the except block, whose traceback still holds the prefill's
            # tensors) before anything else needs memory; the larger frame counts are out of reach.
            run = None
            free_cached_memory(device)
            point.status, point.note, point.ttft_ms, point.tpot_ms, point.retrieval_ms = *stopped, [], [], []
            continue
        run.record(point, retrieved)
    del run
    free_cached_memory(device)
    return points


def device_label(device: torch.device) -> str:
    """The hardware, in words, for tables and plots."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {psutil.cpu_count(logical=True)} vCPU, {torch.get_num_threads()} torch thread(s)"


def run_bench(lm: VideoLM, settings: BenchSettings, progress: bool = True) -> BenchResult:
    """Every policy at every frame count, with a progress bar over the frames streamed."""
    from tqdm import tqdm

    cap = settings.memory_cap if settings.memory_cap is not None else memory_cap_for(lm)
    warm_up(lm, settings)
    # Where the time goes (see hermes.bench.peak): measured before the stream, on a machine at rest.
    first = synthetic_chunk(
        np.random.default_rng(0), 0, settings.config.chunk_frames, settings.frame_size, settings.config.fps, 0
    )
    peaks, flops = gemm_peaks(lm.device), chunk_flops(lm, settings.config, first)
    largest = settings.frames[-1]
    limits = {
        p: min(largest, settings.full_max_frames or largest) if p.build(settings.config).capacity is None else largest
        for p in settings.policies
    }
    points: list[Point] = []
    with tqdm(total=sum(limits.values()), unit="frame", disable=not progress, file=sys.stderr) as bar:
        for policy in settings.policies:
            bar.set_description(policy.name)
            start = bar.n
            points += run_policy(lm, policy, settings, cap, bar.update)
            bar.update(start + limits[policy] - bar.n)  # a policy stopped early still fills its share
    chunk = settings.config.chunk_frames
    meta = {
        "model": lm.source,
        "architecture": lm.arch,
        "random_weights": lm.random_weights,
        "layers": lm.num_layers,
        "kv_layers": lm.kv_layers,  # fewer than the layers in a hybrid model, whose others hold states
        "state_bytes": lm.state_bytes,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "device": device_label(lm.device),
        "device_type": lm.device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "budget": settings.config.budget,
        "chunk_frames": chunk,
        "fps": settings.config.fps,
        "reindex": settings.config.reindex,
        "frame_size": settings.frame_size,
        "tokens_per_frame": _tokens_per_frame(lm, settings),
        "kv_bytes_per_token": lm.kv_bytes_per_token,
        "repeats": settings.repeats,
        "questions": list(settings.questions),
        "max_new_tokens": settings.max_new_tokens,
        "memory_cap_bytes": cap,
        "params": dict(settings.params),
        "static_frames": settings.static,
        "full_max_frames": settings.full_max_frames,
        "memory_kind": memory_kind(lm.device),
        "full_positions_note": "full runs past the model's max_position_embeddings (speed does not depend on it)",
        "gemm_peak_gflops": peaks,
        "chunk_flops": flops,
    }
    return BenchResult(meta, points)


def _tokens_per_frame(lm: VideoLM, settings: BenchSettings) -> float:
    """Video tokens per frame at the benchmark's frame size (chunk extras such as a newline included)."""
    n = max(lm.frame_multiple, settings.config.chunk_frames)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (n, settings.frame_size, settings.frame_size, 3), dtype=np.uint8)
    return round(lm.chunk_inputs(frames, settings.config.fps).num_tokens / n, 2)
