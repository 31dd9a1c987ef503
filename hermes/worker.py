"""The background thread that owns the model, and the live streams it serves.

One `ModelWorker` thread makes every model call of the app: chunk prefills and compressions,
building memories, and questions. Questions go ahead of queued chunks, so that a question waits
for at most the chunk in flight. A `LiveStream` is one viewer's stream: its memories (one
`StreamingSession` per policy, all sharing the read-only model), the source that feeds them (a
file read at a chosen pace by a reader thread, or webcam frames), its chat, and the numbers the
UI draws. The UI never touches a session: it reads the immutable `LiveView` that the worker
publishes after each job. No Gradio here, so all of it runs (and is tested) headless.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import numpy as np
from PIL import Image

from hermes.cache import MemorySnapshot
from hermes.config import HermesConfig
from hermes.engine import MAX_NEW_TOKENS, MAX_QUESTION_CHARS, AnswerUpdate, QuestionError, StreamingSession
from hermes.metrics import memory_reading
from hermes.models.base import VideoLM
from hermes.video import Chunk, Chunker, VideoError, VideoFile, VideoInfo, probe

log = logging.getLogger(__name__)

POLICIES = ("hermes", "fifo", "full")
COMPARE_POLICIES = ("hermes", "fifo")
SPEEDS: dict[str, float | None] = {"1x": 1.0, "2x": 2.0, "4x": 4.0, "max": None}
# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it.
MAX_CHUNK_BACKLOG = 2
ANSWER_TIMEOUT_S = 300.0
THUMB_SIDE = 360
HISTORY_LIMIT = 2000
ANSWER_LIMIT = 500
WEBCAM_ACTIVE_S = 3.0


class Priority(IntEnum):
    """Job order in the worker queue: lower runs first; FIFO within a priority."""

    CONTROL = 0  # build or drop a stream's memories: before that stream's other jobs
    QUESTION = 1  # ahead of queued chunks
    CHUNK = 2


class JobCancelled(Exception):
    """Given to a job's `on_error` when the job was dropped from the queue before it ran."""


class Busy(RuntimeError):
    """Admission control refused a new stream; the message says to try again later."""


@dataclass(eq=False)
class Job:
    """A callable queued for the model thread, on behalf of `owner` (a stream's key)."""

    fn: Callable[[], object]
    priority: Priority
    owner: str
    on_error: Callable[[BaseException], None] | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def wait_ms(self) -> float | None:
        """Time from submission to the start of the run: the wait for the job in flight."""
        return None if self.started_at is None else (self.started_at - self.enqueued_at) * 1000.0


class ModelWorker:
    """One daemon thread that runs jobs from a priority queue, one at a time.

    A job that raises is logged and reported to its `on_error`; the thread carries on with the
    next job, so one stream's failure never stops the others.
    """

    def __init__(self, name: str = "hermes-model") -> None:
        self.name = name
        self.errors = 0
        self._heap: list[tuple[int, int, Job]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._current: Job | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        fn: Callable[[], object],
        priority: Priority = Priority.CHUNK,
        owner: str = "",
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Job:
        """Queue `fn`; it runs on the model thread after every job of a lower priority value."""
        job = Job(fn, Priority(priority), owner, on_error)
        with self._cond:
            if self._stopped:
                raise RuntimeError("the model worker has been stopped")
            heapq.heappush(self._heap, (job.priority, next(self._seq), job))
            if self._thread is None or not self._thread.is_alive():
                # First job, or (defensively) a thread that died: start a fresh one.
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job

    def cancel(self, owner: str) -> int:
        """Drop the queued (not yet running) jobs of `owner`; returns how many."""
        with self._cond:
            dropped = [job for _, _, job in self._heap if job.owner == owner]
            if dropped:
                self._heap = [entry for entry in self._heap if entry[2].owner != owner]
                heapq.heapify(self._heap)
                self._cond.notify_all()
        for job in dropped:
            self._report(job, JobCancelled())
            job.done.set()
        return len(dropped)

    def backlog(self, owner: str, priority: Priority | None = None) -> int:
        """Jobs of `owner` (of one priority, if given) queued or running."""
        with self._cond:
            return self._backlog(owner, priority)

    def _backlog(self, owner: str, priority: Priority | None) -> int:
        jobs = [job for _, _, job in self._heap]
        if self._current is not None:
            jobs.append(self._current)
        return sum(1 for j in jobs if j.owner == owner and (priority is None or j.priority == priority))

    def wait_backlog(self, owner: str, priority: Priority | None, below: int, timeout: float) -> bool:
        """Wait until `backlog(owner, priority) < below`; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._backlog(owner, priority) < below, timeout)

    def wait_idle(self, owner: str | None = None, timeout: float = 60.0) -> bool:
        """Wait until nothing of `owner` (of anyone, if None) is queued or running."""
        with self._cond:

            def idle() -> bool:
                if owner is None:
                    return not self._heap and self._current is None
                return self._backlog(owner, None) == 0

            return self._cond.wait_for(idle, timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Drop queued jobs, let the running one finish, and end the thread."""
        with self._cond:
            self._stopped = True
            dropped = [job for _, _, job in self._heap]
            self._heap = []
            self._cond.notify_all()
        for job in dropped:
            self._report(job, JobCancelled())
            job.done.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._heap or self._stopped)
                if not self._heap:
                    return
                job = heapq.heappop(self._heap)[2]
                self._current = job
                job.started_at = time.monotonic()
            try:
                job.fn()
            except Exception as exc:
                self.errors += 1
                log.exception("job of %r failed", job.owner)
                self._report(job, exc)
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()
                job.done.set()

    @staticmethod
    def _report(job: Job, exc: BaseException) -> None:
        if job.on_error is None:
            return
        try:
            job.on_error(exc)
        except Exception:
            log.exception("on_error of a job of %r failed", job.owner)


# -- one viewer's stream ----------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSettings:
    """What a stream's memories are built with; applied when the stream is (re)started."""

    policy: str = "hermes"
    budget: int = 1024
    chunk_frames: int = 4
    fps: float = 1.0
    reindex: str = "lazy"
    compare: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
        self.config()  # HermesConfig validates the numbers, with clear messages

    @property
    def policies(self) -> tuple[str, ...]:
        """The policies to run: HERMES and FIFO side by side in compare mode."""
        return COMPARE_POLICIES if self.compare else (self.policy,)

    def config(self) -> HermesConfig:
        return HermesConfig(
            budget=int(self.budget), chunk_frames=int(self.chunk_frames), fps=float(self.fps), reindex=self.reindex
        )


@dataclass(frozen=True)
class ChunkRecord:
    """One row of a stream's metrics history, taken after a chunk was ingested."""

    at_s: float  # wall-clock seconds since the stream started
    frames_seen: int
    stream_time_s: float
    cache_bytes: dict[str, int]
    prefill_ms: dict[str, float]
    compress_ms: dict[str, float]
    rss_bytes: int
    gpu_allocated_bytes: int | None


@dataclass(frozen=True)
class AnswerRecord:
    """A finished answer of one policy, with its timings."""

    policy: str
    question: str
    text: str
    ttft_ms: float | None
    tpot_ms: float | None
    wait_ms: float
    frames_seen: int
    frames_in_memory: int
    tokens: int
    stream_time_s: float


@dataclass(frozen=True)
class LiveView:
    """Everything the UI draws, as published after the last job; never mutated."""

    version: int
    settings: StreamSettings
    snapshots: dict[str, MemorySnapshot] = field(default_factory=dict)
    frame_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # tokens per frame index at prefill
    frames_seen: int = 0
    stream_time_s: float = 0.0
    chunks: int = 0
    frame_image: np.ndarray | None = None  # the last frame the model consumed, downscaled
    history: tuple[ChunkRecord, ...] = ()
    answers: tuple[AnswerRecord, ...] = ()
    frames_in_memory: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamStatus:
    """What the stream is doing right now (cheap to read on every UI tick)."""

    state: str  # idle | starting | streaming | paused | finishing | finished | stopped | error | closed
    source: str | None
    speed: str
    frames_read: int
    queued_chunks: int
    dropped_frames: int
    error: str | None


@dataclass
class AnswerEvent:
    """One update of one policy's answer; `error` set (and text empty) when the question failed."""

    policy: str
    text: str = ""
    done: bool = False
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    wait_ms: float = 0.0
    frames_seen: int = 0
    frames_in_memory: int = 0
    tokens: int = 0
    error: str | None = None

    @classmethod
    def from_update(cls, policy: str, update: AnswerUpdate, wait_ms: float) -> AnswerEvent:
        # The engine mutates one AnswerUpdate as it decodes: copy the fields out.
        return cls(
            policy=policy,
            text=update.text,
            done=update.done,
            ttft_ms=update.ttft_ms,
            tpot_ms=update.tpot_ms,
            wait_ms=wait_ms,
            frames_seen=update.frames_seen,
            frames_in_memory=update.frames_in_memory,
            tokens=update.tokens,
        )


class AnswerTicket:
    """The answer to one question, streamed from the model thread to whoever reads `events()`."""

    def __init__(self, question: str) -> None:
        self.question = question
        self.enqueued_at = time.monotonic()
        self._queue: queue.Queue[AnswerEvent | None] = queue.Queue()

    def put(self, event: AnswerEvent) -> None:
        self._queue.put(event)

    def fail(self, message: str) -> None:
        self._queue.put(AnswerEvent(policy="", done=True, error=message))

    def close(self) -> None:
        self._queue.put(None)

    def events(self, timeout: float = ANSWER_TIMEOUT_S) -> Iterator[AnswerEvent]:
        """Yield the answer's updates until it is complete (or failed)."""
        while True:
            try:
                event = self._queue.get(timeout=timeout)
            except queue.Empty:
                yield AnswerEvent(
                    policy="", done=True, error=f"No answer after {timeout:.0f} s: the server is overloaded."
                )
                return
            if event is None:
                return
            yield event


def validate_question(question: str | None) -> str:
    """The question, stripped; QuestionError for an empty or over-long one (before any queueing)."""
    q = (question or "").strip()
    if not q:
        raise QuestionError("The question is empty: type something to ask about the video.")
    if len(q) > MAX_QUESTION_CHARS:
        raise QuestionError(
            f"The question is {len(q):,} characters long; the limit is {MAX_QUESTION_CHARS:,} characters."
        )
    return q


def thumbnail(image: np.ndarray, side: int = THUMB_SIDE) -> np.ndarray:
    """A copy of an RGB frame whose longer side is at most `side` pixels."""
    h, w = image.shape[:2]
    if max(h, w) <= side:
        return image.copy()
    scale = side / max(h, w)
    return np.asarray(Image.fromarray(image).resize((max(1, round(w * scale)), max(1, round(h * scale)))))


def frames_in_memory(snapshot: MemorySnapshot) -> int:
    """Distinct frames of which some layer still keeps at least one token."""
    frames = np.concatenate([layer.frames for layer in snapshot.layers]) if snapshot.layers else np.zeros(0)
    return int(np.unique(frames[frames >= 0]).size)


class LiveStream:
    """One viewer's stream: source, memories, chat and published views.

    Control methods (`start_file`, `push_frame`, `pause`, `stop`, `reset`, `ask`, `close`) are
    called from UI threads and return at once; model work goes to the shared `ModelWorker`.
    `key` names this stream's jobs in the worker queue.
    """

    def __init__(
        self,
        worker: ModelWorker,
        lm: VideoLM,
        settings: StreamSettings | None = None,
        key: str = "stream",
        admit: Callable[[LiveStream], None] | None = None,
    ) -> None:
        self.worker = worker
        self.lm = lm
        self.key = key
        self._admit = admit
        self._lock = threading.RLock()
        self._generation = 0
        self._sessions: dict[str, StreamingSession] = {}  # only the model thread touches these
        self._resume = threading.Event()
        self._resume.set()
        self._reader: threading.Thread | None = None
        self._stop_reader = threading.Event()
        self._flush_on_stop = True
        self._webcam: Chunker | None = None
        self._last_webcam = 0.0
        self._sessions_gen = -1
        self._source: str | None = None
        self._state = "starting"
        self._error: str | None = None
        self._frames_read = 0
        self._dropped = 0
        self._started = time.monotonic()
        self._notices: list[str] = []
        self.settings = settings or StreamSettings()
        self.speed = "1x"
        self._view = LiveView(version=0, settings=self.settings)
        self.chat: list[dict] = []
        self.closed = False
        self.last_active = time.monotonic()
        self.reset()

    # -- control ----------------------------------------------------------------------------
    def touch(self) -> None:
        """Mark the stream as in use (idle streams are reaped by the registry)."""
        self.last_active = time.monotonic()

    def reset(self, settings: StreamSettings | None = None) -> None:
        """Stop the source and start over with fresh memories, chat and plots.

        `settings` (default: the current ones) take effect here.
        """
        settings = settings or self.settings
        self._stop_source(flush=False)
        with self._lock:
            self._check_open()
            self._generation += 1
            gen = self._generation
            self.settings = settings
            self.chat = []
            self._source = None
            self._state = "starting"
            self._error = None
            self._frames_read = 0
            self._dropped = 0
            self._started = time.monotonic()
            self._resume.set()
            self._webcam = None
            self._notices = []
            self._view = LiveView(version=self._view.version + 1, settings=settings)
        self.worker.cancel(self.key)
        self.worker.submit(
            lambda: self._build(gen, settings), Priority.CONTROL, self.key, lambda exc: self._on_job_error(gen, exc)
        )

    def start_file(self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None) -> VideoInfo:
        """Start streaming a video file from its beginning into fresh memories.

        Raises VideoError (with the file name) at once for a file that cannot be decoded, and
        Busy when admission control refuses another stream.
        """
        info = probe(path)
        if self._admit is not None:
            self._admit(self)
        self.reset(settings)
        self.set_speed(speed)
        with self._lock:
            gen = self._generation
            self._source = info.name
            self._state = "streaming"
            self._stop_reader = threading.Event()
            self._flush_on_stop = True
            args = (gen, Path(path), self._stop_reader)
            self._reader = threading.Thread(target=self._read_file, args=args, name=f"read-{self.key}", daemon=True)
            self._reader.start()
        return info

    def push_frame(self, image: np.ndarray, settings: StreamSettings | None = None) -> None:
        """Feed one webcam frame. Unless a file is playing or a webcam stream exists (running or
        stopped with the Stop control), the frame starts a webcam stream in fresh memories.

        Frames are thinned to the stream's fps. A chunk that finds the model still busy with
        MAX_CHUNK_BACKLOG chunks is dropped: a live source cannot wait.
        """
        # Gradio runs one stream event per session at a time, so this check does not race.
        if self._source != "webcam" and self._state not in ("streaming", "paused"):
            if self._admit is not None:
                self._admit(self)
            self.reset(settings)
            with self._lock:
                self._source = "webcam"
                self._state = "streaming"
                self._webcam = Chunker(self.settings.chunk_frames, fps=self.settings.fps)
        with self._lock:
            if self._webcam is None or self._state != "streaming":
                return
            self._last_webcam = time.monotonic()
            chunk = self._webcam.push(image)
            self._frames_read = self._webcam.next_index + self._webcam.pending
            gen = self._generation
        if chunk is None:
            return
        if self.worker.backlog(self.key, Priority.CHUNK) >= MAX_CHUNK_BACKLOG:
            with self._lock:
                self._dropped += chunk.n_real
            return
        self._submit_chunk(gen, chunk)

    def set_speed(self, speed: str) -> None:
        """Pace of a file stream: "1x" (real time), "2x", "4x" or "max"; applies at once."""
        if speed not in SPEEDS:
            raise ValueError(f"speed must be one of {', '.join(SPEEDS)}; got {speed!r}")
        self.speed = speed

    def pause(self) -> None:
        """Hold the source; chunks already queued still reach the model."""
        with self._lock:
            if self._state == "streaming":
                self._resume.clear()
                self._state = "paused"

    def resume(self) -> None:
        with self._lock:
            if self._state == "paused":
                self._state = "streaming"
                self._resume.set()

    def stop(self) -> None:
        """End the source; the frames read so far reach the model, and questions still work."""
        with self._lock:
            if self._state in ("streaming", "paused"):
                self._state = "stopped"
        self._stop_source(flush=True)

    def close(self) -> None:
        """Free everything: the source, queued jobs and (on the model thread) the memories."""
        if self.closed:
            return
        self._stop_source(flush=False)
        with self._lock:
            self.closed = True
            self._generation += 1
            self._state = "closed"
        self.worker.cancel(self.key)

        def drop() -> None:
            self._sessions = {}

        self.worker.submit(drop, Priority.CONTROL, self.key)

    def ask(self, question: str, max_new_tokens: int = MAX_NEW_TOKENS) -> AnswerTicket:
        """Queue a question ahead of pending chunks; read the answer from the ticket's events().

        Raises QuestionError at once for an empty or over-long question.
        """
        q = validate_question(question)
        with self._lock:
            self._check_open()
            gen = self._generation
        self.touch()
        ticket = AnswerTicket(q)

        def on_error(exc: BaseException) -> None:
            # Failures inside the job reach the ticket from _answer itself; only a dropped job lands here.
            if isinstance(exc, JobCancelled):
                ticket.fail("The stream was reset before this question's turn: ask again.")
                ticket.close()

        self.worker.submit(lambda: self._answer(gen, ticket, max_new_tokens), Priority.QUESTION, self.key, on_error)
        return ticket

    # -- reading ----------------------------------------------------------------------------
    def view(self) -> LiveView:
        """The last published view (its `version` changes whenever anything drawn changed)."""
        return self._view

    def status(self) -> StreamStatus:
        with self._lock:
            state = self._state
            queued = self.worker.backlog(self.key, Priority.CHUNK)
            if state == "streaming" and self._source == "webcam":
                if time.monotonic() - self._last_webcam > WEBCAM_ACTIVE_S:
                    state = "waiting for the webcam"
            elif state in ("finished", "stopped") and queued:
                state = "finishing"
            return StreamStatus(
                state=state,
                source=self._source,
                speed=self.speed,
                frames_read=self._frames_read,
                queued_chunks=queued,
                dropped_frames=self._dropped,
                error=self._error,
            )

    @property
    def running(self) -> bool:
        """Whether a source is feeding this stream (for admission control)."""
        return self.status().state in ("streaming", "paused", "finishing")

    def pop_notices(self) -> list[str]:
        """Messages for the viewer (errors of this stream's jobs), each returned once."""
        with self._lock:
            out, self._notices = self._notices, []
            return out

    def chat_messages(self) -> list[dict]:
        with self._lock:
            return [dict(m) for m in self.chat]

    def add_message(self, message: dict) -> int:
        """Append a chat message; returns its index, for `set_message`."""
        with self._lock:
            self.chat.append(message)
            return len(self.chat) - 1

    def set_message(self, index: int, message: dict) -> None:
        with self._lock:
            if index < len(self.chat):  # a reset may have cleared the chat meanwhile
                self.chat[index] = message

    def metrics(self) -> dict:
        """Plain-data numbers for the API and the UI's details panel."""
        view, status = self.view(), self.status()
        last = view.history[-1] if view.history else None
        reading = memory_reading(self.lm.device)
        return {
            "model": self.lm.source,
            "random_weights": self.lm.random_weights,
            "state": status.state,
            "source": status.source,
            "speed": status.speed,
            "error": status.error,
            "settings": dataclasses.asdict(view.settings),
            "frames_read": status.frames_read,
            "frames_seen": view.frames_seen,
            "stream_time_s": view.stream_time_s,
            "chunks": view.chunks,
            "queued_chunks": status.queued_chunks,
            "dropped_frames": status.dropped_frames,
            "frames_in_memory": dict(view.frames_in_memory),
            "cache_bytes": {p: s.cache_bytes for p, s in view.snapshots.items()},
            "video_tokens_per_layer": {
                p: [int((layer.stream_ids >= 0).sum()) for layer in s.layers] for p, s in view.snapshots.items()
            },
            "last_chunk": None if last is None else {"prefill_ms": last.prefill_ms, "compress_ms": last.compress_ms},
            "rss_bytes": reading.rss_bytes,
            "gpu_allocated_bytes": reading.gpu_allocated_bytes,
            "answers": [dataclasses.asdict(a) for a in view.answers[-20:]],
        }

    # -- internals: UI threads ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this stream was closed (its tab went away)")

    def _stop_source(self, flush: bool) -> None:
        reader = self._reader
        self._flush_on_stop = flush
        self._stop_reader.set()
        self._resume.set()
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=10.0)
        self._reader = None
        with self._lock:
            webcam, self._webcam = self._webcam, None
            gen = self._generation
        if webcam is not None and flush:
            tail = webcam.flush(pad_to=self.lm.frame_multiple)
            if tail is not None:
                self._submit_chunk(gen, tail)

    # -- internals: the reader thread -----------------------------------------------------------
    def _read_file(self, gen: int, path: Path, stop: threading.Event) -> None:
        settings = self.settings
        chunker = Chunker(settings.chunk_frames)
        try:
            with VideoFile(path) as video:
                prev_t: float | None = None
                for frame in video.frames(settings.fps):
                    speed = SPEEDS[self.speed]
                    due = time.monotonic() + (frame.t - prev_t) / speed if prev_t is not None and speed else 0.0
                    if not self._wait(due, stop):  # also where a paused stream waits
                        break
                    prev_t = frame.t
                    chunk = chunker.push(frame)
                    with self._lock:
                        self._frames_read += 1
                    if chunk is not None and not self._enqueue_paced(gen, chunk, stop):
                        break
                else:
                    with self._lock:
                        if self._generation == gen and self._state in ("streaming", "paused"):
                            self._state = "finished"
        except VideoError as exc:
            self._fail(gen, str(exc))
            return
        except Exception as exc:  # keep the process alive whatever the decoder does
            log.exception("reading %s failed", path)
            self._fail(gen, f"Reading {path.name} failed: {exc}")
            return
        if self._flush_on_stop or not stop.is_set():
            tail = chunker.flush(pad_to=self.lm.frame_multiple)
            if tail is not None:
                self._submit_chunk(gen, tail)

    def _wait(self, until: float, stop: threading.Event) -> bool:
        """Sleep until the monotonic time `until`, longer while paused; False once stopped."""
        while not stop.is_set():
            if not self._resume.is_set():
                paused_at = time.monotonic()
                self._resume.wait(0.1)
                until += time.monotonic() - paused_at  # pausing shifts the stream's clock
                continue
            left = until - time.monotonic()
            if left <= 0:
                return True
            stop.wait(min(left, 0.1))
        return False

    def _enqueue_paced(self, gen: int, chunk: Chunk, stop: threading.Event) -> bool:
        """Queue a chunk once the backlog allows; False if stopped while waiting."""
        while not self.worker.wait_backlog(self.key, Priority.CHUNK, MAX_CHUNK_BACKLOG, 0.1):
            if stop.is_set():
                return False
        self._submit_chunk(gen, chunk)
        return True

    def _fail(self, gen: int, message: str) -> None:
        with self._lock:
            if self._generation != gen:
                return
            self._state = "error"
            self._error = message
            self._notices.append(message)
            self._flush_on_stop = False
            self._stop_reader.set()

    # -- internals: jobs on the model thread ----------------------------------------------------
    def _submit_chunk(self, gen: int, chunk: Chunk) -> None:
        self.worker.submit(
            lambda: self._ingest(gen, chunk), Priority.CHUNK, self.key, lambda exc: self._on_job_error(gen, exc)
        )

    def _on_job_error(self, gen: int, exc: BaseException) -> None:
        # A job of an older generation (before a reset) failing must not stop the new stream.
        if not isinstance(exc, JobCancelled):
            self._fail(
                gen, f"The model failed on this stream ({type(exc).__name__}: {exc}); press Reset to start over."
            )

    def _build(self, gen: int, settings: StreamSettings) -> None:
        if gen != self._generation:
            return
        config = settings.config()
        self._sessions = {p: StreamingSession(self.lm, config, policy=p) for p in settings.policies}
        self._sessions_gen = gen
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        with self._lock:
            if gen == self._generation:
                if self._state == "starting":
                    self._state = "idle"
                self._view = dataclasses.replace(self._view, version=self._view.version + 1, snapshots=snapshots)

    def _ingest(self, gen: int, chunk: Chunk) -> None:
        if gen != self._generation or gen != self._sessions_gen:
            return
        reports = {p: s.ingest(chunk) for p, s in self._sessions.items()}
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        report = next(iter(reports.values()))
        reading = memory_reading(self.lm.device)
        # Tokens each frame had when prefilled: the denominator of the retained-token map.
        multiple = self.lm.frame_multiple
        prefilled = -(-chunk.num_frames // multiple) * multiple
        per_frame = np.full(chunk.n_real, report.tokens / prefilled)
        record = ChunkRecord(
            at_s=time.monotonic() - self._started,
            frames_seen=report.frames_seen,
            stream_time_s=report.stream_time_s,
            cache_bytes={p: r.cache_bytes for p, r in reports.items()},
            prefill_ms={p: r.prefill_ms for p, r in reports.items()},
            compress_ms={p: r.compress_ms for p, r in reports.items()},
            rss_bytes=reading.rss_bytes,
            gpu_allocated_bytes=reading.gpu_allocated_bytes,
        )
        image = thumbnail(chunk.frames[chunk.n_real - 1])
        with self._lock:
            if gen != self._generation:
                return
            v = self._view
            self._view = dataclasses.replace(
                v,
                version=v.version + 1,
                snapshots=snapshots,
                frame_tokens=np.concatenate([v.frame_tokens, per_frame]),
                frames_seen=report.frames_seen,
                stream_time_s=report.stream_time_s,
                chunks=v.chunks + 1,
                frame_image=image,
                history=(*v.history, record)[-HISTORY_LIMIT:],
                frames_in_memory={p: frames_in_memory(s) for p, s in snapshots.items()},
            )

    def _answer(self, gen: int, ticket: AnswerTicket, max_new_tokens: int) -> None:
        wait_ms = (time.monotonic() - ticket.enqueued_at) * 1000.0
        records: list[AnswerRecord] = []
        try:
            if gen != self._generation:
                raise QuestionError("The stream was reset before this question's turn: ask again.")
            if gen != self._sessions_gen or self._view.frames_seen == 0:
                raise QuestionError(self._no_video_message())
            for policy, session in self._sessions.items():
                for update in session.ask_stream(ticket.question, max_new_tokens):
                    ticket.put(AnswerEvent.from_update(policy, update, wait_ms))
                    if update.done:
                        records.append(
                            AnswerRecord(
                                policy=policy,
                                question=update.question,
                                text=update.text,
                                ttft_ms=update.ttft_ms,
                                tpot_ms=update.tpot_ms,
                                wait_ms=wait_ms,
                                frames_seen=update.frames_seen,
                                frames_in_memory=update.frames_in_memory,
                                tokens=update.tokens,
                                stream_time_s=update.at_s,
                            )
                        )
        except QuestionError as exc:
            ticket.fail(str(exc))
        except Exception as exc:
            ticket.fail(f"The model failed while answering ({type(exc).__name__}: {exc}).")
            raise
        finally:
            ticket.close()
            if records:
                with self._lock:
                    if gen == self._generation:
                        v = self._view
                        answers = (*v.answers, *records)[-ANSWER_LIMIT:]
                        self._view = dataclasses.replace(v, version=v.version + 1, answers=answers)

    def _no_video_message(self) -> str:
        status = self.status()
        if status.state in ("streaming", "paused", "finishing") or status.queued_chunks:
            s = self.settings
            return (
                f"The first chunk has not reached the model yet (it holds {s.chunk_frames} frames at {s.fps:g} fps, "
                f"about {s.chunk_frames / s.fps:.0f} s of video): ask again in a moment."
            )
        return "No video yet: start the sample clip, upload a video or turn on the webcam, then ask."


class StreamRegistry:
    """The live streams of all viewers, keyed by session, with admission control.

    `max_streams` caps the streams that have a running source at once; starting one more raises
    Busy. Streams idle for `idle_timeout_s` (no calls, no running source) are closed, for API
    clients that never say goodbye.
    """

    def __init__(
        self,
        lm: VideoLM,
        worker: ModelWorker | None = None,
        settings: StreamSettings | None = None,
        max_streams: int = 4,
        idle_timeout_s: float = 1800.0,
    ) -> None:
        self.lm = lm
        self.worker = worker or ModelWorker()
        self.settings = settings or StreamSettings()
        self.max_streams = max_streams
        self.idle_timeout_s = idle_timeout_s
        self._streams: dict[str, LiveStream] = {}
        self._lock = threading.Lock()

    def get(self, key: str, create: bool = True) -> LiveStream | None:
        """The stream of session `key`, created (with the default settings) on first use."""
        self.reap_idle()
        with self._lock:
            stream = self._streams.get(key)
            if stream is None and create:
                stream = LiveStream(self.worker, self.lm, self.settings, key=key, admit=self.admit)
                self._streams[key] = stream
        if stream is not None:
            stream.touch()
        return stream

    def close(self, key: str) -> bool:
        """Close and forget session `key`'s stream (its tab closed); False if there was none."""
        with self._lock:
            stream = self._streams.pop(key, None)
        if stream is None:
            return False
        stream.close()
        return True

    def admit(self, stream: LiveStream) -> None:
        """Raise Busy if `max_streams` other streams already have a running source."""
        with self._lock:
            others = [s for s in self._streams.values() if s is not stream]
        running = sum(1 for s in others if s.running)
        if running >= self.max_streams:
            raise Busy(
                f"Busy: this server runs at most {self.max_streams} stream(s) at once, and all are in use. "
                "Try again in a minute."
            )

    def reap_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [k for k, s in self._streams.items() if now - s.last_active > self.idle_timeout_s and not s.running]
        for key in idle:
            self.close(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        """Close every stream and stop the model thread."""
        with self._lock:
            keys = list(self._streams)
        for key in keys:
            self.close(key)
        self.worker.stop()
