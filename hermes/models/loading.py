"""Load a video LLM by hub id, local folder or alias, with clear errors when it cannot be had."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
from transformers.utils import logging as hf_logging

from hermes.models.base import VideoLM
from hermes.models.llava_onevision import LlavaOnevision
from hermes.models.qwen2_5_vl import Qwen25VL

DEFAULT_MODEL = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"
ADAPTERS: dict[str, type[VideoLM]] = {cls.arch: cls for cls in (LlavaOnevision, Qwen25VL)}
# Aliases for tiny random-weight models of the real architectures: (arch, decoder layers).
TINY_ALIASES: dict[str, tuple[str, int]] = {
    "tiny": ("llava_onevision", 4),
    "tiny-qwen": ("qwen2_5_vl", 4),
    # The app's offline fallback: the 0.5B checkpoint's 24 layers, so its tier map looks real.
    "tiny-24": ("llava_onevision", 24),
}
RANDOM_MARKER = "HERMES_RANDOM_WEIGHTS"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


def pick_device(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """GPU in bf16 (fp16 where bf16 is missing) when there is one, else CPU in fp32."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return dev, torch.float32


def _hub_reachable(timeout: float = 2.0) -> bool:
    # A quick probe, so that an offline machine fails in seconds instead of retrying downloads.
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve(name: str) -> tuple[str, bool]:
    """Local path or hub id for `name`, and whether it is a known random-weight model."""
    if name in TINY_ALIASES:
        from hermes.models.tiny import ensure_tiny

        arch, layers = TINY_ALIASES[name]
        return str(ensure_tiny(arch, num_layers=layers)), True
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name}: this folder has no config.json, so it is not a transformers checkpoint")
        return str(path), (path / RANDOM_MARKER).exists()
    return name, False


def _load_config(source: str):
    try:
        return AutoConfig.from_pretrained(source, local_files_only=True), True
    except (OSError, ValueError):
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
        raise ModelLoadError(
            f"Cannot load model {source!r}: it is not in the local Hugging Face cache and {why}. "
            f"Download it on a connected machine (huggingface-cli download {source}), pass a local folder, "
            "or use --model tiny for a random-weight model of the same architecture."
        )
    try:
        return AutoConfig.from_pretrained(source), False
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot load model {source!r}: {exc}") from exc


def load_video_lm(name: str = DEFAULT_MODEL, device: str | None = None) -> VideoLM:
    """Load a supported video LLM (LLaVA-OneVision or Qwen2.5-VL) for streaming."""
    if not name or not name.strip():
        raise ModelLoadError("No model given: pass a hub id, a local folder, 'tiny' or 'tiny-qwen'.")
    source, random_weights = resolve(name.strip())
    config, local = _load_config(source)
    arch = getattr(config, "model_type", None)
    if arch not in ADAPTERS:
        raise ModelLoadError(
            f"Model {name!r} is a {arch!r} model; HERMES Live supports "
            f"{', '.join(ADAPTERS)} (LlavaOnevisionForConditionalGeneration, Qwen2_5_VLForConditionalGeneration)."
        )
    dev, dtype = pick_device(device)
    hf_logging.disable_progress_bar()  # per-shard bars are noise in a CLI transcript and in logs
    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=local)
        model = AutoModelForImageTextToText.from_pretrained(
            source, local_files_only=local, dtype=dtype, attn_implementation="sdpa"
        ).to(dev)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot load model {name!r}: {exc}") from exc
    return wrap(model, processor, source=name, random_weights=random_weights)


def wrap(model: Any, processor: Any, source: str = "", random_weights: bool = False) -> VideoLM:
    """The adapter for a model and processor loaded with `transformers`, by the model's type."""
    arch = getattr(model.config, "model_type", None)
    if arch not in ADAPTERS:
        raise ModelLoadError(
            f"{type(model).__name__} ({arch!r}) is not supported; HERMES Live supports {', '.join(ADAPTERS)}"
        )
    return ADAPTERS[arch](
        model, processor, source=source or getattr(model, "name_or_path", ""), random_weights=random_weights
    )
