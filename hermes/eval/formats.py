"""Readers for the benchmark annotation files, into one question type.

Each reader returns the questions it could parse and the entries it could not (with the reason),
so that a malformed entry is reported and counted, never fatal. Options are stored without their
letters; the answer is always a letter.

- StreamingBench (real-time): [{video_path, questions: [{task_type, question, time_stamp
  "HH:MM:SS", options ["A. ..."], answer "C"}]}], asked at time_stamp while streaming.
- OVO-Bench: backward and real-time tasks [{id, task, video, realtime (s), question, options
  [...], gt (index)}], asked at realtime while streaming; forward active responding tasks (REC,
  SSR, CRR) [{id, task, video, ..., test_info: [{realtime, ...}]}], one yes/no or count question
  per test point, asked at its realtime with OVO-Bench's own prompt (ForwardItem).
- Video-MME: [{videoID, duration, question_id, task_type, question, options ["A. ..."],
  answer}] (JSON list or JSON lines), asked after the whole video.
- MVBench: one JSON per task of [{video, question, candidates, answer (text), start?, end?}],
  asked after the clip (from start to end when given).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LETTERS = string.ascii_uppercase
_LETTERED = re.compile(r"^\s*\(?([A-Z])\s*[.):]\s*(.*)$", re.S)

OVO_BACKWARD = ("EPM", "ASI", "HLD")
OVO_REAL_TIME = ("STU", "OJR", "ATR", "ACR", "OCR", "FPD")
OVO_FORWARD = ("REC", "SSR", "CRR")
# OVO-Bench's prompts for its forward tasks, verbatim from its constant.py (JoeLeelyf/OVO-Bench),
# typos included: a model is scored on the benchmark's own wording. REC's {} is "How many times did
# they ACTIVITY?", SSR's the step, CRR's the question.
OVO_FORWARD_PROMPTS = {
    "REC": (
        "\nYou're watching a video in which people may perform a certain type of action repetively. \n"
        "The person performing this kind of action are referred to as 'they' in the following statement.\n"
        "You're task is to count how many times have different people in the video perform this kind of action "
        "in total.\nOne complete motion counts as one. \nNow, answer the following question: {}\n"
        "Provide your answer as a single number (e.g., 0, 1, 2, 3…) indicating the total count.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
    "SSR": (
        "\nYou're watching a tutorial video which contain a sequential of steps. \n"
        "The following is one step from the whole procedures: \n{}\n"
        "Your task is to determine if the man or woman in the video is currently performing this step.\n"
        "Answer only with “Yes” or “No”.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
    "CRR": (
        "\nYou're responsible of answering questions based on the video content. \n"
        "The following question are relevant to the latest frames, i.e. the end of the video.\n{}\n"
        "Decide whether existing visual content, especially latest frames, i.e. frames that near the end of the "
        "video, provide enough information for answering the question.\nAnswer only with “Yes” or “No”.\n"
        "Do not include any additional text or explanation in your response.\n"
    ),
}

# MVBench: JSON file stem -> (task name, video folder under the MVBench video root). Used to find
# a task's videos when --videos is that root, as the official loader does.
MVBENCH_TASKS: dict[str, tuple[str, str]] = {
    "action_sequence": ("Action Sequence", "star/Charades_v1_480"),
    "action_prediction": ("Action Prediction", "star/Charades_v1_480"),
    "action_antonym": ("Action Antonym", "ssv2_video"),
    "fine_grained_action": ("Fine-grained Action", "Moments_in_Time_Raw/videos"),
    "unexpected_action": ("Unexpected Action", "FunQA_test/test"),
    "object_existence": ("Object Existence", "clevrer/video_validation"),
    "object_interaction": ("Object Interaction", "star/Charades_v1_480"),
    "object_shuffle": ("Object Shuffle", "perception/videos"),
    "moving_direction": ("Moving Direction", "clevrer/video_validation"),
    "action_localization": ("Action Localization", "sta/sta_video"),
    "scene_transition": ("Scene Transition", "scene_qa/video"),
    "action_count": ("Action Count", "perception/videos"),
    "moving_count": ("Moving Count", "clevrer/video_validation"),
    "moving_attribute": ("Moving Attribute", "clevrer/video_validation"),
    "state_change": ("State Change", "perception/videos"),
    "fine_grained_pose": ("Fine-grained Pose", "nturgbd"),
    "character_order": ("Character Order", "perception/videos"),
    "egocentric_navigation": ("Egocentric Navigation", "vlnqa"),
    "episodic_reasoning": ("Episodic Reasoning", "tvqa/frames_fps3_hq"),
    "counterfactual_inference": ("Counterfactual Inference", "clevrer/video_validation"),
}


class AnnotationError(ValueError):
    """An annotation file that cannot be read at all (missing, not JSON, wrong shape)."""


@dataclass(frozen=True)
class Item:
    """One multiple-choice question about one video.

    `at_s` is when the question is asked, in seconds of the video (None: after the whole clip).
    `start_s`/`end_s` bound the part of the video that is streamed. `video_dirs` are folders under
    the video root where the file may also sit.
    """

    qid: str
    task: str
    video: str
    question: str
    options: tuple[str, ...]
    answer: str
    at_s: float | None = None
    start_s: float = 0.0
    end_s: float | None = None
    group: str = ""
    video_dirs: tuple[str, ...] = ()

    def prompt(self) -> str:
        """The question, its lettered options and the instruction to answer with a letter."""
        lines = [self.question.strip(), *(f"{LETTERS[i]}. {o}" for i, o in enumerate(self.options))]
        return "\n".join([*lines, "Answer with the option's letter from the given choices directly."])


@dataclass(frozen=True)
class ForwardItem(Item):
    """One test point of an OVO-Bench forward active responding task, asked at `at_s` (its
    `realtime`) with the benchmark's prompt. `question` fills the prompt; `answer` is "Yes" or "No"
    (SSR: the step is under way then; CRR: the clue has been shown by then) or the count so far (REC),
    and there are no options."""

    def prompt(self) -> str:
        return OVO_FORWARD_PROMPTS[self.task].format(self.question).strip()


@dataclass(frozen=True)
class Problem:
    """An entry that was skipped, and why."""

    qid: str
    task: str
    reason: str


class _Bad(ValueError):
    """One entry is malformed (becomes a Problem)."""


def _text(entry: dict, key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"no {key!r}")
    return value.strip()


def _options(entry: dict, key: str) -> tuple[str, ...]:
    """Option texts, their "A. " prefixes removed when every option has one."""
    raw = entry.get(key)
    if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(o, str | int | float) for o in raw):
        raise _Bad(f"{key!r} is not a list of at least two options")
    texts = [str(o).strip() for o in raw]
    matches = [_LETTERED.match(t) for t in texts]
    if all(matches) and [m.group(1) for m in matches] == list(LETTERS[: len(texts)]):
        texts = [m.group(2).strip() for m in matches]
    if len(texts) > len(LETTERS):
        raise _Bad(f"{len(texts)} options, more than there are letters")
    return tuple(texts)


def _letter(value: Any, n_options: int) -> str:
    letter = str(value).strip().upper()[:1] if value is not None else ""
    if not letter or letter not in LETTERS[:n_options]:
        raise _Bad(f"answer {value!r} is not one of the letters A-{LETTERS[n_options - 1]}")
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
        raise _Bad(f"time {value!r} is not HH:MM:SS or seconds")
    if seconds < 0:
        raise _Bad(f"time {value!r} is negative")
    return seconds


def _load_json(path: Path) -> Any:
    """A JSON document, or JSON lines (one object per line)."""
    if not path.is_file():
        raise AnnotationError(f"annotation file not found: {path}")
    if path.suffix == ".parquet":
        raise AnnotationError(
            f"{path.name} is Parquet; convert it to JSON first, for example "
            f"python -c \"import pandas; pandas.read_parquet('{path}').to_json('{path.with_suffix('.json')}', "
            "orient='records')\""
        )
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise AnnotationError(f"{path}: not JSON or JSON lines ({first})") from None


def _records(data: Any, path: Path) -> list:
    if isinstance(data, dict):
        # Some exports wrap the list, e.g. {"data": [...]}.
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
    if not isinstance(data, list):
        raise AnnotationError(f"{path}: expected a list of entries, got {type(data).__name__}")
    return data


def _collect(
    path: Path, parse: Callable[[int, Any], list[Item]], qid_of: Callable[[int, Any], str]
) -> tuple[list[Item], list[Problem]]:
    items: list[Item] = []
    problems: list[Problem] = []
    for index, entry in enumerate(_records(_load_json(path), path)):
        try:
            if not isinstance(entry, dict):
                raise _Bad("entry is not an object")
            items += parse(index, entry)
        except _Bad as exc:
            task = (entry.get("task") or entry.get("task_type")) if isinstance(entry, dict) else None
            problems.append(Problem(qid_of(index, entry), str(task or "unknown"), str(exc)))
    return items, problems


def load_streamingbench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """StreamingBench real-time: per video, questions asked at their time_stamp."""
    path = Path(path)
    problems: list[Problem] = []

    def parse(index: int, entry: dict) -> list[Item]:
        video = _text(entry, "video_path")
        questions = entry.get("questions")
        if not isinstance(questions, list) or not questions:
            raise _Bad("no 'questions' list")
        out = []
        for j, q in enumerate(questions):
            qid = f"{index}.{j}"
            try:
                if not isinstance(q, dict):
                    raise _Bad("question is not an object")
                options = _options(q, "options")
                out.append(
                    Item(
                        qid=qid,
                        task=str(q.get("task_type") or "unknown"),
                        video=video,
                        question=_text(q, "question"),
                        options=options,
                        answer=_letter(q.get("answer"), len(options)),
                        at_s=parse_time(q.get("time_stamp")),
                        group="real-time",
                    )
                )
            except _Bad as exc:
                task = q.get("task_type") if isinstance(q, dict) else None
                problems.append(Problem(qid, str(task or "unknown"), str(exc)))
        return out

    items, bad = _collect(path, parse, lambda i, e: f"{i}")
    return items, bad + problems


def _ovo_forward(base: str, task: str, entry: dict, problems: list[Problem]) -> list[Item]:
    """The test points of one OVO-Bench forward entry, as its evaluation code reads them: REC
    (activity; per test: realtime, count), SSR (per test: realtime, step, type), CRR (question;
    per test: realtime, type), where type 1 means the answer is Yes then."""
    video = _text(entry, "video")
    tests = entry.get("test_info")
    if not isinstance(tests, list) or not tests:
        raise _Bad("no 'test_info' list of test times")
    query = ""  # SSR: each test point names its step
    if task == "REC":  # the question OVO-Bench builds from the activity
        query = f"How many times did they {_text(entry, 'activity')}?"
    elif task == "CRR":
        query = _text(entry, "question")
    out: list[Item] = []
    for j, test in enumerate(tests):
        qid = f"{base}/{j}"
        try:
            if not isinstance(test, dict):
                raise _Bad("test is not an object")
            if task == "REC":
                count = test.get("count")
                whole = isinstance(count, int | float) and not isinstance(count, bool) and float(count).is_integer()
                if not whole or count < 0:
                    raise _Bad(f"count {count!r} is not a whole number")
                answer = str(int(count))
            else:
                kind = test.get("type")
                if isinstance(kind, bool) or kind not in (0, 1):
                    raise _Bad(f"type {kind!r} is not 0 (No) or 1 (Yes)")
                answer = "Yes" if kind == 1 else "No"
            question = _text(test, "step") if task == "SSR" else query
            at_s = parse_time(test.get("realtime"))
            out.append(ForwardItem(qid, task, video, question, (), answer, at_s=at_s, group="forward"))
        except _Bad as exc:
            problems.append(Problem(qid, task, str(exc)))
    return out


def load_ovobench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """OVO-Bench: backward and real-time tasks asked at `realtime` seconds, and forward tasks asked
    at each of their test times."""
    path = Path(path)
    problems: list[Problem] = []

    def qid(index: int, entry: Any) -> str:
        return str(entry.get("id", index)) if isinstance(entry, dict) else str(index)

    def parse(index: int, entry: dict) -> list[Item]:
        task = _text(entry, "task")
        if task in OVO_FORWARD:
            return _ovo_forward(qid(index, entry), task, entry, problems)
        group = "backward" if task in OVO_BACKWARD else "real-time" if task in OVO_REAL_TIME else "other"
        options = _options(entry, "options")
        gt = entry.get("gt")
        if isinstance(gt, bool) or not isinstance(gt, int) or not 0 <= gt < len(options):
            raise _Bad(f"gt {gt!r} is not an option index 0-{len(options) - 1}")
        return [
            Item(
                qid=qid(index, entry),
                task=task,
                video=_text(entry, "video"),
                question=_text(entry, "question"),
                options=options,
                answer=LETTERS[gt],
                at_s=parse_time(entry.get("realtime")),
                group=group,
            )
        ]

    items, bad = _collect(path, parse, qid)
    return items, bad + problems


def load_videomme(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """Video-MME: asked after the whole video, found as <videoID>.mp4 (or .mkv, .webm, .avi)."""
    path = Path(path)

    def qid(index: int, entry: Any) -> str:
        return str(entry.get("question_id", index)) if isinstance(entry, dict) else str(index)

    def parse(index: int, entry: dict) -> list[Item]:
        video = _text(entry, "videoID")
        options = _options(entry, "options")
        return [
            Item(
                qid=qid(index, entry),
                task=str(entry.get("task_type") or "unknown"),
                video=video,
                question=_text(entry, "question"),
                options=options,
                answer=_letter(entry.get("answer"), len(options)),
                group=str(entry.get("duration") or ""),
            )
        ]

    return _collect(path, parse, qid)


def load_mvbench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """MVBench: one task per JSON file (a file, or a folder of them); answers given as text."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise AnnotationError(f"no MVBench task files (*.json) in {path}")
    items: list[Item] = []
    problems: list[Problem] = []
    for file in files:
        task, folder = MVBENCH_TASKS.get(file.stem, (file.stem, ""))

        def parse(index: int, entry: dict, task: str = task, folder: str = folder, stem: str = file.stem) -> list[Item]:
            options = _options(entry, "candidates")
            answer = str(entry.get("answer", "")).strip()
            if answer not in options:
                raise _Bad(f"answer {answer!r} is not one of the candidates")
            start, end = entry.get("start"), entry.get("end")
            start_s = parse_time(start) if start is not None else 0.0
            end_s = parse_time(end) if end is not None else None
            if end_s is not None and end_s <= start_s:
                raise _Bad(f"end {end!r} is not after start {start!r}")
            return [
                Item(
                    qid=f"{stem}/{index}",
                    task=task,
                    video=_text(entry, "video"),
                    question=_text(entry, "question"),
                    options=options,
                    answer=LETTERS[options.index(answer)],
                    start_s=start_s,
                    end_s=end_s,
                    video_dirs=(folder,) if folder else (),
                )
            ]

        found, bad = _collect(file, parse, lambda i, e, stem=file.stem: f"{stem}/{i}")
        items += found
        problems += [Problem(p.qid, task, p.reason) for p in bad]
    return items, problems


@dataclass(frozen=True)
class BenchSpec:
    """How a benchmark is read and run: the paper's re-indexing default and whether it streams."""

    name: str
    load: Callable[[str | Path], tuple[list[Item], list[Problem]]]
    reindex: str
    streaming: bool
    extensions: tuple[str, ...] = ()  # tried after the name as given, for ids without a suffix


BENCHES: dict[str, BenchSpec] = {
    "streamingbench": BenchSpec("StreamingBench (real-time)", load_streamingbench, "lazy", True),
    "ovobench": BenchSpec("OVO-Bench (backward, real-time and forward)", load_ovobench, "lazy", True),
    "videomme": BenchSpec("Video-MME", load_videomme, "eager", False, (".mp4", ".mkv", ".webm", ".avi")),
    "mvbench": BenchSpec("MVBench", load_mvbench, "eager", False),
}
