"""What a checkpoint made for HERMES Live says about itself beyond transformers' own files.

A folder may hold `hermes.json`: a line for viewers about what the model knows, and the stream
settings it was trained for (frames per second, frames per chunk, the budget its benchmark uses).
The toy world's model writes one (docs/toyworld.md); a checkpoint without the file has an empty card.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CARD_FILE = "hermes.json"


class ModelCardError(ValueError):
    """A `hermes.json` that cannot be read; the message names the file and why."""


@dataclass(frozen=True)
class ModelCard:
    """`about`: one line for viewers; `stream`: defaults for a stream's settings (field -> value);
    `samples`: whether clips made for this model are bundled with the app (then it starts on them)."""

    about: str | None = None
    stream: dict[str, Any] = field(default_factory=dict)
    samples: bool = False

    @classmethod
    def read(cls, folder: str | Path) -> ModelCard:
        """The card in `folder`, or an empty one when there is none."""
        path = Path(folder) / CARD_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            return cls(data.get("about"), dict(data.get("stream") or {}), bool(data.get("samples", False)))
        except (ValueError, AttributeError, TypeError) as exc:
            raise ModelCardError(f"{path}: not a model card ({exc})") from exc

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / CARD_FILE
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path
