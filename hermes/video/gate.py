"""The way out for a stream that a `UrlPolicy` governs: every connection FFmpeg makes for it goes
through a gate on loopback that checks its URL against the policy before a byte leaves for it.

FFmpeg opens more URLs than the one it is given: it follows HTTP and RTSP redirects, and an HLS
playlist names variant playlists, segments and keys that its demuxer opens itself. None of that
passes through Python on its own. So an `HttpGate` is FFmpeg's HTTP proxy (its `http_proxy`
option, which the HLS demuxer hands on to every URL it opens): each request, and each HTTPS
`CONNECT`, names its URL, which is checked, resolved once and connected to at the address checked
(no second DNS answer, so no DNS rebinding). An `RtspGate` relays one RTSP server, whose address
was checked and fixed when it opened, and reads its answers: a redirect never reaches FFmpeg; one
to an allowed URL is followed by the reader through a new gate, one to another URL is refused.
The first refusal shuts the gate (every later connection is refused too, and those open are cut),
so that a stream that names a refused URL stops with that one reason. FFmpeg reads only demuxers
whose nested opens go through the gate (`FORMATS`). docs/design.md, "Live network streams", says
why it is done this way and what it does not cover.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import urljoin, urlsplit

from hermes.video.urls import Address, UrlPolicy, UrlRefused, default_port, redact, split_live_url

HEAD_LIMIT = 64 * 1024  # a request's or an answer's head: longer is not FFmpeg's, nor a stream server's
BODY_LIMIT = 1 << 20  # an RTSP answer's body (an SDP)
POLL_S = 0.2  # how often the gate's threads look whether it closed
CHUNK = 1 << 16

# The demuxers a gated stream may use: live and container formats that open nothing, and HLS, whose
# playlists, segments and keys go through the gate. Lists that open files themselves without the
# gate's proxy option (ffconcat, image sequences, SDP) are not among them.
FORMATS = (
    "hls,mpegts,mov,matroska,flv,live_flv,mpjpeg,mjpeg,h264,hevc,m4v,mpegvideo,avi,asf,mpeg,nut,ogg,ivf,rtsp,"
    "aac,mp3,ac3,eac3,webvtt"  # HLS's audio and subtitle renditions
)
HTTP_PROTOCOLS = "http,https,tls,tcp,httpproxy,crypto,data"  # crypto and data: HLS keys and inline URIs
RTSP_PROTOCOLS = "rtsp,tcp"


class Gate:
    """What FFmpeg opens for one attempt at a stream: `url` with `options`. `refusal` says, once the
    gate refused a URL, which and why; `moved` is an allowed URL an RTSP server sent the stream on to.
    This one lets FFmpeg connect by itself (no policy, or RTMP and SRT, which name no other URL)."""

    def __init__(self, url: str, options: dict[str, str]) -> None:
        self.url, self.options = url, options
        self.refusal: str | None = None
        self.moved: str | None = None
        self.unreachable: OSError | None = None  # why the first connection that failed did (an allowed host)

    def close(self) -> None:
        """End the gate's connections (FFmpeg's container is closed first)."""

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gate_for(url: str, policy: UrlPolicy | None, timeout_s: float) -> Gate:
    """The gate for one attempt at `url` under `policy` (None: FFmpeg connects by itself, as the command
    line lets it); UrlRefused when the policy refuses `url` itself. `timeout_s` bounds a connection."""
    scheme = split_live_url(url).scheme.lower()
    rtsp = {"rtsp_transport": "tcp"} if scheme.startswith("rtsp") else {}
    if policy is None:
        return Gate(url, rtsp)
    if scheme in ("http", "https"):
        return HttpGate(url, policy, timeout_s)
    if scheme in ("rtsp", "rtsps"):
        return RtspGate(url, policy, timeout_s)
    policy.check(url)  # FFmpeg resolves the name again (docs/limits.md)
    return Gate(url, {"format_whitelist": FORMATS})


class _Checkpoint(Gate):
    """A gate that FFmpeg connects to on loopback: one thread accepts, one serves each connection."""

    def __init__(self, url: str, options: dict[str, str], policy: UrlPolicy, timeout_s: float) -> None:
        super().__init__(url, options)
        self.policy, self.timeout_s = policy, timeout_s
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="stream-gate", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._cut(keep=None)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._serve_client, args=(client,), name="stream-gate-conn", daemon=True).start()

    def _serve_client(self, client: socket.socket) -> None:
        client.settimeout(self.timeout_s)
        with self._tracked(client):
            try:
                self._serve(client)
            except (OSError, ValueError):  # a side closed or broke the protocol: FFmpeg sees the end
                return

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _tracked(self, sock: socket.socket) -> Iterator[socket.socket]:
        """`sock`, cut when the gate closes or refuses, and closed when done."""
        with self._lock:
            self._sockets.add(sock)
        try:
            with sock:
                yield sock
        finally:
            with self._lock:
                self._sockets.discard(sock)

    def _cut(self, keep: socket.socket | None) -> None:
        with self._lock:
            cut = [s for s in self._sockets if s is not keep]
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes its thread, which closes it

    def _refuse(self, url: str, reason: str, how: str | None, keep: socket.socket | None) -> None:
        """Refuse `url` and with it the stream: what is open is cut (but `keep`), and what comes later is
        refused. `how`: how the stream came to name it, in words with `{url}` (None: it is the stream's own)."""
        with self._lock:
            if self.refusal is None:
                named = None if how is None else how.format(url=redact(url))
                self.refusal = reason if named is None else f"{named}, which this server does not open ({reason})"
        self._cut(keep)

    def _connect(self, url: str, addresses: Sequence[Address]) -> socket.socket:
        """A connection to `url`'s port at one of `addresses` (checked by the policy); OSError when none
        takes it, noted as why the stream could not be reached."""
        port = default_port(split_live_url(url))
        error: OSError = OSError("the host has no address")
        for address in addresses:
            try:
                sock = socket.create_connection((str(address), port), timeout=self.timeout_s)
            except OSError as exc:
                error = exc
                continue
            sock.settimeout(None)  # FFmpeg's read timeout decides; the gate's close cuts it
            return sock
        with self._lock:
            self.unreachable = self.unreachable or error
        raise error

    def _pipe(
        self, client: socket.socket, upstream: socket.socket, both: bool, passed: Callable[[bytes], bytes] = bytes
    ) -> None:
        """Bytes from `upstream` to `client`, as `passed` lets them (`both`: and back; else what the client
        sends is let go) until a side closes or the gate is cut."""
        client.settimeout(None)  # a paced reader may leave FFmpeg's socket full for a while; the cut ends it
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ)
            selector.register(upstream, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in selector.select(POLL_S):
                    data = _received(key.fileobj)
                    if not data:
                        return
                    if key.fileobj is upstream:
                        client.sendall(passed(data))
                    elif both:
                        upstream.sendall(data)


def _received(sock: socket.socket) -> bytes:
    """What `sock` has now (a TLS socket's decrypted bytes included, which select does not see)."""
    data = sock.recv(CHUNK)
    while data and isinstance(sock, ssl.SSLSocket) and sock.pending():
        data += sock.recv(sock.pending())
    return data


def _head(sock: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes]:
    """A head read from `sock` (up to its blank line) and the bytes read after it; ValueError when the
    other side closes first or the head is too long."""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > HEAD_LIMIT:
            raise ValueError("the head is too long")
        data = sock.recv(CHUNK)
        if not data:
            raise ValueError("closed before its head ended")
        buffer += data
    head, rest = buffer.split(b"\r\n\r\n", 1)
    return head + b"\r\n\r\n", rest


def _header(head: bytes, name: str) -> str | None:
    """The value of header `name` in `head`, if there."""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _status(code: int, reason: str) -> bytes:
    return f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


class HttpGate(_Checkpoint):
    """FFmpeg's HTTP proxy for one stream: a request (`GET http://...`) or tunnel (`CONNECT host:port`)
    to a URL the policy allows goes on, to the address checked, one request a connection; any other is
    refused, and with it the stream. A redirect's target is named in the refusal when it was seen
    (plain HTTP; inside HTTPS only the host and port are)."""

    def __init__(self, url: str, policy: UrlPolicy, timeout_s: float) -> None:
        if os.environ.get("no_proxy"):  # FFmpeg would connect to the hosts it names directly, unchecked
            raise UrlRefused("the server's environment sets no_proxy, which lets FFmpeg past the URL checks: unset it")
        self._requests = 0
        self._redirects: dict[str, str] = {}  # where servers sent the stream on to (plain HTTP), by URL asked for
        options = {"protocol_whitelist": HTTP_PROTOCOLS, "format_whitelist": FORMATS}
        super().__init__(url, options, policy, timeout_s)
        self.options["http_proxy"] = f"http://127.0.0.1:{self.port}"

    def _serve(self, client: socket.socket) -> None:
        head, _ = _head(client)  # FFmpeg's GET has no body, and nothing after the head goes on
        method, target, version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        if method == "CONNECT":
            url = f"https://{target}/"
        elif method in ("GET", "HEAD") and target.lower().startswith("http://"):
            url = target
        else:
            client.sendall(_status(405, "Method Not Allowed"))
            return
        upstream = self._open(client, url)
        if upstream is None:
            return
        with self._tracked(upstream):
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self._pipe(client, upstream, both=True)
                return
            upstream.sendall(_origin_form(head, method, url, version))
            upstream.settimeout(self.timeout_s)
            answer, rest = _head(upstream)
            upstream.settimeout(None)
            if answer[9:10] == b"3" and (location := _header(answer, "location")):
                moved = urljoin(url, location)
                with self._lock:
                    self._redirects[_without_credentials(moved)] = moved  # FFmpeg asks without them
            client.sendall(answer + rest)
            self._pipe(client, upstream, both=False)

    def _open(self, client: socket.socket, url: str) -> socket.socket | None:
        """A connection for `url` if the policy allows it (None when refused, FFmpeg told so)."""
        with self._lock:
            named = self._redirects.get(url, url)  # as the server named it, credentials too (redacted)
            if self._requests == 0:
                how = None  # the stream's own URL
            elif url in self._redirects:
                how = "the server redirected it to {url}"
            else:
                how = "it leads on to {url} (by a redirect, or as a URL its playlist names)"
            self._requests += 1
            refused = self.refusal
        try:
            if refused is not None:
                raise UrlRefused(refused)
            addresses = self.policy.addresses(url)
        except UrlRefused as refusal:
            if refused is None:
                self._refuse(named, str(refusal), how, keep=client)
            client.sendall(_status(403, "Forbidden"))
            return None
        try:
            return self._connect(url, addresses)
        except OSError:
            client.sendall(_status(502, "Bad Gateway"))
            return None


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()


def _origin_form(head: bytes, method: str, url: str, version: str) -> bytes:
    """FFmpeg's request to the proxy as the server gets it: the path alone, no proxy headers, and one
    request per connection (so that every request comes through the gate's check)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    hop = ("connection", "proxy-connection", "keep-alive", "proxy-authorization")
    lines = head.decode("latin-1").split("\r\n")[1:]
    lines = [line for line in lines if line and line.split(":")[0].strip().lower() not in hop]
    return "\r\n".join([f"{method} {path} {version}", *lines, "Connection: close", "", ""]).encode("latin-1")


class RtspGate(_Checkpoint):
    """A relay to one RTSP server, at the address checked when the gate opened: FFmpeg talks plain RTSP
    to it on loopback (an rtsps server's TLS is the relay's), and the relay reads the server's answers,
    passing on all but a redirect."""

    def __init__(self, url: str, policy: UrlPolicy, timeout_s: float) -> None:
        self._addresses = policy.addresses(url)  # resolved once: every connection goes here
        self._origin = url.strip()
        parts = split_live_url(url)
        self._tls = parts.scheme.lower() == "rtsps"
        options = {"rtsp_transport": "tcp", "protocol_whitelist": RTSP_PROTOCOLS, "format_whitelist": FORMATS}
        super().__init__(url, options, policy, timeout_s)
        auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        self.url = parts._replace(scheme="rtsp", netloc=f"{auth}127.0.0.1:{self.port}").geturl()

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect(self._origin, self._addresses)
        if self._tls:
            # FFmpeg's own TLS does not verify the server either (its tls_verify is off by default).
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            upstream.settimeout(self.timeout_s)
            upstream = context.wrap_socket(upstream, server_hostname=split_live_url(self._origin).hostname)
            upstream.settimeout(None)
        answers = bytearray()  # the server's bytes not yet passed on: a message or packet not all there
        with self._tracked(upstream):
            self._pipe(client, upstream, both=True, passed=lambda data: self._answered(answers, data))

    def _answered(self, answers: bytearray, data: bytes) -> bytes:
        """The server's complete messages and interleaved packets in `answers` + `data`, but a redirect,
        which ends the relay before FFmpeg sees it (ValueError)."""
        answers += data
        out = bytearray()
        while n := _rtsp_unit(answers):
            unit = bytes(answers[:n])
            del answers[:n]
            if unit.startswith(b"RTSP/") and unit[9:10] == b"3":
                self._redirected(unit)
                raise ValueError("redirected")
            out += unit
        return bytes(out)

    def _redirected(self, answer: bytes) -> None:
        location = _header(answer.split(b"\r\n\r\n", 1)[0], "location")
        if not location:
            return
        url = urljoin(self._origin, location)
        try:
            self.policy.check(url)
        except UrlRefused as refused:
            self._refuse(url, str(refused), "the server redirected it to {url}", keep=None)
            return
        self.moved = url


def _rtsp_unit(buffer: bytearray) -> int:
    """The length of the message or interleaved packet that `buffer` starts with, 0 while it is not all
    there; ValueError when it is not RTSP."""
    if buffer[:1] == b"$":
        size = 4 + int.from_bytes(buffer[2:4], "big") if len(buffer) >= 4 else 0
        return size if size and len(buffer) >= size else 0
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > HEAD_LIMIT:
            raise ValueError("not RTSP")
        return 0
    length = int(_header(bytes(buffer[:end]), "content-length") or 0)
    if not 0 <= length <= BODY_LIMIT:
        raise ValueError("an RTSP body too long")
    size = end + 4 + length
    return size if len(buffer) >= size else 0
