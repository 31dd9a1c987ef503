"""A live stream's source when it is a network stream (RTSP, RTMP, SRT, HLS, MJPEG, MP4 over HTTP).

The `NetworkReader` (hermes.video.network) decodes in its own thread and keeps the newest frames
(a chunk's worth); a `NetworkSource` takes frames from it, cuts them into chunks and hands each on,
but only while the model holds no chunk of the stream: while the model is busy the reader goes on
keeping only the newest frames, so the next chunk is the newest, the memory follows the live edge,
and what was skipped is counted, never piled up. A live source is
never paced or seeked. A drop and a reconnect are said through `on_drop` and `on_back`; the
memory is untouched meanwhile. A stream that never opens calls `on_error` once, with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hermes.engine.chunk import Chunk
from hermes.video.chunking import Chunker
from hermes.video.errors import Skipped
from hermes.video.network import Link, NetworkReader
from hermes.video.urls import redact

log = logging.getLogger(__name__)

ROOM_POLL_S = 0.1  # how often a waiting source looks at its stop signal


def opened(url: str, fps: float, name: str, **options: object) -> NetworkReader:
    """A reader of `url` sampling at `fps`, started, once the stream sent its first frame; StreamError,
    within seconds, with the reason when it does not. `options`: the reader's (its timeouts)."""
    reader = NetworkReader(url, fps, name=name, **options)
    reader.start()
    reader.wait_open()
    log.info("streaming %s", redact(url))
    return reader


@dataclass(frozen=True)
class NetworkNumbers:
    """What the status line and /metrics say of a network stream."""

    url: str  # without credentials
    link: str  # connecting, streaming, reconnecting, ...
    reconnects: int
    skipped_s: float  # stream time the model skipped to stay at the live edge
    skipped_frames: int
    latency_s: float | None  # glass to memory: the newest frame of the last chunk, until its prefill ended
    gaps: tuple[str, ...]  # the latest drops, in words


class NetworkSource:
    """Frames of a network stream from its `reader`, cut into chunks; frames are taken while
    `has_room(timeout)` says the consumer has room, and meanwhile the reader keeps only the newest."""

    def __init__(
        self,
        reader: NetworkReader,
        chunk_frames: int,
        *,
        on_chunk: Callable[[Chunk], None],
        has_room: Callable[[float], bool],
        on_end: Callable[[], None],
        on_error: Callable[[str], None],
        on_drop: Callable[[str], None] = lambda reason: None,
        on_back: Callable[[], None] = lambda: None,
        name: str = "stream",
        start_s: float = 0.0,
        first_frame: int = 0,
    ) -> None:
        self.reader = reader
        # A stream reconnected into a loaded memory goes on at that memory's stream time and frame number.
        self.start_s = start_s
        reader.on_link = self._on_link
        self.frames_read = 0
        self.skipped: list[Skipped] = []  # frames that could not be decoded: FFmpeg conceals them in a stream
        self.latency_s: float | None = None
        self._glass: dict[int, float] = {}  # id(chunk) -> glass time of its newest frame, until ingested
        self._chunker = Chunker(chunk_frames)
        self._chunker.next_index = first_frame
        self._on_chunk, self._has_room, self._on_end, self._on_error = on_chunk, has_room, on_end, on_error
        self._on_drop, self._on_back = on_drop, on_back
        self._stop = threading.Event()
        self._paused = False
        self._flush = True
        self._streamed = reader.link is not Link.CONNECTING  # a later STREAMING is a reconnect
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def dropped_frames(self) -> int:
        """Frames skipped to stay at the live edge."""
        return self.reader.frames.skipped_frames

    def start(self) -> None:
        """Start chunking (and reading, unless the reader was started to wait for it to open)."""
        if self.reader.thread.ident is None:
            self.reader.start()
        self.thread.start()

    def pause(self) -> None:
        """Frames that come while paused are let go (a live stream cannot wait)."""
        self._paused = True

    def resume(self) -> None:
        self.reader.frames.clear()
        self._paused = False

    def position_s(self) -> float | None:
        """The stream time of the newest frame read."""
        return self.start_s + self.reader.timeline.last_t if self.frames_read else None

    def stop(self, flush: bool) -> None:
        self._flush = flush
        self._stop.set()
        self.reader.stop()

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the chunking thread (the decoding thread ends by itself at its next packet or timeout)."""
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def ingested(self, chunk: Chunk) -> None:
        """`chunk` is in memory now: its glass-to-memory latency is measured."""
        glass = self._glass.pop(id(chunk), None)  # a chunk of another source is not there
        if glass is not None:
            self.latency_s = time.time() - glass

    def numbers(self) -> NetworkNumbers:
        r = self.reader
        return NetworkNumbers(
            url=r.name,
            link=str(r.link),
            reconnects=r.reconnects,
            skipped_s=r.frames.skipped_s,
            skipped_frames=r.frames.skipped_frames,
            latency_s=self.latency_s,
            gaps=tuple(str(g) for g in r.timeline.gaps[-5:]),
        )

    # -- threads ----------------------------------------------------------------------------------
    def _on_link(self, link: Link, detail: str | None) -> None:
        """The reader's connection changed (on the reader's thread)."""
        if link is Link.RECONNECTING:
            self._on_drop(detail or "the stream dropped")
        elif link is Link.STREAMING:
            if self._streamed:
                self._on_back()
            self._streamed = True

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._has_room(ROOM_POLL_S):  # meanwhile the reader keeps the newest frames
                continue
            frame = self.reader.get(ROOM_POLL_S)
            if frame is None:
                if self.reader.done:
                    break
                if self.reader.link is Link.RECONNECTING:
                    self._send_tail()  # what came before a drop goes in now, not when the stream is back
                continue
            if self._paused:
                continue
            chunk = self._chunker.push(frame.image, self.start_s + frame.t)
            self.frames_read += 1
            if chunk is not None:
                self._send(chunk, frame.glass)
        if self._flush or not self._stop.is_set():
            self._send_tail()
        if self._stop.is_set():
            return
        if self.reader.link is Link.FAILED:
            self._on_error(self.reader.error or "the stream failed")
        else:
            self._on_end()

    def _send_tail(self) -> None:
        tail = self._chunker.flush()
        if tail is not None:
            self._send(tail, self.reader.timeline.origin + float(tail.timestamps[-1]) - self.start_s)

    def _send(self, chunk: Chunk, glass: float) -> None:
        self._glass[id(chunk)] = glass
        while len(self._glass) > 8:  # chunks dropped on the way (a reset) are never ingested
            self._glass.pop(next(iter(self._glass)))
        self._on_chunk(chunk)
