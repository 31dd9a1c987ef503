"""One viewer's live stream: the controls a viewer has, a source feeding memories, views for the UI.

A `LiveStream` composes the parts of a stream: its settings (hermes.serving.settings), its state
(hermes.serving.state), a source of chunks (hermes.serving.sources), the chat (hermes.serving.chat)
and the views the UI reads (hermes.serving.view). Its memories, one `StreamingSession` per policy
(two in compare mode) over the one read-only model, are a `StreamMemories`
(hermes.serving.memories) that only the model thread touches: all model work goes to the shared
`ModelWorker` (hermes.serving.worker) as jobs, and answers come back on tickets
(hermes.serving.answers). The UI never touches a session: it reads the immutable `LiveView`
published after each job. No Gradio here, so all of it runs (and is tested) headless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.engine.metrics import memory_reading
from hermes.engine.session import MAX_NEW_TOKENS, MAX_QUESTION_CHARS, validate_question
from hermes.models.base import VideoLM
from hermes.serving.answers import AnswerBatch, AnswerTicket, job_error_message
from hermes.serving.chat import Chat
from hermes.serving.feed import Feed, FeedHooks
from hermes.serving.memories import StreamMemories
from hermes.serving.metrics import metrics_of
from hermes.serving.network import opened
from hermes.serving.settings import StreamSettings
from hermes.serving.sources import Source
from hermes.serving.state import Lifecycle, StreamState
from hermes.serving.view import LiveView, StreamStatus, stream_status
from hermes.serving.watching import Watchlist
from hermes.serving.worker import JobCancelled, ModelWorker, Priority
from hermes.video.decoding import VideoInfo, check_start
from hermes.video.urls import UrlPolicy

# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it. A
# network stream waits until none is (its next chunk is then the newest frames).
MAX_CHUNK_BACKLOG = 2


def dropped_note(reason: str) -> str:
    """What the viewer is told when a network stream drops."""
    return f"The stream dropped ({reason}); reconnecting. The memory and the chat are kept."


class LiveStream:
    """One viewer's stream: the controls, its source, state, chat and published views.

    Control methods (`start_file`, `push_frame`, `pause`, `stop`, `reset`, `ask`, `watch`,
    `close`) are called from UI threads and return at once; model work goes to the shared
    `ModelWorker` as jobs under `key`. `admit(stream, settings)`, if given, is asked before a
    source starts: it raises Busy to refuse, or sets `reserved_bytes`, which the stream gives back
    (to 0) on reset and close.
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
        self._lock = threading.RLock()  # held around every move of the lifecycle and its source
        self.life = Lifecycle()
        self._memories = StreamMemories(lm, self)  # only the model thread touches it
        self.feed = Feed()
        self.settings = settings or StreamSettings()
        self._view = LiveView(version=0, settings=self.settings)
        self.chat = Chat()
        self.watchlist = Watchlist(MAX_QUESTION_CHARS)
        self.closed = False
        self.reserved_bytes = self.reserved_host_bytes = 0
        self.last_active = time.monotonic()
        self._reset(self.settings)

    # -- control ----------------------------------------------------------------------------
    def touch(self) -> None:
        """Mark the stream as in use (idle streams are reaped by the registry)."""
        self.last_active = time.monotonic()

    def reset(self, settings: StreamSettings | None = None) -> None:
        """Stop the source and start over with fresh memories, chat and plots. `settings` (default:
        the current ones) take effect here; an answer being decoded stops at its next token; the
        memory reserved by admission control is given back."""
        self._reset(settings or self.settings)
        self.reserved_bytes = self.reserved_host_bytes = 0

    def _reset(self, settings: StreamSettings) -> int:
        self.feed.stop(flush=False)
        with self._lock:
            self._check_open()
            gen = self.life.restart()
            self.settings = settings
            self.chat.clear(gen)
            self.feed.detach()
            self._view = self._view.fresh(settings)
        self.worker.cancel(self.key)
        self.worker.submit(
            lambda: self._memories.build(gen, settings, self.watchlist.questions),
            Priority.CONTROL,
            self.key,
            lambda exc: self._on_job_error(gen, exc),
        )
        return gen

    def start_file(self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None) -> VideoInfo:
        """Start streaming a video file from its beginning into fresh memories. VideoError (with
        the file name) at once for a file whose first frames cannot be decoded; Busy when admission
        refuses."""
        settings = settings or self.settings
        info = check_start(path, settings.fps)
        self.feed.set_speed(speed)
        gen = self._begin(settings)
        source = self.feed.file(Path(path), settings, source_hooks(self, gen), f"read-{self.key}")
        self._start_source(gen, source, info.name, source.start)
        return info

    def start_url(self, url: str, urls: UrlPolicy, settings: StreamSettings | None = None, **reader: object) -> str:
        """Start a network stream into fresh memories; its URL as shown. UrlRefused, or StreamError within
        seconds, when it cannot be opened (a running stream goes on untouched); Busy when admission
        refuses. `reader`: the `NetworkReader`'s options (its timeouts)."""
        settings = settings or self.settings
        reader = {"queue_frames": max(2, settings.chunk_frames)} | reader  # the newest chunk's frames
        stream = opened(urls.check(url), settings.fps, f"decode-{self.key}", **reader)
        try:
            gen = self._begin(settings)
        except BaseException:
            stream.stop()
            raise
        source = self.feed.stream(stream, settings, source_hooks(self, gen), f"read-{self.key}")
        self._start_source(gen, source, stream.name, source.start)
        return stream.name

    def push_frame(self, image: np.ndarray, settings: StreamSettings | None = None, t: float | None = None) -> None:
        """Feed one webcam frame. Unless a file is playing or a webcam stream exists (running or
        stopped with the Stop control), the frame starts a webcam stream in fresh memories.
        Frames are thinned to the stream's fps by their capture time `t` (default: now); a chunk that
        finds the model still busy with MAX_CHUNK_BACKLOG chunks is dropped (a live source cannot wait)."""
        # Gradio runs one stream event per session at a time, so this check does not race.
        if self.feed.webcam is None and not self.life.state.takes_frames:
            settings = settings or self.settings
            gen = self._begin(settings)
            self._start_source(gen, self.feed.camera(settings, source_hooks(self, gen)), "webcam")
        if (webcam := self.feed.webcam) is not None:
            webcam.push(image, t)

    def pause(self) -> None:
        """Hold the source; chunks already queued still reach the model."""
        with self._lock:
            if self.feed.source is not None and self.life.pause():
                self.feed.source.pause()

    def resume(self) -> None:
        with self._lock:
            if self.feed.source is not None and self.life.resume():
                self.feed.source.resume()

    def stop(self) -> None:
        """End the source; the frames read so far reach the model, and questions still work."""
        self._locked(self.life.stop)
        self.feed.stop(flush=True)

    def close(self) -> None:
        """Free everything: the source, queued jobs and (on the model thread) the memories."""
        if self.closed:
            return
        self.feed.stop(flush=False)
        with self._lock:
            self.closed = True
            self.life.close()
            self.chat.clear(self.life.generation)
        self.reserved_bytes = self.reserved_host_bytes = 0
        self.worker.cancel(self.key)
        self.worker.submit(self._memories.drop, Priority.CONTROL, self.key)

    def ask(self, question: str, max_new_tokens: int = MAX_NEW_TOKENS) -> AnswerTicket:
        """Queue a question ahead of pending chunks; read the answer from the ticket's events().
        QuestionError at once for an empty or over-long question."""
        q = validate_question(question)
        with self._lock:
            self._check_open()
            gen = self.life.generation
        self.touch()
        ticket = AnswerTicket(q, gen)

        self.worker.submit(
            lambda: self._memories.answer(gen, ticket, max_new_tokens),
            Priority.QUESTION,
            self.key,
            ticket.fail_job,
            self._answers,
        )
        return ticket

    def watch(self, question: str) -> list[str]:
        """Add a standing question, asked of every memory after each chunk from the next one on;
        the questions watched now. WatchError at once for an empty, too long, repeated or fifth
        question (the stream goes on)."""
        self._check_open()
        return self._hand_to_memories(self.watchlist.add(question))

    def unwatch(self, question: str) -> list[str]:
        """Stop watching for a standing question; the questions watched now. WatchError when it
        is not watched."""
        self._check_open()
        return self._hand_to_memories(self.watchlist.remove(question))

    # -- reading ----------------------------------------------------------------------------
    def view(self) -> LiveView:
        """The last published view (its `version` changes whenever anything drawn changed)."""
        return self._view

    def status(self) -> StreamStatus:
        with self._lock:
            queued = self.worker.backlog(self.key, Priority.CHUNK)
            return stream_status(self.life, self.feed, queued)

    @property
    def running(self) -> bool:
        """Whether a source is feeding this stream (for admission control)."""
        return self.status().state.runs

    def pop_notices(self) -> list[str]:
        """Messages for the viewer (errors, and why a stream stopped by itself), each returned once."""
        return self._locked(self.life.pop_notices)

    def metrics(self) -> dict:
        """Plain-data numbers for the API and the UI's details panel."""
        view, status, reading = self.view(), self.status(), memory_reading(self.lm.device)
        return metrics_of(view, status, reading, self.lm, self.reserved_bytes, self.watchlist.questions())

    # -- internals: UI and source threads ------------------------------------------------------
    def _locked(self, move: Callable, *args: object) -> object:
        with self._lock:
            return move(*args)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this stream was closed (its tab went away)")

    def _begin(self, settings: StreamSettings) -> int:
        """Admit a new source with `settings` (Busy if admission refuses) and reset the stream for
        it; the new generation."""
        if self._admit is not None:
            self._admit(self, settings)
        return self._reset(settings)

    def _start_source(self, gen: int, source: Source, name: str, start: Callable[[], None] = lambda: None) -> None:
        """`source` becomes the source of generation `gen` and is started, unless a reset came first."""
        with self._lock:
            if not self.life.current(gen):
                source.stop(flush=False)
                return
            self.feed.attach(source, name)
            self.life.state = StreamState.STREAMING
            start()

    def _hand_to_memories(self, watching: list[str]) -> list[str]:
        """Give the memories the standing questions (on the model thread); `watching` back."""
        gen = self.life.generation
        self.touch()
        self.worker.submit(lambda: self._memories.watch(gen, self.watchlist.questions), Priority.CONTROL, self.key)
        return watching

    # -- what the model thread's jobs call back (StreamSide) ----------------------------------
    def publish(self, gen: int, make: Callable[[LiveView], LiveView]) -> LiveView | None:
        """Make `make(the current view)` the one the UI reads, unless the stream was reset since
        generation `gen`; the view published, or None."""
        with self._lock:
            if not self.life.current(gen):
                return None
            self._view = make(self._view)
            return self._view

    def halt(self, gen: int, state: StreamState, message: str, *, error: bool, memory_failed: bool = False) -> None:
        """Stop the source of generation `gen` by itself (an error, or a bound reached), saying why."""
        with self._lock:
            halted = self.life.halt(gen, state, message, error=error, memory_failed=memory_failed)
            source = self.feed.source
        if halted and source is not None:
            source.stop(flush=False)

    # -- internals: jobs for the model thread ----------------------------------------------------
    def _submit_chunk(self, gen: int, chunk: Chunk) -> None:
        self.worker.submit(
            lambda: self._memories.ingest(gen, chunk, landed=self.feed.landed),
            Priority.CHUNK,
            self.key,
            lambda exc: self._on_job_error(gen, exc),
        )

    def _on_job_error(self, gen: int, exc: BaseException) -> None:
        # A job of an older generation (before a reset) failing must not stop the new stream.
        if not isinstance(exc, JobCancelled):
            message = job_error_message(exc, "on this stream", " Press Reset to start over.")
            self.halt(gen, StreamState.ERROR, message, error=True, memory_failed=True)


def source_hooks(stream: LiveStream, gen: int) -> FeedHooks:
    """What the source of generation `gen` of `stream` reports to, and asks of, the stream (the stream's
    own internals: a function beside the class, so that the class holds the controls)."""
    worker, key, life, locked = stream.worker, stream.key, stream.life, stream._locked
    return FeedHooks(
        on_chunk=lambda chunk: stream._submit_chunk(gen, chunk),
        wait_room=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, MAX_CHUNK_BACKLOG, timeout),
        has_room=lambda: worker.backlog(key, Priority.CHUNK) < MAX_CHUNK_BACKLOG,
        wait_idle=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, 1, timeout),
        on_end=lambda: locked(life.end, gen),
        on_error=lambda message: stream.halt(gen, StreamState.ERROR, message, error=True),
        on_silence=lambda: locked(life.silence, gen),
        on_frames=lambda: locked(life.frames_again, gen),
        on_drop=lambda reason: locked(life.lost, gen, dropped_note(reason)),
        on_back=lambda: locked(life.back, gen),
    )
