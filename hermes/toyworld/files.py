"""Toy-world clips as files: an H.264 MP4 and, beside it, the events that happen in it.

The MP4 is what the app and the benchmark stream (decoded by `hermes.video.decoding`, as any
video); it runs at `FILE_FPS`, so objects glide between the world's steps, and the frame shown at
each whole second is exactly the world's state then. The events file (`NAME.events.json`) holds the
clip's description (its seed, background and visits, from which every frame is drawn again) and
its events with their times; a benchmark reads it to know what happened, and refuses a file that
is not one the world could have made.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hermes.toyworld.world import FRAME_SIDE, WORLD_FPS, Clip, WorldError
from hermes.video.clips import ClipError, ffmpeg_path

FILE_FPS = 4.0  # frames per second of a written clip (4 per world step)
CRF = 23  # H.264 quality: flat shapes stay clean (docs/toyworld.md), about 20 kB a 32 s clip at 112 px
EVENTS_SUFFIX = ".events.json"
EVENTS_VERSION = 1


class ToyWorldError(ValueError):
    """A toy-world file that cannot be used, with the reason in one line."""


def events_path(video: str | Path) -> Path:
    """The events file beside a clip: clip.mp4 -> clip.events.json."""
    video = Path(video)
    return video.with_name(video.stem + EVENTS_SUFFIX)


def write_video(clip: Clip, path: str | Path, fps: float = FILE_FPS, side: int = FRAME_SIDE) -> Path:
    """Write the clip as H.264 (yuv420p) MP4 at `fps`, frame k showing time k / fps."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = round(clip.duration_s * fps)
    raw = b"".join(clip.render(k / fps, side).tobytes() for k in range(n))
    cmd = [ffmpeg_path(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]
    cmd += ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{side}x{side}", "-r", f"{fps:g}", "-i", "-"]
    cmd += ["-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", str(CRF), "-preset", "medium"]
    cmd += ["-threads", "1", "-movflags", "+faststart", str(path)]
    proc = subprocess.run(cmd, input=raw, capture_output=True, timeout=120, check=False)
    if proc.returncode != 0 or not path.exists():
        raise ClipError(f"ffmpeg failed (rc={proc.returncode}) writing {path.name}: {proc.stderr.decode()[-400:]}")
    return path


def write_events(clip: Clip, video: str | Path) -> Path:
    """Write the clip's description and events beside its video."""
    path = events_path(video)
    doc = {"version": EVENTS_VERSION, "video": Path(video).name, "clip": clip.to_dict(), "events": clip.events()}
    path.write_text(json.dumps(doc) + "\n")
    return path


def write_clip(clip: Clip, video: str | Path) -> Path:
    """The clip's MP4 and its events file; the MP4's path."""
    path = write_video(clip, video)
    write_events(clip, path)
    return path


def _clip_class(world: object) -> type[Clip]:
    """The clip class of a description's world mark: none for the first world, 2 for the second."""
    from hermes.toyworld.world2 import WORLD, Clip2

    if world is None:
        return Clip
    if world == WORLD:
        return Clip2
    raise ToyWorldError(f"a clip of an unknown toy world ({world!r})")


def read_events(video: str | Path) -> Clip:
    """The clip whose events file sits beside `video`; ToyWorldError when the file is missing, not
    JSON, of another version, or describes something the world could not have made (or events that
    do not follow from its description)."""
    path = events_path(video)
    if not path.is_file():
        raise ToyWorldError(f"{path}: no events file beside {Path(video).name} (a toy-world clip needs one)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ToyWorldError(f"{path}: the events file is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != EVENTS_VERSION or not isinstance(doc.get("clip"), dict):
        raise ToyWorldError(f"{path}: not a toy-world events file of version {EVENTS_VERSION}")
    kind = _clip_class(doc["clip"].get("world"))
    try:
        clip = kind.from_dict(doc["clip"])
    except WorldError as exc:
        raise ToyWorldError(f"{path}: {exc}") from None
    if doc.get("events") != clip.events() or doc["clip"].get("fps") != WORLD_FPS:
        raise ToyWorldError(f"{path}: its events do not follow from its clip description (edited by hand?)")
    return clip
