"""Real network streams on loopback, started by the tests: an RTSP server (GStreamer's, from Debian's
packages, in tests/rtsp_server.py), a live HLS playlist written by FFmpeg and served by Python's
http.server, and plain HTTP pages."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
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
