"""The webcam in a real headless Chromium, as a viewer uses it: a fake camera, Record, the stream.

Chromium's fake capture device (`--use-fake-device-for-media-stream`, allowed without a prompt by
`--use-fake-ui-for-media-stream`) plays a moving test pattern into the page's webcam box, whose
frames stream to the server every half second, exactly as a real camera's would.
"""

from __future__ import annotations

import re

import pytest

from hermes.serving import StreamSettings
from tests.browsers import TIMEOUT_MS, open_page
from tests.helpers import wait_for
from tests.test_app import serve

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app(llava_lm):
    # Every frame the page sends is kept (2 fps), two to a chunk: a chunk a second.
    address, demo, registry = serve(llava_lm, StreamSettings(budget=300, chunk_frames=2, fps=2.0))
    yield address, registry
    demo.close()
    registry.shutdown()


def _seen(page) -> int:
    """Frames the model has seen, as the status line says."""
    match = re.search(r"(\d+) seen by the model", page.inner_text("#status"))
    return int(match.group(1)) if match else 0


def test_the_webcam_streams_into_the_memory_and_stops_with_the_recording(camera_browser, app, tmp_path):
    address, registry = app
    page, errors = open_page(camera_browser, address, viewport={"width": 1400, "height": 1200})
    # Before recording: a standing question, and Compare (applied when the webcam stream starts).
    page.fill("#watch-question textarea", "Is anything moving?")
    page.click("#watch")
    page.wait_for_function("() => document.querySelector('#watching input').value === 'Is anything moving?'")
    page.get_by_text("Settings (applied at the next Start or Reset)").click()
    page.get_by_label("Compare policies side by side (one cache each)").check()  # HERMES and FIFO by default

    page.get_by_role("tab", name="Webcam").click()
    page.get_by_text("Click to Access Webcam").click()
    page.click("button.capture-button")  # Record

    # Frames reach the model: the status line and the stream's /metrics count them.
    page.wait_for_function(
        "() => /webcam/.test(document.querySelector('#status').innerText) && "
        "/([4-9]|\\d\\d+) seen by the model/.test(document.querySelector('#status').innerText)",
        timeout=TIMEOUT_MS,
    )
    (stream,) = registry._streams.values()
    metrics = stream.metrics()
    assert metrics["source"] == "webcam" and metrics["frames_seen"] >= 4 and metrics["chunks"] >= 2
    assert set(metrics["cache_bytes"]) == {"hermes", "fifo"}

    # A question is answered from what the camera showed.
    page.fill("#question textarea", "What do you see?")
    page.click("#ask")
    # Both memories' answers, finished, with their timings.
    page.wait_for_function(
        "() => (document.querySelector('#chat').innerText.match(/TTFT \\d+ ms/g) || []).length >= 2",
        timeout=TIMEOUT_MS,
    )

    # The standing question gets its p(yes) points, per memory; Compare draws two maps.
    page.wait_for_function("() => document.querySelectorAll('#watch-plot .scatterlayer .trace').length >= 1")
    rows = stream.metrics()["standing"]
    assert {r["policy"] for r in rows} == {"hermes", "fifo"} and all(r["checks"] >= 1 for r in rows)
    assert all(0.0 <= r["p_yes"] <= 1.0 for r in rows)
    page.wait_for_function("() => document.querySelectorAll('#retained-map .heatmaplayer .hm').length >= 2")

    # Stopping the recording stops the stream: the frames of the partial chunk still go in, none
    # come after, and what was seen can be asked about.
    page.click("button.capture-button")  # Stop
    page.wait_for_function(
        "() => /Waiting for the webcam/.test(document.querySelector('#status').innerText)", timeout=TIMEOUT_MS
    )
    assert "The webcam stopped sending frames" in page.inner_text("#status")
    # Every frame read went in, but those of chunks dropped while the model was busy (a live source
    # cannot wait).
    assert wait_for(
        lambda: (
            (s := stream.status()).frames_read == stream.view().frames_seen + s.dropped_frames and not s.queued_chunks
        )
    )
    seen = stream.view().frames_seen
    page.wait_for_timeout(2500)  # two more chunks' worth of time
    assert stream.view().frames_seen == seen
    # The page shows it by its next tick, which a loaded machine can hold back past that time.
    page.wait_for_function(
        f"() => /(^|\\D){seen} seen by the model/.test(document.querySelector('#status').innerText)",
        timeout=TIMEOUT_MS,
    )
    assert _seen(page) == seen
    page.fill("#question textarea", "What did you see last?")
    page.click("#ask")
    page.wait_for_function(
        "() => (document.querySelector('#chat').innerText.match(/TTFT/g) || []).length >= 4", timeout=TIMEOUT_MS
    )  # two questions, answered from both memories
    page.screenshot(path=str(tmp_path / "hermes_webcam.png"), full_page=True)

    # Reset: fresh memories, and the frame panel no longer names the last stream's frame.
    page.click("#reset")
    page.wait_for_function("() => !/seen by the model \\([1-9]/.test(document.querySelector('#status').innerText)")
    page.wait_for_function("() => !/consumed: frame/.test(document.querySelector('#frame').innerText)")
    assert errors == [], f"browser console errors: {errors}"
    page.close()
