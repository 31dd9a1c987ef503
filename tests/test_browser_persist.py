"""A memory that outlives the app, in a real headless Chromium (tests/browsers.py): stream the sample
on the tiny model, ask, save the memory as a download, restart `python app.py --state-dir`, reopen
the page, resume, and the same question gets the same answer; another browser is offered nothing,
is refused a file that is not a memory, and loads the download to the same answer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes.engine.persist import read_session
from tests.browsers import TIMEOUT_MS, app_served
from tests.test_app import free_port

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What did you see at the start?"


def app_process(port: int, state: Path, log: Path):
    """`python app.py` on the tiny model with a state folder, serving on `port` until the block ends."""
    args = ["--model", "tiny", "--dtype", "fp32", "--state-dir", str(state), "--checkpoint-every", "2"]
    return app_served(args, port, log)


def open_in(context, url: str):
    """A new page of `context` (a browser profile: its local storage survives the page) on the app,
    and the list that collects its console errors."""
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    return page, errors


def answer_to(page, question: str = QUESTION) -> str:
    """Ask `question` and return the answer's text as the chat shows it (without its timings)."""
    asked = page.inner_text("#chat").count(question)
    page.fill("#question textarea", question)
    page.click("#ask")
    # Read in the same moment as the check: the chat is redrawn by the answer and the timer alike.
    answered = page.wait_for_function(
        """([question, asked]) => {
            const chat = document.querySelector('#chat').innerText;
            if (chat.split(question).length <= asked + 1) return null;
            const after = chat.slice(chat.lastIndexOf(question) + question.length);
            return after.includes('TTFT') ? after.slice(0, after.indexOf('TTFT')) : null;
        }""",
        arg=[question, asked],
    )
    return " ".join(answered.json_value().split())


def test_save_restart_resume_and_load_answer_as_before(browser, llava_lm, tmp_path):
    port, state, log = free_port(), tmp_path / "state", tmp_path / "app.log"
    viewport = {"width": 1400, "height": 1100}
    viewer = browser.new_context(viewport=viewport, accept_downloads=True)  # one browser profile throughout
    with app_process(port, state, log) as url:
        page, errors = open_in(viewer, url)
        page.wait_for_function("() => window.localStorage.getItem('hermes-viewer') !== null")
        assert not page.is_visible("#resume-memory")
        page.get_by_label("max", exact=True).check()
        page.click("#start-sample")
        # The whole clip went in, and the end of the file left a checkpoint whose size the status shows.
        page.wait_for_function(
            "() => { const s = document.querySelector('#status').innerText;"
            " return s.includes('Finished') && /checkpoint [0-9.]+ MiB/.test(s) && !s.includes('queued'); }"
        )
        before = answer_to(page)
        assert before
        page.click("#save-memory")
        with page.expect_download() as download:
            page.click("#memory-download a")
        saved = tmp_path / "saved.hmem"
        download.value.save_as(saved)
        assert read_session(saved).header["session"]["frames_seen"] == 14
        assert errors == [], f"browser console errors: {errors}"

    with app_process(port, state, log) as url:  # a restart: the same address, a new process
        page, errors = open_in(viewer, url)
        page.wait_for_selector("#resume-memory", state="visible")
        offer = page.inner_text("#memory-note")
        assert re.search(r"checkpoint of your last stream is here: .*14 frames.* MiB.*state folder", offer), offer
        page.click("#resume-memory")
        page.get_by_text("Resumed your last stream").first.wait_for()
        page.wait_for_function("() => /14 seen by the model/.test(document.querySelector('#status').innerText)")
        assert answer_to(page) == before
        assert errors == [], f"browser console errors: {errors}"

        # Another browser has a key of its own: no checkpoint offered; it can load the download.
        stranger = browser.new_context(viewport=viewport)
        other, errors = open_in(stranger, url)
        other.wait_for_function("() => window.localStorage.getItem('hermes-viewer') !== null")
        assert not other.is_visible("#resume-memory")
        notes = tmp_path / "notes.txt"
        notes.write_text("not a memory\n" * 10)
        other.set_input_files("#load-memory input[type=file]", str(notes))
        other.wait_for_function(
            "() => document.querySelector('#memory-note').innerText.includes('notes.txt is not a HERMES memory file')"
        )
        other.set_input_files("#load-memory input[type=file]", str(saved))
        other.get_by_text("Memory loaded from saved.hmem").first.wait_for()
        assert answer_to(other) == before
        page.screenshot(path=str(tmp_path / "hermes_resumed.png"), full_page=True)
        stranger.close()
    viewer.close()
