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
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.engine.metrics import free_cached_memory, memory_reading
from hermes.engine.session import MAX_NEW_TOKENS, MAX_QUESTION_CHARS, QuestionError, StreamingSession, validate_question
from hermes.models.base import VideoLM
from hermes.serving.answers import AnswerBatch, AnswerTicket, TooManyQuestions, job_error_message
from hermes.serving.chat import Chat
from hermes.serving.feed import Feed, FeedHooks
from hermes.serving.jobs import JobCancelled, Priority
from hermes.serving.memories import StreamMemories
from hermes.serving.memory_files import MemoryFiles
from hermes.serving.metrics import metrics_of
from hermes.serving.network import opened
from hermes.serving.settings import StreamSettings
from hermes.serving.sources import Source
from hermes.serving.state import Lifecycle, StreamState
from hermes.serving.view import LiveView, StreamStatus, stream_status
from hermes.serving.watching import Watchlist
from hermes.serving.worker import ModelWorker
from hermes.video.decoding import VideoInfo, check_start
from hermes.video.urls import UrlPolicy

# Questions of one stream being answered or waiting at once; more are told to wait. With the round of
# turns on the model thread (hermes.serving.turns), this keeps one viewer from filling the answer
# batch and Gradio's answer slots.
MAX_QUESTIONS_IN_FLIGHT = 2
WAIT_FOR_ANSWER = (
    f"Wait for your previous answer: at most {MAX_QUESTIONS_IN_FLIGHT} questions of a viewer are answered at once."
)
# A question's length in the model's tokens: its prefill against the whole memory comes before the
# first word of the answer, and every viewer waits for it (characters do not bound it: an emoji
# takes several tokens of a byte-level vocabulary).
MAX_QUESTION_TOKENS = 512
# Chunks of one stream queued or running at once. A file reader waits below this (the stream
# falls behind the wall clock instead of piling up memory); a webcam drops chunks above it. A
# network stream waits until none is (its next chunk is then the newest frames).
MAX_CHUNK_BACKLOG = 2


def question_within_tokens(lm: VideoLM, question: str) -> str:
    """`question`, unless it takes more than MAX_QUESTION_TOKENS of `lm`'s tokens: QuestionError then."""
    tokens = int(lm.encode(question).shape[-1])
    if tokens > MAX_QUESTION_TOKENS:
        raise QuestionError(
            f"The question is {tokens:,} tokens long for this model; the limit is {MAX_QUESTION_TOKENS:,} tokens. "
            "Ask it in fewer words."
        )
    return question


def dropped_note(reason: str) -> str:
    """What the viewer is told when a network stream drops."""
    return f"The stream dropped ({reason}); reconnecting. The memory and the chat are kept."


class LiveStream:
    """One viewer's stream: the controls, its source, state, chat and published views.

    Control methods (`start_file`, `push_frame`, `pause`, `stop`, `reset`, `ask`, `watch`,
    `close`) are called from UI threads and return at once; model work goes to the shared
    `ModelWorker` as jobs under `key`. `admit(stream, settings, held_bytes)`, if given, is entered
    before anything of a new source is decoded or a memory file loaded (`held_bytes`: the bytes of
    the loaded memory, else 0): it raises Busy to refuse, or sets `reserved_bytes` (which the stream
    gives back, to 0, on reset and close) and holds the stream's slot while the source is prepared
    inside it.
    """

    def __init__(
        self,
        worker: ModelWorker,
        lm: VideoLM,
        settings: StreamSettings | None = None,
        key: str = "stream",
        admit: Callable[..., AbstractContextManager[None]] | None = None,
    ) -> None:
        self.worker = worker
        self.lm = lm
        self.key = key
        self._admit = admit or (lambda stream, settings, held_bytes=0: nullcontext())
        # Every stream on this model answers in one batch: questions asked together decode together.
        self._answers = worker.batch(lm, lambda: AnswerBatch(lm))
        self._lock = threading.RLock()  # held around every move of the lifecycle and its source
        self.life = Lifecycle()
        self._memories = StreamMemories(lm, self)  # only the model thread touches it
        # Its memory saved, loaded and checkpointed; a loaded memory goes on with a source of its own.
        self.files = MemoryFiles(self, self._memories, lambda gen: source_hooks(self, gen))
        self.feed = Feed()
        self.settings = settings or StreamSettings()
        self.defaults = self.settings  # what the server starts its streams with: the bounds of Settings are drawn there
        self._view = LiveView(version=0, settings=self.settings)
        self.chat = Chat()
        self.watchlist = Watchlist(MAX_QUESTION_CHARS)
        self.closed = False
        self.reserved_bytes = self.reserved_host_bytes = 0
        self.last_active = time.monotonic()
        self._reset(self.settings)

    # -- control ----------------------------------------------------------------------------
    def touch(self) -> None:
        """Its viewer was heard from: renew the stream's lease (the registry closes lapsed streams)."""
        self.last_active = time.monotonic()

    def tell(self, message: str) -> None:
        """Show `message` to the viewer once, and in the status line until the next start."""
        self._locked(self.life.inform, message)

    def reset(self, settings: StreamSettings | None = None) -> None:
        """Stop the source and start over with fresh memories, chat and plots. `settings` (default:
        the current ones) take effect here; an answer being decoded stops at its next token; the
        memory reserved by admission control is given back."""
        self._reset(settings or self.settings)
        self.reserved_bytes = self.reserved_host_bytes = 0

    def _reset(self, settings: StreamSettings, loaded: StreamingSession | None = None) -> int:
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
            lambda: self._memories.build(gen, settings, self.watchlist.questions, loaded),
            Priority.CONTROL,
            self.key,
            lambda exc: self._on_job_error(gen, exc),
        )
        return gen

    def start_file(self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None) -> VideoInfo:
        """Start streaming a video file from its beginning into fresh memories. VideoError (with
        the file name) at once for a file whose first frames cannot be decoded; Busy when admission
        refuses, before anything is decoded."""
        settings = settings or self.settings
        with self._admit(self, settings):
            info = check_start(path, settings.fps)
            self.feed.set_speed(speed)
            gen = self._reset(settings)
            source = self.feed.file(Path(path), settings, source_hooks(self, gen), f"read-{self.key}")
            self._start_source(gen, source, info.name, info.duration)
        self.touch()  # the lease counts from the start's end: preparing it may take a while
        return info

    def start_url(self, url: str, urls: UrlPolicy, settings: StreamSettings | None = None, **reader: object) -> str:
        """Start a network stream into fresh memories; its URL as shown. UrlRefused, or StreamError within
        seconds, when it cannot be opened (a running stream goes on untouched); Busy when admission
        refuses. `reader`: the `NetworkReader`'s options (its timeouts); `urls` governs it too (gate.py)."""
        name = start_network(self, urls.check(url), settings or self.settings, {"policy": urls, **reader})
        self.touch()  # the lease counts from the start's end: opening the stream may take seconds
        return name

    def push_frame(self, image: np.ndarray, settings: StreamSettings | None = None, t: float | None = None) -> None:
        """Feed one webcam frame. Unless a file is playing or a webcam stream exists (running or
        stopped with the Stop control), the frame starts a webcam stream in fresh memories.
        Frames are thinned to the stream's fps by their capture time `t` (default: now); a chunk that
        finds the model still busy with MAX_CHUNK_BACKLOG chunks is dropped (a live source cannot wait)."""
        # Gradio runs one stream event per session at a time, so this check does not race.
        if self.feed.webcam is None and not self.life.state.takes_frames:
            settings = settings or self.settings
            with self._admit(self, settings):
                gen = self._reset(settings)
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
        self.files.checkpoint(self.life.generation)

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
        # The caches freed, their pages go back to the system (else they stay in the process's RSS).
        self.worker.submit(lambda: (self._memories.drop(), free_cached_memory()), Priority.CONTROL, self.key)

    def ask(self, question: str, max_new_tokens: int = MAX_NEW_TOKENS) -> AnswerTicket:
        """Queue a question ahead of pending chunks; read the answer from the ticket's events().
        QuestionError at once for an empty question, one over MAX_QUESTION_TOKENS of the model's
        tokens, or one more than MAX_QUESTIONS_IN_FLIGHT of this stream's."""
        q = question_within_tokens(self.lm, validate_question(question))
        with self._lock:  # checked and queued together: two questions at once cannot both pass
            self._check_open()
            if self.worker.backlog(self.key, Priority.QUESTION) >= MAX_QUESTIONS_IN_FLIGHT:
                raise TooManyQuestions(WAIT_FOR_ANSWER)
            ticket = AnswerTicket(q, self.life.generation)
            answer = partial(self._memories.answer, ticket.generation, ticket, max_new_tokens)
            self.worker.submit(answer, Priority.QUESTION, self.key, ticket.fail_job, self._answers)
        self.touch()
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
        # The status first: a chunk's job publishes its view before it leaves the queue, so the view
        # read next is never behind a status that counts no chunk left.
        status = self.status()
        view, reading = self.view(), memory_reading(self.lm.device)
        return metrics_of(view, status, reading, self.lm, self.reserved_bytes, self.watchlist.questions())

    # -- internals: UI and source threads ------------------------------------------------------
    def _locked(self, move: Callable, *args: object) -> object:
        with self._lock:
            return move(*args)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this stream was closed (its tab went away)")

    def _start_source(self, gen: int, source: Source, name: str, duration_s: float | None = None) -> None:
        """`source` becomes the source of generation `gen` and is started, unless a reset came first."""
        with self._lock:
            if not self.life.current(gen):
                source.stop(flush=False)
                return
            self.feed.attach(source, name, duration_s)
            self.life.state = StreamState.STREAMING
            source.start()

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


def start_network(stream: LiveStream, url: str, settings: StreamSettings, reader: dict) -> str:
    """Open the network stream at `url` (already allowed) inside `stream`'s admission, start over and
    watch it; its name. A refused start opens nothing; a stream that does not open leaves the running
    one untouched."""
    reader = {"queue_frames": max(2, settings.chunk_frames)} | reader  # the newest chunk's frames
    with stream._admit(stream, settings):
        network = opened(url, settings.fps, f"decode-{stream.key}", **reader)
        try:
            gen = stream._reset(settings)
            source = stream.feed.stream(network, settings, source_hooks(stream, gen), f"read-{stream.key}")
            stream._start_source(gen, source, network.name)
        except BaseException:
            network.stop()
            raise
    return network.name


def source_hooks(stream: LiveStream, gen: int) -> FeedHooks:
    """What the source of generation `gen` of `stream` reports to, and asks of, the stream (the stream's
    own internals: a function beside the class, so that the class holds the controls)."""
    worker, key, life, locked = stream.worker, stream.key, stream.life, stream._locked
    return FeedHooks(
        on_chunk=lambda chunk: stream._submit_chunk(gen, chunk),
        wait_room=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, MAX_CHUNK_BACKLOG, timeout),
        has_room=lambda: worker.backlog(key, Priority.CHUNK) < MAX_CHUNK_BACKLOG,
        wait_idle=lambda timeout: worker.wait_backlog(key, Priority.CHUNK, 1, timeout),
        on_end=lambda: (locked(life.end, gen), stream.files.checkpoint(gen)),
        on_error=lambda message: stream.halt(gen, StreamState.ERROR, message, error=True),
        on_silence=lambda: locked(life.silence, gen),
        on_frames=lambda: locked(life.frames_again, gen),
        on_drop=lambda reason: locked(life.lost, gen, dropped_note(reason)),
        on_back=lambda: locked(life.back, gen),
    )
