"""The Live URL tab in a real headless Chromium (tests/browsers.py) against the loopback RTSP server:
a refused URL gets its reason on the page, then the stream plays, the status line shows the network
stream, and a question is answered from it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from hermes.serving import UrlPolicy
from tests.browsers import TIMEOUT_MS, open_page
from tests.network_servers import free_port, rtsp_server
from tests.test_network_app import serve

BOX = "#stream-url textarea, #stream-url input"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def url(llava_lm):
    demo, registry = serve(llava_lm, UrlPolicy.parse("127.0.0.1"))
    yield demo.local_url
    demo.close()
    registry.shutdown()


def status_has(page, pattern: str) -> None:
    page.wait_for_function(f"() => /{pattern}/.test(document.querySelector('#status').innerText)", timeout=TIMEOUT_MS)


def test_the_live_url_tab_streams_an_rtsp_camera(browser, url):
    page, errors = open_page(browser, url, viewport={"width": 1400, "height": 1000})
    page.get_by_role("tab", name="Live URL").click()
    assert "opens streams from: 127.0.0.1" in page.inner_text("body")  # what this server allows, said

    page.fill(BOX, f"rtsp://ann:s3cret@127.0.0.1:{free_port()}/cam")
    page.click("#start-url")
    page.get_by_text("connection refused").first.wait_for(timeout=TIMEOUT_MS)
    assert "s3cret" not in page.inner_text("body").replace(page.input_value(BOX), "")

    with rtsp_server(credentials="ann:s3cret") as server:
        page.fill(BOX, server.url)
        page.click("#start-url")
        status_has(page, "Streaming")
        status_has(page, "[1-9][0-9]* seen by the model")
        status_has(page, "latency [0-9.]+ s")
        status = page.inner_text("#status")
        assert "rtsp://***@127.0.0.1" in status and "s3cret" not in status
        page.fill("#question textarea", "What is moving?")
        page.click("#ask")
        page.wait_for_function("() => document.querySelector('#chat').innerText.includes('TTFT')", timeout=TIMEOUT_MS)
        page.click("#stop")
        status_has(page, "Stopped|Finishing")
    assert errors == [], f"browser console errors: {errors}"
    page.close()
