"""The app in a real headless Chromium: stream the sample, ask, see the answer and the live plots.

Needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)
and the pip `playwright` package; `playwright install` is never used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from hermes.serving import StreamSettings
from tests.test_app import serve

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 90_000

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: install it with `apt-get install -y chromium` (.ci/run does this).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def url(llava_lm):
    # Budget below two chunks of tokens, so that compression (and the attention profile) happens early.
    address, demo, registry = serve(llava_lm, StreamSettings(budget=300, chunk_frames=2, fps=1.0))
    yield address
    demo.close()
    registry.shutdown()


def test_stream_ask_and_watch_the_memory(browser, url, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    assert "Random weights" in page.inner_text(".banner")

    page.get_by_label("max", exact=True).check()
    page.click("#start-sample")
    page.wait_for_function(
        "() => /[1-9][0-9]* seen by the model/.test(document.querySelector('#status').innerText)", timeout=TIMEOUT_MS
    )
    page.click("#ask")  # an empty question: a clear message, nothing sent to the model
    page.get_by_text("The question is empty").first.wait_for(timeout=TIMEOUT_MS)
    page.fill("#question textarea", "What is in the picture?")
    page.click("#ask")
    page.wait_for_function("() => document.querySelector('#chat').innerText.includes('TTFT')", timeout=TIMEOUT_MS)
    chat = page.inner_text("#chat")
    assert "What is in the picture?" in chat and re.search(r"TTFT \d+ ms", chat)

    # The three live views drew real data: the heatmap, three attention profiles, TTFT and memory lines.
    page.wait_for_selector("#retained-map .heatmaplayer .hm", state="attached")
    page.wait_for_function("() => document.querySelectorAll('#attention .scatterlayer .trace').length >= 3")
    page.wait_for_function("() => document.querySelectorAll('#performance .scatterlayer .trace').length >= 3")
    page.screenshot(path=str(tmp_path / "hermes_app.png"), full_page=True)

    # A second viewer starts from a clean slate: no chat, no memory of the first one's stream.
    other = browser.new_page()
    other.goto(url)
    other.wait_for_selector("#status")
    assert "TTFT" not in other.inner_text("#chat")
    assert "Idle" in other.inner_text("#status")
    other.close()

    assert errors == [], f"browser console errors: {errors}"
    page.close()
