"""Timing and memory readings: TTFT, TPOT, prefill and compression time, RSS and GPU memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import torch


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now_ms(device: torch.device | None = None) -> float:
    """A monotonic clock in milliseconds, after the device has caught up."""
    if device is not None:
        sync(device)
    return time.perf_counter() * 1000.0


class Stopwatch:
    """Milliseconds spent in named phases of one piece of work, each timed after the device has
    caught up (`now_ms`); a phase entered twice adds up."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self._ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = now_ms(self.device)
        try:
            yield
        finally:
            self._ms[name] = self._ms.get(name, 0.0) + now_ms(self.device) - start

    def __getitem__(self, name: str) -> float:
        """Milliseconds of phase `name` (0 if it never ran)."""
        return self._ms.get(name, 0.0)

    def total(self, *names: str) -> float:
        return sum(self[name] for name in names)


def process_rss() -> int:
    """Resident memory of this process, in bytes."""
    return psutil.Process().memory_info().rss


@dataclass
class MemoryReading:
    """Memory at one moment: GPU allocated and peak when on a GPU, and the process RSS."""

    rss_bytes: int
    gpu_allocated_bytes: int | None = None
    gpu_peak_bytes: int | None = None


def memory_reading(device: torch.device) -> MemoryReading:
    """Read process RSS and, on CUDA, allocated and peak GPU memory."""
    if device.type == "cuda":
        return MemoryReading(
            process_rss(), torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
        )
    return MemoryReading(process_rss())


def free_cached_memory(device: torch.device | None = None) -> None:
    """Collect garbage, hand the allocator's cached GPU blocks back to the device and the C heap's
    free pages back to the system (`trim_host_memory`).

    After a run, a failed job or a closed stream, so that the next one starts from what is really in
    use. With `device` None, the GPU's cache is emptied if CUDA has been used at all.
    """
    gc.collect()
    if torch.cuda.is_initialized() if device is None else device.type == "cuda":
        torch.cuda.empty_cache()
    trim_host_memory()


def trim_host_memory() -> bool:
    """Hand the free pages of the C heap back to the system: glibc's `malloc_trim(0)`, over every
    thread's arena; whether it ran (not on other C libraries). Without it, the pages of freed
    tensors and frames stay in the arenas of the threads that used them, and in the process's RSS,
    long after the streams that used them are gone."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (looked up once: finding the C library runs ldconfig)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
