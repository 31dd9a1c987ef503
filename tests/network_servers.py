"""Real network streams on loopback, started by the tests: an RTSP server (GStreamer's, from Debian's
packages, in tests/rtsp_server.py), a live HLS playlist written by FFmpeg and served by Python's
http.server, and plain HTTP pages; and servers that record every connection that reaches them
(HTTP with redirects and playlists in turn, a raw RTSP server that answers with redirects, a port
that stays silent or resets), to show what a stream's URLs led FFmpeg to."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Debian's Python, which has python3-gi (the tests' own virtualenv does not).
SYSTEM_PYTHON = "/usr/bin/python3"
NEEDS = (
    "apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good "
    "gstreamer1.0-plugins-ugly"
)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether a socket listens on `port` of loopback, as Linux's /proc/net/tcp says (without connecting)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "0A" for r in rows)


class RtspServer:
    """GStreamer's RTSP server on a loopback port: `url`; `stop()` kills it, `start()` brings it back
    on the same port."""

    def __init__(self, port: int | None = None, credentials: str | None = None) -> None:
        self.port = port or free_port()
        self.credentials = credentials
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f"{self.credentials}@" if self.credentials else ""
        return f"rtsp://{auth}127.0.0.1:{self.port}/cam"

    def start(self) -> RtspServer:
        if not Path(SYSTEM_PYTHON).exists():
            pytest.fail(f"the RTSP test server needs Debian's python3 with GStreamer ({NEEDS})")
        args = [SYSTEM_PYTHON, str(HERE / "rtsp_server.py"), str(self.port)]
        self.process = subprocess.Popen(
            args + ([self.credentials] if self.credentials else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            pytest.fail(f"the RTSP test server did not start ({NEEDS}): {self.process.stderr.read()[-2000:]}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


@contextlib.contextmanager
def rtsp_server(credentials: str | None = None) -> Iterator[RtspServer]:
    server = RtspServer(credentials=credentials).start()
    try:
        yield server
    finally:
        server.stop()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_folder(root: Path) -> Iterator[str]:
    """Python's http.server serving `root` on loopback; the base URL."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def live_hls(root: Path) -> Iterator[str]:
    """A live HLS playlist that FFmpeg writes in real time (1 s segments of a test picture, the
    oldest deleted), served over HTTP; the playlist's URL once its first segments exist."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        pytest.fail("the HLS test stream needs ffmpeg (apt-get install ffmpeg)")
    root.mkdir(parents=True, exist_ok=True)
    args = [ffmpeg, "-v", "error", "-re", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=10", "-c:v", "libx264"]
    args += ["-preset", "ultrafast", "-g", "10", "-pix_fmt", "yuv420p", "-f", "hls", "-hls_time", "1"]
    args += ["-hls_list_size", "6", "-hls_flags", "delete_segments+omit_endlist", str(root / "live.m3u8")]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        with http_folder(root) as base:
            playlist = root / "live.m3u8"
            for _ in range(200):
                if playlist.exists() and playlist.read_text().count(".ts") >= 3:
                    break
                threading.Event().wait(0.05)
            yield f"{base}/live.m3u8"
    finally:
        process.kill()
        process.wait(10)


class _Mjpeg(http.server.BaseHTTPRequestHandler):
    """An MJPEG camera: JPEG frames of a moving square, one part each of a multipart/x-mixed-replace
    answer, at 10 frames a second until the client goes."""

    def do_GET(self) -> None:
        import io
        import time

        import numpy as np
        from PIL import Image

        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace;boundary=frame")
        self.end_headers()
        try:
            for i in range(100_000):
                image = np.zeros((120, 160, 3), dtype=np.uint8)
                image[40:80, (i * 4) % 120 : (i * 4) % 120 + 40] = (255, 0, 0)
                jpeg = io.BytesIO()
                Image.fromarray(image).save(jpeg, format="JPEG")
                head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {jpeg.tell()}\r\n\r\n"
                self.wfile.write(head.encode() + jpeg.getvalue() + b"\r\n")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            return

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def mjpeg_camera() -> Iterator[str]:
    """An MJPEG camera over HTTP on loopback; its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Mjpeg)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/video.mjpg"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def rtmp_server() -> Iterator[str]:
    """FFmpeg serving a live test picture over RTMP on loopback (listen mode: one viewer); its URL."""
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/cam"
    args = [
        shutil.which("ffmpeg") or "ffmpeg",
        "-v",
        "quiet",
        "-re",
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=160x120:rate=10",
    ]
    args += ["-c:v", "libx264", "-preset", "ultrafast", "-g", "10", "-pix_fmt", "yuv420p", "-f", "flv", "-listen", "1"]
    process = subprocess.Popen([*args, url], stdin=subprocess.DEVNULL)
    try:
        for _ in range(200):  # until it listens (a test connection would be its one viewer)
            if listening(port):
                break
            threading.Event().wait(0.05)
        yield url
    finally:
        process.kill()
        process.wait(10)


# -- servers that record what reaches them (tests/test_url_nesting.py) ---------------------------------
class _Recording(http.server.ThreadingHTTPServer):
    """An HTTP server that records every connection it accepts (`log`), whether or not a request
    follows, then every request line."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler, log: list[str]) -> None:
        self.log = log
        super().__init__(address, handler)

    def get_request(self):
        request, client = super().get_request()
        self.log.append(f"connection from {client[0]}")
        return request, client


class _Routed(http.server.SimpleHTTPRequestHandler):
    """A folder's files, but for the paths the server redirects (`redirects`: path -> Location) and those
    it answers with texts in turn (`texts`: path -> list of bodies, the last repeated: a live playlist)."""

    def do_GET(self) -> None:
        self.server.log.append(self.requestline)
        path = self.path.split("?", 1)[0]
        if path in self.server.redirects:
            self.send_response(302)
            self.send_header("Location", self.server.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path in self.server.texts:
            bodies = self.server.texts[path]
            body = (bodies.pop(0) if len(bodies) > 1 else bodies[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.apple.mpegurl")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Served:
    """A recording server: `base` URL (scheme://host:port), `log` of what reached it, `port`."""

    base: str
    log: list[str]
    port: int
    redirects: dict[str, str] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)


@contextlib.contextmanager
def recording_http(root: Path, host: str = "127.0.0.1", port: int = 0, tls=None) -> Iterator[Served]:
    """`root` served over HTTP on `host` (a loopback address), recording every connection; routes are
    added to the `Served` it yields (its `redirects` and `texts`). `tls`: an ssl context (HTTPS)."""
    log: list[str] = []
    server = _Recording((host, port), functools.partial(_Routed, directory=str(root)), log)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    served = Served(f"{scheme}://{host}:{server.server_address[1]}", log, server.server_address[1])
    server.redirects, server.texts = served.redirects, served.texts
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


class RecordingListener:
    """A TCP port on a loopback address that records every connection and what it sent, and answers in
    one of the ways a port can: `silent` (accept, never a word), `reset` (accept, then RST), or, for
    `rtsp_redirect`, `RTSP/1.0 302` to every request with `Location: location`. `tls`: an ssl context
    (rtsps). `log` says what reached it."""

    def __init__(self, host: str, how: str = "silent", location: str = "", tls=None) -> None:
        self.how, self.location, self.tls = how, location, tls
        self.log: list[str] = []
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._open: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, client = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.log.append(f"connection from {client[0]}")
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        import struct

        if self.how == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        if self.how != "rtsp_redirect":
            return  # silent: held open until the listener closes
        with contextlib.suppress(OSError):
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b""
            while not self._closed.is_set() and (chunk := conn.recv(4096)):
                data += chunk
                while b"\r\n\r\n" in data:
                    head, data = data.split(b"\r\n\r\n", 1)
                    conn.sendall(self._redirect(head.decode()))

    def _redirect(self, request: str) -> bytes:
        lines = request.split("\r\n")
        self.log.append(lines[0])
        cseq = next((line.split(":")[1].strip() for line in lines if line.lower().startswith("cseq")), "1")
        return f"RTSP/1.0 302 Moved Temporarily\r\nCSeq: {cseq}\r\nLocation: {self.location}\r\n\r\n".encode()

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        for conn in self._open:
            conn.close()

    def __enter__(self) -> RecordingListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def self_signed_tls(folder: Path):
    """A server-side ssl context with a fresh self-signed certificate for 127.0.0.1 (openssl makes it)."""
    import ssl

    key, cert = folder / "key.pem", folder / "cert.pem"
    args = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run([*args, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
