"""Placement on the CPU: dtypes, loading through an accelerate device map (layers offloaded to disk
run through accelerate's hooks), a memory whose layers live on different devices, and admission
control counted per device."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
import torch

from hermes.engine.methods import make_policy
from hermes.engine.session import StreamingSession
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.compression import compress
from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec
from hermes.models import gemm, loading
from hermes.models.gemm import cpu_has_bf16
from hermes.models.loading import load_video_lm, resolve_dtype
from hermes.runtime.settings import StreamSettings
from hermes.serving import admission
from tests.helpers import random_chunk

QUESTION = "What is happening?"


# -- dtype ----------------------------------------------------------------------------------------


def test_auto_dtype_follows_the_cpu_flags_and_speed(tmp_path, monkeypatch):
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile\n")
    avx = tmp_path / "avx"
    avx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\nbugs\t\t: amx_bf16\n")  # only the flags line counts
    assert cpu_has_bf16(amx) and cpu_has_bf16(avx) and not cpu_has_bf16(plain)
    assert not cpu_has_bf16(tmp_path / "missing")
    cpu = torch.device("cpu")
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(loading, "cpu_bf16_pays", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    # The flag without the speed (AVX-512 BF16 on a Xeon whose AMX is hidden): fp32 is faster there.
    monkeypatch.setattr(loading, "cpu_bf16_pays", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(loading, "cpu_bf16_pays", lambda: True)
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype(None, cpu) == torch.float32  # the library's default is unchanged
    assert resolve_dtype("fp16", cpu) == torch.float16 and resolve_dtype(torch.bfloat16, cpu) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.float16
    with pytest.raises(ValueError, match="bf16"):
        resolve_dtype("int8", cpu)


def test_the_bf16_verdict_is_measured_once_per_machine_and_shared(tmp_path, monkeypatch):
    """Processes on one machine (the shards of an evaluation) compute in one precision: the first
    to ask measures under the file's lock, the others wait and read; a broken file measures again."""
    monkeypatch.setenv("HERMES_CACHE", str(tmp_path))
    measured: list[bool] = []

    def measure() -> bool:
        time.sleep(0.2)  # long enough for the other thread to reach the lock
        measured.append(len(measured) % 2 == 0)  # a second measurement would disagree
        return measured[-1]

    monkeypatch.setattr(gemm, "measure_bf16_pays", measure)
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda: answers.append(gemm.cpu_bf16_pays.__wrapped__())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [True, True] and measured == [True]
    kept = json.loads((tmp_path / gemm.VERDICT_FILE).read_text())
    assert list(kept.values()) == [True] and torch.__version__ in next(iter(kept))
    (tmp_path / gemm.VERDICT_FILE).write_text("{torn")
    assert gemm.cpu_bf16_pays.__wrapped__() is False and measured == [True, False]
    monkeypatch.setenv("HERMES_CACHE", str(tmp_path / gemm.VERDICT_FILE / "not-a-folder"))
    assert gemm.cpu_bf16_pays.__wrapped__() is True and len(measured) == 3  # measured, not kept
    assert gemm.cpu_model(tmp_path / "missing") == "unknown CPU"


def test_bad_placement_is_refused_before_loading():
    with pytest.raises(ValueError, match="not one of"):
        load_video_lm("nobody/no-such-model", dtype="fp8")
    with pytest.raises(ValueError, match="not one of"):
        load_video_lm("nobody/no-such-model", device_map="everywhere")
    with pytest.raises(ValueError, match="not both"):
        load_video_lm("nobody/no-such-model", device="cpu", device_map="auto")


def test_bf16_streams_hold_the_budget_and_equal_full_below_it(qwen3_lm):
    lm = load_video_lm("tiny-qwen3", dtype="bf16")
    assert lm.dtype == torch.bfloat16 and lm.dtype_name == "bf16" and qwen3_lm.dtype_name == "fp32"
    config = HermesConfig(budget=100_000, chunk_frames=2, fps=1.0)
    hermes, full = StreamingSession(lm, config), StreamingSession(lm, config, policy="full")
    for i in range(3):
        hermes.ingest(random_chunk(i))
        full.ingest(random_chunk(i))
    assert torch.equal(hermes.first_token_logprobs(QUESTION), full.first_token_logprobs(QUESTION))


# -- device maps ------------------------------------------------------------------------------------


def _disk_map(layers: int) -> dict[str, str]:
    """Qwen3-VL's modules, with every other decoder layer offloaded to disk."""
    placement = {f"model.language_model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(layers)}
    rest = ("model.visual", "model.language_model.embed_tokens", "model.language_model.norm")
    return {**dict.fromkeys(rest, "cpu"), "model.language_model.rotary_emb": "cpu", "lm_head": "cpu", **placement}


def test_device_map_with_offloaded_layers_streams_like_one_device(qwen3_lm, tmp_path):
    """Layers offloaded to disk keep meta weights and run through accelerate's hooks on the CPU:
    their memory lives where they run, and the stream is the one-device stream exactly."""
    lm = load_video_lm("tiny-qwen3", device_map=_disk_map(qwen3_lm.num_layers), offload_folder=tmp_path)
    layers = lm.language_model.layers
    assert layers[1].self_attn.q_proj.weight.device.type == "meta"  # really offloaded
    assert hasattr(layers[1], "_hf_hook")
    assert lm.layer_devices() == [torch.device("cpu")] * lm.num_layers and lm.device == torch.device("cpu")
    config = HermesConfig(budget=100, chunk_frames=2, fps=1.0)
    mapped, plain = StreamingSession(lm, config), StreamingSession(qwen3_lm, config)
    for i in range(5):
        a, b = mapped.ingest(random_chunk(i)), plain.ingest(random_chunk(i))
        assert a.evicted == b.evicted and a.cache_bytes == b.cache_bytes
    assert b.evicted > 0  # compressed for real, with guidance passes through the hooks
    for (k0, v0), (k1, v1) in zip(mapped.memory.kv(), plain.memory.kv(), strict=True):
        torch.testing.assert_close(k0, k1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v0, v1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        mapped.first_token_logprobs(QUESTION), plain.first_token_logprobs(QUESTION), rtol=1e-4, atol=1e-4
    )


# -- a memory over several devices ------------------------------------------------------------------

LAYERS, HEADS, HEAD_DIM, PREFIX = 4, 2, 16, 5


def _memory() -> HermesCache:
    config = HermesConfig(budget=12, reindex="eager")
    spec = RopeSpec.from_config(HEAD_DIM, 1e6, (4, 2, 2), interleaved=True)
    return HermesCache(LAYERS, spec, config, make_policy("hermes", config).capacity)


def _feed(cache: HermesCache, devices: list[str], seed: int) -> list:
    """Three chunks of random keys, each layer's on its device, compressed with the hermes policy."""
    gen = torch.Generator().manual_seed(seed)
    policy = make_policy("hermes", cache.config)

    def write(n: int) -> None:
        for layer, device in zip(cache.layers, devices, strict=True):
            k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=gen) for _ in range(2))
            layer.update(k.to(device), v.to(device))

    write(PREFIX)
    cache.commit_prefix()
    reports = []
    for chunk in range(3):
        n = 8
        start = cache.start_position(n)
        write(n)
        t = torch.arange(2).repeat_interleave(4)
        hw = torch.arange(4).repeat(2)
        cache.commit(ChunkMeta(frames=chunk * 2 + t, positions=start + torch.stack([t, hw // 2, hw % 2])))
        attention = [torch.rand(cache.slots, generator=gen) for _ in range(LAYERS)]
        report = compress(cache, policy, attention)
        if report is not None:
            cache.reindex()  # eager, as the session does after every eviction
        reports.append(report)
    return reports


def test_a_memory_whose_layers_live_on_different_devices():
    """Eviction, the summary fold and re-indexing run on each layer's own device: layers on the
    meta device stay there (any copy to the CPU would fail), and the CPU layers are exactly those of
    a memory held all on the CPU."""
    mixed_devices = ["cpu", "cpu", "meta", "meta"]
    mixed, alone = _memory(), _memory()
    reports = _feed(mixed, mixed_devices, seed=0)
    _feed(alone, ["cpu"] * LAYERS, seed=0)
    assert all(r is not None and sum(r.evicted) for r in reports[1:]) and mixed.compactions == 2
    assert [layer.device.type for layer in mixed.layers] == mixed_devices
    assert [t.device.type for layer in mixed.layers for t in layer._buffers()] == [
        d for d in mixed_devices for _ in mixed.layers[0]._buffers()
    ]
    assert mixed.layers[3].has_summary  # the deep layer folded evicted tokens, on its device
    for i in (0, 1):
        assert torch.equal(mixed.layers[i].keys, alone.layers[i].keys)
        assert torch.equal(mixed.layers[i].positions, alone.layers[i].positions)
    for i in (2, 3):
        assert torch.equal(mixed.layers[i].stream_ids, alone.layers[i].stream_ids)
    assert mixed.cache_bytes() == alone.cache_bytes()


# -- admission, per device ------------------------------------------------------------------------------


def test_admission_counts_cache_bytes_per_device(llava_lm, monkeypatch):
    settings = StreamSettings(budget=256)
    total = admission.cache_bytes_for(llava_lm, settings)
    assert admission.cache_bytes_per_device(llava_lm, settings) == {torch.device("cpu"): total}
    cuda = [torch.device("cuda", 0)] * 3 + [torch.device("cuda", 1)]
    monkeypatch.setattr(llava_lm, "layer_devices", lambda: cuda)
    split = admission.cache_bytes_per_device(llava_lm, settings)
    assert split == {cuda[0]: total * 3 // 4, cuda[3]: total // 4} and sum(split.values()) == total
    # 80 GiB cards keep 8 GiB free each: GPU 0 has 40 GiB free (a cap of 32), GPU 1 12 GiB (a cap of 4).
    gib = 2**30
    free = {0: 40 * gib, 1: 12 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[torch.device(device).index], 80 * gib))
    monkeypatch.delenv(admission.CAP_ENV, raising=False)
    assert [admission.default_memory_cap(d) for d in (cuda[0], cuda[3])] == [32 * gib, 4 * gib]
    # GPU 1 binds: it holds a quarter of every stream, so the streams may hold 4 x 4 GiB in all.
    cap = admission.memory_cap_for(llava_lm)
    assert cap == 16 * gib
    assert cap * 3 // 4 <= 32 * gib and cap // 4 <= 4 * gib  # within the cap, no device passes its own
    assert admission.memory_cap_for(llava_lm, cap_mb=100) == 100 * admission.MB  # an explicit cap is the total


# -- options ------------------------------------------------------------------------------------------


def test_placement_options_and_their_variables(monkeypatch):
    from hermes.cli.main import build_parser
    from hermes.cli.options import model_options

    parser = build_parser()
    monkeypatch.delenv("HERMES_DTYPE", raising=False)
    monkeypatch.delenv("HERMES_DEVICE_MAP", raising=False)
    for command in (
        ["stream", "clip.mp4"],
        ["bench"],
        ["eval", "--bench", "ovobench", "--annotations", "a", "--videos", "v"],
    ):
        assert model_options(parser.parse_args(command)) == {"device": None, "dtype": "auto", "device_map": None}
    args = parser.parse_args(["bench", "--dtype", "fp16", "--device-map", "balanced"])
    assert model_options(args) == {"device": None, "dtype": "fp16", "device_map": "balanced"}
    monkeypatch.setenv("HERMES_DTYPE", "fp32")
    monkeypatch.setenv("HERMES_DEVICE_MAP", "auto")
    assert model_options(parser.parse_args(["stream", "clip.mp4"]))["dtype"] == "fp32"
    assert model_options(parser.parse_args(["stream", "clip.mp4", "--dtype", "bf16"]))["dtype"] == "bf16"
    with pytest.raises(ValueError, match="not both"):
        model_options(parser.parse_args(["stream", "clip.mp4", "--device", "cpu"]))  # the map comes from the variable
    monkeypatch.setenv("HERMES_DTYPE", "half")
    with pytest.raises(ValueError, match="HERMES_DTYPE"):
        model_options(parser.parse_args(["stream", "clip.mp4"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["stream", "clip.mp4", "--dtype", "fp8"])


def test_app_placement_flags(monkeypatch):
    import app as app_module

    monkeypatch.delenv("HERMES_DTYPE", raising=False)
    monkeypatch.delenv("HERMES_DEVICE_MAP", raising=False)
    args = app_module.parse_args([])
    assert (args.dtype, args.device_map) == ("auto", None)
    monkeypatch.setenv("HERMES_DTYPE", "bf16")
    monkeypatch.setenv("HERMES_DEVICE_MAP", "auto")
    args = app_module.parse_args([])
    assert (args.dtype, args.device_map) == ("bf16", "auto")
    assert app_module.parse_args(["--dtype", "fp32"]).dtype == "fp32"
    assert app_module.main(["--dtype", "fp8"]) == 2  # refused with one line, before anything loads


def test_the_bf16_measurement_compares_the_two_rates(monkeypatch):
    """The measurement keeps bf16 (half the memory) unless fp32 multiplies clearly faster."""
    rates = {torch.bfloat16: 150e9, torch.float32: 260e9}  # an Intel Xeon with AVX-512 BF16, AMX hidden
    monkeypatch.setattr(gemm, "gemm_peak", lambda dtype, device="cpu", side=gemm.CPU_SIDE: rates[dtype])
    assert not gemm.measure_bf16_pays()
    rates[torch.bfloat16], rates[torch.float32] = 170e9, 60e9  # an AMD EPYC (Zen 4)
    assert gemm.measure_bf16_pays()
    rates[torch.bfloat16], rates[torch.float32] = 230e9, 260e9  # within the noise of fp32: bf16 for its memory
    assert gemm.measure_bf16_pays()


def test_the_thread_that_runs_a_model_flushes_denormals(llava_lm):
    """A forward pass flushes denormals on its thread: a product in fp32's denormal range is then zero
    (Gated DeltaNet's decays reach it, and a CPU computes many times slower there). Each thread
    starts with IEEE arithmetic here (a new thread inherits its creator's setting)."""

    def product(after: Callable[[], object]) -> float:
        out: list[float] = []

        def run() -> None:
            torch.set_flush_denormal(False)
            after()
            out.append((torch.tensor([1e-39]) * 2.0).item())

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return out[0]

    assert product(lambda: None) > 0
    assert product(lambda: StreamingSession(llava_lm)) == 0.0  # its prefix is prefilled there
