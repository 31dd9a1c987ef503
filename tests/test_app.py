"""The Gradio app end to end through `gradio_client`, its figures, and app.py's model fallback."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no network calls from tests
# Closed sessions are noticed at the next heartbeat (15 s by default): make that quick.
os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "0.5")

from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from hermes.engine.methods import parse_policy
from hermes.serving import (
    ChunkRecord,
    FrameTokens,
    LayerSnapshot,
    LiveView,
    MemorySnapshot,
    StreamRegistry,
    StreamSettings,
    Tier,
)
from tests.helpers import SMALL, chunk_report, wait_for
from ui import build_app, figures, launch_options
from ui.layout import MAX_UPLOAD

SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "cockatoo.mp4"
HERMES, FIFO = parse_policy("hermes"), parse_policy("fifo")  # views key their policies by the parsed name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(lm, settings: StreamSettings = SMALL, max_file_size: str = MAX_UPLOAD, **registry_options):
    """Launch the app on a free port; returns (url, demo, registry)."""
    registry = StreamRegistry(lm, settings=settings, **registry_options)
    demo = build_app(lm, registry=registry)
    demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        show_error=True,
        quiet=True,
        **launch_options(max_file_size),
    )
    return demo.local_url, demo, registry


@pytest.fixture(scope="module")
def app(llava_lm):
    url, demo, registry = serve(llava_lm)
    yield url, registry
    demo.close()
    registry.shutdown()


def text_of(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def test_upload_stream_ask_and_read_metrics(app):
    url, _ = app
    client = Client(url, verbose=False)
    try:
        status, chat = client.predict(handle_file(str(SAMPLE)), "max", api_name="/start_file")
        assert "cockatoo.mp4" in status and chat == []
        metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["chunks"] >= 2 and m)
        assert metrics["frames_seen"] >= 4 and metrics["cache_bytes"]["hermes"] > 0 and metrics["random_weights"]

        job = client.submit("What bird is this?", api_name="/ask")
        outputs = [chat for chat, _ in job]
        final = job.outputs()[-1][0]
        assert len(outputs) >= 3, "the answer streams token by token"
        assert [m["role"] for m in final] == ["user", "assistant"]
        assert "TTFT" in text_of(final[-1]) and "frames in memory" in text_of(final[-1])

        answers = client.predict(api_name="/metrics")["answers"]
        assert len(answers) == 1 and answers[0]["ttft_ms"] > 0 and answers[0]["wait_ms"] >= 0
        # A second turn works too.
        final = client.predict("And now?", api_name="/ask")[0]
        assert len(final) == 4 and "TTFT" in text_of(final[-1])
    finally:
        client.close()


def test_a_zip_of_frames_uploads_streams_and_answers(app, tmp_path):
    import zipfile

    from tests.eval_helpers import frames_folder

    url, _ = app
    folder = frames_folder(tmp_path / "clip", 6)
    archive = tmp_path / "frames.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for image in sorted(folder.iterdir()):
            zf.write(image, f"clip/{image.name}")
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 not a zip")
    client = Client(url, verbose=False)
    try:
        with pytest.raises(AppError, match="not a readable zip"):
            client.predict(handle_file(str(tmp_path / "broken.zip")), "max", api_name="/start_file")
        status, _ = client.predict(handle_file(str(archive)), "max", api_name="/start_file")
        assert "frames-frames" in status
        assert wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] == 6)  # one image a frame at 0.5 fps
        final = client.predict("What is in the video?", api_name="/ask")[0]
        assert [m["role"] for m in final] == ["user", "assistant"] and "TTFT" in text_of(final[-1])
    finally:
        client.close()


def test_sessions_are_isolated_and_freed_when_closed(app):
    url, registry = app
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    try:
        a.predict("Cockatoo, close-up (14 s)", "max", api_name="/start_sample")
        wait_for(lambda: a.predict(api_name="/metrics")["frames_seen"] > 0)
        a.predict("What is it?", api_name="/ask")

        chat = b.predict("What is it?", api_name="/ask")[0]
        assert "No video yet" in text_of(chat[-1])  # b sees neither a's video nor a's chat
        metrics_b = b.predict(api_name="/metrics")
        assert metrics_b["frames_seen"] == 0 and metrics_b["answers"] == []
        assert a.predict(api_name="/metrics")["answers"]

        before = len(registry)
        a.close()  # the heartbeat ends, as when a tab closes: its stream is freed
        assert wait_for(lambda: len(registry) == before - 1, 15)
    finally:
        b.close()


def test_bad_inputs_get_clear_messages(app, tmp_path):
    url, _ = app
    client = Client(url, verbose=False)
    try:
        empty = tmp_path / "empty.mp4"
        empty.write_bytes(b"")
        with pytest.raises(AppError, match=r"empty\.mp4"):
            client.predict(handle_file(str(empty)), "max", api_name="/start_file")
        chat = client.predict("x" * 20_000, api_name="/ask")[0]
        assert "limit" in text_of(chat[-1]) and "20,000" in text_of(chat[-1])
        with pytest.raises(AppError, match="budget takes a number from 128 to 10240; got 0"):
            client.predict("hermes", 0, api_name="/reset")  # the slider's bounds, the setting named
        # The session still works after all that.
        client.predict("Cockatoo, close-up (14 s)", "max", api_name="/start_sample")
        assert wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] > 0)
    finally:
        client.close()


def test_standing_questions_through_the_api(app):
    url, _ = app
    client = Client(url, verbose=False)
    try:
        # Added before any video: they are the viewer's, asked of every memory once the stream runs.
        update, box = client.predict("Is there a bird?", api_name="/watch")
        assert box == "" and update["value"] == "Is there a bird?"
        update, _ = client.predict("Is it dark?", api_name="/watch")
        assert [value for _, value in update["choices"]] == ["Is there a bird?", "Is it dark?"]
        assert client.predict(api_name="/metrics")["watching"] == ["Is there a bird?", "Is it dark?"]
        client.predict("Cockatoo, close-up (14 s)", "2x", api_name="/start_sample")
        metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["chunks"] >= 1 and m)
        chunks = metrics["chunks"]
        client.predict(api_name="/pause")  # so that chunks come after the questions added below

        # Bad input: a clear message each time, and the stream goes on.
        for question, message in [
            ("   ", "empty"),
            ("x" * 1001, "1,001 characters long"),
            ("Is there a bird?", "Already watching"),
        ]:
            with pytest.raises(AppError, match=message):
                client.predict(question, api_name="/watch")
        client.predict("Is it flying?", api_name="/watch")
        client.predict("Is it eating?", api_name="/watch")
        with pytest.raises(AppError, match="At most 4 standing questions"):
            client.predict("Is it singing?", api_name="/watch")
        with pytest.raises(AppError, match="Not watching for 'Is it singing\\?'"):
            client.predict("Is it singing?", api_name="/unwatch")
        update = client.predict("Is it dark?", api_name="/unwatch")
        assert [v for _, v in update["choices"]] == ["Is there a bird?", "Is it flying?", "Is it eating?"]
        client.predict(api_name="/pause")  # resume
        metrics = wait_for(lambda: (m := client.predict(api_name="/metrics"))["state"] == "finished" and m, 120)
        assert metrics["chunks"] > chunks and metrics["error"] is None
        assert metrics["watching"] == ["Is there a bird?", "Is it flying?", "Is it eating?"]
        rows = {r["question"]: r for r in metrics["standing"]}
        assert set(rows) == set(metrics["watching"])
        assert rows["Is there a bird?"]["checks"] == metrics["chunks"]  # one check per chunk
        assert all(0.0 <= r["p_yes"] <= 1.0 and r["check_ms"] > 0 for r in rows.values())
        # Every firing wrote an alert (with the short answer) for the API and the chat.
        alerts = [a for a in metrics["alerts"] if a["question"] in rows]
        assert len(alerts) == sum(r["fired"] for r in rows.values())
        assert metrics["watch_threshold"] == 0.5
    finally:
        client.close()


# -- figures ---------------------------------------------------------------------------------


def snapshot(frames_per_layer: list[list[int]], budget: int = 4) -> MemorySnapshot:
    tiers = [Tier.SENSORY, Tier.WORKING, Tier.LONG_TERM]
    layers = []
    for tier, frames in zip(tiers, frames_per_layer, strict=True):
        f = np.asarray(frames)
        layers.append(
            LayerSnapshot(
                tier=tier,
                stream_ids=np.arange(len(f)),
                frames=f,
                positions=np.arange(len(f))[None],
                scores=np.zeros(len(f)),
                summary_count=0,
            )
        )
    cache_bytes = 8 * len(layers) * (2 + len(frames_per_layer[0]))  # 8 bytes a slot, 2 prefix slots
    return MemorySnapshot(
        prefix_len=2, budget=budget, tokens_seen=8, next_position=10, cache_bytes=cache_bytes, layers=layers
    )


def test_retained_shares_count_kept_tokens_per_frame():
    # 4 frames of 2 tokens; the shallow layer keeps the newest two frames, the deep one frame 0 and 3.
    snap = snapshot([[2, 2, 3, 3], [1, 2, 3, 3], [0, 0, 3, 3]])
    two_each = FrameTokens().extended(4, 2.0)
    shares, edges = figures.retained_shares(snap, two_each)
    assert edges.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(shares, [[0, 0, 1, 1], [0, 0.5, 0.5, 1], [1, 0, 0, 1]])
    shares, edges = figures.retained_shares(snap, two_each, max_columns=2)  # binned: 2 frames a column
    np.testing.assert_allclose(shares, [[0, 1], [0.25, 0.75], [0.5, 0.5]])


def test_figures_stay_small_on_long_streams():
    n = 5000  # frames seen
    frames = np.sort(np.random.default_rng(0).integers(0, n, 4096))
    snap = snapshot([frames, frames, frames], budget=4096)
    assert figures.binned_profile(np.ones(4096))[0].size <= figures.MAX_SLOT_POINTS
    assert figures.profile_layers(snap) == [0, 1, 2]
    attention = tuple((np.arange(len(f)), np.linspace(0, 1, len(f))) for f in (frames, frames, frames))
    assert figures.profile_layers(snap, (None, *attention[1:])) == [1, 2]  # sensory layers measure none
    view = LiveView(
        version=1,
        settings=SMALL,
        snapshots={HERMES: snap},
        frame_tokens=FrameTokens().extended(n, 196.0),
        frames_seen=n,
        attention={HERMES: attention},
    )
    fig = figures.retained_map_figure(view)
    assert len(fig.to_json()) < 40_000
    assert len(figures.attention_figure(view).to_json()) < 40_000


def test_a_hybrid_models_map_names_its_attention_layers_and_its_states():
    """Qwen3.5: the map's rows are the key-value layers, labelled with their decoder layer, and a
    note says how many other layers hold a fixed-size state."""
    snap = snapshot([[0, 1], [0, 1], [0, 1]])
    snap.layer_indices, snap.state_layers, snap.state_bytes = [3, 7, 11], 9, 3 * 2**20
    view = LiveView(
        version=1,
        settings=SMALL,
        snapshots={HERMES: snap},
        frame_tokens=FrameTokens().extended(2, 2.0),
        frames_seen=2,
    )
    fig = figures.retained_map_figure(view)
    assert list(fig.layout.yaxis.ticktext) == ["3", "7", "11"]
    (note,) = [a.text for a in fig.layout.annotations if "linear attention" in a.text]
    assert note.startswith("9 more layers") and "3.0 MiB" in note
    plain = figures.retained_map_figure(LiveView(**{**vars(view), "snapshots": {HERMES: snapshot([[0, 1]] * 3)}}))
    assert list(plain.layout.yaxis.ticktext) == ["0", "1", "2"]
    assert not [a for a in plain.layout.annotations if "linear attention" in (a.text or "")]


def test_the_budget_line_is_the_published_budget_bytes():
    snap = snapshot([[0, 1], [0, 1], [0, 1]])
    reports = {p: chunk_report(2, 4.0, cache_bytes=96) for p in (HERMES, FIFO)}
    record = ChunkRecord(1.0, reports, rss_bytes=2**20, gpu_allocated_bytes=None)
    view = LiveView(
        version=1,
        settings=SMALL,
        snapshots={HERMES: snap, FIFO: snap},
        history=(record,),
        budget_bytes={HERMES: 5 * figures.MB, FIFO: 4 * figures.MB},
    )
    lines = [shape.y0 for shape in figures.performance_figure(view, gpu=False).layout.shapes]
    assert lines == [5.0]  # one line for both: the larger cache (hermes keeps a summary slot more)


# -- app.py ----------------------------------------------------------------------------------


def test_app_falls_back_to_a_toy_model_then_to_random_weights_with_a_banner(monkeypatch):
    import app as app_module
    from hermes.models import loading
    from hermes.serving import load_model_or_fallback
    from ui import model_banner

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm, error = load_model_or_fallback("nobody/no-such-video-model", device="cpu")
    assert lm.source == "toy2" and not lm.random_weights and "no-such-video-model" in error
    banner = model_banner(lm, error)
    assert "trained here on synthetic clips" in banner and "answers are noise" not in banner
    assert lm.card.stream["budget"] == 260  # the stream it was trained for: the app's defaults
    # Without world v2's model, the easy world's.
    monkeypatch.setitem(loading.TRAINED_ALIASES, "toy2", loading.TOY2_MODEL_DIR.parent / "missing")
    lm, error = load_model_or_fallback("nobody/no-such-video-model", device="cpu")
    assert lm.source == "toy" and not lm.random_weights and lm.card.stream["budget"] == 34
    # Without either, a random-weight stand-in of the CPU default's architecture (Qwen3.5, 24 layers).
    monkeypatch.setitem(loading.TRAINED_ALIASES, "toy", loading.TOY_MODEL_DIR.parent / "missing")
    lm, error = load_model_or_fallback("nobody/no-such-video-model", device="cpu")
    assert lm.random_weights and lm.num_layers == 24 and "no-such-video-model" in error
    banner = model_banner(lm, error)
    assert "answers are noise" in banner and "memory dynamics are real" in banner and "tiny-qwen35-24" in banner
    args = app_module.parse_args([])
    assert (args.model, args.host, args.port, args.share, args.max_sessions) == (None, None, None, False, 4)
    assert args.memory_cap_mb is None  # then $HERMES_MEMORY_CAP_MB, else the device's default
    assert app_module.parse_args(["--memory-cap-mb", "512"]).memory_cap_mb == 512
