"""The app in a real headless Chromium (tests/browsers.py): stream the sample, ask, see the answer
and the live plots."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from hermes.serving import StreamSettings
from tests.browsers import TIMEOUT_MS, chat_when, open_page
from tests.test_app import serve

pytestmark = pytest.mark.browser


def set_slider(page, elem_id: str, value: str, tries: int = 5) -> None:
    """Type `value` into a Gradio slider's number box until the slider holds it.

    Gradio mounts an accordion's content when it first opens, so a value typed into the box during
    that render can be lost; the slider's range input shows what Start will actually read.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = f"#{elem_id} input[type=number]"
    committed = f"() => document.querySelector('#{elem_id} input[type=range]').value === '{value}'"
    for _ in range(tries):
        page.fill(box, value)
        page.press(box, "Tab")
        try:
            page.wait_for_function(committed, timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"slider #{elem_id} never took the value {value}")


@pytest.fixture(scope="module")
def url(llava_lm):
    # Budget below two chunks of tokens, so that compression (and the attention profile) happens early.
    address, demo, registry = serve(llava_lm, StreamSettings(budget=300, chunk_frames=2, fps=1.0))
    yield address
    demo.close()
    registry.shutdown()


def test_stream_ask_and_watch_the_memory(browser, url, tmp_path):
    page, errors = open_page(browser, url, viewport={"width": 1400, "height": 1000})
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
    chat = chat_when(page, "t.includes('TTFT')")
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


def test_watch_for_box_alerts_in_the_chat_and_plots_p_yes(browser, url, tmp_path):
    page, errors = open_page(browser, url, viewport={"width": 1400, "height": 1200})

    page.click("#watch")  # an empty standing question: a clear message, nothing added
    page.get_by_text("The standing question is empty").first.wait_for()
    page.fill("#watch-question textarea", "Is there a bird?")
    page.click("#watch")
    page.wait_for_function("() => document.querySelector('#watching input').value === 'Is there a bird?'")
    assert page.input_value("#watch-question textarea") == ""
    # A low threshold, so that random weights fire at the first check.
    page.get_by_text("Settings (applied at the next Start or Reset)").click()
    set_slider(page, "watch-threshold", "0.05")
    # HERMES's guidance carries the conversation unless told otherwise.
    assert page.get_by_label("Guide the memory by the last question and answer").is_checked()

    page.get_by_label("max", exact=True).check()
    page.click("#start-sample")
    # The alert reaches the chat by itself: marked, with the stream time, p(yes), the question and the frame.
    chat = chat_when(page, "t.includes('Alert')")
    assert re.search(r"Alert · \d+ s \(frame \d+\) · p\(yes\) 0\.\d\d", chat), chat
    assert "Is there a bird?" in chat
    page.wait_for_selector("#chat img", state="attached")
    # The live plot: a p(yes) line, a star where it fired, and the threshold line.
    page.wait_for_function("() => document.querySelectorAll('#watch-plot .scatterlayer .trace').length >= 2")
    assert "threshold 0.05" in page.inner_text("#watch-plot")

    page.click("#unwatch")  # removes the selected one
    page.wait_for_function("() => document.querySelector('#watching input').value === ''")
    page.click("#unwatch")  # nothing left to remove: a clear message
    page.get_by_text("Choose the standing question to remove").first.wait_for()
    page.screenshot(path=str(tmp_path / "hermes_watch.png"), full_page=True)
    assert errors == [], f"browser console errors: {errors}"
    page.close()
