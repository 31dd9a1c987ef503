"""Where HERMES keeps what it builds or measures once per machine (tiny checkpoints, tokenizers,
the CPU's bf16 verdict): $HERMES_CACHE, else ~/.cache/hermes."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Root of the HERMES cache: $HERMES_CACHE, else ~/.cache/hermes."""
    env = os.environ.get("HERMES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hermes"
