"""The app on a toy model in a real headless Chromium, offline: when the requested model cannot
load, the app starts on world v2's toy model trained here (a banner says so, and no random-weight
warning), its own clips are the first samples, and in Compare a backward question about the start of
one of them gets HERMES's right answer beside FIFO's."""

from __future__ import annotations

import json

import pytest

from hermes.models.loading import SAMPLES_FILE, TOY2_SAMPLES
from hermes.serving import StreamRegistry, bundled_samples, load_model_or_fallback
from tests.browsers import TIMEOUT_MS, chat_when, open_page
from tests.test_app import free_port
from ui import build_app, launch_options

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def toy_app():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        lm, error = load_model_or_fallback("nobody/no-such-video-model", device="cpu")
    registry = StreamRegistry(lm)
    demo = build_app(lm, registry=registry, load_error=error)
    demo.launch(
        server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **launch_options()
    )
    yield demo.local_url, lm
    demo.close()
    registry.shutdown()


def test_the_toy_model_stands_in_and_its_clips_come_first(toy_app):
    _, lm = toy_app
    assert lm.source == "toy2" and not lm.random_weights
    samples = bundled_samples(lm)
    first = next(iter(samples.values()))
    assert first.path.parent == TOY2_SAMPLES and first.suggestions
    assert {s.kind for s in first.suggestions} == {"real-time", "backward", "forward"}


def test_compare_on_a_toy_clip_shows_fifo_forgetting(browser, toy_app, tmp_path):
    url, _ = toy_app
    sample = json.loads((TOY2_SAMPLES / SAMPLES_FILE).read_text())[0]
    question = next(q for q in sample["questions"] if q["kind"] == "backward" and q["answers"]["hermes"] == q["answer"])
    page, errors = open_page(browser, url, viewport={"width": 1400, "height": 1100})
    banner = page.inner_text(".banner")
    assert "trained here on synthetic clips" in banner and "Random weights" not in banner
    assert question["text"] in page.inner_text("#suggestions")
    page.get_by_text("Settings (applied at the next Start or Reset)").click()
    page.locator("#compare input[type=checkbox]").check()  # HERMES and FIFO: the toy model's pair
    page.get_by_label("max", exact=True).check()
    page.click("#start-sample")
    page.wait_for_function(
        "() => /64 seen by the model/.test(document.querySelector('#status').innerText)", timeout=3 * TIMEOUT_MS
    )
    page.fill("#question textarea", question["text"])
    page.click("#ask")
    chat = chat_when(page, "(t.match(/TTFT/g) || []).length >= 2")
    replies = {label: chat.split(f"{label} ·", 1)[1].split("TTFT", 1)[0] for label in ("HERMES", "FIFO")}
    assert question["answer"] in replies["HERMES"].lower(), chat
    assert question["answers"]["fifo"] in replies["FIFO"].lower(), chat
    page.wait_for_function(
        "() => document.querySelectorAll('#retained-map .heatmaplayer .hm').length >= 2", timeout=TIMEOUT_MS
    )
    page.screenshot(path=str(tmp_path / "toy_compare.png"), full_page=True)
    assert errors == [], f"browser console errors: {errors}"
    page.close()
