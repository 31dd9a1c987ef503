"""Synthetic test clips made with ffmpeg (``testsrc2`` via lavfi).

Tests and benchmarks need videos of known length, frame rate and size, with
"needle" frames (one solid colour frame) at known times, so that sampling and
retrieval can be checked exactly. Nothing here is needed at run time by the app.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ClipError", "ffmpeg_path", "make_clip"]


class ClipError(RuntimeError):
    """ffmpeg is missing or failed to make a clip."""


# Colour specs go into an ffmpeg filter string, so only allow characters that
# cannot break out of it (names like "red", hex like "0xFF0000" or "#00ff00",
# and an optional "@alpha").
_COLOUR_RE = re.compile(r"^[A-Za-z0-9#]+(@[0-9.]+)?$")

# Codec -> extra options that make the output decodable everywhere.
_CODEC_ARGS: dict[str, list[str]] = {
    "libx264": ["-pix_fmt", "yuv420p"],
    "libx265": ["-pix_fmt", "yuv420p", "-tag:v", "hvc1"],
    "mpeg4": ["-pix_fmt", "yuv420p", "-q:v", "3"],
    "libvpx-vp9": ["-pix_fmt", "yuv420p", "-b:v", "0", "-crf", "40", "-deadline", "realtime"],
    "mjpeg": ["-pix_fmt", "yuvj420p", "-q:v", "5"],
}


def ffmpeg_path() -> str:
    """Return the ffmpeg executable, or raise ClipError saying how to get it."""
    exe = shutil.which("ffmpeg")
    if exe is None:
        raise ClipError(
            "ffmpeg not found on PATH; it is needed to make test clips (Debian/Ubuntu: apt-get install -y ffmpeg)"
        )
    return exe


def _needle_filters(
    needles: Mapping[float, str], fps: float, n_frames: int, seconds: float, needle_frames: int
) -> list[str]:
    """ffmpeg filters that fill the frame shown at each needle's time, and the `needle_frames` - 1
    after it, with the needle's colour."""
    filters = []
    for t, colour in sorted(needles.items()):
        if not _COLOUR_RE.match(colour):
            raise ValueError(f"bad needle colour {colour!r}")
        # The small epsilon keeps t=3.0 at 10 fps on frame 30 despite float error.
        k = math.floor(t * fps + 1e-6)
        if not 0 <= k < n_frames:
            raise ValueError(f"needle at t={t}s is outside the clip (0..{seconds}s)")
        # Timeline editing by frame number `n` is exact (no float time compare).
        enable = f"between(n\\,{k}\\,{k + needle_frames - 1})"
        filters.append(f"drawbox=x=0:y=0:w=iw:h=ih:color={colour}:t=fill:enable='{enable}'")
    return filters


def make_clip(
    path: str | Path,
    seconds: float,
    fps: float = 10.0,
    size: tuple[int, int] = (320, 240),
    needles: Mapping[float, str] | None = None,
    codec: str = "libx264",
    *,
    needle_frames: int = 1,
    preset: str = "ultrafast",
    gop: int | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120.0,
) -> Path:
    """Write a ``testsrc2`` clip of ``seconds`` at ``fps`` and ``size`` (w, h) to ``path``.

    The clip has exactly ``round(seconds * fps)`` frames; frame k is shown at
    t = k / fps. ``needles`` maps a time in seconds to an ffmpeg colour; the frame
    shown at that time (k = floor(t * fps)) and the ``needle_frames - 1`` after it
    are filled with that colour. ``seconds=0`` writes a file with no video frames
    (useful to test error handling). The container follows the file suffix
    (.mp4, .avi, .mkv, .webm, ...); mp4/mov get ``+faststart`` so the header
    comes first (corruption tests then damage frame data, not the index).
    Raises ClipError if ffmpeg is missing or fails, ValueError on bad arguments.
    """
    exe = ffmpeg_path()
    path = Path(path)
    w, h = _checked_size(size, fps, seconds, needle_frames)
    n_frames = round(seconds * fps)
    filters = _needle_filters(needles or {}, fps, n_frames, seconds, needle_frames)

    cmd = [exe, "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]
    # testsrc2 needs a duration; give one frame more than needed and cut with -frames:v.
    src_dur = max(seconds, 0.0) + 2.0 / fps
    cmd += ["-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate={fps}:duration={src_dur}"]
    if filters:
        cmd += ["-vf", ",".join(filters)]
    cmd += ["-frames:v", str(n_frames), *_output_args(path, codec, preset, gop), *extra_args, str(path)]
    _run_ffmpeg(cmd, path, timeout)
    return path


def _checked_size(size: tuple[int, int], fps: float, seconds: float, needle_frames: int) -> tuple[int, int]:
    """The clip's (w, h), once it and the other numbers are checked; ValueError on a bad one."""
    w, h = (int(v) for v in size)
    if w <= 0 or h <= 0:
        raise ValueError(f"size must be positive, got {size}")
    if fps <= 0 or not math.isfinite(fps):
        raise ValueError(f"fps must be > 0, got {fps}")
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    if needle_frames < 1:
        raise ValueError(f"needle_frames must be >= 1, got {needle_frames}")
    return w, h


def _output_args(path: Path, codec: str, preset: str, gop: int | None) -> list[str]:
    """ffmpeg's output options for video alone in `codec` (with its `preset` and `gop` where
    given), in the container that `path`'s suffix names."""
    args = ["-an", "-c:v", codec, *_CODEC_ARGS.get(codec, [])]
    if codec in ("libx264", "libx265"):
        args += ["-preset", preset]
    if gop is not None:
        args += ["-g", str(int(gop))]
    if path.suffix.lower() in (".mp4", ".mov", ".m4v"):
        args += ["-movflags", "+faststart"]
    return args


def _run_ffmpeg(cmd: list[str], path: Path, timeout: float) -> None:
    """Run the ffmpeg command `cmd` that writes `path`; ClipError if it fails or times out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise ClipError(f"ffmpeg timed out after {timeout}s making {path.name}") from e
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or "").strip()[-800:]
        raise ClipError(f"ffmpeg failed (rc={proc.returncode}) making {path.name}: {tail}")
