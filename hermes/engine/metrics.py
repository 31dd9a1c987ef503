"""Timing and memory readings: TTFT, TPOT, prefill and compression time, RSS and GPU memory."""

from __future__ import annotations

import gc
import time
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
    """Collect garbage and hand the allocator's cached GPU blocks back to the device.

    After a run or a failed job, so that the next one starts from what is really in use. With
    `device` None, the GPU's cache is emptied if CUDA has been used at all.
    """
    gc.collect()
    if torch.cuda.is_initialized() if device is None else device.type == "cuda":
        torch.cuda.empty_cache()
