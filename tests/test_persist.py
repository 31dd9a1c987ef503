"""The memory file: save a stream, load it in a fresh process, go on as if it had never stopped;
refuse files for another model, policy or dtype, damaged, truncated or foreign files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hermes.engine.persist import load_session, read_session, save_session
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.memory.persist import MemoryFileError, load_cache, read_memory, save_cache
from tests.helpers import assert_same_memory, memory_state
from tests.persist_child import FRAMES, QUESTION, chunk, go_on

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ["hermes", "fifo", "full", "sink", "infinipot-v", "streammem", "rekv", "simplestream"]
BACKBONES = {"tiny": "llava_lm", "tiny-qwen": "qwen_lm", "tiny-qwen3": "qwen3_lm", "tiny-qwen35": "qwen35_lm"}
BUDGET = 40  # below one chunk's video tokens on every tiny backbone: each chunk evicts
SAVED_AFTER, STOP = 2, 3  # chunks before the save, and the chunk the resumed stream stops before


def _session(lm, policy: str = "hermes", **config) -> StreamingSession:
    config = HermesConfig(**{"budget": BUDGET, "chunk_frames": FRAMES, "fps": 1.0, **config})
    return StreamingSession(lm, config, policy=policy)


def _streamed(lm, policy: str = "hermes", chunks: int = SAVED_AFTER, **config) -> StreamingSession:
    """A session that has taken `chunks` chunks; a HERMES one also watches for a standing question and
    has answered a question (its last turn prefixes the guidance prompt of the chunks that follow)."""
    session = _session(lm, policy, **config)
    hermes = policy.startswith("hermes")
    if hermes:
        session.standing.add("Is there a red circle?")
    for i in range(chunks):
        session.ingest(chunk(i))
    if hermes:
        session.ask("What is on the screen?", max_new_tokens=2)
    return session


def _cases() -> list[tuple[str, str, dict]]:
    """(model, policy, memory constants): every backbone with every policy, an input filter's state,
    and a stream whose positions are compacted after it is loaded."""
    cases = [(model, policy, {}) for model in BACKBONES for policy in POLICIES]
    cases += [("tiny", "hermes+dtd", {}), ("tiny-qwen", "fifo+dtd", {})]
    cases += [("tiny", "hermes", {"max_positions": 1000, "position_margin": 40})]
    return cases


@pytest.mark.timeout(900)  # 35 streams, in two processes, on a machine that may be shared
def test_a_stream_loaded_in_a_fresh_process_goes_on_bit_for_bit(request, tmp_path):
    """For each backbone and policy: N chunks, save, load in another process, M more chunks and a
    question; the answer, its first-token log-probabilities and the memory equal the uninterrupted
    stream's."""
    expected, cases = {}, []
    for n, (model, policy, config) in enumerate(_cases()):
        lm = request.getfixturevalue(BACKBONES[model])
        session = _streamed(lm, policy, **config)
        save_session(session, tmp_path / f"{n}.saved")
        go_on(session, SAVED_AFTER, STOP, str(tmp_path / f"{n}.direct"))
        out = str(tmp_path / f"{n}.resumed")
        cases.append({"model": model, "file": str(tmp_path / f"{n}.saved"), "start": SAVED_AFTER, "stop": STOP})
        cases[-1]["out"] = out
        expected[n] = (model, policy, config)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"threads": torch.get_num_threads(), "cases": cases}))
    subprocess.run([sys.executable, "-m", "tests.persist_child", str(spec)], cwd=ROOT, check=True, timeout=800)
    for n, case in expected.items():
        direct = torch.load(tmp_path / f"{n}.direct.answer.pt")
        resumed = torch.load(tmp_path / f"{n}.resumed.answer.pt")
        assert (resumed["text"], resumed["top"]) == (direct["text"], direct["top"]), case
        assert torch.equal(resumed["logp"], direct["logp"]), case
        a, b = read_memory(tmp_path / f"{n}.direct.memory"), read_memory(tmp_path / f"{n}.resumed.memory")
        assert a.header["sha256"] == b.header["sha256"], case  # every tensor: the memory, the host store
        assert a.header["cache"] == b.header["cache"] and a.header.get("store") == b.header.get("store"), case
        for key in ("frames_seen", "stream_time_s", "chunks_seen", "last_turn", "policy"):
            assert a.header["session"][key] == b.header["session"][key], case
        assert a.header["session"]["standing"]["above"] == b.header["session"]["standing"]["above"], case
        if "max_positions" in case[2]:  # positions were compacted after the load, not before
            assert (
                read_memory(tmp_path / f"{n}.saved").header["cache"]["compactions"],
                a.header["cache"]["compactions"],
            ) == (0, 1)


def test_save_then_load_holds_the_same_memory_and_state(lm, tmp_path):
    """In one process, for each backbone: the loaded memory is bit for bit the saved one (a hybrid
    model's states too), and the session's state comes back."""
    session = _streamed(lm)
    save_session(session, tmp_path / "m")
    loaded = load_session(lm, tmp_path / "m")
    assert_same_memory(memory_state(session.memory), loaded.memory, storage=False)
    for a, b in zip(session.memory.kv_layers, loaded.memory.kv_layers, strict=True):
        assert torch.equal(a.origins, b.origins) and torch.equal(a.patches, b.patches)
        assert (a.summary_count, a.allocated, a.prefix_len) == (b.summary_count, b.allocated, b.prefix_len)
    assert (loaded.frames_seen, loaded.stream_time_s, loaded.chunks_seen) == (2 * FRAMES, 3.0, 2)
    assert loaded.reader.last_turn == session.reader.last_turn
    assert loaded.standing.questions == session.standing.questions
    assert [a.text for a in loaded.reader.answers] == [a.text for a in session.reader.answers]
    assert loaded.memory.tokens_seen == session.memory.tokens_seen


def test_bf16_memories_keep_their_origin_keys(tmp_path):
    """A 16-bit memory keeps each slot's origin key; it comes back, and the stream goes on bit for bit."""
    from hermes.models.loading import load_video_lm

    lm = load_video_lm("tiny", dtype="bf16")
    session = _streamed(lm)
    save_session(session, tmp_path / "m")
    loaded = load_session(lm, tmp_path / "m")
    for a, b in zip(session.memory.kv_layers, loaded.memory.kv_layers, strict=True):
        p, c = a.prefix_len, a.committed
        assert torch.equal(a._k0[..., p:c, :], b._k0[..., p:c, :])
    for s in (session, loaded):
        s.ingest(chunk(SAVED_AFTER))
    assert_same_memory(memory_state(session.memory), loaded.memory, storage=False)
    assert session.ask(QUESTION, max_new_tokens=4).text == loaded.ask(QUESTION, max_new_tokens=4).text


def test_the_library_saves_and_loads_a_cache_alone(llava_lm, tmp_path):
    """`save_cache` and `load_cache`: the cache on its own, checked against a model's rotary."""
    session = _streamed(llava_lm)
    save_cache(session.memory, tmp_path / "cache", extra={"note": "mine"})
    cache = load_cache(tmp_path / "cache", rope=llava_lm.rope_spec(), dtype=llava_lm.dtype)
    assert_same_memory(memory_state(session.memory), cache, storage=False)
    assert read_memory(tmp_path / "cache").header["extra"] == {"note": "mine"}
    with pytest.raises(MemoryFileError, match="saved in fp32 and the model runs in bf16"):
        load_cache(tmp_path / "cache", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def saved(llava_lm, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "memory.hermes"
    save_session(_streamed(llava_lm), path)
    return path


def test_another_model_policy_or_dtype_is_refused_with_the_reason(saved, llava_lm, qwen_lm, tmp_path):
    from hermes.models.loading import load_video_lm

    with pytest.raises(MemoryFileError, match="belongs to 'tiny' \\(llava_onevision\\), not to a qwen2_5_vl"):
        load_session(qwen_lm, saved)
    with pytest.raises(MemoryFileError, match="saved in fp32 and 'tiny' runs in bf16"):
        load_session(load_video_lm("tiny", dtype="bf16"), saved)
    with pytest.raises(MemoryFileError, match="kept by policy 'hermes', not 'fifo'"):
        load_session(llava_lm, saved, policy="fifo")
    with pytest.raises(MemoryFileError, match="kept with budget 40"):
        load_session(llava_lm, saved, config=HermesConfig(budget=400, chunk_frames=FRAMES, fps=1.0))
    other = load_video_lm(str(Path(llava_lm.model.config._name_or_path)))  # the same checkpoint by its folder
    assert load_session(other, saved).frames_seen == 2 * FRAMES
    with torch.no_grad():
        other.language_model.layers[0].mlp.up_proj.weight.mul_(1.5)  # the same config, other weights
    with pytest.raises(MemoryFileError, match="whose weights differ"):
        load_session(other, saved)


def _damaged(saved: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Files that must be refused, each with the reason's words."""
    data = saved.read_bytes()
    out = {}
    for name, content, reason in [
        ("truncated", data[: len(data) * 2 // 3], "is truncated"),
        ("header-cut", data[:100], "truncated: it ends inside its header"),
        ("flipped", data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:], "do not match their checksum"),
        ("text", b"hello, this is not a memory at all\n" * 20, "not a HERMES memory file"),
        ("empty", b"", "not a HERMES memory file"),
    ]:
        (tmp_path / name).write_bytes(content)
        out[name] = (tmp_path / name, reason)
    save_file({"weight": torch.zeros(4, 4)}, tmp_path / "weights.safetensors")
    out["weights"] = (tmp_path / "weights.safetensors", "safetensors file but not a HERMES memory")
    out["missing"] = (tmp_path / "nowhere", "cannot read the memory file")
    return out


def test_damaged_truncated_and_foreign_files_are_refused_and_nothing_changes(saved, llava_lm, tmp_path):
    running = _streamed(llava_lm)
    before = memory_state(running.memory)
    for path, reason in _damaged(saved, tmp_path).values():
        with pytest.raises(MemoryFileError, match=reason):
            load_session(llava_lm, path)
        with pytest.raises(MemoryFileError, match=reason):
            load_cache(path)
    assert_same_memory(before, running.memory)  # the running stream is untouched
    assert read_session(saved).header["session"]["frames_seen"] == 2 * FRAMES


def test_a_header_that_does_not_match_its_tensors_is_refused(saved, llava_lm, tmp_path):
    """A file whose checksum holds but whose header lies (hand-edited) fails the shape checks, whole."""
    from hermes.memory.persist import write_memory

    memory = read_memory(saved)
    memory.header["cache"]["layers"][1]["prefix_len"] += 1
    write_memory(tmp_path / "edited", memory)
    with pytest.raises(MemoryFileError, match="layer 1 holds"):
        load_session(llava_lm, tmp_path / "edited")
    memory = read_memory(saved)
    del memory.tensors["kv.2.scores"]
    write_memory(tmp_path / "missing", memory)
    with pytest.raises(MemoryFileError, match=r"'kv\.2\.scores' is missing"):
        load_session(llava_lm, tmp_path / "missing")
    memory = read_memory(saved)
    memory.header["session"]["last_turn"] = "not a turn"
    write_memory(tmp_path / "turn", memory)
    with pytest.raises(MemoryFileError, match="last question and answer are malformed"):
        load_session(llava_lm, tmp_path / "turn")


KILLER = """
import os, sys, time, torch
from hermes.memory.persist import read_memory, write_memory
point, source, target = sys.argv[1:]
memory = read_memory(source)
memory.tensors["padding"] = torch.arange(3 << 20, dtype=torch.uint8)  # several write blocks
real = {"write": os.write, "fsync": os.fsync, "replace": os.replace}
calls = []
def stop_at(name):
    def wrapped(*args):
        calls.append(name)
        if name == point and (name != "write" or calls.count("write") == 2):
            print("ready", flush=True)
            time.sleep(600)
        return real[name](*args)
    return wrapped
setattr(os, point, stop_at(point))
write_memory(target, memory)
"""


@pytest.mark.parametrize("point", ["write", "fsync", "replace"])
def test_a_writer_killed_mid_write_leaves_the_last_checkpoint_loadable(saved, llava_lm, tmp_path, point):
    """SIGKILL while a new checkpoint is written (mid data, at the flush, just before the rename):
    the previous checkpoint stays whole and loads."""
    target = tmp_path / "checkpoint.hermes"
    target.write_bytes(saved.read_bytes())
    child = subprocess.Popen(
        [sys.executable, "-c", KILLER, point, str(saved), str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.kill()
    finally:
        child.wait(30)
    assert child.returncode == -9
    assert target.read_bytes() == saved.read_bytes()
    assert load_session(llava_lm, target).frames_seen == 2 * FRAMES
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == [f".checkpoint.hermes.{child.pid}.tmp"]  # the killed writer's, never read
    save_session(load_session(llava_lm, target), target)  # the next save replaces the file whole
    assert read_session(target).header["session"]["frames_seen"] == 2 * FRAMES
    assert not os.path.exists(tmp_path / f".checkpoint.hermes.{os.getpid()}.tmp")


# -- the command line ------------------------------------------------------------------------------
def _stream_cmd(clip: Path, *extra: str) -> list[str]:
    options = [
        "--model",
        "tiny",
        "--json",
        "--fps",
        "1",
        "--chunk-frames",
        "2",
        "--budget",
        "300",
        "--max-new-tokens",
        "4",
    ]
    return [sys.executable, "-m", "hermes", "stream", str(clip), *options, "--ask", f"100:{QUESTION}", *extra]


def _answer(stdout: str) -> dict:
    return next(e for e in map(json.loads, stdout.splitlines()) if e["event"] == "answer")


@pytest.mark.timeout(600)
def test_a_stream_killed_and_restarted_from_its_checkpoint_ends_as_if_never_stopped(clips, tmp_path):
    """`stream --save-memory F --save-every M` killed mid-video, then `stream --load-memory F` on the
    same video: the same final answer and, bit for bit, the same memory as one uninterrupted run;
    `ask F` answers from the saved memory as the stream did at its end."""
    whole = subprocess.run(
        _stream_cmd(clips["short"], "--save-memory", str(tmp_path / "whole")), capture_output=True, text=True
    )
    assert whole.returncode == 0, whole.stderr
    checkpoint = tmp_path / "checkpoint"
    crashed = subprocess.Popen(
        _stream_cmd(clips["short"], "--speed", "2", "--save-memory", str(checkpoint), "--save-every", "0.0001"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        chunks = 0
        while chunks < 2:  # a chunk's line comes after the checkpoint of the chunk before it
            chunks += json.loads(crashed.stdout.readline())["event"] == "chunk"
        crashed.kill()
    finally:
        crashed.wait(30)
    saved = read_session(checkpoint).header["session"]["frames_seen"]
    assert 0 < saved < 8  # stopped mid-video
    resumed = subprocess.run(
        _stream_cmd(clips["short"], "--load-memory", str(checkpoint), "--save-memory", str(tmp_path / "resumed")),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    first = next(e for e in map(json.loads, resumed.stdout.splitlines()) if e["event"] == "chunk")
    assert first["frames_seen"] == saved + 2 and first["chunk"] == saved // 2
    assert _answer(resumed.stdout)["text"] == _answer(whole.stdout)["text"]
    assert _answer(resumed.stdout)["top_logprobs"] == _answer(whole.stdout)["top_logprobs"]
    a, b = read_memory(tmp_path / "whole"), read_memory(tmp_path / "resumed")
    assert a.header["sha256"] == b.header["sha256"] and a.header["cache"] == b.header["cache"]
    asked = subprocess.run(
        [sys.executable, "-m", "hermes", "ask", str(tmp_path / "whole"), QUESTION, "--max-new-tokens", "4", "--json"],
        capture_output=True,
        text=True,
    )
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["text"] == _answer(whole.stdout)["text"]


def test_bad_memory_files_and_options_get_one_clear_line(saved, clips, tmp_path, capsys, monkeypatch):
    from hermes.cli.main import main

    monkeypatch.delenv("HERMES_DTYPE", raising=False)  # each refusal below, not the dtype's first

    junk = tmp_path / "junk"
    junk.write_text("not a memory\n" * 10)

    def expect(argv: list[str], fragment: str) -> None:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and fragment in err and err.count("\n") == 1, err

    expect(["ask", str(junk), "What?"], "not a HERMES memory file")
    expect(["ask", str(tmp_path / "nowhere"), "What?"], "cannot read the memory file")
    expect(["ask", str(saved), "What?", "--model", "tiny-qwen"], "not to a qwen2_5_vl model")
    expect(["ask", str(saved), "What?", "--dtype", "bf16"], "saved in fp32")
    expect(["ask", str(saved), "   "], "question is empty")
    video = str(clips["short"])
    expect(["stream", video, "--load-memory", str(junk)], "not a HERMES memory file")
    expect(["stream", video, "--load-memory", str(saved), "--policy", "fifo"], "kept by policy 'hermes', not 'fifo'")
    expect(["stream", video, "--load-memory", str(saved), "--budget", "99"], "kept with budget 40")
    expect(["stream", video, "--load-memory", str(saved), "--param", "hermes.recency_k=5"], "--param does not apply")
    expect(["stream", video, "--save-every", "5"], "--save-memory FILE")
    expect(["stream", video, "--save-memory", str(tmp_path / "no" / "such" / "f")], "does not exist")
