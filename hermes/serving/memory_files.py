"""One live stream's memory files: a download of its memory, a file loaded into it, its checkpoints.

Saving and loading run on the model thread (hermes.serving.worker), as jobs of the stream, and the
caller waits for them: a memory is only ever touched there. Loading checks the file first, on the
caller's thread and before any of it is loaded: is it a memory, whole, undamaged, its state in
range, its settings within the bounds this server holds a viewer's to (`SETTING_BOUNDS`), its
storage no more than its policy and budget need; admission control then reserves the bytes its
cache takes, as a stream's; only then is the new session built, on the model thread (is it this
model's, in this dtype, of its shape), and the stream starts over holding it. A refused file leaves
the running stream as it was (docs/design.md, "The memory file").
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from hermes.engine.answering import MAX_NEW_TOKENS
from hermes.engine.methods import PolicySpec
from hermes.engine.persist import (
    MemoryFileError,
    check_storage,
    file_summary,
    load_session,
    read_session,
    resume_time,
)
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.memory.persist import MemoryFile
from hermes.models.base import VideoLM
from hermes.runtime.feed import Feed
from hermes.runtime.settings import StreamSettings, setting_bounds
from hermes.serving.admission import block_tokens_bound, host_memory_cap
from hermes.serving.checkpoints import SUFFIX, Checkpointer
from hermes.serving.jobs import JobCancelled, Priority
from hermes.serving.memories import StreamMemories
from hermes.serving.starts import CameraStart, FileStart, LoadStart, Resume, Start, UrlStart
from hermes.serving.state import Lifecycle
from hermes.serving.view import LiveView
from hermes.serving.worker import ModelWorker
from hermes.video.decoding import VideoInfo
from hermes.video.urls import UrlPolicy

T = TypeVar("T")
WAIT_S = 300.0  # a save or load waits at most this long for the model thread (behind the chunk in flight)


class Adopting(Protocol):
    """What the memory files need of their stream (a `LiveStream`)."""

    lm: VideoLM
    key: str
    worker: ModelWorker
    life: Lifecycle
    settings: StreamSettings
    defaults: StreamSettings
    feed: Feed

    def begin(self, start: Start) -> int:
        """Run `start` inside the stream's admission; the generation started."""

    def view(self) -> LiveView: ...


def settings_of(memory: MemoryFile, current: StreamSettings, defaults: StreamSettings | None = None) -> StreamSettings:
    """`current` settings with the memory file's policy (its parameters too), memory constants and
    alert threshold (one policy: a file holds one memory); MemoryFileError when this app cannot run them, or they lie
    outside the bounds it holds a viewer's settings to on a server whose streams start with
    `defaults` (default `current`: `setting_bounds`)."""
    config, state = memory.header["cache"]["config"], memory.header["session"]
    chosen = {"budget": config["budget"], "chunk_frames": config["chunk_frames"], "fps": config["fps"]}
    chosen["watch_threshold"] = state["standing"]["threshold"]
    try:
        bounds = setting_bounds(defaults or current)
        for name, value in chosen.items():
            bounds[name].check(name, value)
        answer_tokens = state["standing"]["answer_tokens"]
        if answer_tokens > MAX_NEW_TOKENS:  # an alert's answer, on the model thread all viewers share
            raise ValueError(f"its alerts answer in {answer_tokens:,} tokens, more than this server's {MAX_NEW_TOKENS}")
        return dataclasses.replace(
            current,
            **chosen,
            policy=PolicySpec(state["policy"]["name"], state["policy"]["params"]),  # its constants kept
            params=(),  # the viewer's parameters were for other policies
            reindex=config["reindex"],
            max_positions=config.get("max_positions"),
            guidance_history=config.get("history_tokens", HermesConfig.history_tokens) > 0,
            compare=False,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MemoryFileError(f"this memory's settings cannot be used here: {exc}") from None


class MemoryFiles:
    """Save, load and checkpoint one stream's memory, and go on streaming into a loaded one (a part
    of its `LiveStream`, whose source and admission it starts as the stream's own controls do)."""

    def __init__(self, stream: Adopting, memories: StreamMemories) -> None:
        self.stream = stream
        self._memories = memories  # touched in jobs on the model thread only
        self.checkpointer: Checkpointer | None = None
        # Where a source goes on in the memory last loaded from a file.
        self._loaded: Resume | None = None

    def save(self, path: str | os.PathLike[str], wait_s: float = WAIT_S) -> int:
        """Write the stream's memory to `path` (atomically); the bytes written. QuestionError when
        it holds no video yet."""
        gen = self.stream.life.generation
        return self._on_model_thread(lambda: self._memories.save(gen, os.fspath(path)), wait_s)

    def download(self, folder: Path, wait_s: float = WAIT_S) -> Path:
        """Save the memory into `folder` (made if missing) for a viewer to download, named by its
        policy and frames; the files saved there before are deleted. The path saved to."""
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"*{SUFFIX}"):
            old.unlink(missing_ok=True)
        view = self.stream.view()
        name = f"hermes-memory-{view.settings.policies[0]}-{view.frames_seen}frames{SUFFIX}"
        path = folder / re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
        self.save(path, wait_s)
        return path

    def load(self, path: str | os.PathLike[str], wait_s: float = WAIT_S) -> str:
        """Start over holding the memory saved at `path`, with its policy and settings; one line
        about it. MemoryFileError (a file that is damaged, truncated, not a memory, another model's
        or dtype's, or out of this server's bounds) or Busy (no room for its bytes), and the stream
        is left as it was."""
        stream = self.stream
        memory = read_session(path)
        settings = settings_of(memory, stream.settings, stream.defaults)
        block = block_tokens_bound(stream.lm)  # the largest frames this server's decoders hand over
        held = check_storage(memory, stream.lm, block)
        host_cap = host_memory_cap(settings.host_cap_mb)

        def load() -> StreamingSession:
            return load_session(stream.lm, path, host_cap_bytes=host_cap, block_tokens=block)

        # The loaded cache's bytes count like a stream's.
        start = LoadStart(settings, held, lambda: self._on_model_thread(load, wait_s))
        gen = stream.begin(start)
        self._on_model_thread(lambda: None, wait_s)  # queued behind the stream's rebuild: it holds the memory now
        self._loaded = Resume(gen, resume_time(start.session), start.session.frames_seen, held)
        return file_summary(memory)

    @property
    def resumable(self) -> float | None:
        """Where a video would go on in a memory loaded from a file (s), until a source or a reset
        comes after the load; None otherwise."""
        resume = self.resume_point()
        return None if resume is None else resume.start_s

    def resume_point(self) -> Resume | None:
        """Where a source would go on in the memory loaded from a file, until a source or a reset
        comes after the load; None otherwise."""
        loaded = self._loaded
        if loaded is None or not self.stream.life.current(loaded.generation) or self.stream.feed.source:
            return None
        return loaded

    def _resume(self) -> Resume:
        if (resume := self.resume_point()) is None:
            raise RuntimeError("no memory loaded from a file to go on from: start afresh")
        return resume

    def go_on(self, path: str | os.PathLike[str], speed: str = "1x") -> VideoInfo:
        """Stream the video at `path` on into the memory loaded from a file, from where that memory
        stopped (`resumable`): the same video goes on as if it had never stopped. VideoError for a
        file that cannot be read, Busy when admission refuses."""
        stream = self.stream
        start = FileStart(stream.feed, Path(path), speed, stream.settings, self._resume())
        stream.begin(start)  # a running stream counts against the server's limit
        return start.info

    def go_on_url(self, url: str, urls: UrlPolicy, **reader: object) -> str:
        """Reconnect a network stream into the memory loaded from a file, its stream time going on
        from where that memory stopped; its URL as shown (UrlRefused, StreamError as a start's)."""
        stream, resume = self.stream, self._resume()
        options = {"policy": urls, **reader}
        start = UrlStart(stream.feed, urls.check(url), stream.settings, options, stream.key, resume)
        stream.begin(start)
        return start.reader.name

    def go_on_camera(self) -> None:
        """Webcam frames from now on go on into the memory loaded from a file."""
        self.stream.begin(CameraStart(self.stream.feed, self.stream.settings, self._resume()))

    def keep(self, checkpointer: Checkpointer | None) -> None:
        """Checkpoint the memory with `checkpointer` from now on (None: no more)."""
        self.checkpointer = checkpointer
        self._memories.keeper = checkpointer

    def checkpoint(self, generation: int) -> None:
        """Checkpoint the memory once the chunks queued now are in (the source ended)."""
        if self.checkpointer is not None:
            self.stream.worker.submit(lambda: self._memories.checkpoint(generation), Priority.CHUNK, self.stream.key)

    def checkpoint_line(self) -> str | None:
        """The checkpoint's size and the state folder's, for the status line (None: no checkpoints)."""
        c = self.checkpointer
        if c is None:
            return None
        if c.error is not None:
            return c.error
        size = "none yet" if c.saved_bytes is None else f"{c.saved_bytes / 2**20:,.2f} MiB"
        return (
            f"checkpoint {size} (every {c.store.every_chunks} chunks) · "
            f"state folder {c.store.folder_bytes() / 2**20:,.2f} MiB"
        )

    def _on_model_thread(self, fn: Callable[[], T], wait_s: float) -> T:
        """`fn()` run as a job of the stream on the model thread: its result, or what it raised."""
        box: dict[str, object] = {}

        def job() -> None:
            try:
                box["out"] = fn()
            except Exception as exc:  # handed to the caller, not the worker's log: a refused file is no bug
                box["error"] = exc

        def cancelled(exc: BaseException) -> None:
            box["error"] = exc

        done = self.stream.worker.submit(job, Priority.CONTROL, self.stream.key, cancelled).done
        if not done.wait(wait_s):
            raise TimeoutError(f"the model thread did not get to this in {wait_s:.0f} s: try again")
        error = box.get("error")
        if isinstance(error, JobCancelled):
            raise RuntimeError("the stream was reset or closed meanwhile: try again")
        if isinstance(error, BaseException):
            raise error
        return box["out"]  # type: ignore[return-value]
