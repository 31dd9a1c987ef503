"""CPU arithmetic: how fast this machine multiplies matrices (the GEMM peak), whether bf16 beats
fp32 on its CPU, and denormal numbers flushed to zero on the threads that run a model.

A CPU flag says that bf16 arithmetic exists, not that it is faster. With AMX it is several times
faster than fp32; with AVX-512 BF16 alone it depends on the chip: about 3x fp32 on an AMD EPYC
(Zen 4) measured here, but 0.6x on an Intel Xeon whose hypervisor hides AMX, where a model ran 1.4x
slower in bf16. So `--dtype auto` measures, once per process, before it trusts the flag.
"""

from __future__ import annotations

import functools
import threading
import time

import torch

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


@functools.cache
def cpu_bf16_pays() -> bool:
    """Whether bf16 matrix multiplies on this CPU run at least `BF16_KEEP_RATIO` of fp32's rate
    (measured once per process, with torch's threads at the time)."""
    bf16 = gemm_peak(torch.bfloat16, "cpu")
    fp32 = gemm_peak(torch.float32, "cpu")
    return bf16 >= BF16_KEEP_RATIO * fp32


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
