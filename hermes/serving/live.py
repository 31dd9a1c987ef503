"""One viewer's live stream: its source, memories, chat and the numbers the UI draws.

A `LiveStream` holds one `StreamingSession` per policy (two in compare mode), all over the one
read-only model, and the source that feeds them: a file read at a chosen pace by a reader thread,
or webcam frames. All model work goes to the shared `ModelWorker` (hermes.serving.worker) as jobs, and
answers come back on tickets (hermes.serving.answers). The UI never touches a session: it reads the
immutable `LiveView` that the worker publishes after each job. No Gradio here, so all of it runs
(and is tested) headless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from hermes.engine.chunk import Chunk
from hermes.engine.metrics import memory_reading
from hermes.engine.session import MAX_NEW_TOKENS, QuestionError, StreamingSession
from hermes.memory.cache import MemorySnapshot
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.serving.admission import full_slot_limit
from hermes.serving.answers import AnswerEvent, AnswerTicket, job_error_message, validate_question
from hermes.serving.worker import JobCancelled, ModelWorker, Priority
from hermes.video.chunking import Chunker
from hermes.video.decoding import VideoError, VideoFile, VideoInfo, probe

log = logging.getLogger(__name__)

POLICIES = ("hermes", "fifo", "full")
COMPARE_POLICIES = ("hermes", "fifo")
SPEEDS: dict[str, float | None] = {"1x": 1.0, "2x": 2.0, "4x": 4.0, "max": None}
# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it.
MAX_CHUNK_BACKLOG = 2
THUMB_SIDE = 360
HISTORY_LIMIT = 2000
ANSWER_LIMIT = 500
WEBCAM_ACTIVE_S = 3.0


@dataclass(frozen=True)
class StreamSettings:
    """What a stream's memories are built with; applied when the stream is (re)started."""

    policy: str = "hermes"
    budget: int = 1024
    chunk_frames: int = 4
    fps: float = 1.0
    reindex: str = "lazy"
    compare: bool = False
    # Positions the memories may use (None: the model's max_position_embeddings). The full policy
    # stops there; lower it to bound full streams sooner.
    max_positions: int | None = None

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
            budget=int(self.budget),
            chunk_frames=int(self.chunk_frames),
            fps=float(self.fps),
            reindex=self.reindex,
            max_positions=self.max_positions,
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
    answers: tuple[AnswerEvent, ...] = ()
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
    note: str | None = None  # why the stream stopped by itself, when it was not an error


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
    `key` names this stream's jobs in the worker queue. `admit(stream, settings)`, if given, is
    asked before a source starts: it raises Busy to refuse, or sets `reserved_bytes`, which the
    stream gives back (to 0) on reset and close.
    """

    def __init__(
        self,
        worker: ModelWorker,
        lm: VideoLM,
        settings: StreamSettings | None = None,
        key: str = "stream",
        admit: Callable[[LiveStream, StreamSettings], None] | None = None,
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
        self._note: str | None = None
        self._memory_failed = False  # a model job failed: the memories may be half-updated
        self._full_limit: int | None = None  # slots per layer at which a full stream stops
        self._frames_read = 0
        self._dropped = 0
        self._started = time.monotonic()
        self._notices: list[str] = []
        self.settings = settings or StreamSettings()
        self.speed = "1x"
        self._view = LiveView(version=0, settings=self.settings)
        self.chat: list[dict] = []
        self.closed = False
        self.reserved_bytes = 0
        self.last_active = time.monotonic()
        self._reset(self.settings)

    # -- control ----------------------------------------------------------------------------
    def touch(self) -> None:
        """Mark the stream as in use (idle streams are reaped by the registry)."""
        self.last_active = time.monotonic()

    def reset(self, settings: StreamSettings | None = None) -> None:
        """Stop the source and start over with fresh memories, chat and plots.

        `settings` (default: the current ones) take effect here. An answer being decoded stops
        at its next token. The memory reserved by admission control is given back.
        """
        self._reset(settings or self.settings)
        self.reserved_bytes = 0

    def _reset(self, settings: StreamSettings) -> None:
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
            self._note = None
            self._memory_failed = False
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
        settings = settings or self.settings
        info = probe(path)
        self.set_speed(speed)
        if self._admit is not None:
            self._admit(self, settings)
        self._reset(settings)
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
            settings = settings or self.settings
            if self._admit is not None:
                self._admit(self, settings)
            self._reset(settings)
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
                self._dropped += chunk.num_frames
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
            self._generation += 1  # an answer being decoded stops at its next token
            self._state = "closed"
        self.reserved_bytes = 0
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
        ticket = AnswerTicket(q, gen)

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
                note=self._note,
            )

    @property
    def running(self) -> bool:
        """Whether a source is feeding this stream (for admission control)."""
        return self.status().state in ("streaming", "paused", "finishing")

    def pop_notices(self) -> list[str]:
        """Messages for the viewer (errors, and why a stream stopped by itself), each returned once."""
        with self._lock:
            out, self._notices = self._notices, []
            return out

    def chat_messages(self) -> list[dict]:
        with self._lock:
            return [dict(m) for m in self.chat]

    def add_message(self, message: dict, generation: int | None = None) -> int:
        """Append a chat message; returns its index, for `set_message`.

        With `generation` (an answer ticket's), a message from before a reset is dropped (-1):
        the chat it belonged to is gone.
        """
        with self._lock:
            if generation is not None and generation != self._generation:
                return -1
            self.chat.append(message)
            return len(self.chat) - 1

    def set_message(self, index: int, message: dict, generation: int | None = None) -> None:
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            if 0 <= index < len(self.chat):
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
            "note": status.note,
            "reserved_bytes": self.reserved_bytes,
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
            tail = webcam.flush()
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
        except VideoError as exc:
            self._fail(gen, str(exc))
            return
        except Exception as exc:  # keep the process alive whatever the decoder does
            log.exception("reading %s failed", path)
            self._fail(gen, f"Reading {path.name} failed: {exc}")
            return
        if self._flush_on_stop or not stop.is_set():
            tail = chunker.flush()
            if tail is not None:
                self._submit_chunk(gen, tail)
        # Only now, with the last chunk queued: "finished" with nothing queued means done.
        with self._lock:
            if not stop.is_set() and self._generation == gen and self._state in ("streaming", "paused"):
                self._state = "finished"

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

    def _fail(self, gen: int, message: str, memory_failed: bool = False) -> None:
        with self._lock:
            if self._generation != gen:
                return
            self._state = "error"
            self._error = message
            self._memory_failed = self._memory_failed or memory_failed
            self._notices.append(message)
            self._flush_on_stop = False
            self._stop_reader.set()
            self._resume.set()
            self._webcam = None

    # -- internals: jobs on the model thread ----------------------------------------------------
    def _submit_chunk(self, gen: int, chunk: Chunk) -> None:
        self.worker.submit(
            lambda: self._ingest(gen, chunk), Priority.CHUNK, self.key, lambda exc: self._on_job_error(gen, exc)
        )

    def _on_job_error(self, gen: int, exc: BaseException) -> None:
        # A job of an older generation (before a reset) failing must not stop the new stream.
        if not isinstance(exc, JobCancelled):
            self._fail(gen, job_error_message(exc, "on this stream", " Press Reset to start over."), True)

    def _build(self, gen: int, settings: StreamSettings) -> None:
        if gen != self._generation:
            return
        config = settings.config()
        self._sessions = {}  # free the old memories before building the new ones
        self._sessions = {p: StreamingSession(self.lm, config, policy=p) for p in settings.policies}
        self._full_limit = full_slot_limit(self.lm, config) if "full" in self._sessions else None
        self._sessions_gen = gen
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        with self._lock:
            if gen == self._generation:
                if self._state == "starting":
                    self._state = "idle"
                self._view = dataclasses.replace(self._view, version=self._view.version + 1, snapshots=snapshots)

    def _ingest(self, gen: int, chunk: Chunk) -> None:
        # Skip chunks of an older generation, of a memory that failed, or past the full bound.
        if gen != self._generation or gen != self._sessions_gen or self._memory_failed or self._full_at_limit():
            return
        reports = {p: s.ingest(chunk) for p, s in self._sessions.items()}
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        report = next(iter(reports.values()))
        reading = memory_reading(self.lm.device)
        # Tokens each frame had when prefilled: the denominator of the retained-token map.
        multiple = self.lm.frame_multiple
        prefilled = -(-chunk.num_frames // multiple) * multiple
        per_frame = np.full(chunk.num_frames, report.tokens / prefilled)
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
        image = thumbnail(chunk.pixels[-1])
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
        if self._full_at_limit():
            self._stop_at_limit(gen)

    def _full_at_limit(self) -> bool:
        """Whether a full cache cannot take another chunk like the last one (model thread only)."""
        session = self._sessions.get("full")
        if session is None or self._full_limit is None or not session.chunks:
            return False
        return session.memory.slots + session.chunks[-1].tokens > self._full_limit

    def _stop_at_limit(self, gen: int) -> None:
        mb = self._sessions["full"].memory.cache_bytes() / 2**20
        note = (
            f"The full cache reached its bound ({self._full_limit:,} video tokens per layer, {mb:.1f} MB: the "
            "positions the model has left), so the stream stopped here. Questions still work; pick hermes or "
            "fifo, whose memory stays fixed, to stream further."
        )
        with self._lock:
            if gen != self._generation or self._state not in ("streaming", "paused"):
                return
            self._state = "stopped"
            self._note = note
            self._notices.append(note)
            self._flush_on_stop = False
            self._stop_reader.set()
            self._resume.set()
            self._webcam = None

    def _answer(self, gen: int, ticket: AnswerTicket, max_new_tokens: int) -> None:
        wait_ms = (time.monotonic() - ticket.enqueued_at) * 1000.0
        records: list[AnswerEvent] = []
        try:
            if gen != self._generation:
                raise QuestionError("The stream was reset before this question's turn: ask again.")
            if self._memory_failed:
                raise QuestionError(f"{self._error} (No answers from a memory that failed mid-update.)")
            if gen != self._sessions_gen or self._view.frames_seen == 0:
                raise QuestionError(self._no_video_message())
            for policy, session in self._sessions.items():
                with contextlib.closing(session.ask_stream(ticket.question, max_new_tokens)) as updates:
                    for update in updates:
                        event = AnswerEvent.from_update(policy, update, wait_ms)
                        if gen != self._generation:  # reset or closed while decoding: stop here
                            event.done = event.interrupted = True
                            ticket.put(event)
                            return
                        ticket.put(event)
                        if update.done:
                            records.append(event)
        except QuestionError as exc:
            ticket.fail(str(exc))
        except Exception as exc:
            ticket.fail(job_error_message(exc, "while answering"))
            raise  # the worker logs it (and frees memory after an out-of-memory error)
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
