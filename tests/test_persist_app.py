"""Memory files in the app, headless (no Gradio): a live stream's memory saved and loaded, bad files
refused with the running stream untouched, checkpoints every N chunks and at the end, the state
folder bounded by age and size, and viewers' keys kept apart."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from hermes.engine.methods import PolicySpec
from hermes.engine.persist import MemoryFileError, read_session, save_session
from hermes.engine.session import QuestionError, StreamingSession
from hermes.runtime.settings import StreamSettings
from hermes.serving.checkpoints import SUFFIX, Checkpointer, CheckpointStore, Viewers, new_viewer_key, valid_key
from hermes.serving.live import LiveStream
from tests.helpers import SMALL, assert_same_memory, memory_state, random_chunk, streamed, wait_for

QUESTION = "What did you see at the start?"
PER_FRAME = StreamSettings(budget=400, chunk_frames=1, fps=0.5)  # the short clip in 4 chunks


def answer(stream: LiveStream, question: str = QUESTION) -> tuple[str, list]:
    """The finished answer's text and first-token log-probabilities."""
    events = list(stream.ask(question, max_new_tokens=8).events())
    assert all(e.error is None for e in events), [e.error for e in events]
    last = events[-1].update
    return last.text, last.top_logprobs


@pytest.fixture
def streams(worker, llava_lm):
    made: list[LiveStream] = []

    def make(key: str, settings: StreamSettings = SMALL) -> LiveStream:
        made.append(LiveStream(worker, llava_lm, settings, key=key))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_saved_memory_loads_into_another_stream_and_answers_the_same(streams, clips, tmp_path):
    first = streamed(streams("a"), clips["short"])
    with pytest.raises(QuestionError, match="No video in memory yet"):
        streams("empty").files.save(tmp_path / "nothing.hmem")
    path = first.files.download(tmp_path / "downloads")
    assert path.name == "hermes-memory-hermes-4frames.hmem" and path.stat().st_size > 0
    before = answer(first)

    other = streams("b", StreamSettings(policy="fifo", budget=200, compare=True))
    summary = other.files.load(path)
    assert "policy hermes at budget 400: 4 frames" in summary
    assert wait_for(lambda: other.view().frames_seen == 4)
    view = other.view()
    assert [str(p) for p in view.settings.policies] == ["hermes"] and view.settings.budget == 400
    assert view.frames_in_memory[PolicySpec("hermes")] > 0 and len(view.frame_tokens) == 4
    assert answer(other) == before


def test_a_stream_guided_without_the_conversation_is_saved_and_loaded_so(streams, clips, tmp_path):
    """The Settings' "guide by the last question" off: HERMES's guidance prompt never carries the
    conversation, and a memory saved so goes on so, and says so in the loaded stream's settings."""
    quiet = streamed(
        streams("quiet", StreamSettings(budget=400, chunk_frames=2, fps=0.5, guidance_history=False)), clips["short"]
    )
    [session] = quiet._memories.sessions.values()
    assert session.policy.history_tokens == 0 and session.config.history_tokens == 0
    path = quiet.files.download(tmp_path / "downloads")

    other = streams("other")
    assert other.view().settings.guidance_history
    other.files.load(path)
    assert wait_for(lambda: other.view().frames_seen == 4)
    [loaded] = other._memories.sessions.values()
    assert not other.view().settings.guidance_history and loaded.policy.history_tokens == 0


class HalfwayStore(CheckpointStore):
    """A real store that keeps a copy of the checkpoint written after `at` chunks."""

    def __init__(self, folder, at: int) -> None:
        super().__init__(folder, every_chunks=at)
        self.at = at
        self.halfway = Path(folder) / "halfway.hmem"

    def save(self, session, key):
        size = super().save(session, key)
        if session.chunks_seen == self.at and not self.halfway.exists():
            shutil.copy(self.path(key), self.halfway)
        return size


def test_a_loaded_memory_goes_on_with_its_video_as_if_it_never_stopped(streams, clips, tmp_path):
    store = HalfwayStore(tmp_path / "state", at=2)
    whole = streams("whole", PER_FRAME)
    whole.files.keep(Checkpointer(store, new_viewer_key()))
    streamed(whole, clips["short"])  # 4 chunks of one frame; a copy of the memory after 2
    expected, memory = answer(whole), memory_state(whole._memories.main().memory)

    resumed = streams("resumed", StreamSettings(budget=200))
    with pytest.raises(RuntimeError, match="no memory loaded from a file"):
        resumed.files.go_on(clips["short"])
    resumed.files.load(store.halfway)
    assert resumed.files.resumable == pytest.approx(3.0)  # frames at 0 and 2 s seen; the next is at 4 s
    resumed.files.go_on(clips["short"], "max")
    assert resumed.files.resumable is None  # a source came after the load: the next Start begins afresh
    assert wait_for(lambda: resumed.status().state == "finished" and not resumed.status().queued_chunks)
    assert resumed.worker.wait_idle(resumed.key)
    assert resumed.view().frames_seen == 4 and resumed.view().chunks == 2
    assert_same_memory(memory, resumed._memories.main().memory, storage=False)
    assert answer(resumed) == expected


def test_a_loaded_memory_goes_on_with_a_network_stream_or_the_webcam(streams, clips, tmp_path):
    """What a moved stream of a cluster does: a network stream reconnected into its loaded memory, or
    the webcam's next frames, go on from where the memory stopped (its stream time and frame numbers)."""
    from hermes.video.urls import UrlPolicy
    from tests.network_servers import mjpeg_camera

    saved = tmp_path / "memory.hmem"
    first = streamed(streams("first", PER_FRAME), clips["short"])
    first.files.save(saved)
    seen = first.view().frames_seen

    def went_on(stream: LiveStream, at: float) -> None:
        assert wait_for(lambda: stream.view().frames_seen >= seen + 2, 60)
        stream.stop()
        assert stream.worker.wait_idle(stream.key, 60)
        assert stream.view().stream_time_s > at
        frames = stream._memories.main().memory.kv_layers[0].frames
        assert int(frames.max()) >= seen + 1  # numbered on after the memory's frames, not from 0 again

    net = streams("net", PER_FRAME)
    net.files.load(saved)
    at = net.files.resumable
    with mjpeg_camera() as url:
        assert net.files.go_on_url(url, UrlPolicy.parse("127.0.0.1")).startswith("http://127.0.0.1")
        assert net.files.resumable is None
        went_on(net, at)

    cam = streams("cam", PER_FRAME)
    cam.files.load(saved)
    at = cam.files.resumable
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    for i in range(4):
        cam.push_frame(image, t=2.0 * i)  # 0.5 fps: every frame taken, one a chunk
    went_on(cam, at)
    assert cam.view().stream_time_s >= at + 2.0


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, llava_lm, qwen_lm):
    """Files the app must refuse: not a memory, truncated, another model's, a policy unknown here."""
    root = tmp_path_factory.mktemp("bad")
    session = StreamingSession(llava_lm, SMALL.config())
    session.ingest(random_chunk(0))
    good = root / "good.hmem"
    save_session(session, good)
    (root / "notes.txt").write_text("not a memory at all\n" * 20)
    data = good.read_bytes()
    (root / "cut.hmem").write_bytes(data[: len(data) // 2])
    theirs = StreamingSession(qwen_lm, SMALL.config())
    theirs.ingest(random_chunk(0, size=224))
    save_session(theirs, root / "qwen.hmem")
    # The same memory, its policy renamed in the header (the checksum covers the tensors only).
    header = json.loads(_metadata(good))
    header["session"]["policy"]["name"] = "no-such-policy"
    save_file(load_file(good), root / "policy.hmem", metadata={"hermes-memory": json.dumps(header)})
    return {
        "notes.txt": "is not a HERMES memory file",
        "cut.hmem": "is truncated",
        "qwen.hmem": "this memory belongs to",
        "policy.hmem": "no-such-policy",
    }, root


def _metadata(path) -> str:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()["hermes-memory"]


def test_bad_files_get_one_clear_error_and_the_running_stream_is_untouched(streams, clips, bad_files):
    reasons, root = bad_files
    stream = streamed(streams("a"), clips["short"])
    before, view, memory = answer(stream), stream.view(), stream._memories.main().memory
    for name, reason in reasons.items():
        with pytest.raises(MemoryFileError, match=reason):
            stream.files.load(root / name)
    assert stream.view().frames_seen == view.frames_seen and stream.view().settings == view.settings
    assert stream._memories.main().memory is memory and stream.status().state == "finished"
    assert answer(stream) == before


class CountingStore(CheckpointStore):
    """A real store that records the chunks its sessions had seen at each save."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.saved_at: list[int] = []

    def save(self, session, key):
        self.saved_at.append(session.chunks_seen)
        return super().save(session, key)


def test_a_stream_is_checkpointed_every_n_chunks_and_when_its_source_ends(streams, clips, tmp_path):
    store = CountingStore(tmp_path / "state", every_chunks=3)
    key = new_viewer_key()
    stream = streams("a", PER_FRAME)
    stream.files.keep(Checkpointer(store, key))
    assert stream.files.checkpoint_line().startswith("checkpoint none yet (every 3 chunks)")
    streamed(stream, clips["short"])
    assert wait_for(lambda: store.saved_at == [3, 4])
    assert read_session(store.path(key)).header["session"]["chunks_seen"] == 4
    line = stream.files.checkpoint_line()
    assert line.startswith(f"checkpoint {store.path(key).stat().st_size / 2**20:,.2f} MiB")
    info = store.find(key)
    assert info.size_bytes == store.path(key).stat().st_size and "4 frames" in info.summary
    assert info.folder_bytes == info.size_bytes and "state folder" in info.describe()

    stream.stop()  # the viewer's Stop saves too (here nothing new since the end)
    assert stream.worker.wait_idle(stream.key) and store.saved_at == [3, 4, 4]
    stream.close()  # the tab closed: its memory is checkpointed once more before it is freed
    assert wait_for(lambda: store.saved_at == [3, 4, 4, 4]), store.saved_at


def test_a_checkpoint_that_cannot_be_written_leaves_the_stream_going(llava_lm, tmp_path):
    store = CheckpointStore(tmp_path / "state", every_chunks=1)
    keeper = Checkpointer(store, new_viewer_key())
    session = StreamingSession(llava_lm, SMALL.config())
    session.ingest(random_chunk(0))
    (tmp_path / "state").rmdir()  # the disk went away
    keeper.after_chunk(session)
    assert keeper.saved_bytes is None and keeper.error.startswith("the checkpoint could not be written")


def test_viewers_resume_their_own_checkpoint_and_no_other(streams, clips, tmp_path):
    store = CheckpointStore(tmp_path / "state", every_chunks=100)
    viewers = Viewers(store)
    key, found = viewers.hello("page-1", None)
    assert valid_key(key) and found is None
    first = streams("a")
    viewers.attach("page-1", first.files)
    streamed(first, clips["short"])
    before = answer(first)
    assert wait_for(lambda: store.path(key).exists())

    # The file is named by a hash of the key, never the key itself.
    assert store.path(key).name == hashlib.sha256(key.encode()).hexdigest() + SUFFIX
    assert key not in "".join(os.listdir(store.folder))
    # The same browser after a restart (a new page session, the key from its storage) gets it back.
    again, found = Viewers(store).hello("page-2", key)
    assert again == key and found is not None and "4 frames" in found.summary
    # Another viewer, or a forged key, is offered nothing and resumes nothing.
    stranger, nothing = viewers.hello("page-3", "../" + key)
    assert stranger != key and nothing is None
    for forged in (key[:-1], key.upper(), "", None, "a" * 43):
        assert store.find(forged) is None
    with pytest.raises(MemoryFileError, match="no checkpoint to resume"):
        viewers.resume("page-3", streams("c").files)

    later = Viewers(store)
    later.hello("page-2", key)
    resumed = streams("b")
    assert "4 frames" in later.resume("page-2", resumed.files)
    assert answer(resumed) == before
    later.attach("page-2", resumed.files)  # its checkpoint's size shows before its next save
    size = store.path(key).stat().st_size / 2**20
    assert resumed.files.checkpoint_line().startswith(f"checkpoint {size:,.2f} MiB (every 100 chunks)")


def test_the_state_folder_is_bounded_by_age_and_size(llava_lm, tmp_path):
    session = StreamingSession(llava_lm, SMALL.config())
    session.ingest(random_chunk(0))
    keys = [new_viewer_key() for _ in range(4)]
    store = CheckpointStore(tmp_path / "state", max_age_s=3600)
    for key in keys:
        store.save(session, key)
    size = store.path(keys[0]).stat().st_size
    now = time.time()
    for age, key in zip((7200, 300, 200, 100), keys, strict=True):  # the first is over an hour old
        os.utime(store.path(key), (now - age, now - age))
    stale = store.folder / ".left.1234.tmp"  # a killed writer's temporary file, a day old
    stale.write_bytes(b"x" * 10)
    os.utime(stale, (now - 86400, now - 86400))
    writing = store.folder / ".under-way.5678.tmp"  # a write under way
    writing.write_bytes(b"x" * 10)

    assert store.find(keys[0]) is None  # expired: removed, not offered
    assert not store.path(keys[0]).exists() and not stale.exists() and writing.exists()
    assert store.folder_bytes() == 3 * size + 10

    # Past the cap the oldest go first, never the one just written nor a write under way.
    capped = CheckpointStore(store.folder, max_age_s=3600, max_bytes=2 * size + 10)
    assert capped.prune(keep=store.path(keys[1])) == [store.path(keys[2])]
    assert store.path(keys[1]).exists() and store.path(keys[3]).exists() and writing.exists()
    capped.save(session, keys[0])  # a new checkpoint pushes out the oldest one
    assert sorted(p.name for p in store.folder.glob(f"*{SUFFIX}")) == sorted(
        store.path(k).name for k in (keys[0], keys[3])
    )


def test_bad_state_folders_and_settings_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot make the state folder"):
        CheckpointStore(tmp_path / "file" / "state")
    with pytest.raises(ValueError, match="every_chunks >= 1"):
        CheckpointStore(tmp_path / "state", every_chunks=0)
    store = CheckpointStore(tmp_path / "state")
    with pytest.raises(ValueError, match="not a viewer key"):
        store.path("short")
    assert store.browser_secret() == CheckpointStore(tmp_path / "state").browser_secret()


def test_the_api_saves_a_memory_and_another_client_loads_it(llava_lm, tmp_path):
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client, handle_file

    from tests.test_app import serve, text_of

    url, demo, registry = serve(llava_lm)
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    try:
        a.predict("Cockatoo, close-up (14 s)", "max", api_name="/start_sample")
        assert wait_for(lambda: a.predict(api_name="/metrics")["frames_seen"] == 7)  # 14 s at 0.5 fps
        assert registry.worker.wait_idle()
        expected = text_of(a.predict(QUESTION, api_name="/ask")[0][-1]).split("TTFT")[0]
        saved = a.predict(api_name="/save_memory")
        assert read_session(saved).header["session"]["frames_seen"] == 7

        (tmp_path / "notes.txt").write_text("not a memory\n")
        *_, note, _ = b.predict(handle_file(str(tmp_path / "notes.txt")), api_name="/load_memory")
        assert note == "⚠️ notes.txt is not a HERMES memory file (it is not a safetensors file at all)"
        status, chat, note, _ = b.predict(handle_file(saved), api_name="/load_memory")
        assert "7 seen by the model" in status and "policy hermes at budget 400: 7 frames" in note
        assert "goes on where it stopped" in text_of(chat[-1])
        assert text_of(b.predict(QUESTION, api_name="/ask")[0][-1]).split("TTFT")[0] == expected
    finally:
        a.close()
        b.close()
        demo.close()
        registry.shutdown()


def test_a_memory_saved_with_policy_parameters_keeps_them_across_reset(llava_lm, clips, tmp_path):
    """A memory written by `hermes stream --param rekv.top_k=3` loads with its parameters; the page's
    Settings show them, so a Reset through the API (with what the page holds) keeps them, as does
    a Reset of the stream itself."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client, handle_file

    from hermes.cli.main import main
    from tests.test_app import serve

    saved = tmp_path / "rekv.hmem"
    cli = ["stream", str(clips["short"]), "--model", "tiny", "--dtype", "fp32", "--policy", "rekv"]
    cli += ["--param", "rekv.top_k=3", "--budget", "400", "--chunk-frames", "2", "--fps", "0.5"]
    assert main([*cli, "--save-memory", str(saved)]) == 0
    assert PolicySpec("hermes", history_tokens=0) != PolicySpec("hermes")
    assert PolicySpec("rekv", top_k="3") == PolicySpec("rekv", {"rekv.top_k": 3}) != PolicySpec("rekv")

    url, demo, registry = serve(llava_lm)
    client = Client(url, verbose=False)
    try:
        client.predict(handle_file(str(saved)), api_name="/load_memory")
        shown = client.predict(api_name="/stream_settings")
        assert shown[0] == "rekv" and shown[-1] == "rekv.top_k=3"
        before = client.predict(api_name="/metrics")["settings"]
        client.predict(*shown, api_name="/reset")
        after = client.predict(api_name="/metrics")["settings"]
        assert (
            (after["policy"], after["params"], after["budget"])
            == ("rekv", ["rekv.top_k=3"], 400)
            == (
                before["policy"],
                before["params"],
                before["budget"],
            )
        )
        (stream,) = registry._streams.values()  # the one viewer's
        stream.reset()
        assert stream.settings.policy == PolicySpec("rekv", top_k=3) and stream.settings.params == ("rekv.top_k=3",)
    finally:
        client.close()
        demo.close()
        registry.shutdown()
