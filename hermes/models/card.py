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
    `samples`: whether clips made for this model are bundled with the app (then it starts on them);
    `questions`: questions in words the model was trained on, for the page to suggest (a model that
    reads a few templates takes any other wording as noise); empty: the page's general ones;
    `layers`: where a question's attention goes in this model, per layer, as measured (a lift per
    layer for each part of the stream, `python -m hermes toyworld layers --card`); empty: unmeasured."""

    about: str | None = None
    stream: dict[str, Any] = field(default_factory=dict)
    samples: bool = False
    questions: tuple[str, ...] = ()
    layers: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: str | Path) -> ModelCard:
        """The card in `folder`, or an empty one when there is none."""
        path = Path(folder) / CARD_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            questions = tuple(data.get("questions") or ())
            if not all(isinstance(q, str) and q.strip() for q in questions):
                raise ValueError("its questions must be a list of texts")
            layers = {str(k): [float(v) for v in values] for k, values in dict(data.get("layers") or {}).items()}
            stream, samples = dict(data.get("stream") or {}), bool(data.get("samples", False))
            return cls(data.get("about"), stream, samples, questions, layers)
        except (ValueError, AttributeError, TypeError) as exc:
            raise ModelCardError(f"{path}: not a model card ({exc})") from exc

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / CARD_FILE
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path
