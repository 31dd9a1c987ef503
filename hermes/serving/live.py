"""One viewer's live stream: a source feeding memories, questions on them, views for the UI.

A `LiveStream` holds one `StreamingSession` per policy (two in compare mode), all over the one
read-only model, and composes the parts of a stream: its settings (hermes.serving.settings), a
source of chunks (hermes.serving.sources), the chat (hermes.serving.chat) and the views the UI
reads (hermes.serving.view). All model work goes to the shared `ModelWorker` (hermes.serving.worker)
as jobs, and answers come back on tickets (hermes.serving.answers). The UI never touches a session:
it reads the immutable `LiveView` published after each job. No Gradio here, so all of it runs (and
is tested) headless.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.engine.metrics import memory_reading
from hermes.engine.session import (
    MAX_NEW_TOKENS,
    MAX_QUESTION_CHARS,
    AnswerUpdate,
    QuestionError,
    StreamingSession,
    validate_question,
)
from hermes.engine.watch import check_removable, validate_standing
from hermes.models.base import VideoLM
from hermes.serving.admission import full_slot_limit, policy_cache_bytes
from hermes.serving.answers import AnswerBatch, AnswerEvent, AnswerRequest, AnswerTicket, job_error_message
from hermes.serving.chat import Chat
from hermes.serving.settings import SPEEDS, StreamSettings
from hermes.serving.sources import FileSource, Source, WebcamSource
from hermes.serving.view import ANSWER_LIMIT, Alert, LiveView, StreamStatus, metrics_of, watch_metrics
from hermes.serving.worker import JobCancelled, ModelWorker, Priority
from hermes.video.decoding import VideoInfo, check_start

# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it.
MAX_CHUNK_BACKLOG = 2
WEBCAM_ACTIVE_S = 3.0


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
        # Every stream on this model answers in one batch: questions asked together decode together.
        self._answers = worker.batch(lm, lambda: AnswerBatch(lm))
        self._lock = threading.RLock()
        self._generation = 0  # bumped by every reset and by close: older jobs and writes are stale
        self._sessions: dict[str, StreamingSession] = {}  # only the model thread touches these
        self._sessions_gen = -1
        self._full_limit: int | None = None  # slots per layer at which a full stream stops
        self._feed: Source | None = None
        self._source: str | None = None  # the source's name, for the status
        self._state = "starting"
        self._error: str | None = None
        self._note: str | None = None
        self._memory_failed = False  # a model job failed: the memories may be half-updated
        self._started = time.monotonic()
        self._notices: list[str] = []
        self.settings = settings or StreamSettings()
        self.speed = "1x"
        self._view = LiveView(version=0, settings=self.settings)
        self.chat = Chat()
        # Standing questions: the viewer's, so they outlive a reset; each memory is given them on
        # the model thread. New alerts wait here until the page shows them (`pop_alerts`).
        self._watching: list[str] = []
        self._new_alerts: deque[Alert] = deque(maxlen=ANSWER_LIMIT)
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
        self._stop_feed(flush=False)
        with self._lock:
            self._check_open()
            self._generation += 1
            gen = self._generation
            self.settings = settings
            self.chat.clear(gen)
            self._feed = self._source = None
            self._state = "starting"
            self._error = self._note = None
            self._memory_failed = False
            self._started = time.monotonic()
            self._notices = []
            self._new_alerts.clear()
            self._view = LiveView(version=self._view.version + 1, settings=settings)
        self.worker.cancel(self.key)
        self.worker.submit(
            lambda: self._build(gen, settings), Priority.CONTROL, self.key, lambda exc: self._on_job_error(gen, exc)
        )

    def start_file(self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None) -> VideoInfo:
        """Start streaming a video file from its beginning into fresh memories.

        Raises VideoError (with the file name) at once for a file whose first frames cannot be
        decoded, and Busy when admission control refuses another stream.
        """
        settings = settings or self.settings
        info = check_start(path, settings.fps)
        self.set_speed(speed)
        if self._admit is not None:
            self._admit(self, settings)
        self._reset(settings)
        with self._lock:
            gen = self._generation
            feed = FileSource(
                Path(path),
                settings.chunk_frames,
                settings.fps,
                lambda: SPEEDS[self.speed],
                on_chunk=lambda chunk: self._submit_chunk(gen, chunk),
                has_room=lambda timeout: self.worker.wait_backlog(self.key, Priority.CHUNK, MAX_CHUNK_BACKLOG, timeout),
                on_end=lambda: self._on_end(gen),
                on_error=lambda message: self._fail(gen, message),
                name=f"read-{self.key}",
            )
            self._feed, self._source, self._state = feed, info.name, "streaming"
            feed.start()
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
                gen = self._generation
                self._feed = WebcamSource(
                    settings.chunk_frames,
                    settings.fps,
                    on_chunk=lambda chunk: self._submit_chunk(gen, chunk),
                    has_room=lambda: self.worker.backlog(self.key, Priority.CHUNK) < MAX_CHUNK_BACKLOG,
                )
                self._source, self._state = "webcam", "streaming"
        feed = self._feed
        if isinstance(feed, WebcamSource):
            feed.push(image)

    def set_speed(self, speed: str) -> None:
        """Pace of a file stream: "1x" (real time), "2x", "4x" or "max"; applies at once."""
        if speed not in SPEEDS:
            raise ValueError(f"speed must be one of {', '.join(SPEEDS)}; got {speed!r}")
        self.speed = speed

    def pause(self) -> None:
        """Hold the source; chunks already queued still reach the model."""
        with self._lock:
            if self._state == "streaming" and self._feed is not None:
                self._feed.pause()
                self._state = "paused"

    def resume(self) -> None:
        with self._lock:
            if self._state == "paused" and self._feed is not None:
                self._state = "streaming"
                self._feed.resume()

    def stop(self) -> None:
        """End the source; the frames read so far reach the model, and questions still work."""
        with self._lock:
            if self._state in ("streaming", "paused"):
                self._state = "stopped"
        self._stop_feed(flush=True)

    def close(self) -> None:
        """Free everything: the source, queued jobs and (on the model thread) the memories."""
        if self.closed:
            return
        self._stop_feed(flush=False)
        with self._lock:
            self.closed = True
            self._generation += 1  # an answer being decoded stops at its next token
            self.chat.clear(self._generation)
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
            # Dropped before its turn, or the batch failed (the worker logs it and frees memory).
            if isinstance(exc, JobCancelled):
                ticket.fail("The stream was reset before this question's turn: ask again.")
            else:
                ticket.fail(job_error_message(exc, "while answering"))
            ticket.close()

        self.worker.submit(
            lambda: self._answer(gen, ticket, max_new_tokens), Priority.QUESTION, self.key, on_error, self._answers
        )
        return ticket

    def watch(self, question: str) -> list[str]:
        """Add a standing question, asked of every memory after each chunk from the next one on;
        returns the questions watched now. WatchError at once for an empty, too long, repeated
        or fifth question (the stream goes on)."""
        with self._lock:
            self._check_open()
            self._watching.append(validate_standing(question, self._watching, MAX_QUESTION_CHARS))
            watching, gen = list(self._watching), self._generation
        self.touch()
        self.worker.submit(lambda: self._sync_watching(gen), Priority.CONTROL, self.key)
        return watching

    def unwatch(self, question: str) -> list[str]:
        """Stop watching for a standing question; returns the questions watched now. WatchError
        when it is not watched."""
        with self._lock:
            self._check_open()
            self._watching.remove(check_removable(question, self._watching))
            watching, gen = list(self._watching), self._generation
        self.touch()
        self.worker.submit(lambda: self._sync_watching(gen), Priority.CONTROL, self.key)
        return watching

    def watching(self) -> list[str]:
        """The standing questions, in the order they were added."""
        with self._lock:
            return list(self._watching)

    def pop_alerts(self) -> list[Alert]:
        """Standing questions that fired since the last call, oldest first, each returned once."""
        with self._lock:
            out = list(self._new_alerts)
            self._new_alerts.clear()
            return out

    # -- reading ----------------------------------------------------------------------------
    def view(self) -> LiveView:
        """The last published view (its `version` changes whenever anything drawn changed)."""
        return self._view

    def status(self) -> StreamStatus:
        with self._lock:
            state, feed = self._state, self._feed
            queued = self.worker.backlog(self.key, Priority.CHUNK)
            if state == "streaming" and isinstance(feed, WebcamSource):
                if time.monotonic() - feed.last_frame_at > WEBCAM_ACTIVE_S:
                    state = "waiting for the webcam"
            elif state in ("finished", "stopped") and queued:
                state = "finishing"
            return StreamStatus(
                state=state,
                source=self._source,
                speed=self.speed,
                frames_read=feed.frames_read if feed is not None else 0,
                queued_chunks=queued,
                dropped_frames=feed.dropped_frames if feed is not None else 0,
                error=self._error,
                note=self._note,
                position_s=feed.position_s() if feed is not None and state == "streaming" else None,
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
        return self.chat.messages()

    def add_message(self, message: dict, generation: int | None = None) -> int:
        """Append a chat message; returns its index, for `set_message` (-1: `generation` is stale)."""
        return self.chat.add(message, generation)

    def set_message(self, index: int, message: dict, generation: int | None = None) -> None:
        self.chat.set(index, message, generation)

    def metrics(self) -> dict:
        """Plain-data numbers for the API and the UI's details panel."""
        lm = self.lm
        reading = memory_reading(lm.device)
        view = self.view()
        numbers = metrics_of(view, self.status(), reading, lm.source, lm.random_weights, self.reserved_bytes)
        return numbers | watch_metrics(view, self.watching())

    # -- internals: UI and source threads ------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this stream was closed (its tab went away)")

    def _stop_feed(self, flush: bool) -> None:
        feed = self._feed
        if feed is not None:
            feed.stop(flush)
            feed.join()

    def _on_end(self, gen: int) -> None:
        with self._lock:
            if self._generation == gen and self._state in ("streaming", "paused"):
                self._state = "finished"

    def _halt(self, gen: int, state: str, message: str, *, error: bool, memory_failed: bool = False) -> None:
        """Stop the source of generation `gen` by itself (an error, or a bound reached), saying why."""
        with self._lock:
            if self._generation != gen or (not error and self._state not in ("streaming", "paused")):
                return
            self._state = state
            if error:
                self._error = message
            else:
                self._note = message
            self._memory_failed = self._memory_failed or memory_failed
            self._notices.append(message)
            feed = self._feed
        if feed is not None:
            feed.stop(flush=False)

    def _fail(self, gen: int, message: str, memory_failed: bool = False) -> None:
        self._halt(gen, "error", message, error=True, memory_failed=memory_failed)

    # -- internals: jobs on the model thread ----------------------------------------------------
    def _submit_chunk(self, gen: int, chunk: Chunk) -> None:
        self.worker.submit(
            lambda: self._ingest(gen, chunk), Priority.CHUNK, self.key, lambda exc: self._on_job_error(gen, exc)
        )

    def _on_job_error(self, gen: int, exc: BaseException) -> None:
        # A job of an older generation (before a reset) failing must not stop the new stream.
        if not isinstance(exc, JobCancelled):
            self._fail(gen, job_error_message(exc, "on this stream", " Press Reset to start over."), True)

    def _publish(self, gen: int, view: LiveView) -> None:
        """Make `view` the one the UI reads, unless the stream was reset since generation `gen`."""
        with self._lock:
            if gen == self._generation:
                self._view = view

    def _build(self, gen: int, settings: StreamSettings) -> None:
        if gen != self._generation:
            return
        config = settings.config()
        self._sessions = {}  # free the old memories before building the new ones
        self._sessions = {p: StreamingSession(self.lm, config, policy=p) for p in settings.policies}
        for session in self._sessions.values():
            session.standing.set_threshold(settings.watch_threshold)
            session.standing.set_questions(self.watching())
        self._full_limit = full_slot_limit(self.lm, config) if "full" in self._sessions else None
        self._sessions_gen = gen
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        budget_bytes = {p: policy_cache_bytes(self.lm, config, p) for p in settings.policies}
        with self._lock:
            if gen == self._generation and self._state == "starting":
                self._state = "idle"
        self._publish(gen, self._view.next(snapshots=snapshots, budget_bytes=budget_bytes))

    def _ingest(self, gen: int, chunk: Chunk) -> None:
        # Skip chunks of an older generation, of a memory that failed, or past the full bound.
        if gen != self._generation or gen != self._sessions_gen or self._memory_failed or self._full_at_limit():
            return
        reports = {p: s.ingest(chunk) for p, s in self._sessions.items()}
        snapshots = {p: s.snapshot() for p, s in self._sessions.items()}
        wall_s = time.monotonic() - self._started
        reading = memory_reading(self.lm.device)
        view = self._view.with_chunk(chunk, reports, snapshots, self.lm.frame_multiple, wall_s, reading)
        self._publish(gen, view)
        fired = sum(len(r.alerts) for r in reports.values())
        with self._lock:
            if fired and gen == self._generation:
                self._new_alerts.extend(view.alerts[-fired:])
        if self._full_at_limit():
            mb = self._sessions["full"].memory.cache_bytes() / 2**20
            note = (
                f"The full cache reached its bound ({self._full_limit:,} video tokens per layer, {mb:.1f} MB: the "
                "positions the model has left), so the stream stopped here. Questions still work; pick hermes or "
                "fifo, whose memory stays fixed, to stream further."
            )
            self._halt(gen, "stopped", note, error=False)

    def _sync_watching(self, gen: int) -> None:
        """Give every memory of generation `gen` the standing questions as they are now (model thread)."""
        if gen != self._generation or gen != self._sessions_gen:
            return  # a reset since: its build job hands the memories the questions
        for session in self._sessions.values():
            session.standing.set_questions(self.watching())

    def _full_at_limit(self) -> bool:
        """Whether a full cache cannot take another chunk like the last one (model thread only)."""
        session = self._sessions.get("full")
        if session is None or self._full_limit is None or not session.chunks:
            return False
        return session.memory.slots + session.chunks[-1].tokens > self._full_limit

    def _answer(self, gen: int, ticket: AnswerTicket, max_new_tokens: int) -> AnswerRequest | None:
        """The question as a request to the answer batch, when its turn comes on the model thread;
        None (the reason on the ticket) when there is nothing to answer from."""
        wait_ms = (time.monotonic() - ticket.enqueued_at) * 1000.0
        try:
            if gen != self._generation:
                raise QuestionError("The stream was reset before this question's turn: ask again.")
            if self._memory_failed:
                raise QuestionError(f"{self._error} (No answers from a memory that failed mid-update.)")
            if gen != self._sessions_gen or self._view.frames_seen == 0:
                raise QuestionError(self._no_video_message())
        except QuestionError as exc:
            ticket.fail(str(exc))
            ticket.close()
            return None
        records: list[AnswerEvent] = []

        def emit(policy: str, update: AnswerUpdate) -> bool:
            event = AnswerEvent.from_update(policy, update, wait_ms)
            if gen != self._generation:  # reset or closed while decoding: stop here
                event.done = event.interrupted = True
                ticket.put(event)
                return False
            ticket.put(event)
            if update.done:
                records.append(event)
            return True

        def finish() -> None:
            ticket.close()
            if records:
                self._publish(gen, self._view.with_answers(records))

        return AnswerRequest(ticket.question, dict(self._sessions), emit, finish, max_new_tokens)

    def _no_video_message(self) -> str:
        status = self.status()
        if status.state in ("streaming", "paused", "finishing") or status.queued_chunks:
            s = self.settings
            return (
                f"The first chunk has not reached the model yet (it holds {s.chunk_frames} frames at {s.fps:g} fps, "
                f"about {s.chunk_frames / s.fps:.0f} s of video): ask again in a moment."
            )
        return "No video yet: start the sample clip, upload a video or turn on the webcam, then ask."
