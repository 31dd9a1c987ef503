"""The live streams of all viewers, one per viewer key (a browser tab), with admission control.

Every viewer (browser tab or API client) gets its own `LiveStream` over the one shared model and
model thread. Before a stream starts a source, the registry checks two limits and raises Busy,
with the numbers, when either is reached:

- streams: at most `max_streams` streams have a running source at once (they share one model
  thread, so each more slows all of them down);
- memory: the caches that streams hold (reserved exactly, from `cache_bytes_for`) plus the new
  stream's must fit in `memory_cap_bytes`. A stream keeps its reservation while it holds a
  memory (finished streams can still be asked), and gives it back on Reset or when its tab closes.
"""

from __future__ import annotations

import threading
import time

from hermes.models.base import VideoLM
from hermes.serving.admission import MB, Busy, cache_bytes_for, host_bytes_for, host_memory_cap, memory_cap_for
from hermes.serving.live import LiveStream
from hermes.serving.settings import StreamSettings
from hermes.serving.worker import ModelWorker


class StreamRegistry:
    """Streams by viewer key. Streams idle for `idle_timeout_s` (no calls, no running source) are
    closed, for API clients that never say goodbye. `memory_cap_bytes` None: `memory_cap_for` the
    model (per device when its layers are spread over several)."""

    def __init__(
        self,
        lm: VideoLM,
        worker: ModelWorker | None = None,
        settings: StreamSettings | None = None,
        max_streams: int = 4,
        idle_timeout_s: float = 1800.0,
        memory_cap_bytes: int | None = None,
    ) -> None:
        self.lm = lm
        self.worker = worker or ModelWorker()
        # A checkpoint made for HERMES Live (the toy model) says what stream it was trained for.
        self.settings = settings or StreamSettings(**lm.card.stream)
        self.max_streams = max_streams
        self.idle_timeout_s = idle_timeout_s
        self.memory_cap_bytes = memory_cap_for(lm) if memory_cap_bytes is None else memory_cap_bytes
        self._streams: dict[str, LiveStream] = {}
        self._lock = threading.Lock()

    def get(self, key: str, create: bool = True) -> LiveStream | None:
        """The stream of viewer `key`, created (with the default settings) on first use."""
        self.reap_idle()
        with self._lock:
            stream = self._streams.get(key)
            if stream is None and create:
                stream = LiveStream(self.worker, self.lm, self.settings, key=key, admit=self.admit)
                self._streams[key] = stream
        if stream is not None:
            stream.touch()
        return stream

    def close(self, key: str) -> bool:
        """Close and forget viewer `key`'s stream (its tab closed); False if there was none."""
        with self._lock:
            stream = self._streams.pop(key, None)
        if stream is None:
            return False
        stream.close()
        return True

    def reserved_bytes(self) -> int:
        """Cache memory held by the streams now."""
        with self._lock:
            return sum(s.reserved_bytes for s in self._streams.values())

    def admit(self, stream: LiveStream, settings: StreamSettings) -> None:
        """Reserve `stream`'s cache memory for `settings`, or raise Busy saying why not."""
        needed = cache_bytes_for(self.lm, settings)
        host_needed = host_bytes_for(settings)
        cap = self.memory_cap_bytes
        if needed > cap:
            raise Busy(
                f"These settings need {needed / MB:,.1f} MB of cache, more than this server gives one stream "
                f"({cap / MB:,.1f} MB in all): lower the budget |M|, turn off Compare, or use hermes or fifo "
                "instead of full."
            )
        # Under the lock, so that two streams starting at once cannot both take the last memory.
        with self._lock:
            others = [s for s in self._streams.values() if s is not stream]
            running = sum(1 for s in others if s.running)
            if running >= self.max_streams:
                raise Busy(
                    f"Busy: this server runs at most {self.max_streams} stream(s) at once, and all are in use. "
                    "Try again in a minute."
                )
            reserved = sum(s.reserved_bytes for s in others)
            if reserved + needed > cap:
                raise Busy(
                    f"Busy: the other streams hold {reserved / MB:,.1f} MB of the {cap / MB:,.1f} MB of cache "
                    f"memory, and this one needs {needed / MB:,.1f} MB. Try again in a minute, or lower the "
                    "budget |M|."
                )
            host_reserved, host_cap = sum(s.reserved_host_bytes for s in others), host_memory_cap()
            if host_needed and host_reserved + host_needed > host_cap:
                raise Busy(
                    f"Busy: rekv keeps every frame in host memory; the other streams hold {host_reserved / MB:,.1f} "
                    f"MB of the {host_cap / MB:,.1f} MB this server gives it, and this one may take "
                    f"{host_needed / MB:,.1f} MB. Try again in a minute, or pick a policy without a host store."
                )
            stream.reserved_bytes, stream.reserved_host_bytes = needed, host_needed

    def reap_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [k for k, s in self._streams.items() if now - s.last_active > self.idle_timeout_s and not s.running]
        for key in idle:
            self.close(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        """Close every stream and stop the model thread."""
        with self._lock:
            keys = list(self._streams)
        for key in keys:
            self.close(key)
        self.worker.stop()
