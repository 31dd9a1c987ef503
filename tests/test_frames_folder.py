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


def test_a_zip_of_frames_unpacks_flat_in_name_order_and_crafted_ones_are_refused(tmp_path: Path) -> None:
    import zipfile

    from hermes.video import frames_folder as ff

    folder = frames_folder(tmp_path / "clip", 6)
    archive = tmp_path / "frames.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in frame_files(folder):
            zf.write(p, f"clip/{p.name}")
        zf.write(frame_files(folder)[0], "../../escape.png")  # flattened: it lands inside
        zf.writestr("__MACOSX/clip/._0.png", b"resource fork")
        zf.writestr("readme.txt", "no frame")
    out = ff.unpack_frames(archive, tmp_path / "unpacked")
    assert not (tmp_path.parent / "escape.png").exists() and not (tmp_path / "escape.png").exists()
    assert [p.parent for p in frame_files(out)] == [out] * 7
    red = [int(f.image[0, 0, 0]) for f in iter_folder_frames(out, 1.0, 1.0)]
    assert red == [0, 0, 10, 20, 30, 40, 50]  # name order kept ("../../escape.png" sorts first)

    (tmp_path / "fake.zip").write_text("PK but not a zip")
    with pytest.raises(VideoError, match="not a readable zip"):
        ff.unpack_frames(tmp_path / "fake.zip", tmp_path / "x")
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("notes.txt", "no frames")
    with pytest.raises(VideoError, match="without frame images"):
        ff.unpack_frames(empty, tmp_path / "y")
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("0.png", b"\0" * (ff.MAX_FRAME_BYTES + 1))  # a few KiB packed
    assert bomb.stat().st_size < 2**20
    with pytest.raises(VideoError, match="unpack to more than"):
        ff.unpack_frames(bomb, tmp_path / "z")
    assert not (tmp_path / "z").exists()


def test_an_image_past_the_frame_size_limit_is_refused_before_it_is_decoded(tmp_path: Path, monkeypatch) -> None:
    from hermes.video import frames_folder as ff

    folder = frames_folder(tmp_path / "clip", 2)  # 48 x 32 images
    monkeypatch.setattr(ff, "MAX_FRAME_PIXELS", 48 * 32 - 1)
    with pytest.raises(VideoError, match="larger than this reader decodes"):
        ff.check_folder_start(folder, 1.0)


def test_the_app_streams_a_folder_of_frames_and_answers(worker, llava_lm, tmp_path: Path) -> None:
    from hermes.runtime.settings import StreamSettings
    from hermes.serving.live import LiveStream
    from tests.helpers import wait_for

    folder = frames_folder(tmp_path / "clip", 6)
    stream = LiveStream(worker, llava_lm, StreamSettings(budget=400, chunk_frames=2, fps=1.0), key="folder")
    try:
        info = stream.start_file(folder, speed="max")
        assert (info.name, info.duration, info.num_frames) == ("clip", 6.0, 6)
        assert wait_for(lambda: stream.status().state == "finished", 60) and worker.wait_idle(stream.key, 60)
        assert stream.view().frames_seen == 6
        done = [e for e in stream.ask("What is in the video?", max_new_tokens=3).events() if e.done]
        assert done and all(e.error is None and e.update.tokens > 0 for e in done)
        with pytest.raises(VideoError, match="without frame images"):
            stream.start_file(tmp_path, speed="max")  # a folder of folders: the stream is left as it was
        assert stream.view().frames_seen == 6
    finally:
        stream.close()
