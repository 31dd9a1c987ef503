"""CPU arithmetic: how fast this machine multiplies matrices (the GEMM peak), whether bf16 beats
fp32 on its CPU, and denormal numbers flushed to zero on the threads that run a model.

A CPU flag says that bf16 arithmetic exists, not that it is faster. With AMX it is several times
faster than fp32; with AVX-512 BF16 alone it depends on the chip: about 3x fp32 on an AMD EPYC
(Zen 4) measured here, but 0.6x on an Intel Xeon whose hypervisor hides AMX, where a model ran 1.4x
slower in bf16. So `--dtype auto` measures before it trusts the flag, once per machine: the
verdict is kept in the HERMES cache, so that every process there computes in the same precision
(the shards of one evaluation must: two quick measurements in processes that share the cores can
fall on either side of the line). Delete the file to measure again, or pass --dtype.
"""

from __future__ import annotations

import fcntl
import functools
import json
import threading
import time
from pathlib import Path

import torch

from hermes.models.cachedir import cache_root

GEMM_REPEATS = 5
# bf16 halves the weights and the cache, so it is kept unless fp32 is clearly faster (past the
# noise of two quick measurements).
BF16_KEEP_RATIO = 0.8
# A CPU's measurement: square matrices large enough to run at the peak, and quick (about 0.2 s).
CPU_SIDE = 1024


def gemm_peak(dtype: torch.dtype, device: torch.device | str = "cpu", side: int = CPU_SIDE) -> float:
    """FLOP/s of the fastest of a few (side x side) @ (side x side) multiplies in `dtype` on
    `device`, with torch's current threads."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(side, side, generator=gen, device=device).to(dtype)
    b = torch.randn(side, side, generator=gen, device=device).to(dtype)
    torch.matmul(a, b)  # first-call costs (library init, page faults) belong to no measurement
    best = float("inf")
    for _ in range(GEMM_REPEATS):
        sync(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * side**3 / best


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


VERDICT_FILE = "cpu-bf16.json"
# CPU flags of native bf16 matrix arithmetic (Intel AMX, AVX-512 BF16); without them a CPU emulates
# bf16 and fp32 is the faster choice.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_has_bf16(cpuinfo: str | Path = CPUINFO) -> bool:
    """Whether this CPU computes bf16 natively (AMX or AVX-512 BF16), from the kernel's CPU flags
    (False where there are none to read: not Linux)."""
    return bool(_bf16_flags(cpuinfo))


@functools.cache
def cpu_bf16_pays() -> bool:
    """Whether bf16 matrix multiplies on this CPU run at least `BF16_KEEP_RATIO` of fp32's rate:
    the verdict kept for this CPU and torch in the HERMES cache, measured by whichever process asks
    first (the others wait on the file's lock and read it). Measured per process where the cache
    cannot be written."""
    path = cache_root() / VERDICT_FILE
    key = f"{cpu_model()} | {' '.join(_bf16_flags()) or 'no bf16'} | torch {torch.__version__}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            handle.seek(0)
            verdicts = _verdicts(handle.read())
            if key not in verdicts:
                verdicts[key] = measure_bf16_pays()
                handle.seek(0)
                handle.truncate()
                json.dump(verdicts, handle, indent=1)
            return verdicts[key]
    except OSError:
        return measure_bf16_pays()


def measure_bf16_pays() -> bool:
    """Measure now, with torch's threads at the time: bf16's GEMM peak against fp32's."""
    return gemm_peak(torch.bfloat16, "cpu") >= BF16_KEEP_RATIO * gemm_peak(torch.float32, "cpu")


def cpu_model(cpuinfo: str | Path = CPUINFO) -> str:
    """The CPU's model name as the kernel reports it ('unknown CPU' where it cannot be read)."""
    return _cpuinfo_field("model name", cpuinfo) or "unknown CPU"


def _bf16_flags(cpuinfo: str | Path = CPUINFO) -> list[str]:
    # A virtual machine's model name can hide what its hypervisor lets through (AMX or not), so the
    # verdict's key names the flags too.
    flags = _cpuinfo_field("flags", cpuinfo).split()
    return [flag for flag in CPU_BF16_FLAGS if flag in flags]


def _cpuinfo_field(name: str, cpuinfo: str | Path) -> str:
    # The first processor's line `name : value`; "" where there is none or the file cannot be read.
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return ""
    values = [line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == name]
    return values[0] if values else ""


def _verdicts(text: str) -> dict[str, bool]:
    # A file from an older version or a torn write measures again rather than failing the load.
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, bool)} if isinstance(data, dict) else {}


_flushing = threading.local()


def flush_denormals() -> None:
    """Have the calling thread's CPU treat denormal floats as zero, once per thread.

    Gated DeltaNet's reference code multiplies by decays such as exp(-400), whose products land in
    fp32's denormal range (below 1.2e-38), where an x86 core computes many times slower: the batched
    products of its recurrent state took 1.1 ms instead of 0.1 (Qwen3.5-0.8B's shapes, the values a
    guidance pass gives them), a fifth of a 4-frame chunk's prefill and compression. Values that
    small change no result. The setting is the thread's own (the worker thread that runs the
    model sets it for itself); torch's own threads matter less, since these small products run on
    the caller's."""
    if not getattr(_flushing, "done", False):
        torch.set_flush_denormal(True)
        _flushing.done = True
