"""The model the app serves: the requested one, or a random-weight stand-in when it cannot load."""

from __future__ import annotations

import logging

from hermes.models.base import VideoLM
from hermes.models.loading import DEFAULT_MODEL, ModelLoadError, load_video_lm

FALLBACK_MODEL = "tiny-24"

__all__ = ["DEFAULT_MODEL", "FALLBACK_MODEL", "load_model_or_fallback"]

log = logging.getLogger(__name__)


def load_model_or_fallback(
    name: str = DEFAULT_MODEL,
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | None = None,
) -> tuple[VideoLM, str | None]:
    """(model, load error or None): the requested model, or FALLBACK_MODEL (a LLaVA-OneVision with
    the 0.5B checkpoint's 24 layers and random weights) and why the requested one could not load.

    `dtype` ('auto', 'bf16', 'fp16', 'fp32') and `device_map` ('auto', ...) as for load_video_lm;
    a bad value raises ValueError. The small fallback goes to one device, in the same dtype.
    """
    try:
        return load_video_lm(name, device=device, dtype=dtype, device_map=device_map), None
    except ModelLoadError as exc:
        log.warning("%s; starting on %s (random weights) instead", exc, FALLBACK_MODEL)
        return load_video_lm(FALLBACK_MODEL, device=device, dtype=dtype), str(exc)
