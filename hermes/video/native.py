"""The native side of decoding: decord imported quietly, and its C++ log lines kept off the terminal
(what decord cannot do alone, FFmpeg does in process: hermes.video.libav), and ffprobe's name for a
codec that no decoder here knows.

decord writes some log lines straight to file descriptor 2 from C++ ("[12:00:00] .../video_reader.cc:83:
ERROR opening: ..."), past Python and past FFmpeg's log level. `quiet_native()` points descriptor 2 at
a temporary file around each call into decord and passes on to the real stderr whatever else was
written meanwhile (another thread's traceback, say), dropping only decord's and FFmpeg's own lines.
Errors reach the caller as VideoError instead. HERMES_VIDEO_DEBUG=1 leaves everything on the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

# decord's (dmlc) log lines and FFmpeg's, as they start on stderr.
_NATIVE_LINE = re.compile(rb"^(\[\d\d:\d\d:\d\d\] \S+\.(cc|h):\d+: |\[[\w.-]+ @ 0x[0-9a-f]+\] )")


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


def codec_name(path: Path) -> str | None:
    """The codec of the file's first video stream as ffprobe names it (None without ffprobe, or when
    ffprobe cannot tell); only used to word an error. The one call left to FFmpeg's command-line
    tools: it is wanted for a codec no decoder here knows, and PyAV shows no codec parameters (not
    even the tag) of a stream it has no decoder for."""
    exe = shutil.which("ffprobe")
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
