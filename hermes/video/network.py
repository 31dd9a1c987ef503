"""Live network streams through PyAV: RTSP, RTMP, SRT, and HTTP(S) for HLS, MJPEG and progressive MP4.

decord, the file reader, cannot open a network stream; PyAV (FFmpeg's libraries in-process) can.
A `NetworkReader` runs one thread that owns its container from open to close (FFmpeg's demuxer
and decoder are never touched from another thread: closing them from outside is how decoder
threads crash on a dropped stream), with open and read timeouts so that a stalled server never
blocks it for ever, and RTSP over TCP (UDP loses packets behind NAT and firewalls). Under a
`UrlPolicy`, every connection FFmpeg makes for the stream goes through a gate (hermes/video/gate.py)
that checks it first: a redirect, a playlist or a segment naming a refused URL stops the stream with
that reason, once.

Frames are sampled at `fps` by their timestamps and put in a bounded queue that keeps only the
newest: a consumer that falls behind skips frames (their seconds are counted) and stays at the
live edge instead of drifting behind it. A stream that drops is reopened with backoff; its stream
time goes on across the gap by the wall clock, and each gap is recorded. A stream that never opens
fails once, with the reason in words. docs/design.md, "Live network streams", says why.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from hermes.video.decoding import DEFAULT_MAX_SIDE, fit_size
from hermes.video.errors import VideoError, clock
from hermes.video.gate import Gate, gate_for
from hermes.video.sizes import MAX_FRAME_PIXELS, TooLarge, decode_within
from hermes.video.urls import UrlPolicy, UrlRefused, redact, split_live_url

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 8.0  # to connect and read the stream's header
READ_TIMEOUT_S = 5.0  # without a packet, the stream has dropped
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # waits between reconnect attempts; the last repeats
QUEUE_SECONDS = 4.0  # frames kept for a slow consumer, in seconds of stream at the sampling rate
MAX_REDIRECTS = 5  # RTSP redirects followed (FFmpeg follows HTTP's itself, each through the gate)


class StreamError(VideoError):
    """A network stream cannot be opened (or reopened); the message names the URL without its
    credentials and says why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(redact(url), reason, f"Cannot open stream {redact(url)}: {reason}")


class Link(str, Enum):
    """Where a reader's connection is."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    ENDED = "ended"  # a stream with an end (a file served over HTTP, a finished playlist) ended
    FAILED = "failed"  # it never opened: `error` says why
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class LiveFrame:
    """A sampled frame: `image` (H, W, 3) uint8 RGB, `t` seconds of stream time (gaps included), and
    `glass` the wall-clock time (time.time()) at which it was on the camera's glass, as estimated."""

    image: np.ndarray
    t: float
    glass: float


@dataclass(frozen=True, slots=True)
class Gap:
    """The stream dropped at `at_s` (stream time) and came back `length_s` later."""

    at_s: float
    length_s: float

    def __str__(self) -> str:
        return f"dropped at {clock(self.at_s)} for {self.length_s:.0f} s"


def open_failure(exc: BaseException, elapsed_s: float, open_timeout_s: float) -> str:
    """Why a stream did not open, in words, from PyAV's error and how long the attempt took."""
    import av

    errors = av.error
    if isinstance(exc, ConnectionRefusedError):  # FFmpeg's, or the gate's connection to the server
        return "connection refused (nothing is listening there)"
    if isinstance(exc, errors.HTTPUnauthorizedError | errors.HTTPForbiddenError):
        return "authentication required (the server refused the credentials, or none were given)"
    if isinstance(exc, errors.PermissionError):  # EPERM: FFmpeg's safe mode, as an ffconcat naming a URL meets it
        return "FFmpeg's safe mode refused a file the stream names (a list naming an absolute path or a URL)"
    if isinstance(exc, errors.HTTPNotFoundError):
        return "the server has no stream at that path (404 Not Found)"
    if isinstance(exc, errors.HTTPError):
        return f"the server answered with an error ({exc.strerror})"
    if isinstance(exc, errors.ProtocolNotFoundError):
        return "this FFmpeg build cannot speak that protocol"
    if isinstance(exc, errors.ExitError | TimeoutError) or elapsed_s >= 0.9 * open_timeout_s:
        return f"no answer within {open_timeout_s:g} s (the host is unreachable, or the stream is not running)"
    if isinstance(exc, errors.InvalidDataError):
        return "not a video stream (the server sent something FFmpeg cannot read as video)"
    if isinstance(exc, errors.ArgumentError):  # a gated stream's format is not among gate.FORMATS
        return "not a video stream this server reads (lists that open files themselves, as ffconcat, are refused)"
    if isinstance(exc, errors.DecoderNotFoundError):
        return "codec not supported by the decoder"
    return said(exc)


def said(exc: BaseException) -> str:
    """What an error says, without the URL that FFmpeg's errors carry (it may hold credentials)."""
    if isinstance(exc, OSError):
        return (exc.strerror or type(exc).__name__).lower()
    return type(exc).__name__


class NewestFrames:
    """A bounded queue of frames that keeps the newest: a frame put into a full queue pushes out
    the oldest, and the stream time between the frame pushed out and the next one is counted as
    skipped."""

    def __init__(self, limit: int) -> None:
        self._frames: collections.deque[LiveFrame] = collections.deque()
        self._limit = max(1, limit)
        self._ready = threading.Condition()
        self.skipped_s = 0.0
        self.skipped_frames = 0

    def put(self, frame: LiveFrame) -> None:
        with self._ready:
            self._frames.append(frame)
            while len(self._frames) > self._limit:
                old = self._frames.popleft()
                self.skipped_s += self._frames[0].t - old.t
                self.skipped_frames += 1
            self._ready.notify()

    def get(self, timeout: float) -> LiveFrame | None:
        """The oldest frame kept, waiting up to `timeout` seconds for one; None if none came."""
        with self._ready:
            if not self._frames:
                self._ready.wait(timeout)
            return self._frames.popleft() if self._frames else None

    def clear(self) -> None:
        with self._ready:
            self._frames.clear()

    def __len__(self) -> int:
        return len(self._frames)


@dataclass
class Timeline:
    """Stream time across connections: each connection's timestamps count from where the stream
    stood when it opened, so time goes on across a gap by the wall clock; `origin` maps stream time
    to the wall clock (glass = origin + t), from the frame that arrived soonest after its time."""

    origin: float | None = None
    last_t: float = 0.0
    gaps: list[Gap] = field(default_factory=list)
    _offset: float = 0.0
    _first_pts: float | None = None
    _dropped_at: float | None = None  # wall time of the drop, while reconnecting

    def connected(self, now: float) -> None:
        """A new connection: its first frame comes after the gap since the drop, if any."""
        self._first_pts = None
        if self._dropped_at is not None and self.origin is not None:
            self._offset = max(self.last_t, now - self.origin)
            self.gaps.append(Gap(self.last_t, self._offset - self.last_t))
            del self.gaps[:-100]  # a flaky camera over days: the latest gaps are enough
        self._dropped_at = None

    def dropped(self, now: float) -> None:
        self._dropped_at = now

    def place(self, pts_s: float | None, arrival: float) -> float:
        """The stream time of a frame whose timestamp is `pts_s` (None: none), arrived at `arrival`."""
        if pts_s is None:
            t = self.last_t if self.origin is None else max(self.last_t, arrival - self.origin)
        else:
            if self._first_pts is None:
                self._first_pts = pts_s
            t = self._offset + (pts_s - self._first_pts)
        self.origin = arrival - t if self.origin is None else min(self.origin, arrival - t)
        self.last_t = max(self.last_t, t)
        return t


class NetworkReader:
    """One network stream read by one thread: frames sampled at `fps` into a queue of the newest.

    `policy` (None: none) governs every URL FFmpeg opens for the stream, redirects and playlists'
    URLs included. `start()` starts the thread; `wait_open()` waits for the first frame or raises why
    none came; `get(timeout)` takes the next frame. `link` says where the connection is; `failure`
    why it never opened, or was refused (then `link` is FAILED). `on_link(link, detail)` is called
    at each change (detail: the reason of a drop, the error of a failure), from the reader's thread,
    or for STOPPED from the thread that stopped it. `stop()` returns at once: the thread ends at its
    next packet, timeout or wait.
    """

    def __init__(
        self,
        url: str,
        fps: float,
        *,
        max_side: int | None = DEFAULT_MAX_SIDE,
        open_timeout_s: float = OPEN_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        queue_frames: int | None = None,
        on_link: Callable[[Link, str | None], None] = lambda link, detail: None,
        name: str = "stream-read",
        policy: UrlPolicy | None = None,
        max_pixels: int = MAX_FRAME_PIXELS,
    ) -> None:
        split_live_url(url)  # a URL that is not a live stream fails here, before any thread starts
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.url, self.fps, self.max_side = url.strip(), float(fps), max_side
        self.max_pixels = max_pixels  # every decoded frame is held to it, as a file's are
        self.policy = policy  # what every URL FFmpeg opens for it must pass (None: any, as the command line)
        self.open_timeout_s, self.read_timeout_s, self.backoff_s = open_timeout_s, read_timeout_s, backoff_s
        self.frames = NewestFrames(queue_frames or max(2, round(QUEUE_SECONDS * fps)))
        self.timeline = Timeline()
        self.link = Link.CONNECTING
        self.failure: StreamError | None = None  # why it never opened
        self.reconnects = 0
        self.frames_decoded = 0
        self.on_link = on_link  # who hears of the link's changes; a source taking the reader over sets it
        self._settled = threading.Event()  # set once the link left CONNECTING
        self._link_lock = threading.Lock()
        self._stop = threading.Event()
        self._next_due: float | None = None  # the stream time of the next frame to sample
        self._paced_from: float | None = None  # a stream with an end: the wall time of its time 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def name(self) -> str:
        """The URL as it may be shown (no credentials)."""
        return redact(self.url)

    def start(self) -> None:
        self.thread.start()

    def wait_open(self) -> None:
        """Wait until the stream sends its first frame (at most its open and read timeouts); StreamError
        with the reason when it does not, and the reader is stopped."""
        if not self._settled.wait(self.open_timeout_s + self.read_timeout_s + 1.0):
            self.stop()
            raise StreamError(self.url, f"no frame came within {self.open_timeout_s + self.read_timeout_s:g} s")
        if self.link is Link.FAILED:
            raise self.failure or StreamError(self.url, "it failed")

    def stop(self) -> None:
        """End the stream now; the thread leaves at once unless FFmpeg is inside a call, which its
        timeouts bound."""
        self._stop.set()
        self._set_link(Link.STOPPED, None)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float) -> None:
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def get(self, timeout: float) -> LiveFrame | None:
        return self.frames.get(timeout)

    @property
    def done(self) -> bool:
        """Whether no frame will come any more (ended, failed or stopped) and none is queued."""
        return self.link in (Link.ENDED, Link.FAILED, Link.STOPPED) and not len(self.frames)

    # -- the reader's thread ----------------------------------------------------------------------
    def _set_link(self, link: Link, detail: str | None) -> None:
        with self._link_lock:  # the reader's thread and a stopping one: a stopped link stays stopped
            if self.link is link or self.link is Link.STOPPED:
                return
            self.link = link
            self._settled.set()
        self.on_link(link, detail)

    @property
    def error(self) -> str | None:
        """Why the stream never opened, in words (None while it has not failed)."""
        return None if self.failure is None else str(self.failure)

    def _fail(self, failure: StreamError) -> None:
        self.failure = failure
        log.info("%s", failure)
        self._set_link(Link.FAILED, str(failure))

    def _run(self) -> None:
        attempt = 0
        opened_once = False
        while not self._stop.is_set():
            try:
                ended = self._read_once()
                opened_once = True
            except _Refused as refused:  # a URL the policy refuses: no retry would open it
                self._fail(StreamError(self.url, refused.reason))
                return
            except _Dropped as drop:
                opened_once = opened_once or drop.opened
                if not opened_once:
                    self._fail(StreamError(self.url, drop.reason))
                    return
                attempt = 0 if drop.opened else attempt + 1
                self.timeline.dropped(time.time())
                self._set_link(Link.RECONNECTING, drop.reason)
                if self._stop.wait(self.backoff_s[min(attempt, len(self.backoff_s) - 1)]):
                    return
                self.reconnects += 1
                continue
            except Exception as exc:  # keep the process alive whatever the decoder does
                log.error("reading %s failed: %s", self.name, said(exc))  # no traceback: it holds the URL
                self._fail(StreamError(self.url, f"reading failed: {said(exc)}"))
                return
            if ended:
                self._set_link(Link.ENDED, None)
                return

    def _read_once(self) -> bool:
        """Open the stream and read it until it drops (_Dropped), ends (True), is stopped (False) or is
        refused (_Refused). An RTSP redirect to an allowed URL is followed here, through a new gate."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                return self._read_at(url)
            except _Moved as moved:
                url = moved.url
        raise _Dropped(f"it was redirected more than {MAX_REDIRECTS} times", opened=False)

    def _read_at(self, url: str) -> bool:
        """One attempt at `url`, through its gate."""
        import av

        started = time.monotonic()
        try:
            gate = gate_for(url, self.policy, self.open_timeout_s)
        except UrlRefused as refused:  # the name now resolves to a refused address
            raise _Refused(str(refused)) from None
        with gate:
            try:
                container = av.open(gate.url, options=gate.options, timeout=(self.open_timeout_s, self.read_timeout_s))
            except Exception as exc:
                _stop_if_gated(gate)
                why = open_failure(gate.unreachable or exc, time.monotonic() - started, self.open_timeout_s)
                raise _Dropped(why, opened=False) from exc
            with container:
                return self._decode(container, gate)

    def _decode(self, container, gate: Gate) -> bool:
        """Decode `container`'s video until it drops, ends or is stopped (as `_read_once` says)."""
        _stop_if_gated(gate)
        if not container.streams.video:
            raise _Dropped("no video stream in it", opened=False)
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        live = container.duration is None  # a file over HTTP, or a finished playlist, has a duration
        self.timeline.connected(time.time())
        self._next_due = self._paced_from = None
        opened = False
        try:
            for frame in decode_within(container, stream, self.max_pixels):
                if self._stop.is_set():
                    return False
                _stop_if_gated(gate)  # a playlist went on to a refused URL: what is buffered stays unread
                if not opened:
                    opened = True
                    self._set_link(Link.STREAMING, None)
                self._take(frame, live)
        except (_Refused, _Moved):
            raise
        except TooLarge as exc:  # frames past the limit: reconnecting would only decode them again
            raise _Refused(exc.reason) from exc
        except Exception as exc:  # a read timeout, a reset connection, damaged data
            if self._stop.is_set():
                return False
            _stop_if_gated(gate)
            reason = open_failure(exc, 0.0, self.open_timeout_s) if not opened else _drop_reason(exc)
            raise _Dropped(reason, opened=opened) from exc
        _stop_if_gated(gate)
        if not opened:
            raise _Dropped("the stream sent no frame that decodes", opened=False)
        if self._stop.is_set():
            return False
        if live:
            raise _Dropped("the server ended the stream", opened=True)
        return True

    def _take(self, frame, live: bool) -> None:
        """Sample one decoded frame at the reader's fps by its stream time; a stream with an end is
        paced by the wall clock (it would otherwise arrive as fast as the network goes)."""
        self.frames_decoded += 1
        pts_s = float(frame.time) if frame.time is not None else None
        if not live and pts_s is not None:
            if self._paced_from is None:
                self._paced_from = time.time() - pts_s
            self._stop.wait(max(0.0, self._paced_from + pts_s - time.time()))
        t = self.timeline.place(pts_s, time.time())
        period = 1.0 / self.fps
        if self._next_due is not None and t < self._next_due - 0.25 * period:
            return
        due = (t if self._next_due is None else self._next_due) + period
        self._next_due = due if due > t else t + period  # resync after a gap
        w, h = fit_size(frame.width, frame.height, self.max_side)
        image = frame.to_ndarray(format="rgb24", width=w, height=h)
        self.frames.put(LiveFrame(image, t, self.timeline.origin + t))


class _Dropped(Exception):
    """The connection ended: `reason` in words; `opened` whether it had delivered frames."""

    def __init__(self, reason: str, *, opened: bool) -> None:
        super().__init__(reason)
        self.reason, self.opened = reason, opened


class _Refused(Exception):
    """The policy refused a URL the stream needs, or its frames are past the size limit: `reason` in
    words. The stream fails, not retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Moved(Exception):
    """An RTSP server sent the stream on to `url`, which the policy allows."""

    def __init__(self, url: str) -> None:
        super().__init__(redact(url))
        self.url = url


def _stop_if_gated(gate: Gate) -> None:
    """_Refused once `gate` refused a URL, _Moved once the server sent the stream on: whatever FFmpeg
    says then, this is why."""
    if gate.refusal is not None:
        raise _Refused(gate.refusal)
    if gate.moved is not None:
        raise _Moved(gate.moved)


def _drop_reason(exc: BaseException) -> str:
    """Why a stream that was playing dropped, in words."""
    import av

    if isinstance(exc, av.error.ExitError | av.error.TimeoutError):
        return "no data came for a while (the stream stalled)"
    if isinstance(exc, av.error.EOFError | EOFError):
        return "the server ended the stream"
    return f"the stream broke ({said(exc)})"
