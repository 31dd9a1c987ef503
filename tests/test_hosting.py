"""Safe to host (issue 40): what a hostile file, client or model answer can no longer do.

Frames grown past the limit after a small first one (two MPEG-TS files put end to end), or in a
video stream after the first, are refused before decord opens the file and without the memory
they take; a question past its viewer's questions in flight is refused before it waits for one of
the answer slots; the chat renders no image from a URL; a bare REST start may leave the settings
out; and the secret that Gradio's BrowserState sends every visitor names no checkpoint. No
assertion here is on wall-clock time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import ValidationError

from hermes.engine.methods import parse_policy
from hermes.engine.session import AnswerUpdate
from hermes.serving import Alert, AnswerEvent, CheckpointStore, StreamRegistry, Viewers, WatchCheck
from hermes.serving.checkpoints import new_viewer_key
from hermes.video import reader as reader_module
from hermes.video.clips import ffmpeg_path, make_clip
from hermes.video.decoding import VideoError, VideoFile
from hermes.video.sizes import TooLarge, decode_within
from tests.helpers import SMALL, hold_answers, wait_for
from tests.test_app import free_port, serve, text_of
from ui import build_app, launch_options
from ui.callbacks import alert_message, answer_message

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 100_000  # pixels: a 64 x 48 frame is within it, a 640 x 480 one is not
SMALL_FRAMES, LARGE_FRAMES = 20, 5
GROWN = (
    "frames of 640x480 (0.3 megapixels) later in the video are larger than this reader decodes "
    "(at most 0.1 megapixels); scale the video down first"
)
REMOTE = "http://127.0.0.1:9/x.png"


def end_to_end(path: Path, *parts: Path) -> Path:
    """`cat parts > path`: MPEG-TS files put end to end are one stream whose frames change size."""
    path.write_bytes(b"".join(p.read_bytes() for p in parts))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hosting")
    small = make_clip(root / "small.ts", SMALL_FRAMES / 10, fps=10, size=(64, 48))
    large = make_clip(root / "large.ts", LARGE_FRAMES / 10, fps=10, size=(640, 480))
    two = root / "two_streams.mkv"  # a small video stream first, a large one second
    cmd = [ffmpeg_path(), "-v", "error", "-y", "-i", str(small), "-i", str(large), "-map", "0:v", "-map", "1:v"]
    subprocess.run([*cmd, "-c", "copy", str(two)], check=True, timeout=60)
    return {
        "small": small,
        "grown": end_to_end(root / "grown.ts", small, large),
        "two_streams": two,
        "long": make_clip(root / "long.mp4", 120.0, fps=1, size=(64, 64)),
    }


# -- frame sizes ---------------------------------------------------------------------------------


def test_frames_grown_past_the_limit_later_in_a_file_are_refused_before_decord_opens_it(files, monkeypatch):
    opened = []
    real = reader_module.FrameReader._open
    monkeypatch.setattr(reader_module.FrameReader, "_open", lambda self: opened.append(self.path) or real(self))
    with pytest.raises(VideoError) as refused:
        VideoFile(files["grown"], max_pixels=LIMIT)
    assert str(refused.value) == f"Cannot read video 'grown.ts': {GROWN}"
    assert opened == []  # refused before decord saw the file
    # Its header alone is within the limit: only the key frames further on say otherwise.
    with VideoFile(files["small"], max_pixels=LIMIT) as video:
        assert video.info.frame_size == (64, 48)


def test_a_file_whose_frames_grow_within_the_limit_streams(files):
    with VideoFile(files["grown"]) as video:
        frames = list(video.frames(None))
    assert len(frames) == SMALL_FRAMES + LARGE_FRAMES
    assert {f.image.shape for f in frames} == {(48, 64, 3)}  # every frame at the first one's size


def test_every_video_stream_of_a_file_is_held_to_the_limit(files):
    with pytest.raises(VideoError, match=r"'two_streams\.mkv': its frames are 640x480 \(0\.3 megapixels\), larger"):
        VideoFile(files["two_streams"], max_pixels=LIMIT)


def test_a_pyav_decoder_is_held_to_the_limit_frame_by_frame(files):
    """`decode_within`, what a network stream decodes through: the small frames, then TooLarge."""
    sizes = []
    with av.open(str(files["grown"])) as container, pytest.raises(TooLarge, match=re.escape(GROWN)):
        for frame in decode_within(container, container.streams.video[0], max_pixels=LIMIT):
            sizes.append((frame.width, frame.height))
    assert len(sizes) >= SMALL_FRAMES // 2 and set(sizes) == {(64, 48)}


def test_a_network_stream_whose_frames_grow_past_the_limit_fails_in_one_line_and_is_not_reopened(files):
    """The network reader decodes through `decode_within` too: past the limit the stream fails with
    the reason, once, instead of dropping and reconnecting to decode the same frames again."""
    from hermes.video.network import Link, NetworkReader
    from tests.network_servers import http_folder

    with http_folder(files["grown"].parent) as base:
        reader = NetworkReader(f"{base}/grown.ts", 10.0, max_pixels=LIMIT, backoff_s=(0.1,))
        reader.start()
        try:
            reader.wait_open()  # the small frames come first
            deadline = time.monotonic() + 20
            while reader.link is not Link.FAILED and time.monotonic() < deadline:
                time.sleep(0.05)
            assert reader.link is Link.FAILED and reader.reconnects == 0
            assert GROWN in str(reader.failure) and "\n" not in str(reader.failure)
        finally:
            reader.stop()


# A child process, so that its peak memory is the start's alone.
PEAK_CHILD = """
import json, resource, sys
from hermes.video.decoding import VideoError, check_start
import av, decord  # loaded before the baseline: their libraries are most of a process's memory

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

base = peak_mb()
try:
    check_start(sys.argv[1], 1.0)
    refused = None
except VideoError as exc:
    refused = str(exc)
print(json.dumps({"refused": refused, "grown_mb": peak_mb() - base}))
"""


def test_small_frames_then_8000x8000_ones_are_refused_at_start_without_the_memory_they_take(tmp_path, files):
    """The attack as it was found: `cat small.ts big.ts`, where three 8000 x 8000 frames took 1.1 GB."""
    big = make_clip(tmp_path / "big.ts", 0.2, fps=10, size=(8000, 8000))
    grown = end_to_end(tmp_path / "attack.ts", files["small"], big)
    child = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(grown)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["refused"] == (
        "Cannot read video 'attack.ts': frames of 8000x8000 (64.0 megapixels) later in the video are larger "
        "than this reader decodes (at most 33.2 megapixels); scale the video down first"
    )
    # Decoding them took 450 MB here (96 MB of pixels each, and the decoder's own copies); refusing
    # them takes the decoder's tables for that size, about 25 MB.
    assert result["grown_mb"] < 150, result


# -- the app -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(llava_lm):
    url, demo, registry = serve(llava_lm, SMALL)
    yield url, demo, registry
    demo.close()
    registry.shutdown()


def test_questions_past_the_in_flight_limit_are_refused_before_they_take_an_answer_slot(app, files):
    url, _, registry = app
    client = Client(url, verbose=False)
    try:
        client.predict(handle_file(str(files["long"])), "1x", api_name="/start_file")
        assert wait_for(lambda: client.predict(api_name="/metrics")["chunks"] >= 1, 60)
        stream = registry.get(client.session_hash, create=False)
        with hold_answers(stream._memories.sessions[parse_policy("hermes")]) as (first, gate):
            jobs = [client.submit(f"Question {i}?", api_name="/ask") for i in range(8)]
            # The answers are held after their first token; the refusals come back meanwhile.
            assert first.wait(30)
            assert wait_for(lambda: sum(job.done() for job in jobs) == 6, 30)
            done = [job for job in jobs if job.done()]
            gate.set()
            answered = [job.result(timeout=60)[0] for job in jobs if job not in done]
        refused = [job.exception() for job in done]
    finally:
        client.close()
    # Refused as they arrived (HTTP 422 from the validator): none became an event, none held a slot.
    assert all(isinstance(e, ValidationError) for e in refused), refused
    assert all("Wait for your previous answer: at most 2 questions" in str(e) for e in refused)
    assert len(answered) == 2
    # The chat holds the two questions answered and nothing of the refused: no handler ran for them.
    chat = stream.chat.messages()
    assert sorted(m["role"] for m in chat) == ["assistant", "assistant", "user", "user"], chat
    assert sum("TTFT" in text_of(m) for m in chat) == 2 and not any("Wait for" in text_of(m) for m in chat)


def test_the_chat_renders_no_image_from_a_url():
    text = f"Look: ![cat]({REMOTE}) and <img src='{REMOTE}'> <video src={REMOTE}></video>; 2 < 3"
    update = AnswerUpdate(question="q", text=text, tokens=1)
    message = answer_message(AnswerEvent(parse_policy("hermes"), update), compare=False)["content"]
    assert "![" not in message and "<" not in message
    assert REMOTE in message and "2 &lt; 3" in message  # shown as text
    assert message.startswith("Look: !\\[cat](")


def test_an_alert_keeps_its_frame_and_shows_the_text_inert():
    check = WatchCheck(question=f"Is it ![x]({REMOTE})?", at_s=3.0, p_yes=0.9, fired=True, check_ms=1.0)
    answer = AnswerUpdate(question=check.question, text=f"yes <img src={REMOTE}>", done=True, frames_seen=4)
    alert = Alert(parse_policy("hermes"), check, answer, np.zeros((8, 8, 3), dtype=np.uint8))
    text, frame = alert_message(alert, compare=False)["content"]
    assert "![" not in text and "<img" not in text and REMOTE in text
    assert frame.value is not None  # the app's own image of the frame is still shown


def rest_call(url: str, api: str, data: list) -> tuple[str, str]:
    """A bare REST call (no session, no client): its last event and data."""
    with httpx.Client(base_url=url, timeout=60) as http:
        reply = http.post(f"/gradio_api/call/{api}", json={"data": data})
        assert reply.status_code == 200, reply.text
        event, last = reply.json()["event_id"], ("", "")
        with http.stream("GET", f"/gradio_api/call/{api}/{event}") as events:
            for line in events.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind in ("complete", "error"):
                    last = (kind, line.split(":", 1)[1].strip())
        return last


def test_a_bare_rest_start_may_leave_out_the_settings(app, files):
    url = app[0]
    with httpx.Client(base_url=url, timeout=60) as http, files["long"].open("rb") as f:
        path = http.post("/gradio_api/upload", files={"files": ("long.mp4", f, "video/mp4")}).json()[0]
    video = {"path": path, "meta": {"_type": "gradio.FileData"}}
    kind, data = rest_call(url, "start_file", [video, "1x"])  # 2 of its 11 inputs
    assert kind == "complete" and "Streaming" in json.loads(data)[0], data
    kind, data = rest_call(url, "start_file", [])  # nothing: the video is what it cannot do without
    assert kind == "error" and "Upload a video file first" in data, data


def test_the_browser_secret_in_the_page_config_names_no_checkpoint(llava_lm, tmp_path):
    """Gradio's BrowserState encrypts in the browser, so its secret is in every visitor's /config:
    it protects nothing, and nothing depends on it. A checkpoint is named by a hash of its
    viewer's random key, which only that browser holds."""
    store = CheckpointStore(tmp_path / "state")
    key = new_viewer_key()
    store.path(key).write_bytes(b"a checkpoint")
    registry = StreamRegistry(llava_lm, settings=SMALL)
    demo = build_app(llava_lm, registry=registry, checkpoints=store)
    options = {"server_name": "127.0.0.1", "server_port": free_port(), "prevent_thread_lock": True, "quiet": True}
    demo.launch(**options, **launch_options())
    try:
        config = httpx.get(demo.local_url + "config", timeout=30).json()
    finally:
        demo.close()
        registry.shutdown()
    secrets = [c["props"]["secret"] for c in config["components"] if "secret" in c.get("props", {})]
    assert secrets == [store.browser_secret()]  # sent to every visitor, as Gradio's design has it
    viewers = Viewers(store)
    assert viewers.hello("visitor", secrets[0])[1] is None  # the secret finds nothing
    assert viewers.hello("owner", key)[1] is not None  # the key does
    assert all(secrets[0] not in p.name and key not in p.name for p in store.folder.iterdir())
