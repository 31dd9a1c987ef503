"""The status line tells a viewer when the model reads slower than the video plays."""

from __future__ import annotations

import threading
import time

import pytest

from hermes.engine.methods import parse_policy
from hermes.runtime.readers import FileSource, PlayClock
from hermes.serving import LiveView, StreamSettings, StreamStatus
from hermes.serving.view import ChunkRecord
from hermes.video.decoding import VideoFile
from tests.helpers import chunk_report
from ui.callbacks import behind_text


def _view(frames_per_chunk: int, ms_per_chunk: float, chunks: int, fps: float = 1.0) -> LiveView:
    history = tuple(
        ChunkRecord(
            wall_s=float(i),
            reports={
                parse_policy("hermes"): chunk_report(
                    (i + 1) * frames_per_chunk,
                    (i + 1) * frames_per_chunk / fps,
                    prefill_ms=ms_per_chunk * 0.9,
                    compress_ms=ms_per_chunk * 0.1,
                )
            },
            rss_bytes=0,
            gpu_allocated_bytes=None,
        )
        for i in range(chunks)
    )
    settings = StreamSettings(chunk_frames=frames_per_chunk, fps=fps)
    return LiveView(version=1, settings=settings, history=history, stream_time_s=history[-1].stream_time_s)


def _status(position_s: float | None) -> StreamStatus:
    return StreamStatus("streaming", "clip.mp4", "1x", 0, 1, 0, None, position_s=position_s)


def test_a_slow_model_is_named_with_its_rate_and_the_lag():
    view = _view(frames_per_chunk=4, ms_per_chunk=5000, chunks=5)  # 0.8 frames/s against a 1 fps video
    assert view.model_fps() == 4 / 5.0
    text = behind_text(_status(position_s=view.stream_time_s + 12), view)
    assert "0.8 frames/s" in text and "12 s behind" in text


def test_nothing_is_said_while_the_model_keeps_up():
    fast = _view(frames_per_chunk=4, ms_per_chunk=1000, chunks=5)  # 4 frames/s
    assert behind_text(_status(position_s=fast.stream_time_s + 12), fast) is None
    slow = _view(frames_per_chunk=4, ms_per_chunk=5000, chunks=5)
    assert behind_text(_status(position_s=slow.stream_time_s + 1), slow) is None  # within a chunk or two
    assert behind_text(_status(position_s=None), slow) is None  # unpaced ("max") or not streaming
    assert _view(4, 5000, chunks=1).model_fps() is None  # one chunk is not a rate yet


def test_play_clock_stops_while_paused():
    clock = PlayClock(lambda: 1.0)
    assert clock.position() == 0.0
    clock.start()
    clock.pause()
    paused = clock.position()
    time.sleep(0.05)
    assert clock.position() == paused
    clock.resume()
    time.sleep(0.01)
    assert clock.position() > paused


def test_play_clock_follows_the_pace_and_an_unpaced_stream():
    now, speed = [0.0], [2.0]
    clock = PlayClock(lambda: speed[0], now=lambda: now[0])
    clock.start()
    now[0] = 1.0
    assert clock.position() == 2.0 and clock.wait_s(3.0) == 0.5  # 1 s of video left, at 2x
    speed[0] = None  # "max": nothing waits, and the clock follows the frames read
    assert clock.position() is None and clock.wait_s(100.0) == 0.0
    clock.seen(10.0)
    now[0] = 5.0
    speed[0] = 1.0  # back to real time, from where the frames are
    assert clock.position() == 10.0 and clock.wait_s(11.0) == 1.0


def test_a_file_at_1x_keeps_real_time_however_long_a_frame_takes_to_decode(clips, monkeypatch):
    """Frames are due by the play clock: decoding time does not add up on top of the waits.

    The clip's 8 s at 2 fps are 16 frames, each taking 0.15 s to decode here. Waiting the 0.5 s
    frame interval after each decode would play in 16 x 0.65 = 10.4 s; real time is 7.5 s to the
    last frame."""
    real_frames = VideoFile.frames

    def slow_frames(self, *args, **kwargs):
        for frame in real_frames(self, *args, **kwargs):
            time.sleep(0.15)
            yield frame

    monkeypatch.setattr(VideoFile, "frames", slow_frames)
    delivered: list[float] = []
    ended = threading.Event()
    source = FileSource(
        clips["short"],
        chunk_frames=1,
        fps=2.0,
        speed=lambda: 1.0,
        on_chunk=lambda chunk: delivered.append(time.monotonic()),
        has_room=lambda timeout: True,
        on_end=ended.set,
        on_error=lambda message: pytest.fail(message),
    )
    start = time.monotonic()
    source.start()
    assert ended.wait(30)
    assert len(delivered) == 16
    assert delivered[-1] - start < 8.5, f"the last frame came {delivered[-1] - start:.1f} s in, real time is 7.5 s"
    assert delivered[-1] - start > 7.4  # and it is paced, not read as fast as it decodes
