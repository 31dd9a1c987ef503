"""The clips bundled with the app, with what to ask about each.

Two real clips, and each toy world's samples (docs/toyworld.md), each with suggested questions of
three kinds: about the present, about the past (with what each memory answered when the samples
were made), and a standing question to watch. A model whose card names samples of its own (a toy
model) starts on the first of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hermes.models.base import VideoLM
from hermes.models.loading import SAMPLES_FILE, TRAINED_SAMPLES

ASSETS = Path(__file__).resolve().parents[2] / "assets"
REAL_SAMPLES = {
    "Cockatoo, close-up (14 s)": ASSETS / "cockatoo.mp4",
    "Pedestrians on a campus road (40 s)": ASSETS / "sample.mp4",
}


@dataclass(frozen=True)
class Suggestion:
    """A question to try: its kind (real-time, backward, forward), words, right answer, and what
    each memory answered when the sample was made (policy -> words)."""

    kind: str
    text: str
    answer: str | None = None
    answers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Sample:
    title: str
    path: Path
    suggestions: tuple[Suggestion, ...] = ()


def read_samples(folder: str | Path) -> list[Sample]:
    """The samples listed in `folder`'s samples.json (none when there is no such file)."""
    path = Path(folder) / SAMPLES_FILE
    if not path.is_file():
        return []
    samples = []
    for entry in json.loads(path.read_text()):
        asked = [
            Suggestion(q["kind"], q["text"], q["answer"], tuple(q.get("answers", {}).items()))
            for q in entry["questions"]
        ]
        watch = entry.get("watch")
        if watch:
            asked.append(Suggestion(watch["kind"], watch["text"]))
        samples.append(Sample(entry["title"], Path(folder) / entry["file"], tuple(asked)))
    return samples


def bundled_samples(lm: VideoLM | None = None) -> dict[str, Sample]:
    """Every bundled sample by title: the model's own first (a toy model whose card says it has
    them), then the real clips, then the toy worlds'."""
    real = [Sample(title, path) for title, path in REAL_SAMPLES.items()]
    toys = {alias: read_samples(folder) for alias, folder in TRAINED_SAMPLES.items()}
    first = toys.get(lm.source, []) if lm is not None and lm.card.samples else []
    ordered = [*first, *real, *(s for toy in toys.values() for s in toy if s not in first)]
    return {s.title: s for s in ordered}


def suggestions_markdown(sample: Sample) -> str:
    """The sample's suggested questions as a short list for the page ('' when it has none)."""
    if not sample.suggestions:
        return ""
    lines = ["**Try asking** (at the end of the clip):"]
    for s in sample.suggestions:
        if s.kind == "forward":
            lines.append(f"- *watch* (a standing question, read after every chunk): {s.text}")
            continue
        said = ", ".join(f"{p} said {w}" for p, w in s.answers)
        lines.append(f"- *{s.kind}*: {s.text} ({s.answer}" + (f"; {said})" if said else ")"))
    return "\n".join(lines)
