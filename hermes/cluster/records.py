"""What engines, the directory and front ends hand each other: plain, picklable records.

Nothing here imports ray, so the records are tested (and read) without a cluster.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from hermes.serving import (
    Busy,
    CheckpointStore,
    MemoryFileError,
    QuestionError,
    StreamError,
    StreamSettings,
    TooManyQuestions,
    UrlPolicy,
    UrlRefused,
    VideoError,
    VideoLM,
    WatchError,
)

# Where engines keep what a stream needs on another machine, inside the shared state folder.
CHECKPOINTS = "checkpoints"
UPLOADS = "uploads"


@dataclass(frozen=True)
class StreamRecord:
    """How a stream was started, enough for another engine to take it on: its kind ('file', 'url',
    'webcam', or 'memory' for a memory loaded without a source), the video's path on shared storage,
    the pace, the settings, and for a URL the policy it was opened under."""

    key: str
    kind: str
    video: str | None = None
    speed: str = "1x"
    settings: StreamSettings | None = None
    urls: UrlPolicy | None = None


@dataclass(frozen=True)
class StreamFacts:
    """What an engine reports of one of its streams at every health check."""

    record: StreamRecord | None
    state: str
    stream_time_s: float
    frames_seen: int


@dataclass(frozen=True)
class EngineHealth:
    """An engine's answer to a health check: who it is (a restarted actor has a new `incarnation`),
    its memory, and its streams by viewer key."""

    name: str
    incarnation: str
    node_id: str
    free_bytes: int
    cap_bytes: int
    max_streams: int
    streams: dict[str, StreamFacts] = field(default_factory=dict)


@dataclass(frozen=True)
class MoveResult:
    """A stream moved from one engine to another: the seconds of video it lost (streamed after its
    last checkpoint), where its video goes on, and (when asked for) the digest of the memory it holds
    right after the move."""

    key: str
    from_engine: str
    to_engine: str
    lost_s: float
    resumed_at_s: float | None
    took_s: float
    digest: str | None = None
    note: str = ""


@dataclass(frozen=True)
class ModelFacts:
    """What the page reads of the engines' model (the model line, the banner, the tiers), without
    loading it in the front end."""

    source: str
    arch: str
    num_layers: int
    kv_layers: int
    random_weights: bool
    devices: list[torch.device]
    device: torch.device
    dtype_name: str
    card: object


def model_facts(lm: VideoLM) -> ModelFacts:
    """The page's facts of `lm`."""
    return ModelFacts(
        lm.source, lm.arch, lm.num_layers, lm.kv_layers, lm.random_weights, list(lm.devices), lm.device,
        lm.dtype_name, lm.card,
    )  # fmt: skip


class StreamElsewhere(RuntimeError):
    """An engine was asked for a stream it handed to another (drained): ask the directory again."""


# The errors a viewer is shown, by name: an engine hands them back as (name, message), since some
# (VideoError) cannot be pickled by their arguments, and the front end raises them again.
ERRORS: dict[str, type[Exception]] = {
    "StreamElsewhere": StreamElsewhere,
    "Busy": Busy,
    "TooManyQuestions": TooManyQuestions,
    "QuestionError": QuestionError,
    "WatchError": WatchError,
    "MemoryFileError": MemoryFileError,
    "UrlRefused": UrlRefused,
    "StreamError": StreamError,
    "VideoError": VideoError,
    "TimeoutError": TimeoutError,
    "ValueError": ValueError,
    "RuntimeError": RuntimeError,
}


@dataclass(frozen=True)
class Failed:
    """An engine call that raised one of ERRORS: its class's name and message."""

    kind: str
    message: str

    @classmethod
    def of(cls, exc: Exception) -> Failed:
        """The record of `exc` (by the nearest of ERRORS in its classes; else a RuntimeError)."""
        kind = next((c.__name__ for c in type(exc).__mro__ if c.__name__ in ERRORS), "RuntimeError")
        return cls(kind, str(exc))

    def error(self) -> Exception:
        """The exception to raise again in the front end."""
        kind = ERRORS[self.kind]
        if issubclass(kind, VideoError):
            return kind("", "", self.message)
        return kind(self.message)


def browser_secret(state_dir: str | os.PathLike[str]) -> str:
    """The secret every front end encrypts the viewers' keys in their browsers with: one, kept in
    the shared state folder, so that any front end reads the key a page holds."""
    return CheckpointStore(Path(state_dir) / CHECKPOINTS).browser_secret()


def checkpoint_key(key: str) -> str:
    """The checkpoint key of viewer key `key` (any string): a SHA-256, which has a viewer key's shape."""
    return hashlib.sha256(b"hermes-cluster\0" + key.encode()).hexdigest()


def short_id(key: str) -> str:
    """A stream's name in listings: never the viewer's key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def memory_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 over every tensor of a memory file (name, dtype, shape, bytes), in name order: two
    memories are the same bit for bit exactly when their digests are."""
    h = hashlib.sha256()
    with safe_open(os.fspath(path), framework="pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def keep_upload(folder: Path, data: bytes, name: str) -> Path:
    """`data` (an uploaded video) kept in the shared `folder`, in a folder named by its content's
    SHA-256 under its own name (made safe), so that any engine can open it after a move; the path."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(name).name)[-120:].lstrip(".") or "upload"
    path = folder / hashlib.sha256(data).hexdigest() / safe
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{safe}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
