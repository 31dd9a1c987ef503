"""Crafted memory files (issue 40): valid files, their checksum recomputed, whose cache is shaped for
another model, whose settings pass the app's bounds, whose storage is past what their budget needs,
whose numbers are NaN, negative or huge, whose header nests too deep. Each is refused in one line
through the app's API (in-process) and by `hermes ask` (exit 2, one `error:` line), before anything
of it is allocated; another viewer's batched answers stay right; a loaded memory's bytes count
against the memory cap and show in /metrics."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hermes.engine.methods import PolicySpec
from hermes.engine.persist import MemoryFileError, check_storage, read_session, save_session
from hermes.engine.session import StreamingSession
from hermes.memory.persist import FORMAT, MemoryFile, read_memory, write_memory
from hermes.serving.admission import Busy, block_tokens_bound, cache_bytes_for
from hermes.serving.jobs import Priority
from hermes.serving.live import LiveStream
from hermes.serving.memory_files import settings_of
from hermes.serving.registry import StreamRegistry
from tests.helpers import SMALL, random_chunk, streamed, wait_for

QUESTION = "What did you see at the start?"
Edit = Callable[[MemoryFile], None]


def _saved(lm, path: Path) -> Path:
    """A real session of `lm` (the app's small settings, two chunks) saved to `path`."""
    session = StreamingSession(lm, SMALL.config())
    for i in range(2):
        session.ingest(random_chunk(i))
    save_session(session, path)
    return path


def _crafted(good: Path, path: Path, edit: Edit) -> Path:
    """`good` edited by `edit`, written with its checksum recomputed (what an attacker can do)."""
    memory = read_memory(good)
    edit(memory)
    write_memory(path, memory)
    return path


def _kv(memory: MemoryFile, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Every key-value layer's keys and values (and origin keys) changed by `change`."""
    for name, t in list(memory.tensors.items()):
        if name.startswith("kv.") and name.endswith(("keys", "values")):
            memory.tensors[name] = change(t).contiguous()


def _cache(**changes) -> Edit:
    return lambda m: m.header["cache"].update(changes)


def _config(**changes) -> Edit:
    return lambda m: m.header["cache"]["config"].update(changes)


def _session(**changes) -> Edit:
    return lambda m: m.header["session"].update(changes)


def _layers(**changes) -> Edit:
    return lambda m: [layer.update(changes) for layer in m.header["cache"]["layers"]]


def _fewer_layers(linear: bool) -> Edit:
    """The last key-value layer dropped: the file has one decoder layer less, or (`linear`) says it
    is a linear-attention layer of no state."""

    def edit(memory: MemoryFile) -> None:
        cache = memory.header["cache"]
        last = len(cache["layers"]) - 1
        cache["layers"].pop()
        if linear:
            cache["linear"], cache["states"] = [last], [{"names": [], "has_previous": False}]
        else:
            cache["num_layers"] -= 1
        for name in [n for n in memory.tensors if n.startswith(f"kv.{last}.")]:
            del memory.tensors[name]

    return edit


def _book(name: str, value: int) -> Edit:
    def edit(memory: MemoryFile) -> None:
        memory.tensors[f"kv.0.{name}"] = memory.tensors[f"kv.0.{name}"].clone()
        memory.tensors[f"kv.0.{name}"].view(-1)[0] = value

    return edit


def _answer_at(value: float) -> Edit:
    def edit(memory: MemoryFile) -> None:
        answer = {"question": "Q?", "text": "A.", "done": True, "at_s": value}
        memory.header["session"]["answers"] = [answer]

    return edit


SAME = True  # `hermes ask` refuses the file in the app's words
# name -> (edit, what the app says, what `hermes ask` says: SAME, its own words, or None where the
# command line takes the file: the bounds the app's API holds a viewer's settings to are the app's,
# and `stream --budget` takes any budget).
CASES: dict[str, tuple[Edit, str, str | bool | None]] = {
    "doubled-heads": (lambda m: _kv(m, lambda t: torch.cat([t, t], dim=1)), "it belongs to another model", SAME),
    "half-head-dim": (lambda m: _kv(m, lambda t: t[..., : t.shape[-1] // 2]), "it belongs to another model", SAME),
    "fewer-layers": (_fewer_layers(linear=False), "this memory has 3 decoder layers", SAME),
    "layer-kinds": (_fewer_layers(linear=True), "linear attention at [3]", SAME),
    "bf16-tensors": (lambda m: _kv(m, lambda t: t.to(torch.bfloat16)), "expected torch.float32", SAME),
    "chunk-frames-1e6": (_config(chunk_frames=10**6), "chunk_frames takes a number from 1 to 32", "does not fit in"),
    "budget-20000": (_config(budget=20000), "budget takes a number from 128 to 10240; got 20000", None),
    "budget-0": (_config(budget=0), "budget must be at least 1", SAME),
    "fps-8": (_config(fps=8.0), "fps takes a number from 0.25 to 4; got 8.0", None),
    "fps-nan": (_config(fps=float("nan")), "fps = nan", SAME),
    "threshold-0.99": (
        lambda m: m.header["session"]["standing"].update(threshold=0.99),
        "watch_threshold takes a number from 0.05 to 0.95",
        None,
    ),
    "alert-tokens": (
        lambda m: m.header["session"]["standing"].update(answer_tokens=10**6),
        "its alerts answer in 1,000,000 tokens",
        None,
    ),
    "allocated-1.4M": (_layers(allocated=1_400_000), "asks for room for 1,400,000 tokens", SAME),
    "allocated-2**40": (_layers(allocated=2**40), f"asks for room for {2**40:,} tokens", SAME),
    "time-nan": (_session(stream_time_s=float("nan")), "'stream_time_s' is nan", SAME),
    "time-negative": (_session(stream_time_s=-5.0), "'stream_time_s' is -5.0", SAME),
    "time-1e308": (_session(stream_time_s=1e308), "'stream_time_s' is 1e+308", SAME),
    "frames-negative": (_session(frames_seen=-3), "'frames_seen' is -3", SAME),
    "chunks-1e308": (_session(chunks_seen=1e308), "'chunks_seen' is missing or malformed", SAME),
    "tokens-negative": (_cache(tokens_seen=-1), "'tokens_seen' is -1", SAME),
    "position-negative": (_book("positions", -5), "holds positions, frames or stream ids out of range", SAME),
    "position-2**62": (_book("positions", 2**62), "holds positions, frames or stream ids out of range", SAME),
    "frame-negative": (_book("frames", -7), "holds positions, frames or stream ids out of range", SAME),
    "answer-at-nan": (_answer_at(float("nan")), "its answers hold at_s = nan", SAME),
}


@pytest.fixture(scope="module")
def files(llava_lm, tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """The good file, and each crafted one (plus a header nested past any parser's depth)."""
    root = tmp_path_factory.mktemp("crafted")
    good = _saved(llava_lm, root / "good.hmem")
    crafted = {name: _crafted(good, root / f"{name}.hmem", edit) for name, (edit, _, _) in CASES.items()}
    memory = read_memory(good)
    deep = json.dumps(memory.header)[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    save_file(memory.tensors, root / "deep.hmem", metadata={FORMAT: deep})
    crafted["deep"] = root / "deep.hmem"
    return good, crafted


def _fragment(name: str, cli: bool) -> str | None:
    if name == "deep":
        return "its header cannot be read"
    _, app, ask = CASES[name]
    return app if not cli or ask is SAME else ask


@pytest.fixture
def stream(worker, llava_lm, clips):
    s = streamed(LiveStream(worker, llava_lm, SMALL, key="viewer"), clips["short"])
    yield s
    s.close()


def test_each_crafted_file_is_refused_in_one_line_by_the_app_and_the_stream_is_untouched(stream, files):
    _, crafted = files
    before, memory = stream.view(), stream._memories.main().memory
    for name, path in crafted.items():
        with pytest.raises(MemoryFileError) as refused:
            stream.files.load(path)
        message = str(refused.value)
        assert _fragment(name, cli=False) in message and "\n" not in message, (name, message)
    view = stream.view()
    assert (view.frames_seen, view.settings) == (before.frames_seen, before.settings)
    assert stream._memories.main().memory is memory and stream.worker.errors == 0


def test_each_crafted_file_is_refused_by_ask_with_exit_2_and_one_error_line(files, capsys, monkeypatch):
    from hermes.cli.main import main

    monkeypatch.delenv("HERMES_DTYPE", raising=False)
    _, crafted = files
    for name, path in crafted.items():
        fragment = _fragment(name, cli=True)
        if fragment is None:  # a bound of the app's API only
            continue
        assert main(["ask", str(path), QUESTION, "--max-new-tokens", "2"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, (name, err)
        assert "Traceback" not in err


def test_the_storage_check_runs_on_declared_shapes_before_anything_is_allocated(llava_lm, files):
    """A file asking for 2**40 tokens of storage is refused with no tensor of its loaded: the check
    reads the header and the tensors' shapes as declared (meta tensors)."""
    good, crafted = files
    seen: list[torch.device] = []

    def spy(memory: MemoryFile) -> None:
        seen.extend(t.device for t in memory.tensors.values())
        check_storage(memory, llava_lm, block_tokens_bound(llava_lm))

    with pytest.raises(MemoryFileError, match="asks for room for"):
        read_memory(crafted["allocated-2**40"], spy)
    assert seen and all(d.type == "meta" for d in seen)
    assert check_storage(read_session(good), llava_lm, block_tokens_bound(llava_lm)) > 0  # the good one passes


def test_a_hybrid_models_file_with_other_states_or_layer_kinds_is_refused(worker, qwen35_lm, tmp_path, capsys):
    from hermes.cli.main import main

    good = _saved(qwen35_lm, tmp_path / "good.hmem")
    linear = read_memory(good).header["cache"]["linear"]
    attention = next(i for i in range(qwen35_lm.num_layers) if i not in linear)
    crafted = {
        "conv-channels": (
            lambda m: m.tensors.update({"state.0.conv": torch.cat([m.tensors["state.0.conv"]] * 2, dim=1)}),
            "state.0.conv has shape",
        ),
        "kinds-swapped": (_cache(linear=[*linear[:-1], attention]), "it belongs to another model"),
    }
    stream = LiveStream(worker, qwen35_lm, SMALL, key="hybrid")
    try:
        for name, (edit, fragment) in crafted.items():
            path = _crafted(good, tmp_path / f"{name}.hmem", edit)
            with pytest.raises(MemoryFileError, match=fragment):
                stream.files.load(path)
            assert main(["ask", str(path), QUESTION, "--max-new-tokens", "2", "--dtype", "fp32"]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
        assert "policy hermes at budget 400" in stream.files.load(good)  # the model's own file loads
    finally:
        stream.close()


def test_another_viewers_batched_answers_stay_right_while_a_crafted_file_is_refused(worker, llava_lm, clips, files):
    _, crafted = files
    victim, attacker = (LiveStream(worker, llava_lm, SMALL, key=k) for k in ("victim", "attacker"))
    try:
        for s in (victim, attacker):
            streamed(s, clips["short"])
        with pytest.raises(MemoryFileError, match="it belongs to another model"):
            attacker.files.load(crafted["doubled-heads"])
        gate = threading.Event()
        worker.submit(lambda: gate.wait(5), Priority.CHUNK, "x")  # the model thread is busy...
        tickets = [s.ask(QUESTION, max_new_tokens=8) for s in (victim, attacker)]
        gate.set()  # ...so both questions are answered in one batch
        answers = [list(t.events()) for t in tickets]
        assert worker.wait_idle(timeout=30) and worker.largest_batch == 2 and worker.errors == 0
        for s, events in zip((victim, attacker), answers, strict=True):
            assert all(e.error is None for e in events), [e.error for e in events]
            alone = s._memories.sessions[PolicySpec("hermes")].ask(QUESTION, max_new_tokens=8)
            assert (events[-1].update.text, events[-1].update.tokens) == (alone.text, alone.tokens)
    finally:
        victim.close()
        attacker.close()


def test_a_loaded_memory_reserves_its_bytes_and_is_refused_past_the_cap(llava_lm, files):
    good, _ = files
    memory = read_session(good)
    held = check_storage(memory, llava_lm, block_tokens_bound(llava_lm))
    fresh = cache_bytes_for(llava_lm, settings_of(memory, SMALL))
    assert held > fresh  # its storage was sized for a chunk and a question: more than the settings alone

    tight = StreamRegistry(llava_lm, settings=SMALL, memory_cap_bytes=(held + fresh) // 2)
    try:
        stream = tight.get("a")
        with pytest.raises(Busy, match="This memory takes"):
            stream.files.load(good)
        assert stream.reserved_bytes == 0 and stream.view().frames_seen == 0
    finally:
        tight.shutdown()

    roomy = StreamRegistry(llava_lm, settings=SMALL, memory_cap_bytes=held + fresh)
    try:
        stream = roomy.get("a")
        stream.files.load(good)
        assert stream.reserved_bytes == held == roomy.reserved_bytes()
        assert wait_for(lambda: stream.metrics()["reserved_bytes"] == held)
        [session] = stream._memories.sessions.values()
        assert sum(layer._k.numel() * 2 * 4 for layer in session.memory.kv_layers) == held  # fp32 keys, values
        with pytest.raises(Busy, match="this one needs"):
            roomy.get("b").files.load(good)  # a second copy does not fit beside it
    finally:
        roomy.shutdown()


def test_the_pages_load_memory_note_is_one_line_and_metrics_show_the_loaded_bytes(llava_lm, files):
    """Through the app's HTTP API: a crafted upload gets one line in the Load memory note; the good
    file loads, and /metrics reports the bytes its cache reserves."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client, handle_file

    from tests.test_app import serve

    good, crafted = files
    url, demo, registry = serve(llava_lm)
    client = Client(url, verbose=False)
    try:
        for name in ("doubled-heads", "allocated-2**40", "chunk-frames-1e6", "deep"):
            *_, note, _ = client.predict(handle_file(str(crafted[name])), api_name="/load_memory")
            assert note.startswith("⚠️ ") and "\n" not in note and _fragment(name, cli=False) in note, note
        assert client.predict(api_name="/metrics")["reserved_bytes"] == 0
        *_, note, _ = client.predict(handle_file(str(good)), api_name="/load_memory")
        assert "policy hermes at budget 400" in note
        held = check_storage(read_session(good), llava_lm, block_tokens_bound(llava_lm))
        assert client.predict(api_name="/metrics")["reserved_bytes"] == held == registry.reserved_bytes()
    finally:
        client.close()
        demo.close()
        registry.shutdown()


def test_an_allocation_that_fails_is_one_line_not_the_allocators(llava_lm, files, capsys, monkeypatch):
    """A good file on a machine out of memory: the allocator's RuntimeError (bytes, an error code, a
    C++ file) becomes one sentence, in the library and in `hermes ask`."""
    from hermes.cli.main import main
    from hermes.engine.persist import load_session
    from hermes.memory import persist

    good, _ = files
    message = "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried"

    def out_of_memory(*args: object) -> None:
        raise RuntimeError(f"{message} to allocate 140737488355328 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(persist, "_fill_layer", out_of_memory)
    monkeypatch.delenv("HERMES_DTYPE", raising=False)
    with pytest.raises(MemoryFileError, match="there is not enough memory to load this memory") as refused:
        load_session(llava_lm, good)
    assert "alloc_cpu" not in str(refused.value)
    assert main(["ask", str(good), QUESTION]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: there is not enough memory") and err.count("\n") == 1 and "alloc_cpu" not in err
