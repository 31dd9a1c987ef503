"""Options shared by the commands, each defined once, and the HermesConfig they describe."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hermes.memory.config import HermesConfig

if TYPE_CHECKING:
    import torch

POLICIES = ("hermes", "fifo", "full")
MODEL_HELP = "hub id, local folder, 'tiny' or 'tiny-qwen'"
FPS_HELP = "sampling rate (default: 0.5 LLaVA-OV, 1 Qwen2.5-VL)"


def add_memory_options(
    p: argparse.ArgumentParser,
    *,
    model_default: str | None = None,
    model_help: str = MODEL_HELP,
    policy: bool = True,
    fps_help: str = FPS_HELP,
    reindex_default: str | None = "lazy",
    reindex_help: str | None = None,
) -> None:
    """--model, --policy, --budget, --chunk-frames, --fps, --reindex and --device.

    A command may change the model's default and the help of --model, --fps and --reindex, or leave
    out --policy (bench takes a list of policies instead).
    """
    p.add_argument("--model", default=model_default, help=model_help)
    if policy:
        p.add_argument("--policy", choices=POLICIES, default="hermes")
    p.add_argument("--budget", type=int, default=HermesConfig.budget, help="video tokens kept per layer, |M|")
    p.add_argument("--chunk-frames", type=int, default=HermesConfig.chunk_frames)
    p.add_argument("--fps", type=float, default=None, help=fps_help)
    p.add_argument("--reindex", choices=["lazy", "eager"], default=reindex_default, help=reindex_help)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")


def config_from_args(
    args: argparse.Namespace, default_fps: float = HermesConfig.fps, default_reindex: str = "lazy"
) -> HermesConfig:
    """The HermesConfig the memory options ask for (it validates them).

    Without --fps, `default_fps`: call it once before the model loads, so that a bad option fails
    in seconds rather than after minutes of loading, and again with the model's `default_fps`.
    """
    return HermesConfig(
        budget=args.budget,
        chunk_frames=args.chunk_frames,
        fps=default_fps if args.fps is None else args.fps,
        reindex=args.reindex or default_reindex,
    )


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--threads and --no-progress, for the long-running commands (bench, eval)."""
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on a CPU; 0: torch's own)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def check_run_options(args: argparse.Namespace) -> None:
    """Refuse a negative --threads before the model loads (torch would silently keep its own count)."""
    if args.threads is not None and args.threads < 0:
        raise ValueError("--threads must be 0 (torch's default) or more")


def set_threads(threads: int | None, device: torch.device) -> None:
    """Apply --threads for the device the model landed on."""
    import torch

    # One thread by default on a CPU: on a 2-vCPU VM, two OpenMP threads made the TTFT of the tiny
    # model jump between 25 and 440 ms, against a steady 8-12 ms with one.
    if threads is None:
        threads = 1 if device.type == "cpu" else 0
    if threads > 0:
        torch.set_num_threads(threads)
