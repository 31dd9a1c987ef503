"""One engine: the model loaded once and today's `StreamRegistry` (admission, leases, fair turns,
memory cap) unchanged inside, every page call of a stream reached by its viewer's key.

On a cluster it runs as a named, detached Ray actor (hermes.cluster.launch); the class itself is
plain Python. Every stream is checkpointed to the shared state folder (`Viewers` and
`CheckpointStore` of hermes.serving, under a key derived from the viewer's), so that another engine
can take it on from its last checkpoint (`adopt`). A viewer's error comes back as a `Failed` record,
which the front end raises again as the error it was.
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from hermes.cluster.records import (
    CHECKPOINTS,
    ERRORS,
    UPLOADS,
    EngineHealth,
    Failed,
    ModelFacts,
    MoveResult,
    StreamElsewhere,
    StreamFacts,
    StreamRecord,
    checkpoint_key,
    keep_upload,
    memory_digest,
    model_facts,
)
from hermes.serving import (
    CheckpointStore,
    LiveStream,
    LiveView,
    StreamRegistry,
    StreamSettings,
    UrlPolicy,
    Viewers,
    load_model_or_fallback,
)

IDLE_WAIT_S = 120.0  # a drained stream's last chunks and checkpoint


def guarded(method: Callable) -> Callable:
    """`method`, with the viewer's errors (ERRORS) returned as `Failed` instead of raised."""

    @functools.wraps(method)
    def call(*args: object, **kwargs: object) -> object:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if not any(c.__name__ in ERRORS for c in type(exc).__mro__):
                raise
            return Failed.of(exc)

    return call


class Engine:
    """The streams of one engine by viewer key (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        state_dir: str,
        model: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_streams: int = 4,
        lease_s: float = 60.0,
        memory_cap_mb: float | None = None,
        every_chunks: int = 8,
    ) -> None:
        self.name = name
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new engine, holding no streams
        self.lm, self.load_error = load_model_or_fallback(model, device, dtype)
        cap = None if memory_cap_mb is None else int(memory_cap_mb * 2**20)
        self.registry = StreamRegistry(self.lm, max_streams=max_streams, lease_s=lease_s, memory_cap_bytes=cap)
        self.uploads = Path(state_dir) / UPLOADS
        self.store = CheckpointStore(Path(state_dir) / CHECKPOINTS, every_chunks=every_chunks)
        self.viewers = Viewers(self.store)
        self.node_id = ""
        self._streams: dict[str, LiveStream] = {}  # read by health checks without renewing a lease
        self._records: dict[str, StreamRecord] = {}
        self._handed: set[str] = set()  # keys drained to other engines: a late call must not start afresh
        self._lock = threading.Lock()

    # -- the engine ----------------------------------------------------------------------------
    def facts(self) -> tuple[ModelFacts, StreamSettings, float, str | None]:
        """The model's facts, the streams' default settings, the lease and the model's load error."""
        return model_facts(self.lm), self.registry.settings, self.registry.lease_s, self.load_error

    def health(self) -> EngineHealth:
        """Who this engine is, its free memory and its streams (reading them renews no lease)."""
        with self._lock:
            for key in [k for k, s in self._streams.items() if s.closed]:  # lapsed or closed
                del self._streams[key]
                self._records.pop(key, None)
            streams = dict(self._streams)
        facts = {}
        for key, s in streams.items():
            view = s.view()
            facts[key] = StreamFacts(
                self._records.get(key), str(s.status().state), view.stream_time_s, view.frames_seen
            )
        free = self.registry.memory_cap_bytes - self.registry.reserved_bytes()
        cap, most = self.registry.memory_cap_bytes, self.registry.max_streams
        return EngineHealth(self.name, self.incarnation, self.node_id, free, cap, most, facts)

    def stream(self, key: str) -> LiveStream:
        """Viewer `key`'s stream (made on first use; its lease renewed), checkpointed to the state folder;
        StreamElsewhere when it was drained to another engine."""
        if key in self._handed:
            raise StreamElsewhere("this stream moved to another engine")
        stream = self.registry.get(key)
        with self._lock:
            fresh = self._streams.get(key) is not stream
            self._streams[key] = stream
        if fresh:
            self.viewers.hello(key, checkpoint_key(key))
            self.viewers.attach(key, stream.files)
        return stream

    def _record(
        self, key: str, kind: str, video: str | None = None, speed: str = "1x", urls: UrlPolicy | None = None
    ) -> None:
        settings = self._streams[key].settings
        with self._lock:
            self._records[key] = StreamRecord(key, kind, video, speed, settings, urls)

    # -- sources and controls ------------------------------------------------------------------
    @guarded
    def start_file(self, key: str, video: str | bytes, name: str, speed: str, settings: StreamSettings) -> None:
        """Stream a video file: `video` a path every engine can open (a bundled sample, shared storage)
        or an upload's bytes, kept in the state folder's uploads. Into a memory loaded from a file,
        the video goes on where that memory stopped."""
        path = keep_upload(self.uploads, video, name) if isinstance(video, bytes) else Path(video)
        stream = self.stream(key)
        if stream.files.resumable is not None:
            stream.files.go_on(path, speed)
        else:
            stream.start_file(path, speed=speed, settings=settings)
        self._record(key, "file", str(path), speed)

    @guarded
    def start_url(self, key: str, url: str, urls: UrlPolicy, settings: StreamSettings) -> str:
        """Watch a network stream; its name as shown."""
        shown = self.stream(key).start_url(url, urls, settings)
        self._record(key, "url", url, urls=urls)
        return shown

    @guarded
    def push_frame(self, key: str, image: np.ndarray, settings: StreamSettings) -> bool:
        """Feed a webcam frame; whether it started a new webcam stream."""
        stream = self.stream(key)
        before = stream.life.generation
        stream.push_frame(image, settings)
        started = stream.life.generation != before
        if started:
            self._record(key, "webcam")
        return started

    @guarded
    def control(self, key: str, move: str, *args: object) -> object:
        """A control of the stream that needs nothing of the engine: pause, resume, stop, reset,
        watch, unwatch, touch, tell."""
        if move not in ("pause", "resume", "stop", "reset", "watch", "unwatch", "touch", "tell"):
            raise ValueError(f"no control {move!r}")
        out = getattr(self.stream(key), move)(*args)
        if move == "reset":
            with self._lock:
                self._records.pop(key, None)
        return out

    @guarded
    def set_speed(self, key: str, speed: str) -> None:
        self.stream(key).feed.set_speed(speed)

    def close(self, key: str) -> bool:
        """Close viewer `key`'s stream (its tab closed); whether there was one."""
        with self._lock:
            self._streams.pop(key, None)
            self._records.pop(key, None)
        return self.registry.close(key)

    def ask(self, key: str, question: str, max_new_tokens: int | None = None) -> Iterator[object]:
        """A question's answer, streamed: first the question as queued (or `Failed`), then every
        `AnswerEvent` (a Ray generator method on the actor)."""
        try:
            stream = self.stream(key)
            ticket = stream.ask(question) if max_new_tokens is None else stream.ask(question, max_new_tokens)
        except Exception as exc:
            if not any(c.__name__ in ERRORS for c in type(exc).__mro__):
                raise
            yield Failed.of(exc)
            return
        yield ticket.question
        yield from ticket.events()

    # -- reading -------------------------------------------------------------------------------
    @guarded
    def read(self, key: str, known: tuple[str, int] | None = None) -> tuple:
        """What the page's timer reads, in one call: the status, the view (None when `known`, the
        engine and version of the view the caller holds, names this engine's current one), the
        notices, the checkpoint line, whether a loaded memory can go on, and this engine's name."""
        s = self.stream(key)
        status = s.status()  # before the view: a view read next is never behind the status
        view: LiveView | None = s.view()
        if known == (self.name, view.version):
            view = None
        return status, view, s.pop_notices(), s.files.checkpoint_line(), s.files.resumable, self.name

    @guarded
    def metrics(self, key: str) -> dict:
        return self.stream(key).metrics()

    # -- memory files --------------------------------------------------------------------------
    @guarded
    def download(self, key: str) -> tuple[str, bytes]:
        """The stream's memory file: its name and bytes."""
        with tempfile.TemporaryDirectory() as folder:
            path = self.stream(key).files.download(Path(folder))
            return path.name, path.read_bytes()

    @guarded
    def load(self, key: str, data: bytes) -> str:
        """Start over holding the memory file `data`; one line about it."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "memory.hmem"
            path.write_bytes(data)
            summary = self.stream(key).files.load(path)
        self._record(key, "memory")
        return summary

    def digest(self, key: str) -> str:
        """The digest of the memory the stream holds now (`memory_digest` of its file)."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "memory.hmem"
            self.stream(key).files.save(path)
            return memory_digest(path)

    # -- moves ---------------------------------------------------------------------------------
    def drain(self, key: str) -> StreamFacts | None:
        """Hand viewer `key`'s stream away: stop its source (the frames read reach the memory), wait
        for its checkpoint, then close it here; what another engine needs to go on with it."""
        with self._lock:
            stream, record = self._streams.get(key), self._records.get(key)
        if stream is None:
            return None
        stream.stop()
        stream.worker.wait_idle(key, IDLE_WAIT_S)
        view = stream.view()
        with self._lock:
            self._handed.add(key)
        self.close(key)
        stream.worker.wait_idle(key, IDLE_WAIT_S)
        return StreamFacts(record, "drained", view.stream_time_s, view.frames_seen)

    def _reconnect(self, key: str, record: StreamRecord) -> str:
        """Reconnect a moved network stream into its loaded memory; the status line's words for it."""
        try:
            self._streams[key].files.go_on_url(record.video, record.urls or UrlPolicy())
        except Exception as exc:  # the memory moved all the same: it answers, and Start reconnects
            return f"; its stream did not reopen ({exc}): its memory answers as it was, and Start opens it afresh."
        self._record(key, "url", record.video, urls=record.urls)
        return "; its stream reconnected and goes on."

    @guarded
    def adopt(self, facts: StreamFacts, from_engine: str, verify: bool = False) -> MoveResult:
        """Take on a stream of another engine from its last checkpoint: the memory loaded, a file's
        video going on from where that memory stopped, the viewer told what the move cost."""
        began = time.monotonic()
        record = facts.record or StreamRecord("", "memory")
        key = record.key
        with self._lock:
            self._handed.discard(key)  # a stream drained from here may come back
        stream = self.stream(key)
        path = self.store.path(checkpoint_key(key))
        if not path.exists():
            stream.tell(f"This stream's engine ({from_engine}) stopped before its first checkpoint: start again.")
            return MoveResult(key, from_engine, self.name, facts.stream_time_s, None, time.monotonic() - began)
        stream.files.load(path)
        digest = self.digest(key) if verify else None
        at = stream.view().stream_time_s
        resumed_at = stream.files.resumable
        lost = max(0.0, facts.stream_time_s - at)
        note = (
            f"This stream moved from engine {from_engine} to {self.name} (its engine stopped) and lost "
            f"{lost:.0f} s of video since its last checkpoint"
        )
        if record.kind == "file" and record.video and resumed_at is not None:
            stream.files.go_on(record.video, record.speed)
            self._record(key, "file", record.video, record.speed)
            note += f"; its video goes on from {resumed_at:.0f} s."
        elif record.kind == "url" and record.video and resumed_at is not None:
            note += self._reconnect(key, record)
        elif record.kind == "webcam":
            note += "; it goes on with the webcam's next frames."
        else:
            note += "; its memory answers questions as it was."
        stream.tell(note)
        return MoveResult(key, from_engine, self.name, lost, resumed_at, time.monotonic() - began, digest, note)
