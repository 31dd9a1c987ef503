"""The model the app serves: the requested one (else the device's default); when it cannot load,
the toy model trained in this repository, and without that a random-weight stand-in of the
default's architecture."""

from __future__ import annotations

import logging

from hermes.models.base import VideoLM
from hermes.models.loading import (
    AUTO_DTYPE_HELP,
    CPU_DEFAULT_MODEL,
    DEFAULT_MODEL,
    ModelLoadError,
    default_model,
    load_video_lm,
    requested_model,
)

# Random weights, each default checkpoint's architecture and 24 layers.
FALLBACK_MODELS = {DEFAULT_MODEL: "tiny-24", CPU_DEFAULT_MODEL: "tiny-qwen35-24"}
FALLBACK_MODEL = FALLBACK_MODELS[DEFAULT_MODEL]
# Before random weights: a toy model (docs/toyworld.md), whose answers on its clips are right or wrong;
# world v2's first (several objects at once, held-out wordings), then the easy world's. Each is under
# a million parameters trained in fp32, so it runs in fp32 whatever the dtype asked for.
TRAINED_FALLBACKS = ("toy2", "toy")

__all__ = [
    "AUTO_DTYPE_HELP",
    "CPU_DEFAULT_MODEL",
    "DEFAULT_MODEL",
    "FALLBACK_MODEL",
    "fallback_model",
    "keep_up_hint",
    "load_model_or_fallback",
    "requested_model",
]

log = logging.getLogger(__name__)


def fallback_model(name: str, device: str | None = None) -> str:
    """The random-weight stand-in for `name`: a default checkpoint's own architecture, any other
    model the device default's."""
    return FALLBACK_MODELS.get(name) or FALLBACK_MODELS[default_model(device)]


def load_model_or_fallback(
    name: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | None = None,
) -> tuple[VideoLM, str | None]:
    """(model, load error or None): `name` (default: the device's default model); when it cannot
    load, a trained toy model (`TRAINED_FALLBACKS`, the first there is), else its random-weight
    stand-in (`fallback_model`: a default checkpoint's architecture with its 24 layers), with why the
    requested one could not load.

    `dtype` ('auto', 'bf16', 'fp16', 'fp32') and `device_map` ('auto', ...) as for load_video_lm;
    a bad value raises ValueError. A fallback goes to one device.
    """
    name = name or default_model(device)
    try:
        return load_video_lm(name, device=device, dtype=dtype, device_map=device_map), None
    except ModelLoadError as exc:
        reason = str(exc)
    for toy in TRAINED_FALLBACKS:
        try:
            lm = load_video_lm(toy, device=device, dtype="fp32")
            log.warning("%s; starting on the toy model trained here (%s) instead", reason, toy)
            return lm, reason
        except ModelLoadError as missing:  # a checkout without this toy model's folder
            log.warning("%s", missing)
    fallback = fallback_model(name, device)
    log.warning("%s; starting on %s (random weights) instead", reason, fallback)
    return load_video_lm(fallback, device=device, dtype=dtype), reason


def keep_up_hint(source: str, device_type: str) -> str:
    """What would keep up with the video when the model `source` falls behind on `device_type`."""
    if device_type == "cpu" and source != CPU_DEFAULT_MODEL:
        # 0.77 to 1.22 frames/s on 2 cores, by the processor and its load (docs/performance.md): "about".
        fastest = f"{CPU_DEFAULT_MODEL} reads about 1 frame/s on 2 CPU cores"
        return f"{fastest}; a GPU or fewer frames per second would keep up"
    if device_type == "cpu":
        return "a GPU or fewer frames per second would keep up"
    return "a smaller model or fewer frames per second would keep up"
