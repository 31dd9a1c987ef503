"""The live streams of all viewers, one per viewer key (a browser tab), with admission control and leases.

Every viewer (browser tab or API client) gets its own `LiveStream` over the one shared model and
model thread. Before a stream starts a source, the registry checks its limits and raises Busy,
with the numbers, when one is reached; it does so before anything of the source is decoded, so a
refused start costs nothing:

- streams: at most `max_streams` streams have a running source, or a start being prepared, at once
  (they share one model thread, so each more slows all of them down);
- starts: at most `max_preparing` starts are being prepared (their first frames decoded) at once;
- memory: the caches that streams hold (reserved exactly, from `cache_bytes_for`; a memory loaded
  from a file, its cache's bytes if more) plus the new stream's must fit in `memory_cap_bytes`. A
  stream keeps its reservation while it holds a memory (finished streams can still be asked), and
  gives it back on Reset or when its tab closes.

Leases: every stream belongs to a viewer who can be lost. Each request of the viewer's session
(the page's timer ticks every second; an API client polls `/metrics` or calls `/keepalive`)
renews its lease; a stream not heard from for `lease_s` seconds is closed, whatever it is doing
(streaming, paused, waiting for the webcam, finished), and its slot and memory go to others. A
viewer who comes back gets a fresh stream that says why the old one is gone.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from hermes.models.base import VideoLM
from hermes.runtime.settings import StreamSettings
from hermes.serving.admission import MB, Busy, cache_bytes_for, host_bytes_for, host_memory_cap, memory_cap_for
from hermes.serving.live import LiveStream
from hermes.serving.worker import ModelWorker

DEFAULT_LEASE_S = 60.0
DEFAULT_MAX_PREPARING = 2
# Viewers whose stream lapsed, kept to tell them why when they come back (the oldest forgotten first).
LAPSED_KEPT = 1000


def lapsed_note(lease_s: float) -> str:
    """What a viewer whose stream lapsed reads when they come back."""
    return (
        f"Your previous stream was stopped after {lease_s:.0f} s without a sign of this page or client (a heartbeat, "
        "a request, a /metrics poll or a /keepalive), and its slot and memory went to other viewers. Start again "
        "to go on."
    )


class StreamRegistry:
    """Streams by viewer key, each on a lease of `lease_s` seconds renewed by every `get` (see the
    module's docstring). `memory_cap_bytes` None: `memory_cap_for` the model (per device when its
    layers are spread over several)."""

    def __init__(
        self,
        lm: VideoLM,
        worker: ModelWorker | None = None,
        settings: StreamSettings | None = None,
        max_streams: int = 4,
        lease_s: float = DEFAULT_LEASE_S,
        memory_cap_bytes: int | None = None,
        max_preparing: int = DEFAULT_MAX_PREPARING,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"the lease must be positive, got {lease_s} s")
        self.lm = lm
        self.worker = worker or ModelWorker()
        # A checkpoint made for HERMES Live (the toy model) says what stream it was trained for.
        self.settings = settings or StreamSettings(**lm.card.stream)
        self.max_streams = max_streams
        self.max_preparing = max_preparing
        self.lease_s = lease_s
        self.memory_cap_bytes = memory_cap_for(lm) if memory_cap_bytes is None else memory_cap_bytes
        self.lapsed = 0  # streams closed because their lease ran out
        self._streams: dict[str, LiveStream] = {}
        self._preparing: set[str] = set()  # keys whose start is being prepared (its slot taken)
        self._gone: OrderedDict[str, str] = OrderedDict()  # lapsed keys -> what to tell them
        self._lock = threading.Lock()
        self._stop = threading.Event()
        every = max(0.05, min(lease_s / 4, 5.0))
        threading.Thread(
            target=_watch_leases, args=(weakref.ref(self), self._stop, every), name="hermes-leases", daemon=True
        ).start()

    def get(self, key: str, create: bool = True) -> LiveStream | None:
        """The stream of viewer `key`, created (with the default settings) on first use; renews its lease."""
        self.reap()
        with self._lock:
            stream = self._streams.get(key)
            note = None
            if stream is None and create:
                stream = LiveStream(self.worker, self.lm, self.settings, key=key, admit=self.admitting)
                self._streams[key] = stream
                note = self._gone.pop(key, None)
        if stream is not None:
            stream.touch()
            if note is not None:
                stream.tell(note)
        return stream

    def close(self, key: str) -> bool:
        """Close and forget viewer `key`'s stream (its tab closed); False if there was none."""
        with self._lock:
            stream = self._streams.pop(key, None)
        if stream is None:
            return False
        stream.close()
        return True

    def pop_lapsed(self, key: str) -> str | None:
        """What to tell viewer `key` if its stream lapsed (once), else None."""
        with self._lock:
            return self._gone.pop(key, None)

    def reap(self) -> list[str]:
        """Close the streams whose lease ran out (none of their viewer's requests for `lease_s`); their keys.
        A viewer whose stream held a source or memory is told why when they come back."""
        now = time.monotonic()
        with self._lock:
            lapsed = {
                k: s
                for k, s in self._streams.items()
                if now - s.last_active > self.lease_s and k not in self._preparing
            }
            for key in lapsed:
                del self._streams[key]
        for key, stream in lapsed.items():
            held = stream.running or stream.reserved_bytes > 0
            stream.close()
            if held:
                with self._lock:
                    self.lapsed += 1
                    self._gone[key] = lapsed_note(self.lease_s)
                    while len(self._gone) > LAPSED_KEPT:
                        self._gone.popitem(last=False)
        return list(lapsed)

    def reserved_bytes(self) -> int:
        """Cache memory held by the streams now."""
        with self._lock:
            return sum(s.reserved_bytes for s in self._streams.values())

    @contextmanager
    def admitting(self, stream: LiveStream, settings: StreamSettings, held_bytes: int = 0) -> Iterator[None]:
        """Take a slot for `stream`'s start and reserve its cache memory for `settings` (at least
        `held_bytes`: a memory loaded from a file, whose cache is as large as it was saved), or raise
        Busy saying why not, before anything is decoded or loaded. Inside the block the start is
        prepared (its slot counts as taken); if the block raises, the stream gets its earlier
        reservation back."""
        needed = max(cache_bytes_for(self.lm, settings), held_bytes)
        host_needed = host_bytes_for(settings)
        cap = f"more than this server gives one stream ({self.memory_cap_bytes / MB:,.1f} MB in all)"
        if needed > self.memory_cap_bytes and held_bytes >= needed:
            raise Busy(f"This memory takes {needed / MB:,.1f} MB of cache once loaded, {cap}.")
        if needed > self.memory_cap_bytes:
            raise Busy(
                f"These settings need {needed / MB:,.1f} MB of cache, {cap}: lower the budget |M|, turn off "
                "Compare, or use hermes or fifo instead of full."
            )
        # Under the lock, so that two streams starting at once cannot both take the last slot or memory.
        with self._lock:
            self._check_room(stream, needed, host_needed)
            before = stream.reserved_bytes, stream.reserved_host_bytes
            stream.reserved_bytes, stream.reserved_host_bytes = needed, host_needed
            self._preparing.add(stream.key)
        try:
            yield
        except BaseException:
            stream.reserved_bytes, stream.reserved_host_bytes = before
            raise
        finally:
            with self._lock:
                self._preparing.discard(stream.key)

    def _check_room(self, stream: LiveStream, needed: int, host_needed: int) -> None:
        """Busy unless a slot, a preparing turn and the memory are free for `stream` (lock held)."""
        others = {k: s for k, s in self._streams.items() if s is not stream}
        running = sum(1 for k, s in others.items() if k in self._preparing or s.running)
        if running >= self.max_streams:
            raise Busy(
                f"Busy: this server runs at most {self.max_streams} stream(s) at once, and all are in use. "
                "Try again in a minute."
            )
        if stream.key in self._preparing or len(self._preparing) >= self.max_preparing:
            raise Busy(
                f"Busy: {len(self._preparing)} start(s) are being prepared, the most this server prepares at once. "
                "Try again in a moment."
            )
        cap = self.memory_cap_bytes
        reserved = sum(s.reserved_bytes for s in others.values())
        if reserved + needed > cap:
            raise Busy(
                f"Busy: the other streams hold {reserved / MB:,.1f} MB of the {cap / MB:,.1f} MB of cache "
                f"memory, and this one needs {needed / MB:,.1f} MB. Try again in a minute, or lower the "
                "budget |M|."
            )
        host_reserved, host_cap = sum(s.reserved_host_bytes for s in others.values()), host_memory_cap()
        if host_needed and host_reserved + host_needed > host_cap:
            raise Busy(
                f"Busy: rekv keeps every frame in host memory; the other streams hold {host_reserved / MB:,.1f} "
                f"MB of the {host_cap / MB:,.1f} MB this server gives it, and this one may take "
                f"{host_needed / MB:,.1f} MB. Try again in a minute, or pick a policy without a host store."
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        """Close every stream and stop the lease watch and the model thread."""
        self._stop.set()
        with self._lock:
            keys = list(self._streams)
        for key in keys:
            self.close(key)
        self.worker.stop()


def _watch_leases(ref: weakref.ref[StreamRegistry], stop: threading.Event, every: float) -> None:
    """Reap lapsed streams every `every` seconds until `stop` (or the registry is gone): a server that
    nobody calls any more still frees what its silent viewers held."""
    while not stop.wait(every):
        registry = ref()
        if registry is None:
            return
        registry.reap()
        del registry
