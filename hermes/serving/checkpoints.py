"""Memory files in the app: checkpoints of each viewer's memory that outlive a restart.

With a state folder (`python app.py --state-dir DIR`), the memory of every live stream is saved
to its viewer's checkpoint every `every_chunks` chunks and when its source ends, by the library's
atomic write (hermes.engine.persist.save_session: the previous checkpoint stays whole until the
new one is). A viewer is known by a random key that the page keeps in the browser's local storage
and sends with its requests; the checkpoint's file is named by a SHA-256 of that key, so the
folder never holds a key, and a viewer who does not know a key cannot name its file. The folder is
bounded: checkpoints not written for `max_age_s` expire, and past `max_bytes` in all the oldest go
first (docs/limits.md, "Memory files").
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hermes.engine.persist import MemoryFileError, file_summary, read_session, save_session
from hermes.engine.session import StreamingSession

log = logging.getLogger(__name__)

SUFFIX = ".hmem"
KEY_BYTES = 32  # 256 random bits: a key cannot be guessed
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{40,128}")  # what `new_viewer_key` makes (URL-safe base64)
SECRET_FILE = ".browser-secret"  # encrypts the key in the browser's storage, the same across restarts
EVERY_CHUNKS = 8
MAX_AGE_S = 7 * 24 * 3600.0
MAX_BYTES = 2 * 2**30


def new_viewer_key() -> str:
    """A fresh, unguessable viewer key."""
    return secrets.token_urlsafe(KEY_BYTES)


def valid_key(key: object) -> bool:
    """Whether `key` has the shape of a viewer key (anything else names no checkpoint)."""
    return isinstance(key, str) and KEY_PATTERN.fullmatch(key) is not None


@dataclass(frozen=True)
class CheckpointInfo:
    """A viewer's checkpoint, as the page shows it."""

    size_bytes: int
    saved_at: float  # seconds since the epoch
    summary: str  # model, policy, budget, frames and stream time (or why the file cannot be read)
    folder_bytes: int  # every checkpoint in the folder

    def describe(self) -> str:
        """One line: what the checkpoint holds, its size, when it was saved and the folder's size."""
        saved = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.saved_at))
        return (
            f"{self.summary} · {self.size_bytes / 2**20:,.2f} MiB, saved {saved} · "
            f"state folder {self.folder_bytes / 2**20:,.2f} MiB"
        )


class CheckpointStore:
    """The viewers' checkpoints in one folder, bounded by age and total size."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        every_chunks: int = EVERY_CHUNKS,
        max_age_s: float = MAX_AGE_S,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if every_chunks < 1 or max_age_s <= 0 or max_bytes <= 0:
            raise ValueError(
                "checkpoints want every_chunks >= 1, a positive age and a positive size cap; got "
                f"{every_chunks}, {max_age_s} s, {max_bytes} bytes"
            )
        self.folder = Path(folder).expanduser()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot make the state folder {self.folder}: {exc.strerror or exc}") from None
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise ValueError(f"the state folder {self.folder} is not writable")
        self.every_chunks = every_chunks
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # one pruning at a time (the model thread and page loads)

    def path(self, key: str) -> Path:
        """The checkpoint file of viewer `key`; ValueError for a string that is not a viewer key."""
        if not valid_key(key):
            raise ValueError("not a viewer key")
        return self.folder / (hashlib.sha256(key.encode()).hexdigest() + SUFFIX)

    def save(self, session: StreamingSession, key: str) -> int:
        """Write `session`'s memory to viewer `key`'s checkpoint (atomically), then bound the folder
        (never removing this checkpoint); the bytes written."""
        path = self.path(key)
        size = save_session(session, path)
        self.prune(keep=path)
        return size

    def find(self, key: str) -> CheckpointInfo | None:
        """Viewer `key`'s checkpoint, if there is one that has not expired."""
        if not valid_key(key):
            return None
        self.prune()
        path = self.path(key)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        try:
            summary = file_summary(read_session(path))
        except MemoryFileError as exc:  # offered anyway: resuming it says the same, and the viewer can start over
            summary = f"unreadable ({exc})".replace(str(path), "the checkpoint")
        return CheckpointInfo(stat.st_size, stat.st_mtime, summary, self.folder_bytes())

    def remove(self, key: str) -> bool:
        """Delete viewer `key`'s checkpoint; whether there was one."""
        if not valid_key(key):
            return False
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def folder_bytes(self) -> int:
        """Bytes of every checkpoint (and unfinished write) in the folder."""
        return sum(size for _, _, size in self._files())

    def prune(self, keep: Path | None = None, now: float | None = None) -> list[Path]:
        """Delete checkpoints (and temporary files a killed writer left) older than `max_age_s`, then
        the oldest checkpoints until the folder holds at most `max_bytes`; never `keep`, nor a write
        under way. The paths deleted."""
        now = time.time() if now is None else now
        removed = []
        with self._lock:
            files = sorted(self._files(), key=lambda f: f[1])  # oldest first
            total = sum(size for _, _, size in files)
            for path, mtime, size in files:
                if path == keep:
                    continue
                expired = now - mtime > self.max_age_s
                if expired or (total > self.max_bytes and path.name.endswith(SUFFIX)):
                    path.unlink(missing_ok=True)
                    total -= size
                    removed.append(path)
        for path in removed:
            log.info("checkpoint %s removed (expired, or the state folder was over its cap)", path.name)
        return removed

    def _files(self) -> list[tuple[Path, float, int]]:
        """(path, modification time, size) of the checkpoints and temporary files in the folder."""
        out = []
        for path in self.folder.iterdir():
            if not (path.name.endswith(SUFFIX) or path.name.endswith(".tmp")):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed meanwhile (a write renamed over it)
                continue
            out.append((path, stat.st_mtime, stat.st_size))
        return out

    def browser_secret(self) -> str:
        """The secret the page's local storage is encrypted with, made once and kept in the folder
        (so that a restarted app still reads the keys the browsers hold)."""
        path = self.folder / SECRET_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            secret = secrets.token_urlsafe(KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another front end of a cluster made it first, in a shared folder
            return self.browser_secret()
        with os.fdopen(fd, "w") as f:
            f.write(secret)
        return secret


class Checkpointer:
    """Saves one stream's memory to its viewer's checkpoint; called on the model thread only."""

    def __init__(self, store: CheckpointStore, key: str) -> None:
        path = store.path(key)  # a bad key fails here, not on the model thread
        self.store = store
        self.key = key
        # The size of the viewer's checkpoint: the last one written (by this app, or before its restart).
        self.saved_bytes: int | None = path.stat().st_size if path.exists() else None
        self.error: str | None = None  # why the last one could not be written

    def after_chunk(self, session: StreamingSession) -> None:
        """Save every `every_chunks` chunks of the session's stream."""
        if session.chunks_seen % self.store.every_chunks == 0:
            self.save(session)

    def save(self, session: StreamingSession) -> None:
        """Save now, unless the session holds no video; a disk that refuses is noted, never raised
        (the stream goes on, and the previous checkpoint stays whole)."""
        if session.frames_seen == 0:
            return
        try:
            self.saved_bytes = self.store.save(session, self.key)
            self.error = None
        except OSError as exc:
            self.error = f"the checkpoint could not be written: {exc.strerror or exc}"
            log.warning("checkpoint of a stream not written: %s", exc)


class Resumable(Protocol):
    """A stream's memory files as the viewers' checkpoints use them (`LiveStream.files`)."""

    checkpointer: Checkpointer | None

    def keep(self, checkpointer: Checkpointer | None) -> None: ...

    def load(self, path: str | os.PathLike[str]) -> str: ...


class PageKeys:
    """The viewers' keys by page session (a Gradio session hash): the key each page's browser keeps
    in its local storage, which outlives the page, the server's restart and the server itself."""

    def __init__(self) -> None:
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()

    def hello(self, session: str, key: object) -> str:
        """A page session opened with the `key` its browser keeps: the key it goes on with (anything
        but a viewer key gets a new one)."""
        key = key if valid_key(key) else new_viewer_key()
        with self._lock:
            self._keys[session] = key
        return key

    def key_of(self, session: str) -> str | None:
        """The key of the page session (None: its page has not said hello)."""
        with self._lock:
            return self._keys.get(session)

    def forget(self, session: str) -> None:
        """The page closed (what was kept for its key stays)."""
        with self._lock:
            self._keys.pop(session, None)


class Viewers:
    """The viewers' keys by page session, their checkpoints, and resuming."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.keys = PageKeys()

    def hello(self, session: str, key: object) -> tuple[str, CheckpointInfo | None]:
        """A page session opened with the `key` its browser keeps (anything but a viewer key gets a new
        one): the key it goes on with, and its checkpoint if there is one to resume."""
        key = self.keys.hello(session, key)
        return key, self.store.find(key)

    def attach(self, session: str, files: Resumable) -> None:
        """Checkpoint a stream's memory `files` to the key of its page session, if the page said hello."""
        key = self.keys.key_of(session)
        if key is not None and files.checkpointer is None:
            files.keep(Checkpointer(self.store, key))

    def resume(self, session: str, files: Resumable) -> str:
        """Load the page session's checkpoint into a stream's memory `files`; one line about it. MemoryFileError when
        there is none (never said hello, expired, deleted) or it cannot be loaded."""
        key = self.keys.key_of(session)
        path = None if key is None else self.store.path(key)
        if path is None or not path.exists():
            raise MemoryFileError("There is no checkpoint to resume (it expired, or was never written).")
        try:
            return files.load(path)
        except MemoryFileError as exc:
            raise MemoryFileError(str(exc).replace(str(path), "the checkpoint")) from None

    def forget(self, session: str) -> None:
        """The page closed (its checkpoint stays, for the key its browser keeps)."""
        self.keys.forget(session)
