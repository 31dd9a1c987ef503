"""The question types the benchmark readers produce, and what the readers share.

A reader returns the questions it could parse and the entries it could not (`Problem`, with the
reason), so that a malformed entry is reported and counted, never fatal; a file that is not in any
layout the benchmark has raises one AnnotationError naming the layouts it accepts. Options are
stored without their letters; the answer of a multiple-choice question is always a letter. Each
question carries its benchmark's prompt (`hermes.eval.prompts`) and the name of the rule that
scores its generated answer (`hermes.eval.scorers`).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LETTERS = string.ascii_uppercase
_LETTERED = re.compile(r"^\s*\(?([A-Z])\s*[.):]\s*(.*)$", re.S)


class AnnotationError(ValueError):
    """An annotation file that cannot be read at all (missing, not JSON, not in a known layout)."""


@dataclass(frozen=True)
class VideoDir:
    """A folder under the video root where a benchmark keeps some of its videos. `whole`: the files
    there are already cut to the question's clip (lmms-eval's MVBench segments), so the clip's
    start and end do not apply to them."""

    folder: str
    whole: bool = False


@dataclass(frozen=True)
class Item:
    """One multiple-choice question about one video.

    `at_s` is when the question is asked, in seconds of the video (None: after the whole clip).
    `start_s`/`end_s` bound the part of the video that is streamed. `prompt` is the benchmark's own
    wording of the question; `rule` names the scorer of its generated answer. `video_dirs` are
    folders under the video root where the video may also sit, and `frames_fps` the rate of the
    benchmark's frame folders, when it has some.
    """

    qid: str
    task: str
    video: str
    question: str
    options: tuple[str, ...]
    answer: str
    prompt: str = ""
    rule: str = ""
    at_s: float | None = None
    start_s: float = 0.0
    end_s: float | None = None
    group: str = ""
    video_dirs: tuple[VideoDir, ...] = ()
    frames_fps: float | None = None


@dataclass(frozen=True)
class ForwardItem(Item):
    """One test point of an OVO-Bench forward active responding task, asked at `at_s` (its
    `realtime`) with the benchmark's prompt. `question` fills the prompt; `answer` is "Yes" or "No"
    (SSR: the step is under way then; CRR: the clue has been shown by then) or the count so far (REC),
    and there are no options."""


@dataclass(frozen=True)
class ProactiveItem(Item):
    """A StreamingBench proactive-output task: streamed from `start_s` (its time_stamp), polled
    every second with `prompt` (is it time to output `answer`?) until the poll says yes or
    `expected_s` (the reference time) plus the polling margin has passed; then asked `question`."""

    expected_s: float = 0.0


@dataclass(frozen=True)
class Problem:
    """An entry that was skipped, and why."""

    qid: str
    task: str
    reason: str


class EntryError(ValueError):
    """One entry is malformed (becomes a Problem)."""


def text_field(entry: dict, key: str) -> str:
    """A non-empty string field, stripped."""
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise EntryError(f"no {key!r}")
    return value.strip()


def raw_options(entry: dict, key: str, at_least: int = 2) -> list[str]:
    """The option strings as the file writes them."""
    raw = entry.get(key)
    if isinstance(raw, tuple):
        raw = list(raw)
    if (
        not isinstance(raw, list)
        or len(raw) < at_least
        or not all(isinstance(o, str | int | float) and not isinstance(o, bool) for o in raw)
    ):
        raise EntryError(f"{key!r} is not a list of at least {at_least} options")
    if len(raw) > len(LETTERS):
        raise EntryError(f"{len(raw)} options, more than there are letters")
    return [str(o) for o in raw]


def strip_letters(options: Sequence[str]) -> tuple[str, ...]:
    """Option texts, their "A. " prefixes removed when every option has one, in order."""
    texts = [o.strip() for o in options]
    matches = [_LETTERED.match(t) for t in texts]
    if all(matches) and [m.group(1) for m in matches] == list(LETTERS[: len(texts)]):
        texts = [m.group(2).strip() for m in matches]
    return tuple(texts)


def letter_field(value: Any, n_options: int) -> str:
    """The answer letter, one of the first `n_options`."""
    letter = str(value).strip().upper()[:1] if value is not None else ""
    if not letter or letter not in LETTERS[:n_options]:
        raise EntryError(f"answer {value!r} is not one of the letters A-{LETTERS[n_options - 1]}")
    return letter


def parse_time(value: Any) -> float:
    """Seconds from 'HH:MM:SS', 'MM:SS', '12.5' or a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?(:\d+(\.\d+)?){0,2}\s*", value):
        seconds = 0.0
        for part in value.strip().split(":"):
            seconds = seconds * 60 + float(part)
    else:
        raise EntryError(f"time {value!r} is not HH:MM:SS or seconds")
    if seconds < 0:
        raise EntryError(f"time {value!r} is negative")
    return seconds


# -- files --------------------------------------------------------------------------------------------


def _load_parquet(path: Path) -> list:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise AnnotationError(
            f"{path.name} is Parquet, and reading Parquet needs pyarrow: pip install pyarrow"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises ArrowInvalid, ArrowIOError, OSError
        raise AnnotationError(f"{path}: not a readable Parquet file ({exc})") from None


def load_data(path: Path) -> Any:
    """A JSON document, JSON lines (one object per line) or a Parquet table (rows as dicts)."""
    if not path.is_file():
        raise AnnotationError(f"annotation file not found: {path}")
    if path.suffix == ".parquet":
        return _load_parquet(path)
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise AnnotationError(f"{path}: not JSON or JSON lines ({first})") from None


def records(data: Any, path: Path) -> list:
    """The list of entries of a document: a list, a list wrapped alone in an object (some exports
    write {"data": [...]}), or one object (a JSON-lines file of one line)."""
    if isinstance(data, dict):
        values = list(data.values())
        return values[0] if len(values) == 1 and isinstance(values[0], list) else [data]
    if not isinstance(data, list):
        raise AnnotationError(f"{path}: expected a list of entries, got {type(data).__name__}")
    return data


def check_layout(entries: list, path: Path, keys: Sequence[str], bench: str, layouts: str) -> None:
    """One error for a file none of whose entries has any of `keys`: it is some other layout (or
    another benchmark's file), and every entry would only be reported as malformed."""
    if entries and not any(isinstance(e, dict) and any(k in e for k in keys) for e in entries):
        raise AnnotationError(f"{path.name} is not in a layout {bench} reads. It accepts: {layouts}")


def collect(
    entries: list, parse: Callable[[int, Any], list[Item]], qid_of: Callable[[int, Any], str]
) -> tuple[list[Item], list[Problem]]:
    """Parse each entry; one that raises EntryError becomes a Problem."""
    items: list[Item] = []
    problems: list[Problem] = []
    for index, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict):
                raise EntryError("entry is not an object")
            items += parse(index, entry)
        except EntryError as exc:
            task = (entry.get("task") or entry.get("task_type")) if isinstance(entry, dict) else None
            problems.append(Problem(qid_of(index, entry), str(task or "unknown"), str(exc)))
    return items, problems
