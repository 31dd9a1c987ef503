"""The front end's side: a registry and streams with the interface the page uses today
(`StreamRegistry.get(key)` giving something that reads and steers like a `LiveStream`), every call
going to the engine that holds the stream, found through the directory.

When an engine stops answering (it died, or its stream is being moved), a call asks the directory
again and retries on the stream's new engine for up to MOVE_WAIT_S seconds. The chat lives here, in
the front end (its messages carry the page's own components); the memory lives in the engine.
Uploads reach the engine as bytes, which it keeps in the shared state folder; a bundled sample
goes as its path, the same on every node of one install.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from hermes.cluster.launch import directory, engine
from hermes.cluster.records import Failed, ModelFacts
from hermes.serving import (
    AnswerEvent,
    Busy,
    LiveView,
    QuestionError,
    StreamSettings,
    StreamStatus,
    UrlPolicy,
    bundled_samples,
)

MOVE_WAIT_S = 60.0  # a call waits this long for its stream's engine to answer again (a move takes seconds)
READ_TIMEOUT_S = 5.0  # reads and controls; starts and memory files wait longer
LONG_TIMEOUT_S = 300.0
READ_FRESH_S = 0.25  # one timer tick's reads share one call to the engine
TOUCH_EVERY_S = 5.0
ANSWER_TIMEOUT_S = 300.0
ENGINE_LOST = "This stream's engine stopped answering and no other took the stream on: start again."
MAX_MESSAGES = 400


class FrontChat:
    """A stream's chat in the front end: the interface of hermes.serving's chat (clear, add, set,
    messages, version), writes of an older generation landing nowhere; the last MAX_MESSAGES kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[dict] = []
        self._first = 0
        self.generation = 0
        self.version = 0

    def clear(self, generation: int) -> None:
        with self._lock:
            self._messages, self._first, self.generation = [], 0, generation
            self.version += 1

    def messages(self) -> list[dict]:
        with self._lock:
            return [dict(m) for m in self._messages]

    def add(self, message: dict, generation: int | None = None) -> int:
        with self._lock:
            if generation is not None and generation != self.generation:
                return -1
            self._messages.append(message)
            gone = max(0, len(self._messages) - MAX_MESSAGES)
            self._messages, self._first = self._messages[gone:], self._first + gone
            self.version += 1
            return self._first + len(self._messages) - 1

    def set(self, index: int, message: dict, generation: int | None = None) -> None:
        with self._lock:
            at = index - self._first
            if (generation is None or generation == self.generation) and 0 <= at < len(self._messages):
                self._messages[at] = message
                self.version += 1


class RemoteTicket:
    """An answer streaming from the engine (a Ray generator), read as an `AnswerTicket`'s events."""

    def __init__(self, question: str, generation: int, refs: ray.ObjectRefGenerator) -> None:
        self.question, self.generation, self._refs = question, generation, refs

    def events(self, timeout: float = ANSWER_TIMEOUT_S) -> Iterator[AnswerEvent]:
        try:
            for ref in self._refs:
                yield ray.get(ref, timeout=timeout)
        except (RayActorError, GetTimeoutError):
            yield AnswerEvent(None, error="The stream's engine stopped while answering: ask again in a moment.")


class RemoteRegistry:
    """The streams of every viewer of this front end, held by the cluster's engines."""

    def __init__(self) -> None:
        self.directory = directory()
        engines = ray.get(self.directory.status.remote())["engines"]
        alive = next(name for name, e in engines.items() if e["alive"])
        self.lm, self.settings, self.lease_s, self.load_error = ray.get(engine(alive).facts.remote())
        self.shared = {str(Path(s.path).resolve()) for s in bundled_samples(self.lm).values()}
        self._streams: dict[str, RemoteStream] = {}
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, key: str, create: bool = True) -> RemoteStream | None:
        """Viewer `key`'s stream (with `create` False: only one the cluster holds)."""
        with self._lock:
            stream = self._streams.get(key)
        if stream is None and (create or ray.get(self.directory.lookup.remote(key)) is not None):
            with self._lock:
                stream = self._streams.setdefault(key, RemoteStream(self, key))
        return stream

    def close(self, key: str) -> bool:
        with self._lock:
            stream = self._streams.pop(key, None)
            owner = self._owners.pop(key, None)
        if owner is not None:
            engine(owner).close.remote(key)
            self.directory.forget.remote(key)
        return stream is not None

    def pop_lapsed(self, key: str) -> str | None:
        """None: a lapsed stream's note reaches the viewer through its engine's notices."""
        return None

    def owner(self, key: str, away_from: tuple[str, ...] = ()) -> str:
        """The engine of `key`'s stream (placed by the directory on first use); Busy when none is left."""
        with self._lock:
            name = self._owners.get(key)
        if name is None or name in away_from:
            name = ray.get(self.directory.assign.remote(key, away_from), timeout=READ_TIMEOUT_S)
            if name is None:
                raise Busy("Busy: every engine of this cluster is full. Try again in a minute.")
            with self._lock:
                self._owners[key] = name
        return name

    def forget_owner(self, key: str) -> None:
        """Ask the directory for `key`'s engine at the next call."""
        with self._lock:
            self._owners.pop(key, None)

    def call(self, key: str, method: str, *args: object, timeout: float = READ_TIMEOUT_S) -> object:
        """`method(key, *args)` on the engine of `key`'s stream, following the stream when it moves."""
        deadline = time.monotonic() + MOVE_WAIT_S
        while True:
            name = self.owner(key)
            try:
                out = ray.get(getattr(engine(name), method).remote(key, *args), timeout=timeout)
            except (RayActorError, GetTimeoutError, ValueError):
                self.forget_owner(key)
                if time.monotonic() > deadline:
                    raise RuntimeError(ENGINE_LOST) from None
                time.sleep(0.5)
                continue
            if isinstance(out, Failed) and out.kind == "StreamElsewhere":  # drained: ask the directory again
                self.forget_owner(key)
                if time.monotonic() > deadline:
                    raise RuntimeError(ENGINE_LOST)
                continue
            if isinstance(out, Failed):
                raise out.error()
            return out

    def start(self, key: str, method: str, *args: object) -> object:
        """A start on the stream's engine, or (its admission refusing) on the next one that admits it."""
        tried: tuple[str, ...] = ()
        while True:
            try:
                return self.call(key, method, *args, timeout=LONG_TIMEOUT_S)
            except Busy:
                tried = (*tried, self.owner(key))
                engine(tried[-1]).close.remote(key)
                self.owner(key, away_from=tried)  # raises Busy when no engine is left

    def shutdown(self) -> None:
        """Close this front end's streams (the engines and their other streams go on)."""
        for key in list(self._streams):
            self.close(key)


class RemoteFeed:
    def __init__(self, stream: RemoteStream) -> None:
        self._stream = stream

    def set_speed(self, speed: str) -> None:
        self._stream._call("set_speed", speed)


class RemoteFiles:
    """The stream's memory files, on its engine (which also checkpoints it to the state folder)."""

    def __init__(self, stream: RemoteStream) -> None:
        self._stream = stream

    @property
    def resumable(self) -> float | None:
        return self._stream._read()[4]

    def go_on(self, path: str | Path, speed: str = "1x") -> None:
        self._stream.start_file(path, speed, None, fresh=False)

    def checkpoint_line(self) -> str | None:
        return self._stream._read()[3]

    def download(self, folder: Path) -> Path:
        name, data = self._stream._call("download", timeout=LONG_TIMEOUT_S)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.hmem"):
            old.unlink(missing_ok=True)
        (folder / name).write_bytes(data)
        return folder / name

    def load(self, path: str | Path) -> str:
        summary = self._stream._call("load", Path(path).read_bytes(), timeout=LONG_TIMEOUT_S)
        self._stream._fresh()
        return summary


class RemoteStream:
    """One viewer's stream on its engine, with `LiveStream`'s controls and reads."""

    def __init__(self, registry: RemoteRegistry, key: str) -> None:
        self.registry, self.key = registry, key
        self.lm: ModelFacts = registry.lm
        self.chat, self.feed, self.files = FrontChat(), RemoteFeed(self), RemoteFiles(self)
        self._read_at = 0.0
        self._last: tuple | None = None
        self._view: LiveView | None = None
        self._view_engine = ""  # the engine that published `_view` (versions count per engine)
        self._notices: list[str] = []
        self._touched = 0.0
        self._lock = threading.Lock()

    def _call(self, method: str, *args: object, timeout: float = READ_TIMEOUT_S) -> object:
        self._read_at = 0.0  # what the engine said before this call may have changed
        out = self.registry.call(self.key, method, *args, timeout=timeout)
        self._read_at = 0.0
        return out

    def _start(self, method: str, *args: object) -> object:
        self._read_at = 0.0
        out = self.registry.start(self.key, method, *args)
        self._read_at = 0.0
        return out

    def _fresh(self) -> None:
        """The stream started over: its chat too."""
        self.chat.clear(self.chat.generation + 1)

    def _read(self) -> tuple:
        """The engine's status, view, notices, checkpoint line and resume point, read at most once a tick."""
        with self._lock:
            if self._last is None or time.monotonic() - self._read_at > READ_FRESH_S:
                known = None if self._view is None else (self._view_engine, self._view.version)
                self._last = self.registry.call(self.key, "read", known)
                self._read_at = time.monotonic()
                if self._last[1] is not None:
                    self._view, self._view_engine = self._last[1], self._last[5]
                self._notices += self._last[2]
            return self._last

    @property
    def settings(self) -> StreamSettings:
        """The stream's settings now (a loaded memory's, after a load); the engines' defaults before a view."""
        view = self.view()
        return self.registry.settings if view is None else view.settings

    # -- sources and controls ------------------------------------------------------------------
    def start_file(
        self, path: str | Path, speed: str = "1x", settings: StreamSettings | None = None, fresh: bool = True
    ) -> None:
        if Path(path).is_dir():
            raise ValueError("A folder of frames cannot be sent to this cluster's engines yet: upload a video file.")
        resolved = str(Path(path).resolve())
        video = resolved if resolved in self.registry.shared else Path(path).read_bytes()
        self._start("start_file", video, Path(path).name, speed, settings or self.settings)
        if fresh and self._read()[4] is None:
            self._fresh()

    def start_url(self, url: str, urls: UrlPolicy, settings: StreamSettings | None = None) -> str:
        shown = self._start("start_url", url, urls, settings or self.settings)
        self._fresh()
        return shown

    def push_frame(self, image: np.ndarray, settings: StreamSettings | None = None) -> None:
        if self._start("push_frame", image, settings or self.settings):
            self._fresh()

    def pause(self) -> None:
        self._call("control", "pause")

    def resume(self) -> None:
        self._call("control", "resume")

    def stop(self) -> None:
        self._call("control", "stop")

    def reset(self, settings: StreamSettings | None = None) -> None:
        self._call("control", "reset", settings)
        self._fresh()

    def watch(self, question: str) -> list[str]:
        return self._call("control", "watch", question)

    def unwatch(self, question: str) -> list[str]:
        return self._call("control", "unwatch", question)

    def touch(self) -> None:
        if time.monotonic() - self._touched > TOUCH_EVERY_S:
            self._touched = time.monotonic()
            self._call("control", "touch")

    def ask(self, question: str, max_new_tokens: int | None = None) -> RemoteTicket:
        """Queue a question on the engine; QuestionError (TooManyQuestions) at once as `LiveStream.ask`."""
        for _ in range(2):  # a second time on the stream's new engine, when it was drained away
            refs = engine(self.registry.owner(self.key)).ask.remote(self.key, question, max_new_tokens)
            try:
                first = ray.get(next(refs), timeout=READ_TIMEOUT_S)
            except (RayActorError, GetTimeoutError, StopIteration):
                raise QuestionError("This stream's engine is not answering: ask again in a moment.") from None
            if not (isinstance(first, Failed) and first.kind == "StreamElsewhere"):
                break
            self.registry.forget_owner(self.key)
        if isinstance(first, Failed):
            raise first.error()
        return RemoteTicket(first, self.chat.generation, refs)

    # -- reading -------------------------------------------------------------------------------
    def view(self) -> LiveView:
        self._read()
        return self._view

    def status(self) -> StreamStatus:
        return self._read()[0]

    def pop_notices(self) -> list[str]:
        self._read()
        with self._lock:
            notices, self._notices = self._notices, []
        return notices

    def metrics(self) -> dict:
        return self._call("metrics")
