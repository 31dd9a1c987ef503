"""A folder of frame images as a video: its images in name order, recorded at a known rate.

Some benchmarks ship clips as extracted frames (MVBench's TVQA clips: 00001.jpg, 00002.jpg, ...
at 3 fps). Image k in name order (numbers compared as numbers, so 2.jpg comes before 10.jpg) is
on screen from k / fps; sampling at a stream's rate then picks frames exactly as for a video file
(`hermes.video.decoding.sample_indices`), and each image is brought to RGB and downscaled the same
way.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from hermes.video.decoding import (
    DEFAULT_MAX_SIDE,
    START_CHECK_FRAMES,
    Frame,
    VideoError,
    VideoInfo,
    fit_size,
    iter_frames,
    sample_indices,
)
from hermes.video.sizes import MAX_FRAME_PIXELS, too_large

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


def frame_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The folder's images in name order (VideoError when it has none)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise VideoError(folder, "not a folder of frames")
    files = sorted((p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), key=lambda p: _natural(p.name))
    if not files:
        raise VideoError(folder, f"a folder without frame images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def iter_folder_frames(
    folder: str | os.PathLike[str],
    folder_fps: float,
    fps: float | None,
    *,
    max_side: int | None = DEFAULT_MAX_SIDE,
    start: float = 0.0,
    end: float | None = None,
) -> Iterator[Frame]:
    """Yield the frames of a folder recorded at `folder_fps`, sampled at `fps` (None: every image)
    from `start` to `end` s, like `iter_frames` for a file. Checked on the first `next()`."""
    if not folder_fps > 0:
        raise ValueError(f"a frame folder's rate must be > 0, got {folder_fps}")
    files = frame_files(folder)
    starts = np.arange(len(files), dtype=np.float64) / folder_fps
    idx, times = sample_indices(starts, fps, start, end, duration=len(files) / folder_fps)
    for i, t in zip(idx, times, strict=True):
        try:
            with Image.open(files[i]) as img:
                # The header's size, before anything is decoded: a crafted image is refused unallocated.
                if img.width * img.height > MAX_FRAME_PIXELS:
                    raise VideoError(folder, f"{files[i].name}: {too_large(img.width, img.height, MAX_FRAME_PIXELS)}")
                rgb = img.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise VideoError(folder, f"cannot read frame {files[i].name}: {exc}") from exc
        size = fit_size(rgb.width, rgb.height, max_side)
        if size != rgb.size:
            rgb = rgb.resize(size, Image.BILINEAR)
        yield Frame(np.asarray(rgb, dtype=np.uint8), float(t), int(i))


def check_folder_start(folder: str | os.PathLike[str], fps: float, folder_fps: float | None = None) -> VideoInfo:
    """What Start checks of a folder of frames recorded at `folder_fps` (default: one image per frame at
    `fps`): it holds images and its first frames at `fps` read (VideoError with the reason otherwise).
    Its facts as a video file's."""
    folder_fps = folder_fps or fps
    files = frame_files(folder)
    first = None
    for frame in iter_folder_frames(folder, folder_fps, fps, end=START_CHECK_FRAMES / fps):
        first = first if first is not None else frame
    with Image.open(files[0]) as img:
        width, height = img.size
    shown = (first.image.shape[1], first.image.shape[0])
    return VideoInfo(str(folder), len(files) / folder_fps, folder_fps, len(files), width, height, shown)


def iter_video(
    path: str | os.PathLike[str],
    fps: float | None,
    *,
    folder_fps: float | None = None,
    start: float = 0.0,
    end: float | None = None,
) -> Iterator[Frame]:
    """The frames of a video file, or of a folder of frames recorded at `folder_fps`."""
    if not Path(path).is_dir():
        return iter_frames(path, fps, start=start, end=end)
    if folder_fps is None:
        raise VideoError(path, "a folder of frames, and its frame rate is not known")
    return iter_folder_frames(path, folder_fps, fps, start=start, end=end)


# What an archive of frames may hold when it comes from outside (an upload): its images only, each at
# most MAX_FRAME_BYTES and all of them MAX_FRAMES_BYTES unpacked, so that a small crafted archive
# cannot fill the disk; names flattened, so that none lands outside the folder.
MAX_ARCHIVE_FRAMES = 20_000
MAX_FRAME_BYTES = 64 * 2**20
MAX_FRAMES_BYTES = 2 * 2**30


def unpack_frames(archive: str | os.PathLike[str], into: str | os.PathLike[str]) -> Path:
    """The images of the zip `archive` unpacked into the folder `into` (made), a folder of frames in
    their name order; VideoError with the reason for a file that is no zip, holds no image, or holds
    more than the limits above."""
    archive, into = Path(archive), Path(into)
    try:
        with zipfile.ZipFile(archive) as zf:
            frames = [m for m in zf.infolist() if not m.is_dir() and _is_frame(m.filename)]
            members = sorted(frames, key=lambda m: _natural(m.filename))
            if not members:
                raise VideoError(archive, f"a zip without frame images ({', '.join(IMAGE_SUFFIXES)})")
            if len(members) > MAX_ARCHIVE_FRAMES:
                raise VideoError(archive, f"{len(members):,} images, more than {MAX_ARCHIVE_FRAMES:,}")
            largest, total = max(m.file_size for m in members), sum(m.file_size for m in members)
            if largest > MAX_FRAME_BYTES or total > MAX_FRAMES_BYTES:
                limits = f"{MAX_FRAME_BYTES / 2**20:.0f} MiB an image, {MAX_FRAMES_BYTES / 2**30:.0f} GiB in all"
                raise VideoError(archive, f"its images unpack to more than {limits}")
            into.mkdir(parents=True, exist_ok=True)
            for k, m in enumerate(members):
                # Flattened, each numbered by its place in name order: two folders' 1.png stay apart.
                target = into / f"{k:06d}{Path(m.filename).suffix.lower()}"
                with zf.open(m) as src, target.open("wb") as dst:
                    _copy_within(src, dst, m.file_size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise VideoError(archive, f"not a readable zip of frames ({exc})") from exc
    return into


def _is_frame(name: str) -> bool:
    path = Path(name)
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".") and "__MACOSX" not in path.parts


def _copy_within(src: BinaryIO, dst: BinaryIO, declared: int) -> None:
    """Copy `src` to `dst`, refusing more bytes than the archive declared for it (a lying header)."""
    copied = 0
    while chunk := src.read(1 << 20):
        copied += len(chunk)
        if copied > declared:
            raise zipfile.BadZipFile("a member unpacks to more than its declared size")
        dst.write(chunk)
