"""Videos as browsers, phones and cameras write them, made by ffmpeg in the tests (once per session).

Each clip is tiny (a second or two, small frames, fast encoders) and says what a stream at 1 fps
makes of it: the frames it reads, or the sentence Start refuses it with. `tests/test_reliability.py`
streams every one through the CLI, `tests/test_app_reliability.py` through `gradio_client`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hermes.video.clips import ffmpeg_path
from hermes.video.errors import Skipped


@dataclass(frozen=True)
class Clip:
    """A clip: the ffmpeg arguments that make it (between the inputs and the output file), what a
    stream at 1 fps reads (`frames`) or the reason Start refuses it with (`refused`); `then`, an
    ffmpeg stream copy with these arguments afterwards (to set rotation metadata, for example),
    `damage`, the video frames whose bytes are zeroed at the end, and `scramble`, a count of bytes
    overwritten in the middle of the frame data."""

    name: str
    args: tuple[str, ...]
    frames: int | None = None
    refused: str | None = None
    size: str = "96x64"
    seconds: float = 2.0
    rate: int = 10
    audio: bool = False
    then: tuple[str, ...] = ()
    damage: tuple[int, ...] = ()
    scramble: int = 0


def _x264(pix_fmt: str = "yuv420p") -> tuple[str, ...]:
    return ("-c:v", "libx264", "-preset", "ultrafast", "-threads", "1", "-pix_fmt", pix_fmt)


# MediaRecorder's WebM: VP9 at a target bitrate, Opus sound, written live (no duration, no index).
_RECORDER = ("-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k")
_X265 = ("-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=none", "-tag:v", "hvc1")

STREAMED = [
    # VP9 at a bitrate, as browsers record it: decord's threaded decoding fails on it.
    Clip("vp9.webm", _RECORDER, frames=2, rate=30),
    Clip("browser_recording.webm", (*_RECORDER, "-c:a", "libopus", "-f", "webm", "-live", "1"), 2, rate=30, audio=True),
    Clip("vp8.webm", ("-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k"), frames=2),
    Clip("av1.mp4", ("-c:v", "libaom-av1", "-usage", "realtime", "-cpu-used", "8", "-b:v", "100k"), frames=2),
    Clip("hevc.mp4", (*_X265, "-pix_fmt", "yuv420p"), frames=2),
    # An iPhone's HDR video: 10-bit HEVC in QuickTime, with sound, held upright (rotation metadata).
    Clip(
        "iphone.mov",
        (*_X265, "-pix_fmt", "yuv420p10le", "-c:a", "aac"),
        frames=2,
        audio=True,
        then=("-metadata:s:v:0", "rotate=90"),
    ),
    Clip("android.mp4", (*_x264(), "-c:a", "aac"), frames=2, audio=True, then=("-metadata:s:v:0", "rotate=270")),
    Clip("phone.3gp", (*_x264(), "-c:a", "aac"), frames=2, size="176x144", audio=True),
    Clip("camcorder.mts", (*_x264(), "-f", "mpegts"), frames=2),
    Clip("prores.mov", ("-c:v", "prores_ks", "-profile:v", "0"), frames=2),
    Clip("mjpeg.avi", ("-c:v", "mjpeg", "-q:v", "5", "-pix_fmt", "yuvj420p"), frames=2),
    Clip(
        "animated.gif",
        (
            "-c:v",
            "gif",
        ),
        frames=2,
    ),
    Clip("h264_10bit.mp4", _x264("yuv420p10le"), frames=2),
    Clip("h264_444.mp4", _x264("yuv444p"), frames=2),
    Clip("gray.mkv", _x264("gray"), frames=2),
    Clip("odd_161x97.mp4", _x264("yuv444p"), frames=2, size="161x97"),
    Clip("tiny_16x16.mp4", _x264(), frames=2, size="16x16"),
    Clip("wide_1024x32.mp4", _x264(), frames=2, size="1024x32"),
    Clip("tall_32x1024.mp4", _x264(), frames=2, size="32x1024"),
    # Variable frame rate: 10 frames in the first second, 10 more over the next two; a decoder that
    # assumed a constant rate would see 2 s and read 2 frames at 1 fps, not 3.
    Clip("variable_rate.mp4", (*_x264(), "-vf", "setpts='if(lt(N,10),N/10,1+(N-10)/5)/TB'", "-fps_mode", "vfr"), 3),
    Clip("clip with spaces, ÅÉÎ ü.mp4", _x264(), frames=2),
]

# 8 s at 4 fps with a key frame every 2 s, as a camera's file damaged in transfer.
_DAMAGEABLE = (*_x264(), "-g", "8", "-movflags", "+faststart")
# Frame 20 (5 s) zeroed: FFmpeg decodes the 31 others (those after it concealed); at 1 fps the frame at
# 5 s is skipped and the stream goes on at 6 s.
DAMAGED = Clip("damaged_in_the_middle.mp4", _DAMAGEABLE, seconds=8, rate=4, damage=(20,))
DAMAGED_AT_S = 5
# Frames 17 (4.25 s) to the end zeroed: at 1 fps the frames up to 0:04 decode, then none.
DAMAGED_TO_THE_END = Clip("damaged_to_the_end.mp4", _DAMAGEABLE, seconds=8, rate=4, damage=tuple(range(17, 32)))
DAMAGED_AFTER_S = 4
# As the damage of a download or a disk looks: 4 KB overwritten in the middle of an 8 s H.264 file, as
# reported (200 frames at 25 fps, FFmpeg decodes 199), and a lighter one for the whole engine path.
_SCRAMBLED = (*_x264(), "-movflags", "+faststart")
SCRAMBLED = Clip("damaged_4kb.mp4", _SCRAMBLED, size="320x240", seconds=8, rate=25, scramble=4096)
SCRAMBLED_LIGHT = Clip("damaged_4kb_light.mp4", _SCRAMBLED, size="160x120", seconds=8, rate=4, scramble=4096)

REFUSED = [
    Clip("audio_only.mp4", ("-vn", "-c:a", "aac"), refused="no video stream", audio=True),
    Clip("a64.avi", ("-c:v", "a64multi", "-pix_fmt", "gray"), refused="codec not supported: a64m", size="320x200"),
    # Frames 9 (2.25 s) to the end zeroed: nothing after 0:02 decodes, and Start decodes up to 3 s.
    Clip(
        "damaged_early.mp4",
        _DAMAGEABLE,
        refused="the file is damaged after 0:02",
        seconds=8,
        rate=4,
        damage=tuple(range(9, 32)),
    ),
]


def _ffmpeg(*args: str) -> None:
    subprocess.run([ffmpeg_path(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args], check=True)


DAMAGED_CLIPS = [DAMAGED, DAMAGED_TO_THE_END, SCRAMBLED, SCRAMBLED_LIGHT]


def make(clip: Clip, root: Path) -> Path:
    """Write `clip` under `root` and return its path."""
    path = root / clip.name
    inputs = ["-f", "lavfi", "-i", f"testsrc2=size={clip.size}:rate={clip.rate}:duration={clip.seconds}"]
    if clip.audio:
        inputs += ["-f", "lavfi", "-i", f"sine=duration={clip.seconds}"]
    out = path.with_name(f"raw-{path.name}") if clip.then else path
    _ffmpeg(*inputs, *clip.args, str(out))
    if clip.then:
        _ffmpeg("-i", str(out), "-map", "0", "-c", "copy", *clip.then, str(path))
        out.unlink()
    if clip.damage:
        damage_frames(path, clip.damage)
    if clip.scramble:
        scramble(path, clip.scramble)
    return path


def damage_frames(path: Path, indices: tuple[int, ...]) -> Path:
    """Zero the bytes of the video frames `indices` in the file (found with ffprobe); the index stays whole."""
    probe = [shutil.which("ffprobe") or "ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries"]
    out = subprocess.run([*probe, "packet=pos,size", "-of", "json", str(path)], capture_output=True, text=True)
    packets = json.loads(out.stdout)["packets"]
    data = bytearray(path.read_bytes())
    for index in indices:
        pos, size = int(packets[index]["pos"]), int(packets[index]["size"])
        data[pos : pos + size] = bytes(size)
    path.write_bytes(bytes(data))
    return path


def scramble(path: Path, count: int) -> Path:
    """Overwrite `count` bytes in the middle of the file's frame data (its mp4 `mdat` box) with a fixed
    pattern of bytes, as a bad sector or a broken download leaves them."""
    data = bytearray(path.read_bytes())
    start = data.find(b"mdat") + 4
    middle = (start + len(data)) // 2
    data[middle : middle + count] = bytes((i * 7919 + 13) % 256 for i in range(count))
    path.write_bytes(bytes(data))
    return path


def ffmpeg_frame_times(path: Path) -> list[float]:
    """The start times (s) of the frames that FFmpeg's own decoder decodes from the file, in order (a
    damaged packet's frame is not one)."""
    cmd = [shutil.which("ffprobe") or "ffprobe", "-v", "quiet", "-select_streams", "v:0", "-show_entries"]
    out = subprocess.run([*cmd, "frame=pts_time", "-of", "csv=p=0", str(path)], capture_output=True, text=True)
    return [float(line.strip(",")) for line in out.stdout.split()]


def skipped_notes(path: Path, every: list[float]) -> list[str]:
    """What a stream of the frames starting at `every` (s) must say it skipped: the runs of frames that
    FFmpeg does not decode."""
    decoded = ffmpeg_frame_times(path)
    lost = [not any(abs(t - d) < 1e-3 for d in decoded) for t in every]
    notes, run = [], 0
    for k, missing in enumerate([*lost, False]):
        if missing:
            run += 1
        elif run:
            notes.append(str(Skipped(every[k - run], run)))
            run = 0
    return notes


def make_corpus(root: Path) -> dict[str, Path]:
    """Every clip of the corpus under `root`, by name."""
    root.mkdir(parents=True, exist_ok=True)
    return {clip.name: make(clip, root) for clip in [*STREAMED, *REFUSED, *DAMAGED_CLIPS]}
