"""Compare in a real headless Chromium: three policies chosen in Settings, three retained-token maps,
three answers to one question, and /metrics per policy."""

from __future__ import annotations

import pytest
from gradio_client import Client

from hermes.engine.methods import parse_policy
from hermes.serving import StreamSettings
from tests.browsers import TIMEOUT_MS, chat_when, open_page
from tests.helpers import wait_for
from tests.test_app import serve

pytestmark = pytest.mark.browser
CHOSEN = ("hermes", "fifo", "streammem")


@pytest.fixture(scope="module")
def url(llava_lm):
    address, demo, registry = serve(llava_lm, StreamSettings(budget=300, chunk_frames=2, fps=1.0))
    yield address
    demo.close()
    registry.shutdown()


def test_compare_three_policies_shows_three_maps_and_three_answers(browser, url, tmp_path):
    page, errors = open_page(browser, url, viewport={"width": 1400, "height": 1100})
    page.get_by_text("Settings (applied at the next Start or Reset)").click()
    page.locator("#compare input[type=checkbox]").check()
    # HERMES and FIFO are the default pair; add StreamMem as the third.
    chosen = page.locator("#compare-policies")
    chosen.locator("input").click()
    page.get_by_role("option", name="streammem", exact=True).click()
    page.keyboard.press("Escape")
    page.get_by_label("max", exact=True).check()
    page.click("#start-sample")
    page.wait_for_function(
        "() => /[1-9][0-9]* seen by the model/.test(document.querySelector('#status').innerText)", timeout=TIMEOUT_MS
    )
    page.fill("#question textarea", "What is in the picture?")
    page.click("#ask")
    labels = [parse_policy(p).label for p in CHOSEN]
    check = " && ".join(f"(t.includes('**{lab}**') || t.includes('{lab} ·'))" for lab in labels)
    chat = chat_when(page, f"(t.match(/TTFT/g) || []).length >= 3 && {check}")
    assert all(lab in chat for lab in labels), chat
    page.wait_for_function(
        "() => document.querySelectorAll('#retained-map .heatmaplayer .hm').length >= 3", timeout=TIMEOUT_MS
    )
    titles = page.inner_text("#retained-map")
    assert all(f"{lab} memory" in titles for lab in labels), titles
    page.screenshot(path=str(tmp_path / "compare_three.png"), full_page=True)
    assert errors == [], f"browser console errors: {errors}"
    page.close()


def test_compare_through_the_api_reports_metrics_per_policy_and_refuses_bad_choices(url):
    client = Client(url, verbose=False)
    try:
        settings = ["hermes", 300, 2, 1.0, "lazy", True, ["sink", "infinipot-v", "hermes+dtd"], 0.5, False]
        client.predict("Cockatoo, close-up (14 s)", "max", *settings, api_name="/start_sample")
        metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["chunks"] >= 2 and m)
        assert metrics["policies"] == ["sink", "infinipot-v", "hermes+dtd"]
        assert metrics["settings"]["guidance_history"] is False  # the last setting, given by position
        assert set(metrics["cache_bytes"]) == set(metrics["video_tokens_per_layer"]) == set(metrics["policies"])
        before = client.predict(api_name="/metrics")["frames_seen"]
        for bad, words in [
            (["hermes"], "2 to 3 policies"),
            (["hermes", "hermes+dtd", "fifo", "sink"], "2 to 3|max"),
        ]:
            with pytest.raises(Exception, match=words):
                client.predict("Cockatoo, close-up (14 s)", "max", *settings[:6], bad, 0.5, api_name="/start_sample")
        for policy in ("lru", "dtd", "hermes+dtd+dtd"):  # not among the choices Gradio offers
            with pytest.raises(Exception, match="hermes"):  # the message lists the choices
                client.predict("Cockatoo, close-up (14 s)", "max", policy, *settings[1:], api_name="/start_sample")
        # The stream that was running is untouched by the refused starts.
        assert client.predict(api_name="/metrics")["policies"] == ["sink", "infinipot-v", "hermes+dtd"]
        assert client.predict(api_name="/metrics")["frames_seen"] >= before
    finally:
        client.close()


@pytest.fixture(scope="module")
def rekv_url(llava_lm):
    """An app whose default Compare is HERMES against ReKV (the choosing is tested above)."""
    settings = StreamSettings(budget=300, chunk_frames=2, fps=1.0, compare=True, compare_policies=("hermes", "rekv"))
    address, demo, registry = serve(llava_lm, settings)
    yield address
    demo.close()
    registry.shutdown()


def test_compare_hermes_against_rekv_shows_both_answers_and_rekv_host_memory_growing(browser, rekv_url, tmp_path):
    page, errors = open_page(browser, rekv_url, viewport={"width": 1400, "height": 1100})
    page.get_by_label("max", exact=True).check()
    page.click("#start-sample")
    # Enough chunks that ReKV's window (300 tokens: a frame or so) has let frames go to host memory.
    page.wait_for_function(
        "() => { const m = /([0-9]+) seen by the model/.exec(document.querySelector('#status').innerText);"
        " return m && Number(m[1]) >= 8; }",
        timeout=TIMEOUT_MS,
    )
    page.fill("#question textarea", "What is in the picture?")
    page.click("#ask")
    chat = chat_when(page, "(t.match(/TTFT/g) || []).length >= 2")
    assert parse_policy("hermes").label in chat and parse_policy("rekv").label in chat, chat
    # The memory plot: ReKV's host memory is its own line and grows; HERMES's cache stays flat past its budget.
    traces = page.wait_for_function(
        """() => { const plot = document.querySelector('#performance .js-plotly-plot');
            if (!plot || !plot.data) return null;
            const byName = Object.fromEntries(plot.data.map(t => [t.name, Array.from(t.y || [])]));
            const host = byName['ReKV host memory'];
            return host && host.length >= 4 ? byName : null; }""",
        timeout=TIMEOUT_MS,
    ).json_value()
    host, hermes = traces["ReKV host memory"], traces["HERMES cache"]
    assert host[-1] > host[len(host) // 2] > 0, host
    assert hermes[-1] == hermes[-2] == hermes[-3], hermes
    page.screenshot(path=str(tmp_path / "compare_rekv.png"), full_page=True)
    assert errors == [], f"browser console errors: {errors}"
    page.close()
