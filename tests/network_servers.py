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
