"""The status line tells a viewer when the model reads slower than the video plays."""

from __future__ import annotations

import time

from hermes.serving import LiveView, StreamSettings, StreamStatus
from hermes.serving.sources import PlayClock
from hermes.serving.view import ChunkRecord
from ui.callbacks import behind_text


def _view(frames_per_chunk: int, ms_per_chunk: float, chunks: int, fps: float = 1.0) -> LiveView:
    history = tuple(
        ChunkRecord(
            wall_s=float(i),
            frames_seen=(i + 1) * frames_per_chunk,
            stream_time_s=(i + 1) * frames_per_chunk / fps,
            cache_bytes={"hermes": 0},
            prefill_ms={"hermes": ms_per_chunk * 0.9},
            compress_ms={"hermes": ms_per_chunk * 0.1},
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
    clock = PlayClock()
    assert clock.elapsed() == 0.0
    clock.start()
    clock.pause()
    paused = clock.elapsed()
    time.sleep(0.05)
    assert clock.elapsed() == paused
    clock.resume()
    time.sleep(0.01)
    assert clock.elapsed() > paused
