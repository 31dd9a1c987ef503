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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from hermes.video.decoding import DEFAULT_MAX_SIDE, Frame, VideoError, fit_size, iter_frames, sample_indices

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
                rgb = img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise VideoError(folder, f"cannot read frame {files[i].name}: {exc}") from exc
        size = fit_size(rgb.width, rgb.height, max_side)
        if size != rgb.size:
            rgb = rgb.resize(size, Image.BILINEAR)
        yield Frame(np.asarray(rgb, dtype=np.uint8), float(t), int(i))


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
