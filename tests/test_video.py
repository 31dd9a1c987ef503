"""Tests for hermes.video.decoding (decoding, sampling, chunking, webcam frames) and hermes.video.clips.

Needs ffmpeg on PATH (Debian: apt-get install -y ffmpeg) to make the clips.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import itertools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hermes.video import clips
from hermes.video.chunking import Chunker
from hermes.video.clips import ClipError, make_clip
from hermes.video.decoding import (
    UntilDamage,
    VideoDamaged,
    VideoError,
    VideoFile,
    check_start,
    fit_size,
    iter_frames,
    letterbox,
    probe,
    sample_indices,
    sample_times,
    to_rgb_uint8,
)
from hermes.video.errors import Skipped
from hermes.video.native import decord, quiet_native
from hermes.video.reader import FrameReader, unpad
from tests.corpus import (
    DAMAGED,
    DAMAGED_AFTER_S,
    DAMAGED_AT_S,
    DAMAGED_TO_THE_END,
    SCRAMBLED,
    ffmpeg_frame_times,
    skipped_notes,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets"
RED = (255, 0, 0)
BLUE = (0, 0, 255)


def mean_rgb(img: np.ndarray) -> np.ndarray:
    return img.reshape(-1, 3).mean(axis=0)


def is_solid(img: np.ndarray, rgb: tuple[int, int, int], tol: float = 20.0) -> bool:
    """True if the frame is (almost) entirely one colour (H.264 moves colours a little)."""
    return bool(np.abs(mean_rgb(img) - np.asarray(rgb)).max() < tol and img.reshape(-1, 3).std(axis=0).max() < tol)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clips")


@pytest.fixture(scope="session")
def clip5(clip_dir: Path) -> Path:
    """5 s at 10 fps, 320x240: red frame at t=3.0, blue frame at t=1.5."""
    return make_clip(clip_dir / "clip5.mp4", 5.0, fps=10, size=(320, 240), needles={3.0: "red", 1.5: "blue"})


@pytest.fixture(scope="session")
def big_clip(clip_dir: Path) -> Path:
    return make_clip(clip_dir / "big.mp4", 0.5, fps=4, size=(2560, 1440))


@pytest.fixture(scope="session")
def one_frame_clip(clip_dir: Path) -> Path:
    return make_clip(clip_dir / "one_frame.mp4", 0.1, fps=10, size=(160, 120))


# --------------------------------------------------------------------------- pure sampling


def test_sample_times_grid() -> None:
    np.testing.assert_allclose(sample_times(5.0, 1.0), [0, 1, 2, 3, 4])
    np.testing.assert_allclose(sample_times(5.0, 0.5), [0, 2, 4])
    np.testing.assert_allclose(sample_times(4.0, 0.5), [0, 2])  # t=4 is the end, not a frame
    np.testing.assert_allclose(sample_times(0.1, 1.0), [0])  # shorter than one period
    np.testing.assert_allclose(sample_times(10.0, 0.5, start=3.0), [4, 6, 8])  # grid anchored at 0
    assert sample_times(0.0, 1.0).size == 0
    with pytest.raises(ValueError):
        sample_times(5.0, 0.0)


def test_sample_indices_picks_frame_on_screen_and_dedups() -> None:
    ft = np.arange(50) * np.float32(0.1)  # float32-ish container timestamps, 10 fps
    idx, ts = sample_indices(ft, 1.0)
    assert idx.tolist() == [0, 10, 20, 30, 40]
    np.testing.assert_allclose(ts, [0, 1, 2, 3, 4], atol=1e-6)
    # Above the native rate each source frame is used once.
    idx, _ = sample_indices(ft[:5], 100.0)
    assert idx.tolist() == [0, 1, 2, 3, 4]
    idx, _ = sample_indices(ft, None, start=1.0, end=1.5)
    assert idx.tolist() == [10, 11, 12, 13, 14]
    idx, _ = sample_indices(ft, 0.5, start=1.0, end=4.0)
    assert idx.tolist() == [20]


def test_fit_size_keeps_aspect_and_never_upscales() -> None:
    assert fit_size(2560, 1440, 768) == (768, 432)
    assert fit_size(1440, 2560, 768) == (432, 768)
    assert fit_size(640, 480, 768) == (640, 480)
    assert fit_size(4000, 3000, None) == (4000, 3000)
    assert fit_size(10000, 3, 768) == (768, 1)


# --------------------------------------------------------------------------- file decoding


def test_decode_1fps_and_05fps(clip5: Path) -> None:
    with VideoFile(clip5) as vf:
        info = vf.info
        assert info.num_frames == 50
        assert info.fps == pytest.approx(10.0)
        assert info.duration == pytest.approx(5.0, abs=0.01)
        assert (info.width, info.height) == (320, 240)
        assert info.frame_size == (320, 240)
        assert info.name == "clip5.mp4"

        frames = list(vf.frames(1.0))
        assert [f.source_index for f in frames] == [0, 10, 20, 30, 40]
        np.testing.assert_allclose([f.t for f in frames], [0, 1, 2, 3, 4], atol=1e-3)
        for f in frames:
            assert f.image.dtype == np.uint8 and f.image.shape == (240, 320, 3)

        frames = list(vf.frames(0.5, batch_size=2))
        np.testing.assert_allclose([f.t for f in frames], [0, 2, 4], atol=1e-3)
        assert vf.count(0.5) == 3
        assert vf.count(None) == 50


def test_needles_found_at_their_time(clip5: Path) -> None:
    frames = list(iter_frames(clip5, 1.0))
    red = [round(f.t, 3) for f in frames if is_solid(f.image, RED)]
    assert red == [3.0]
    assert not any(is_solid(f.image, BLUE) for f in frames)  # t=1.5 is not on the 1 fps grid

    frames = list(iter_frames(clip5, 2.0))
    assert [round(f.t, 3) for f in frames if is_solid(f.image, BLUE)] == [1.5]
    assert [round(f.t, 3) for f in frames if is_solid(f.image, RED)] == [3.0]
    # The testsrc2 frames around the needles are not solid.
    assert sum(is_solid(f.image, RED) or is_solid(f.image, BLUE) for f in frames) == 2


@pytest.mark.parametrize(("codec", "suffix"), [("mpeg4", ".avi"), ("libvpx-vp9", ".webm")])
def test_other_containers_decode_with_needle(tmp_path: Path, codec: str, suffix: str) -> None:
    p = make_clip(tmp_path / f"clip{suffix}", 2.0, fps=10, size=(160, 120), needles={1.0: "red"}, codec=codec)
    frames = list(iter_frames(p, 1.0))
    np.testing.assert_allclose([f.t for f in frames], [0, 1], atol=1e-3)
    assert [is_solid(f.image, RED, tol=30) for f in frames] == [False, True]


def test_start_end_window(clip5: Path) -> None:
    frames = list(iter_frames(clip5, 1.0, start=2.0, end=4.0))
    np.testing.assert_allclose([f.t for f in frames], [2, 3])
    assert is_solid(frames[1].image, RED)


def test_large_resolution_is_downscaled(big_clip: Path) -> None:
    info = probe(big_clip)
    assert (info.width, info.height) == (2560, 1440)
    assert info.frame_size == (768, 432)
    frames = list(iter_frames(big_clip, None))
    assert len(frames) == 2
    assert frames[0].image.shape == (432, 768, 3)
    small = list(iter_frames(big_clip, None, max_side=256))
    assert small[0].image.shape == (144, 256, 3)


def test_one_frame_video(one_frame_clip: Path) -> None:
    frames = list(iter_frames(one_frame_clip, 1.0))
    assert len(frames) == 1 and frames[0].t == 0.0 and frames[0].source_index == 0
    chunker = Chunker(16)
    assert chunker.push(frames[0]) is None
    chunk = chunker.flush()
    assert chunk.num_frames == 1 and chunk.frame_ids.tolist() == [0]


def test_chunks_from_file(clip5: Path) -> None:
    chunker = Chunker(2)
    chunks = [c for f in iter_frames(clip5, 1.0) if (c := chunker.push(f)) is not None]
    chunks.append(chunker.flush())
    assert [c.num_frames for c in chunks] == [2, 2, 1]
    assert [c.frame_ids.tolist() for c in chunks] == [[0, 1], [2, 3], [4]]
    assert [c.source_ids.tolist() for c in chunks] == [[0, 10], [20, 30], [40]]
    np.testing.assert_allclose(chunks[1].timestamps, [2, 3], atol=1e-3)
    assert [c.chunk_index for c in chunks] == [0, 1, 2]
    assert chunks[0].pixels.shape == (2, 240, 320, 3) and chunks[0].size == (320, 240)


# --------------------------------------------------------------------------- errors


def _assert_video_error(path: Path, *, match: str | None = None) -> None:
    with pytest.raises(VideoError) as ei:
        list(iter_frames(path, 1.0))  # the error may come at open or while decoding
    assert isinstance(ei.value, ValueError)
    assert path.name in str(ei.value)
    if match:
        assert re.search(match, ei.value.reason), ei.value.reason


def test_missing_file(tmp_path: Path) -> None:
    _assert_video_error(tmp_path / "missing_clip.mp4", match="not found")


def test_zero_byte_file(tmp_path: Path) -> None:
    p = tmp_path / "nothing_here.mp4"
    p.write_bytes(b"")
    _assert_video_error(p, match="0 bytes")


def test_text_file_renamed_mp4(tmp_path: Path) -> None:
    p = tmp_path / "notes_renamed.mp4"
    p.write_text("this is not a video\n" * 50)
    _assert_video_error(p)


def test_directory_is_rejected(tmp_path: Path) -> None:
    d = tmp_path / "a_folder.mp4"
    d.mkdir()
    _assert_video_error(d)


@pytest.mark.parametrize(
    ("how", "reason"),
    # Without its header, FFmpeg may take the file for another format that it then cannot decode.
    [("zero_header", "not a video file|the decoder cannot read"), ("flip_data", "the first frame cannot be decoded")],
)
def test_corrupt_file(clip5: Path, tmp_path: Path, how: str, reason: str) -> None:
    data = bytearray(clip5.read_bytes())
    mdat = data.find(b"mdat")
    assert 0 < mdat < len(data) // 4  # make_clip writes mp4 with +faststart: index first
    if how == "zero_header":
        data[: mdat + 8] = bytes(mdat + 8)
    else:  # damage every 7th byte of the frame data, keep the index intact
        for k in range(mdat + 8, len(data), 7):
            data[k] ^= 0xFF
    p = tmp_path / f"corrupt_{how}.mp4"
    p.write_bytes(bytes(data))
    _assert_video_error(p, match=reason)


def test_a_file_cut_short_streams_what_it_holds(clip5: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut_short.mp4"  # a download that stopped half-way: the index is whole, the data not
    cut.write_bytes(clip5.read_bytes()[: clip5.stat().st_size // 2])
    frames = list(iter_frames(cut, 1.0))
    assert 1 <= len(frames) < 5
    np.testing.assert_allclose([f.t for f in frames], range(len(frames)), atol=1e-3)


def test_zero_frame_video(tmp_path: Path) -> None:
    p = make_clip(tmp_path / "zero_frames.mp4", 0.0)
    assert p.stat().st_size > 0
    _assert_video_error(p, match="no video stream")


def test_make_clip_without_ffmpeg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(clips.shutil, "which", lambda name: None)
    with pytest.raises(ClipError, match="ffmpeg not found"):
        make_clip(tmp_path / "x.mp4", 1.0)


def test_make_clip_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        make_clip(tmp_path / "x.mp4", 1.0, needles={2.0: "red"})
    with pytest.raises(ValueError, match="colour"):
        make_clip(tmp_path / "x.mp4", 1.0, needles={0.0: "red:t=1"})


# --------------------------------------------------------------------------- files as devices write them


def reference_frame(path: Path, at_s: float) -> np.ndarray:
    """The frame FFmpeg itself shows at `at_s` (rotation applied), as RGB: what decoding must match."""
    cmd = [clips.ffmpeg_path(), "-v", "error", "-ss", f"{at_s:.3f}", "-i", str(path), "-frames:v", "1"]
    out = subprocess.run([*cmd, "-f", "image2pipe", "-c:v", "ppm", "-"], capture_output=True, check=True).stdout
    return np.asarray(Image.open(io.BytesIO(out)).convert("RGB"))


def assert_like_ffmpeg(path: Path, frames: list, tol: float = 3.0) -> None:
    for frame in frames:
        ref = reference_frame(path, frame.t)
        assert frame.image.shape == ref.shape
        assert np.abs(frame.image.astype(int) - ref).mean() < tol, f"{path.name} at {frame.t} s"


@pytest.mark.parametrize(
    "name",
    [
        "hevc.mp4",  # 96 px wide: FFmpeg pads its rows on some processors (AVX-512), not on others
        "vp9.webm",  # decord's threaded VP9 decoding fails where FFmpeg runs several threads
        "tiny_16x16.mp4",  # rows padded on every processor
        "tall_32x1024.mp4",  # 24 px wide once downscaled: the same
        "android.mp4",
    ],
)
def test_each_file_is_read_by_decord_as_ffmpeg_shows_it(corpus: dict[str, Path], name: str) -> None:
    with VideoFile(corpus[name]) as vf:
        frames = list(vf.frames(1.0))
        assert vf.rescued_frames == 0  # decord read every frame itself, not FFmpeg's slower fallback
        if name != "vp9.webm":
            assert vf.threaded  # with FFmpeg's threads, whatever the rows' padding
    np.testing.assert_allclose([f.t for f in frames], [0, 1], atol=1e-3)
    if name != "tall_32x1024.mp4":  # FFmpeg's reference is not downscaled
        assert_like_ffmpeg(corpus[name], frames)


@contextlib.contextmanager
def ffmpeg_alignment_of_avx2() -> Iterator[int]:
    """decord's FFmpeg as on a processor without AVX-512: its frame buffers then align rows to 32 bytes,
    not 64 (`av_cpu_max_align`), as on the machines where 96 px rows were not padded. Yields the
    alignment in force (64 would mean the flags could not be changed)."""
    folder = Path(decord().__file__).parent.parent / "decord2.libs"
    avutil = ctypes.CDLL(str(next(folder.glob("libavutil-*.so*"))))
    avutil.av_cpu_max_align.restype = ctypes.c_size_t
    avx512 = 0x100000 | 0x200000  # AV_CPU_FLAG_AVX512, AV_CPU_FLAG_AVX512ICL
    avutil.av_force_cpu_flags(avutil.av_get_cpu_flags() & ~avx512)
    try:
        yield int(avutil.av_cpu_max_align())
    finally:
        avutil.av_force_cpu_flags(-1)  # detected again


@pytest.mark.parametrize("name", ["hevc.mp4", "tiny_16x16.mp4"])
def test_the_frames_are_the_same_whatever_the_processor_pads(corpus: dict[str, Path], name: str) -> None:
    def frames() -> list[np.ndarray]:
        with VideoFile(corpus[name]) as vf:
            out = [f.image for f in vf.frames(None)]
            assert vf.threaded and vf.rescued_frames == 0  # decord read them all, with FFmpeg's threads
        return out

    here = frames()
    with ffmpeg_alignment_of_avx2() as align:
        assert align <= 32
        there = frames()
    assert len(here) == len(there) == 20
    for mine, theirs in zip(here, there, strict=True):
        assert mine.shape == theirs.shape and np.abs(mine.astype(int) - theirs).mean() < 1.0


def test_ffmpeg_reads_the_very_frames_decord_does(corpus: dict[str, Path], tmp_path: Path) -> None:
    """What the reader falls back to picks each frame by its time on the container's clock, from the
    key frame before: a phone's rotated video, and a broadcast recording at 60 fps whose clock starts
    at 10,000 s, its sound half a second before its picture, and one key frame (MPEG-TS seeks by
    time only roughly: from a frame after the key frame, nothing would decode)."""
    late = tmp_path / "late.ts"
    video = ["-itsoffset", "0.5", "-f", "lavfi", "-i", "testsrc2=size=96x64:rate=60:duration=3"]
    sound = ["-f", "lavfi", "-i", "sine=duration=3.5", "-c:a", "aac", "-output_ts_offset", "10000"]
    x264 = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"]
    subprocess.run([clips.ffmpeg_path(), "-v", "error", *video, *sound, *x264, str(late)], check=True)
    for path, indices in [(corpus["android.mp4"], [0, 7, 13, 19]), (late, [70, 131, 179])]:
        reader = FrameReader(path)
        by_ffmpeg = list(reader.read_by_ffmpeg(indices))
        assert reader.rescued == len(indices)
        for index, mine, theirs in zip(indices, reader.read(indices), by_ffmpeg, strict=True):
            assert theirs is not None and theirs.shape == mine.shape, (path.name, index)
            assert np.abs(theirs.astype(int) - mine).mean() < 1.0, (path.name, index)  # another frame: ~30


def test_padded_rows_are_cut_to_the_frame() -> None:
    image = np.arange(16 * 32 * 3, dtype=np.uint8).reshape(16, 32, 3)  # rows padded to 32 px
    padded = image.reshape(16, 16, 6)  # how decord shapes a 16 px wide frame with such rows
    np.testing.assert_array_equal(unpad(padded), image[:, :16])
    assert unpad(image) is image


def test_rotated_phone_videos_come_out_upright(corpus: dict[str, Path]) -> None:
    for name in ("iphone.mov", "android.mp4"):  # 96x64 frames held with rotation metadata
        frames = list(iter_frames(corpus[name], 1.0))
        assert [f.image.shape for f in frames] == [(96, 64, 3)] * 2
        assert_like_ffmpeg(corpus[name], frames)


def test_variable_frame_rate_follows_the_stream_timestamps(corpus: dict[str, Path]) -> None:
    frames = list(iter_frames(corpus["variable_rate.mp4"], 1.0))
    # 10 frames in the first second, then one every 0.2 s: the frame at 2 s is frame 15, not 20.
    assert [f.source_index for f in frames] == [0, 10, 15]
    assert_like_ffmpeg(corpus["variable_rate.mp4"], frames)


def test_a_browser_recording_is_read_through_a_fresh_container(corpus: dict[str, Path]) -> None:
    with VideoFile(corpus["browser_recording.webm"]) as vf:  # no duration, no index: decord refuses it
        copy = vf._remuxed
        assert copy is not None and copy.exists()
        assert len(list(vf.frames(1.0))) == 2
    assert not copy.exists()


def test_without_ffmpegs_programs_the_fallbacks_still_work(corpus: dict[str, Path], monkeypatch) -> None:
    """A fresh container and decoding past damage run in this process (PyAV), so an install with no
    `ffmpeg` program (pip only, a Space) reads what one with it reads."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert shutil.which("ffmpeg") is None and shutil.which("ffprobe") is None
    with VideoFile(corpus["browser_recording.webm"]) as vf:
        assert vf._remuxed is not None and len(list(vf.frames(1.0))) == 2
    with VideoFile(corpus[DAMAGED.name]) as vf:
        got = list(UntilDamage(vf.frames(1.0)))
        assert [f.t for f in got] == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0] and vf.rescued_frames > 0


def test_mpeg_ts_streams_as_hls_segments_and_recorders_write_it(tmp_path: Path) -> None:
    """MPEG-TS as it comes off the air: an HLS segment (sound beside the picture, its clock at 8 s)
    and a recording that begins mid-broadcast (cut at a packet, no key frame first) both stream, a
    frame each second, every one decoded and each a new picture."""
    segment, whole, cut = tmp_path / "segment.ts", tmp_path / "whole.ts", tmp_path / "cut.ts"
    video = ["-f", "lavfi", "-i", "testsrc2=size=96x64:rate=10:duration=6"]
    x264 = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", "20"]
    sound = ["-f", "lavfi", "-i", "sine=duration=6", "-c:a", "mp2", "-output_ts_offset", "8"]  # mp2: no priming
    subprocess.run([clips.ffmpeg_path(), "-v", "error", *video, *sound, *x264, str(segment)], check=True)
    subprocess.run([clips.ffmpeg_path(), "-v", "error", *video, *x264, str(whole)], check=True)
    data = whole.read_bytes()
    cut.write_bytes(data[len(data) // 3 // 188 * 188 :])  # 188: the size of an MPEG-TS packet
    for path, seconds in [(segment, 6), (cut, 4)]:
        with VideoFile(path) as vf:
            frames = UntilDamage(vf.frames(1.0))
            got = list(frames)
            assert frames.damage is None and not frames.skips and vf.rescued_frames == 0
        assert [f.t for f in got] == [float(t) for t in range(seconds)], path.name
        assert all(np.abs(a.image.astype(int) - b.image).mean() > 3 for a, b in itertools.pairwise(got))


def test_a_damaged_frame_is_skipped_and_the_stream_goes_on(corpus: dict[str, Path]) -> None:
    path = corpus[DAMAGED.name]  # frame 20 (5 s) zeroed
    with VideoFile(path) as vf:
        frames = UntilDamage(vf.frames(1.0))
        got = list(frames)
        assert [f.t for f in got] == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0] and frames.damage is None
        assert [str(s) for s in frames.skips] == [f"1 frame could not be decoded at 0:0{DAMAGED_AT_S}"]
        assert [f.skipped for f in got] == [None] * 5 + [Skipped(DAMAGED_AT_S, 1), None]
        assert_like_ffmpeg(path, got[5:])  # the frames after it, as FFmpeg conceals what they refer to
        every = UntilDamage(vf.frames(None))
        assert len(list(every)) == len(ffmpeg_frame_times(path)) == vf.info.num_frames - 1
        assert [str(s) for s in every.skips] == ["1 frame could not be decoded at 0:05"]
    assert check_start(path, 1.0).num_frames == 32


def test_4kb_of_damaged_bytes_lose_only_the_frames_ffmpeg_loses(corpus: dict[str, Path]) -> None:
    path = corpus[SCRAMBLED.name]  # as reported: FFmpeg decodes 199 of the 200 frames
    with VideoFile(path) as vf:
        frames = UntilDamage(vf.frames(None))
        got = list(frames)
        assert frames.damage is None and vf.info.num_frames == 200
        decoded = ffmpeg_frame_times(path)
        assert [f.t for f in got] == pytest.approx(decoded, abs=1e-3) and len(decoded) < 200
        assert [str(s) for s in frames.skips] == skipped_notes(path, list(vf.frame_times)) != []
        assert_like_ffmpeg(path, [got[-1]])


def test_a_file_that_decodes_no_further_yields_every_good_frame_then_says_where(corpus: dict[str, Path]) -> None:
    path = corpus[DAMAGED_TO_THE_END.name]
    with VideoFile(path) as vf:
        frames = UntilDamage(vf.frames(1.0))
        assert [f.t for f in frames] == [0.0, 1.0, 2.0, 3.0, 4.0] and frames.skips == []
        assert frames.damage is not None and frames.damage.good_until_s == DAMAGED_AFTER_S
        assert frames.damage.reason == "the file is damaged after 0:04"
        assert str(frames.damage) == (
            f"'{path.name}' is damaged after 0:04: the stream stopped at the last good frame, "
            "and what was read stays in memory."
        )
        with pytest.raises(VideoDamaged, match="damaged after 0:04"):
            list(vf.frames(1.0))
        # Every frame: 0 to 16 decode (the key frame at 4 s included), as in FFmpeg, though decord's
        # worker thread reads ahead by however far its timing takes it.
        assert len(list(UntilDamage(vf.frames(None)))) == len(ffmpeg_frame_times(path)) == 17
    assert check_start(path, 1.0).num_frames == 32  # damaged after the frames Start checks


def test_no_native_log_line_reaches_stderr(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.mp4"
    notes.write_text("this is not a video\n" * 50)  # decord logs "ERROR opening: ..." from C++
    _assert_video_error(notes, match="not a video file")
    assert capfd.readouterr().err == ""


def test_the_stderr_trap_passes_on_everything_else(capfd: pytest.CaptureFixture[str]) -> None:
    started, done = threading.Event(), threading.Event()

    def other_thread() -> None:  # writes while the trap is set, as a server's logging would
        started.wait(5)
        os.write(2, b"a line from another thread\n")
        done.set()

    writer = threading.Thread(target=other_thread)
    writer.start()
    with quiet_native():
        os.write(2, b"[12:00:00] /project/src/video/video_reader.cc:83: ERROR opening: x, End of file\n")
        os.write(2, b"[h264 @ 0x55e85d25dcc0] error while decoding MB 0 0\n")
        started.set()
        assert done.wait(5)
    writer.join()
    assert capfd.readouterr().err == "a line from another thread\n"


# --------------------------------------------------------------------------- chunking


def _solid(h: int, w: int, value: int) -> np.ndarray:
    return np.full((h, w, 3), value, dtype=np.uint8)


def test_chunker_sizes_indices_and_flush() -> None:
    ch = Chunker(3)
    out = [ch.push(_solid(8, 8, i), t=float(i)) for i in range(7)]
    full = [c for c in out if c is not None]
    assert [i for i, c in enumerate(out) if c is not None] == [2, 5]
    assert [c.frame_ids.tolist() for c in full] == [[0, 1, 2], [3, 4, 5]]
    assert full[1].pixels[:, 0, 0, 0].tolist() == [3, 4, 5]
    assert ch.pending == 1

    last = ch.flush()
    assert last is not None and last.num_frames == 1
    assert last.frame_ids.tolist() == [6]
    assert last.timestamps.tolist() == [6.0]
    assert last.end == 6.0
    assert ch.flush() is None and ch.pending == 0

    # The stream continues after a flush; reset starts over.
    assert ch.push(_solid(8, 8, 9), t=7.0) is None
    assert ch.flush().frame_ids.tolist() == [7]
    ch.reset()
    ch.push(_solid(8, 8, 1), t=0.0)
    assert ch.flush().frame_ids.tolist() == [0]


def test_webcam_frames_of_varying_kinds_become_one_size() -> None:
    ch = Chunker(4, max_side=768)
    rgb = np.zeros((480, 640, 3), np.uint8)
    rgb[..., 0] = 200
    rgba = np.zeros((720, 1280, 4), np.uint8)
    rgba[..., 1] = 150
    rgba[..., 3] = 7  # alpha must be dropped, not blended
    gray = np.full((640, 480), 90, np.uint8)  # portrait: letterboxed into landscape
    flt = np.full((240, 320, 3), 0.5, np.float32)
    assert ch.push(rgb, t=0.0) is None
    assert ch.push(rgba, t=0.1) is None
    assert ch.push(gray, t=0.2) is None
    chunk = ch.push(flt, t=0.3)
    assert chunk is not None and ch.size == (640, 480)
    assert chunk.pixels.shape == (4, 480, 640, 3) and chunk.pixels.dtype == np.uint8
    np.testing.assert_allclose(mean_rgb(chunk.pixels[0]), [200, 0, 0])
    # 1280x720 -> 640x360 centred with black bars of 60 rows.
    np.testing.assert_allclose(mean_rgb(chunk.pixels[1][60:420]), [0, 150, 0], atol=0.5)
    assert chunk.pixels[1][:60].max() == 0 and chunk.pixels[1][420:].max() == 0
    # 480x640 portrait -> 360x480 centred with black bars of 140 columns.
    assert (chunk.pixels[2][:, 140:500] == 90).all()
    assert chunk.pixels[2][:, :140].max() == 0 and chunk.pixels[2][:, 500:].max() == 0
    assert (chunk.pixels[3] == 128).all()  # 0.5 * 255 rounds to 128
    assert chunk.frame_ids.tolist() == [0, 1, 2, 3]


def test_chunker_first_frame_size_is_capped_or_fixed() -> None:
    ch = Chunker(1, max_side=768)
    chunk = ch.push(np.zeros((1000, 2000, 3), np.uint8), t=0.0)
    assert chunk.size == (768, 384)
    ch = Chunker(1, size=(64, 48))
    chunk = ch.push(np.zeros((1000, 2000, 3), np.uint8), t=0.0)
    assert chunk.size == (64, 48)


def test_chunker_fps_thinning() -> None:
    ch = Chunker(16, fps=1.0)
    times = [0.0, 0.5, 0.98, 1.5, 2.0, 2.5, 3.01, 7.0, 7.4, 8.0]  # 0.98: jitter, 7.0: after a gap
    for t in times:
        ch.push(_solid(4, 4, 0), t=t)
    chunk = ch.flush()
    assert chunk.timestamps.tolist() == [0.0, 0.98, 2.0, 3.01, 7.0, 8.0]
    assert ch.dropped == 4


def test_chunker_default_clock_is_monotonic() -> None:
    ch = Chunker(16)
    for _ in range(3):
        ch.push(_solid(4, 4, 0))
    ts = ch.flush().timestamps
    assert ts[0] == 0.0 and np.all(np.diff(ts) >= 0)


def test_to_rgb_uint8_conversions() -> None:
    g = np.arange(12, dtype=np.uint8).reshape(3, 4)
    out = to_rgb_uint8(g)
    assert out.shape == (3, 4, 3) and (out[..., 0] == g).all() and (out[..., 2] == g).all()
    assert to_rgb_uint8(g[..., None]).shape == (3, 4, 3)
    rgba = np.random.default_rng(0).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    assert np.array_equal(to_rgb_uint8(rgba), rgba[..., :3])
    assert to_rgb_uint8(np.ones((2, 2, 3), np.float64)).max() == 255
    assert to_rgb_uint8(np.full((2, 2, 3), 7, np.int64)).dtype == np.uint8


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 4, 2), np.uint8),
        np.zeros((2, 4, 4, 3), np.uint8),
        np.zeros((5,), np.uint8),
        np.zeros((0, 4, 3), np.uint8),
        np.full((4, 4, 3), 2.0, np.float32),
        np.full((4, 4, 3), np.nan, np.float32),
        np.full((4, 4, 3), 1000, np.uint16),
        np.zeros((4, 4, 3), bool),
        [[0, 0, 0]],
        "frame.png",
    ],
    ids=["2ch", "4d", "1d", "empty", "float>1", "nan", "uint16", "bool", "list", "str"],
)
def test_to_rgb_uint8_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        to_rgb_uint8(bad)
    with pytest.raises(ValueError):
        Chunker(2).push(bad, t=0.0)


def test_letterbox_same_size_is_identity() -> None:
    img = _solid(6, 8, 3)
    assert letterbox(img, (8, 6)) is img


# --------------------------------------------------------------------------- assets


@pytest.mark.parametrize(
    ("name", "seconds", "size"), [("sample.mp4", 40.0, (640, 480)), ("cockatoo.mp4", 14.0, (640, 360))]
)
def test_sample_assets_decode(name: str, seconds: float, size: tuple[int, int]) -> None:
    path = ASSETS / name
    with VideoFile(path) as vf:
        assert vf.info.duration == pytest.approx(seconds, abs=0.2)
        assert vf.info.frame_size == size
        assert vf.count(1.0) == round(seconds)
        frames = list(vf.frames(0.25))
    assert len(frames) == int(np.ceil(seconds * 0.25))
    assert all(f.image.shape == (size[1], size[0], 3) for f in frames)
    assert all(f.image.std() > 10 for f in frames)  # real content, not blank frames
    assert (ASSETS / "LICENSE-sample.md").is_file()


def test_ffmpeg_is_available_for_these_tests() -> None:
    # A clear message in CI when the Debian ffmpeg package is missing.
    assert shutil.which("ffmpeg"), "install ffmpeg (apt-get install -y ffmpeg) to run the video tests"
