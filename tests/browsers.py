"""A real headless Chromium for the browser tests (the `browser` and `camera_browser` fixtures of
tests/conftest.py), and a page opened on the app that collects its console errors.

Needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)
and the pip `playwright` package; `playwright install` is never used.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

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
# Chromium's fake capture device plays a moving test pattern into the page's webcam box, allowed
# without a prompt.
CAMERA_ARGS = [*CHROMIUM_ARGS, "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
TIMEOUT_MS = 90_000


@contextlib.contextmanager
def chromium(args: Sequence[str] = CHROMIUM_ARGS) -> Iterator:
    """Debian's Chromium, driven by playwright, started with `args`; the test fails when it is missing."""
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: install it with `apt-get install -y chromium` (.ci/run does this).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=list(args))
        try:
            yield browser
        finally:
            browser.close()


def chat_when(page, condition: str, timeout: float = TIMEOUT_MS) -> str:
    """The chat's text `t` at the first moment the JavaScript `condition` on it holds. Read in the same
    moment as the check: an answer's own updates and the timer both draw the chat, and when the
    timer's older copy lands last the page shows it until the next tick puts the answer back."""
    script = f"() => {{ const t = document.querySelector('#chat').innerText; return ({condition}) ? t : null; }}"
    return page.wait_for_function(script, timeout=timeout).json_value()


def open_page(browser, url: str, viewport: dict):
    """A new page on the app, and the list that collects its console errors."""
    page = browser.new_page(viewport=viewport)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    return page, errors


@contextlib.contextmanager
def app_served(args: Sequence[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`python app.py ARGS` serving on 127.0.0.1:`port` (its output appended to `log`) until the block
    ends; its URL once the page answers. The test fails, with the log's end, if it exits or never serves."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "app.py", *args, "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, **(env or {}), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"app.py exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"app.py never served: {log.read_text()[-3000:]}"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
