"""Options shared by the commands, each defined once, and the HermesConfig they describe."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hermes.engine.methods import parse_params as parse_params  # the CLI's name for it
from hermes.memory.config import HermesConfig

FPS_HELP = "sampling rate (default: 0.5 LLaVA-OV, 1 Qwen2.5-VL and Qwen3-VL)"
DTYPE_ENV = "HERMES_DTYPE"
DEVICE_MAP_ENV = "HERMES_DEVICE_MAP"


def add_memory_options(
    p: argparse.ArgumentParser,
    *,
    model_default: str | None = None,
    model_help: str | None = None,
    policy: bool = True,
    fps_help: str = FPS_HELP,
    reindex_default: str | None = "lazy",
    reindex_help: str | None = None,
) -> None:
    """--model, --policy, --budget, --chunk-frames, --fps, --reindex, --device, --dtype and --device-map.

    A command may change the model's default and the help of --model, --fps and --reindex, or leave
    out --policy (bench takes a list of policies instead).
    """
    p.add_argument("--model", default=model_default, help=model_help or local_model_help())
    if policy:
        from hermes.engine.methods import DEFAULT_POLICY, policy_names

        p.add_argument(
            "--policy",
            default=DEFAULT_POLICY,
            help=f"memory policy, one of {', '.join(policy_names())} (default: %(default)s)",
        )
        add_param_option(p)
    p.add_argument("--budget", type=int, default=HermesConfig.budget, help="video tokens kept per layer, |M|")
    p.add_argument("--chunk-frames", type=int, default=HermesConfig.chunk_frames)
    p.add_argument("--fps", type=float, default=None, help=fps_help)
    p.add_argument("--reindex", choices=["lazy", "eager"], default=reindex_default, help=reindex_help)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    from hermes.models.loading import AUTO_DTYPE_HELP, DEVICE_MAPS, DTYPE_CHOICES

    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default=None,
        help=f"precision of the weights and the cache; {AUTO_DTYPE_HELP} (default: ${DTYPE_ENV}, else auto)",
    )
    p.add_argument(
        "--device-map",
        choices=DEVICE_MAPS,
        default=None,
        help="spread the model over all visible GPUs (and the CPU when they are full) with accelerate, each layer's "
        f"memory on its layer's GPU (default: ${DEVICE_MAP_ENV}, else the whole model on --device)",
    )


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """load_video_lm's device, dtype and device_map for --device, --dtype and --device-map (or their
    environment variables), checked before the model loads."""
    from hermes.models.loading import DEVICE_MAPS, DTYPE_CHOICES

    dtype = args.dtype or os.environ.get(DTYPE_ENV) or "auto"
    device_map = args.device_map or os.environ.get(DEVICE_MAP_ENV) or None
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"${DTYPE_ENV}={dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
    if device_map is not None and device_map not in DEVICE_MAPS:
        raise ValueError(f"${DEVICE_MAP_ENV}={device_map!r} is not one of {', '.join(DEVICE_MAPS)}")
    if device_map is not None and args.device is not None:
        raise ValueError("give --device or --device-map, not both: a device map places every layer itself")
    return {"device": args.device, "dtype": dtype, "device_map": device_map}


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


def local_model_help() -> str:
    """What --model takes besides a hub id: a local folder or a tiny alias."""
    from hermes.models.loading import tiny_names

    return f"hub id, local folder, {tiny_names(chr(39))}"


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--threads and --no-progress, for the long-running commands (bench, eval)."""
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (default 0: torch's own, every core, as the app runs; 1 gives steadier timings "
        "on a small shared machine)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def check_run_options(args: argparse.Namespace) -> None:
    """Refuse a negative --threads before the model loads (torch would silently keep its own count)."""
    if args.threads < 0:
        raise ValueError("--threads must be 0 (torch's default) or more")


def add_param_option(p: argparse.ArgumentParser) -> None:
    """--param METHOD.FIELD=VALUE, repeatable: a method's constant (infinipot-v.tar_ratio=0.3)."""
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="METHOD.FIELD=VALUE",
        help="override one constant of a method or input filter, e.g. infinipot-v.tar_ratio=0.3, "
        "sink.sinks=8, simplestream.frames=8, rekv.similarity=cosine, dtd.threshold=0.7 (repeatable)",
    )
