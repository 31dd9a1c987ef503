"""One viewer's live stream: the controls a viewer has, a source feeding memories, views for the UI.

A `LiveStream` is the page's handle on one stream of the runtime: its settings
(hermes.runtime.settings), its state (hermes.serving.state), a source of chunks (hermes.runtime.readers)
started by one admitted start (hermes.serving.starts) and reporting through its links
(hermes.serving.links), its questions (hermes.serving.asking), the chat (hermes.serving.chat) and the
views the UI reads (hermes.serving.view). Its memories, one `StreamingSession` per policy
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
from pathlib import Path

import numpy as np

from hermes.engine.metrics import free_cached_memory, memory_reading
from hermes.engine.session import MAX_NEW_TOKENS, MAX_QUESTION_CHARS, StreamingSession
from hermes.models.base import VideoLM
from hermes.runtime.feed import Feed
from hermes.runtime.settings import StreamSettings
from hermes.serving.answers import AnswerTicket
from hermes.serving.asking import StreamQuestions
from hermes.serving.chat import Chat
from hermes.serving.jobs import Priority
from hermes.serving.links import SourceLinks
from hermes.serving.memories import StreamMemories
from hermes.serving.memory_files import MemoryFiles
from hermes.serving.metrics import metrics_of
from hermes.serving.starts import CameraStart, FileStart, Opened, Start, UrlStart
from hermes.serving.state import Lifecycle, StreamState
from hermes.serving.view import LiveView, StreamStatus, stream_status
from hermes.serving.watching import Watchlist
from hermes.serving.worker import ModelWorker
from hermes.video.decoding import VideoInfo
from hermes.video.urls import UrlPolicy


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
        self._lock = threading.RLock()  # held around every move of the lifecycle and its source
        self.life = Lifecycle()
        self._memories = StreamMemories(lm, self)  # only the model thread touches it
        # Its memory saved, loaded and checkpointed; a loaded memory goes on with a source of its own.
        self.files = MemoryFiles(self, self._memories)
        self.links = SourceLinks(self, self._memories)  # what its sources and jobs report to
        self.questions = StreamQuestions(self, self._memories)
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
        self.locked(self.life.inform, message)

    def reset(self, settings: StreamSettings | None = None) -> None:
        """Stop the source and start over with fresh memories, chat and plots. `settings` (default:
        the current ones) take effect here; an answer being decoded stops at its next token; the
        memory reserved by admission control is given back."""
        self._reset(settings or self.settings)
        self.reserved_bytes = self.reserved_host_bytes = 0

    def _reset(self, settings: StreamSettings, loaded: StreamingSession | None = None) -> int:
        self.feed.stop(flush=False)
        with self._lock:
            self.check_open()
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
            lambda exc: self.links.job_failed(gen, exc),
        )
        return gen

    def begin(self, start: Start) -> int:
        """Run `start` (hermes.serving.starts), the one way a stream starts: inside admission (Busy
        refuses before anything is read), `start.prepare()` (what it raises leaves the running stream
        as it was), then a fresh generation holding `start.memory()` (or `start.generation` goes on)
        with `start.open`'s source started. The generation started."""
        with self._admit(self, start.settings, start.held_bytes):
            start.prepare()
            try:
                gen = start.generation
                if gen is None:
                    gen = self._reset(start.settings, start.memory())
                if (opened := start.open(gen, self.links.hooks(gen), self.key)) is not None:
                    self._start_source(gen, opened)
            except BaseException:
                start.abandon()
                raise
        self.touch()  # the lease counts from the start's end: preparing it may take a while
        return gen

    def start_file(self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None) -> VideoInfo:
        """Start streaming a video file (or a folder of frames) from its beginning into fresh memories.
        VideoError (with the file name) at once for one whose first frames cannot be decoded; Busy when
        admission refuses, before anything is decoded."""
        start = FileStart(self.feed, path, speed, settings or self.settings)
        self.begin(start)
        return start.info

    def start_url(self, url: str, urls: UrlPolicy, settings: StreamSettings | None = None, **reader: object) -> str:
        """Start a network stream into fresh memories; its URL as shown. UrlRefused, or StreamError within
        seconds, when it cannot be opened (a running stream goes on untouched); Busy when admission
        refuses. `reader`: the `NetworkReader`'s options (its timeouts); `urls` governs it too (gate.py)."""
        start = UrlStart(self.feed, urls.check(url), settings or self.settings, {"policy": urls, **reader}, self.key)
        self.begin(start)
        return start.reader.name

    def push_frame(self, image: np.ndarray, settings: StreamSettings | None = None, t: float | None = None) -> None:
        """Feed one webcam frame. Unless a file is playing or a webcam stream exists (running or
        stopped with the Stop control), the frame starts a webcam stream in fresh memories, or on
        into a memory loaded from a file (as a video file would go on in it).
        Frames are thinned to the stream's fps by their capture time `t` (default: now); a chunk that
        finds the model still busy with MAX_CHUNK_BACKLOG chunks is dropped (a live source cannot wait)."""
        # Gradio runs one stream event per session at a time, so this check does not race.
        if self.feed.webcam is None and not self.life.state.takes_frames:
            if self.files.resume_point() is not None:
                self.files.go_on_camera()
            else:
                self.begin(CameraStart(self.feed, settings or self.settings))
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
        self.locked(self.life.stop)
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
        """Queue a question (`StreamQuestions.ask`); read the answer from the ticket's events()."""
        return self.questions.ask(question, max_new_tokens)

    def watch(self, question: str) -> list[str]:
        """Add a standing question (`StreamQuestions.watch`); the questions watched now."""
        self.check_open()
        return self.questions.watch(question)

    def unwatch(self, question: str) -> list[str]:
        """Stop watching for a standing question; the questions watched now."""
        self.check_open()
        return self.questions.unwatch(question)

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
        return self.locked(self.life.pop_notices)

    def metrics(self) -> dict:
        """Plain-data numbers for the API and the UI's details panel."""
        # The status first: a chunk's job publishes its view before it leaves the queue, so the view
        # read next is never behind a status that counts no chunk left.
        status = self.status()
        view, reading = self.view(), memory_reading(self.lm.device)
        return metrics_of(view, status, reading, self.lm, self.reserved_bytes, self.watchlist.questions())

    # -- internals: UI and source threads ------------------------------------------------------
    def locked(self, move: Callable, *args: object) -> object:
        """`move(*args)` under the stream's lock."""
        with self._lock:
            return move(*args)

    def check_open(self) -> None:
        """RuntimeError once the stream was closed."""
        if self.closed:
            raise RuntimeError("this stream was closed (its tab went away)")

    def _start_source(self, gen: int, opened: Opened) -> None:
        """`opened`'s source becomes the source of generation `gen` and is started, unless a reset came first."""
        with self._lock:
            if not self.life.current(gen):
                opened.source.stop(flush=False)
                return
            self.feed.attach(opened.source, opened.name, opened.duration_s)
            self.life.state = StreamState.STREAMING
            opened.source.start()

    # -- what a source and the model thread's jobs call back ----------------------------------
    def ended(self, gen: int) -> None:
        """The source of generation `gen` read its whole video: the stream ends there, checkpointed."""
        self.locked(self.life.end, gen)
        self.files.checkpoint(gen)

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
