"""An opt-in soak of a live network stream: RTSP from the loopback GStreamer server at 1 fps into the
tiny model through a headless `LiveStream`, for as long as HERMES_LIVE_SOAK_MINUTES says (an hour:
60). A live stream runs in real time, so this one is skipped unless asked for:

    HERMES_LIVE_SOAK_MINUTES=60 python -m pytest -q -s tests/test_network_soak.py

The process's RSS after each chunk must not grow (Theil-Sen's slope under the bound of
tests/test_soak.py, `slope_bound`), the cache bytes stay constant, the stream never drops, and a question is
answered at the end; the seconds the model skipped to stay live are printed. docs/limits.md has the result of a run."""

from __future__ import annotations

import os
import time

import pytest

from hermes.engine.methods import PolicySpec
from hermes.runtime.settings import StreamSettings
from hermes.serving.live import LiveStream
from hermes.video.urls import UrlPolicy
from tests.helpers import wait_for
from tests.network_servers import rtsp_server
from tests.test_soak import report, rss_mib, shorten_histories, slope_bound, slope_per_hour

MINUTES = float(os.environ.get("HERMES_LIVE_SOAK_MINUTES", "0"))
SETTINGS = StreamSettings(fps=1.0, chunk_frames=4, budget=256)  # the app's rate and chunk: 15 chunks a minute
WARMUP = 16

pytestmark = [
    pytest.mark.soak,
    pytest.mark.timeout(600 + 60 * MINUTES),
    pytest.mark.skipif(not MINUTES, reason="a live soak runs in real time: set HERMES_LIVE_SOAK_MINUTES"),
]


@pytest.fixture(autouse=True)
def short_histories(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream's histories fill within the warm-up, as in tests/test_soak.py (this test runs in
    the suite's process, alone when asked for)."""
    shorten_histories(monkeypatch.setattr)


def test_an_rtsp_stream_keeps_host_memory_flat(worker, llava_lm):
    stream = LiveStream(worker, llava_lm, SETTINGS, key="soak")
    readings: list[float] = []
    try:
        with rtsp_server() as server:
            stream.start_url(server.url, UrlPolicy.parse("127.0.0.1"))
            assert wait_for(lambda: stream.view().chunks >= WARMUP, 120)
            held = stream.view().snapshots[PolicySpec("hermes")].cache_bytes
            skipped = stream.status().network.skipped_s  # opening buffers a few seconds
            end = time.monotonic() + 60 * MINUTES
            seen = stream.view().chunks
            while time.monotonic() < end:
                assert wait_for(lambda seen=seen: stream.view().chunks > seen, 30), "the stream stalled"
                seen = stream.view().chunks
                readings.append(rss_mib())
                assert stream.view().snapshots[PolicySpec("hermes")].cache_bytes == held
            events = list(stream.ask("What is moving?", max_new_tokens=4).events())
            status = stream.status()
    finally:
        stream.close()
    slope = slope_per_hour(readings)
    print("\n" + report(f"live RTSP, {MINUTES:g} min", readings, slope))
    print("RSS (MiB) every 15 chunks:", [round(r, 1) for r in readings[::15]])
    # How far the model kept up depends on the machine's load: said, not held to.
    print(f"the model skipped {status.network.skipped_s - skipped:.0f} s of the stream after the warm-up")
    assert events[-1].done and events[-1].error is None
    assert status.network.reconnects == 0
    assert abs(slope) < slope_bound(len(readings))
