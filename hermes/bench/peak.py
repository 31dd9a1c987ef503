"""Where a chunk's time goes: the machine's matrix-multiply peak and the share of it a model reaches.

A "missed" ingest target should say why. The benchmark measures, once per run, how fast this
machine multiplies large matrices in bf16 and in fp32 (its GEMM peak, a ceiling no model beats),
counts the floating-point operations of one chunk (the vision encoder's and the language model's
apart, with torch's FLOP counter on a throwaway session), and times the vision encoder within
every chunk's prefill (`VisionTimer`). FLOPs over seconds, over the peak, is the share of the
machine a model uses: a model near its peak can only get faster by doing less work (fewer or
smaller frames, a smaller model), one far below it loses time outside the big multiplies.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from hermes.engine.chunk import Chunk
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.models.gemm import CPU_SIDE, gemm_peak, sync

# A GPU needs far larger matrices than a CPU to run at its peak, or kernel launches are all that is timed.
GEMM_SIDE_ACCELERATOR = 8192
# The modules that encode frames, by the name the backbones give them (LLaVA-OneVision: SigLIP and
# its projector; the Qwen-VL family: one `visual` module).
VISION_MODULES = ("visual", "vision_tower", "multi_modal_projector")


def gemm_peaks(device: torch.device) -> dict[str, float]:
    """The GEMM peak in bf16 and fp32, in GFLOP/s."""
    side = CPU_SIDE if device.type == "cpu" else GEMM_SIDE_ACCELERATOR
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    return {name: gemm_peak(dtype, device, side) / 1e9 for name, dtype in dtypes.items()}


def vision_modules(lm: VideoLM) -> list[torch.nn.Module]:
    """The modules of `lm` that encode frames."""
    inner = lm.model.model
    return [getattr(inner, name) for name in VISION_MODULES if getattr(inner, name, None) is not None]


class VisionTimer:
    """Context manager: wall milliseconds spent in the vision encoder, summed until `take`."""

    def __init__(self, lm: VideoLM) -> None:
        self.modules = vision_modules(lm)
        self.device = lm.device
        self._ms = 0.0
        self._start = 0.0
        self._handles: list = []

    def __enter__(self) -> VisionTimer:
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._begin))
            self._handles.append(module.register_forward_hook(self._end))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _begin(self, module: torch.nn.Module, args: tuple) -> None:
        sync(self.device)
        self._start = time.perf_counter()

    def _end(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        sync(self.device)
        self._ms += (time.perf_counter() - self._start) * 1000

    def take(self) -> float:
        """The milliseconds since the last `take`, and start again from zero."""
        ms, self._ms = self._ms, 0.0
        return ms


def chunk_flops(lm: VideoLM, config: HermesConfig, chunk: Chunk) -> dict[str, int]:
    """The FLOPs of prefilling `chunk`: the vision encoder's and the language model's, counted on a
    throwaway session with `config` (its first chunk: nothing cached before it)."""
    session = StreamingSession(lm, config, policy="fifo")
    with FlopCounterMode(display=False) as counter:
        session.ingest(chunk)
    flops = counter.get_flop_counts()
    total = sum(flops.get("Global", {}).values())
    vision = sum(
        sum(counts.values())
        for name, counts in flops.items()
        if name.count(".") == 2 and name.rsplit(".", 1)[-1] in VISION_MODULES
    )
    return {"vision": int(vision), "language_model": int(total - vision)}
