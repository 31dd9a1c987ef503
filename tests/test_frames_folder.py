"""A folder of frame images read as a video: name order, its rate, sampling as for a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hermes.video.decoding import VideoError, iter_frames
from hermes.video.frames_folder import frame_files, iter_folder_frames, iter_video
from tests.eval_helpers import frames_folder


def test_frames_in_name_order_at_their_rate(tmp_path: Path) -> None:
    folder = frames_folder(tmp_path / "clip", 15)  # 5 s at 3 fps; frame k has red 10 * k
    frames = list(iter_folder_frames(folder, 3.0, 1.0))
    assert [f.t for f in frames] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [int(f.image[0, 0, 0]) for f in frames] == [0, 30, 60, 90, 120]  # the frame on screen each second
    assert [f.source_index for f in frames] == [0, 3, 6, 9, 12]
    assert frames[0].image.shape == (32, 48, 3) and frames[0].image.dtype == np.uint8
    clipped = list(iter_folder_frames(folder, 3.0, 1.0, start=1.0, end=3.0))
    assert [f.t for f in clipped] == [1.0, 2.0]
    assert len(list(iter_folder_frames(folder, 3.0, None))) == 15  # every image


def test_numbers_sort_as_numbers_and_big_frames_shrink(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    for name, red in (("10.jpg", 200), ("2.jpg", 100), ("1.jpg", 0)):
        Image.fromarray(np.full((900, 1200, 3), red, dtype=np.uint8)).save(folder / name, quality=95)
    (folder / "notes.txt").write_text("not a frame")
    assert [p.name for p in frame_files(folder)] == ["1.jpg", "2.jpg", "10.jpg"]
    frames = list(iter_folder_frames(folder, 1.0, 1.0, max_side=300))
    assert [round(float(f.image[..., 0].mean()) / 50) * 50 for f in frames] == [0, 100, 200]
    assert frames[0].image.shape == (225, 300, 3)


def test_unusable_folders(tmp_path: Path, clips: dict[str, Path]) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(VideoError, match="without frame images"):
        list(iter_folder_frames(tmp_path / "empty", 3.0, 1.0))
    with pytest.raises(VideoError, match="frame rate is not known"):
        iter_video(frames_folder(tmp_path / "clip", 3), 1.0)
    # A file goes to the file decoder, unchanged.
    assert [f.t for f in iter_video(clips["short"], 1.0)] == [f.t for f in iter_frames(clips["short"], 1.0)]
