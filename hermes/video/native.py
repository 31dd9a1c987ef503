"""The native side of decoding: decord imported quietly, its C++ log lines kept off the terminal, and
the ffmpeg tools for the files decord cannot open by itself.

decord writes some log lines straight to file descriptor 2 from C++ ("[12:00:00] .../video_reader.cc:83:
ERROR opening: ..."), past Python and past FFmpeg's log level. `quiet_native()` points descriptor 2 at
a temporary file around each call into decord and passes on to the real stderr whatever else was
written meanwhile (another thread's traceback, say), dropping only decord's and FFmpeg's own lines.
Errors reach the caller as VideoError instead. HERMES_VIDEO_DEBUG=1 leaves everything on the terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

# decord's (dmlc) log lines and FFmpeg's, as they start on stderr.
_NATIVE_LINE = re.compile(rb"^(\[\d\d:\d\d:\d\d\] \S+\.(cc|h):\d+: |\[[\w.-]+ @ 0x[0-9a-f]+\] )")
REMUX_TIMEOUT_S = 300.0  # a stream copy of a 200 MB upload takes seconds; this only bounds a hung ffmpeg


def debugging() -> bool:
    """Whether HERMES_VIDEO_DEBUG asks for the decoder's own messages."""
    return bool(os.environ.get("HERMES_VIDEO_DEBUG"))


_import_lock = threading.Lock()
_quietened = False


def decord():
    """The decord module (imported on first use: webcam-only use does not need it), with FFmpeg's
    own log level set to quiet unless debugging."""
    global _quietened
    try:
        import decord as module
    except ImportError as e:  # e.g. platforms without decord wheels
        raise ImportError("decord is needed to read video files: pip install decord2") from e
    with _import_lock:
        if not _quietened:
            if not debugging():
                module.logging.set_level(module.logging.QUIET)
            _quietened = True
    return module


class _StderrTrap:
    """Descriptor 2 redirected to a temporary file while any thread is inside a native call.

    Re-entrant across threads: the first caller in redirects, the last one out restores. Each caller
    leaving passes on the complete lines written so far, except native log lines, so nothing else
    written to stderr meanwhile is lost, only delayed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = -1  # the real stderr, duplicated, while redirected
        self._fd = -1  # the temporary file (unlinked at once), made on first use
        self._passed = 0  # bytes of it already passed on

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if debugging():
            yield
            return
        self._enter()
        try:
            yield
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                if self._fd < 0:
                    self._fd, name = tempfile.mkstemp(prefix="hermes-stderr-")
                    os.unlink(name)
                with contextlib.suppress(Exception):
                    sys.stderr.flush()  # Python's own pending output goes out before the switch
                self._saved = os.dup(2)
                os.dup2(self._fd, 2)
            self._depth += 1

    def _leave(self) -> None:
        with self._lock:
            self._depth -= 1
            last = self._depth == 0
            if last:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(self._saved, 2)
            self._pass_on(whole=last)
            if last:
                os.close(self._saved)
                self._saved = -1
                os.ftruncate(self._fd, 0)
                os.lseek(self._fd, 0, os.SEEK_SET)  # the offset is shared with what was descriptor 2
                self._passed = 0

    def _pass_on(self, whole: bool) -> None:
        """Write what others wrote meanwhile to the real stderr (a partial last line waits, unless `whole`)."""
        # pread leaves the shared file offset alone: descriptor 2 may still be writing at it.
        data = os.pread(self._fd, os.fstat(self._fd).st_size - self._passed, self._passed)
        if not whole:
            data = data[: data.rfind(b"\n") + 1]
        self._passed += len(data)
        kept = b"".join(line for line in data.splitlines(keepends=True) if not _NATIVE_LINE.match(line))
        if kept:
            os.write(self._saved, kept)


quiet_native = _StderrTrap()


def ffmpeg_tool(name: str) -> str | None:
    """The path of `ffmpeg` or `ffprobe`, or None when it is not installed."""
    return shutil.which(name)


def codec_name(path: Path) -> str | None:
    """The codec of the file's first video stream as ffprobe names it (None without ffprobe, or when
    ffprobe cannot tell); only used to word an error."""
    exe = ffmpeg_tool("ffprobe")
    if exe is None:
        return None
    cmd = [exe, "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name,codec_tag_string"]
    try:
        out = subprocess.run([*cmd, "-of", "default=nw=1", str(path)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(line.partition("=")[::2] for line in out.stdout.splitlines())
    name = fields.get("codec_name", "")
    if name in ("", "unknown", "none"):
        name = fields.get("codec_tag_string", "").strip("[]0 ")
    return name or None


def frame_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of the file's first video stream as its header gives them, read by ffprobe
    without decoding a frame (None without ffprobe, or when the header does not say)."""
    exe = ffmpeg_tool("ffprobe")
    if exe is None:
        return None
    cmd = [exe, "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=width,height", "-of", "json"]
    try:
        out = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=30)
        stream = json.loads(out.stdout)["streams"][0]
        return int(stream["width"]), int(stream["height"])
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError, TypeError):
        return None


def remux(path: Path) -> Path | None:
    """Copy the first video stream of `path`, untouched, into a new Matroska file, whose header
    ffmpeg writes whole (duration, index). Browser recordings (MediaRecorder's WebM has no
    duration), Ogg and MPEG program streams then open in decord. Returns the temporary file (the
    caller deletes it), or None without ffmpeg or when ffmpeg cannot read the file either."""
    exe = ffmpeg_tool("ffmpeg")
    if exe is None:
        return None
    fd, name = tempfile.mkstemp(prefix="hermes-remux-", suffix=".mkv")
    os.close(fd)
    out = Path(name)
    cmd = [exe, "-nostdin", "-v", "error", "-y", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "matroska"]
    try:
        done = subprocess.run([*cmd, str(out)], capture_output=True, timeout=REMUX_TIMEOUT_S)
        ok = done.returncode == 0 and out.stat().st_size > 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        out.unlink(missing_ok=True)
        return None
    return out


def stream_start(path: Path) -> float:
    """When the file's first video stream starts, in seconds on the container's clock (0 without
    ffprobe, or when unknown). decord counts frame times from there."""
    exe = ffmpeg_tool("ffprobe")
    if exe is None:
        return 0.0
    cmd = [exe, "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=start_time", "-of", "json"]
    try:
        out = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=30)
        return float(json.loads(out.stdout)["streams"][0]["start_time"])
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
        return 0.0


# What FFmpeg's showinfo filter says of each frame it passes: its time in microseconds (after settb,
# below; its pts_time has 6 significant digits, 10 ms after 16 minutes) and its size.
_SHOWINFO = re.compile(rb"\bn:\s*\d+\s+pts:\s*(-?\d+)\s.*?\bs:(\d+)x(\d+)")


def ffmpeg_frames(
    path: Path,
    starts: Sequence[float],
    slack: Sequence[float],
    size: tuple[int, int] | None,
    *,
    seek_s: float,
    origin_s: float = 0.0,
) -> list[np.ndarray | None]:
    """The frames that start at `starts` (seconds from the video stream's start, ascending), decoded
    by FFmpeg alone in one pass from `seek_s` (a key frame's start, or before it), single-threaded,
    as its own player decodes: a damaged packet is dropped and the frames that refer to it are
    concealed. None for each frame that FFmpeg's decoder does not output (its packet is damaged
    beyond repair), and for all of them without ffmpeg. A frame is matched to a start within its
    `slack` seconds. Upright (rotation applied) and scaled to `size` (w, h) when given, as decord
    gives frames. `origin_s`: where the stream starts on the container's clock (`stream_start`)."""
    exe = ffmpeg_tool("ffmpeg")
    if exe is None or not starts:
        return [None] * len(starts)
    # The container's own clock throughout (-copyts, -seek_timestamp): no start time is added or
    # taken away, whatever the FFmpeg version; the filters pick the frames, not ffmpeg's trimming.
    clock = [t + origin_s for t in starts]
    wanted = "+".join(f"between(t\\,{t - s:.6f}\\,{t + s:.6f})" for t, s in zip(clock, slack, strict=True))
    scale = [f"scale={size[0]}:{size[1]}"] if size else []
    chain = [f"trim=end={clock[-1] + slack[-1]:.6f}", f"select='{wanted}'", *scale, "settb=AVTB", "showinfo"]
    cmd = [exe, "-nostdin", "-hide_banner", "-loglevel", "info", "-threads", "1", "-copyts", "-seek_timestamp", "1"]
    cmd += ["-noaccurate_seek", "-ss", f"{seek_s + origin_s:.6f}", "-i", str(path), "-map", "0:v:0"]
    # Passthrough: each frame once, as picked (a constant rate would repeat them to fill the gaps).
    cmd += ["-vf", ",".join(chain), "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=REMUX_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return [None] * len(starts)
    out: list[np.ndarray | None] = [None] * len(starts)
    at = 0
    for match in _SHOWINFO.finditer(done.stderr):
        w, h = int(match[2]), int(match[3])
        pixels = done.stdout[at : at + w * h * 3]
        at += w * h * 3
        if len(pixels) < w * h * 3:
            break  # ffmpeg stopped part-way through this frame
        t = int(match[1]) / 1e6 - origin_s
        k = min(range(len(starts)), key=lambda i: abs(starts[i] - t))
        if abs(starts[k] - t) <= slack[k]:
            out[k] = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
    return out
