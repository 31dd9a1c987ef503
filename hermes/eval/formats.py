"""The four benchmarks: how each is read and run (`BENCHES`), and the OVO-Bench and Video-MME readers.

StreamingBench's readers are in `hermes.eval.streamingbench`, MVBench's in `hermes.eval.mvbench`;
the question types and what readers share in `hermes.eval.items`.

- OVO-Bench (`ovo_bench_new.json`): backward and real-time tasks [{id, task, video, realtime (s),
  question, options [...], gt (index)}], asked at realtime while streaming; forward active
  responding tasks (REC, SSR, CRR) [{id, task, video, ..., test_info: [{realtime, ...}]}], one
  yes/no or count question per test point, asked at its realtime (ForwardItem).
- Video-MME: [{videoID, duration, question_id, task_type, question, options ["A. ..."], answer}]
  as JSON, JSON lines or the released Parquet file, asked after the whole video, found as
  <videoID>.mp4 (or .MP4, .mkv, ...) under the root or its data/ folder (lmms-eval's layout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.eval.items import (
    LETTERS,
    EntryError,
    ForwardItem,
    Item,
    Problem,
    VideoDir,
    check_layout,
    collect,
    letter_field,
    load_data,
    parse_time,
    raw_options,
    records,
    strip_letters,
    text_field,
)
from hermes.eval.mvbench import load_mvbench
from hermes.eval.prompts import ovo_choice_prompt, ovo_forward_prompt, videomme_prompt
from hermes.eval.streamingbench import load_streamingbench

OVO_BACKWARD = ("EPM", "ASI", "HLD")
OVO_REAL_TIME = ("STU", "OJR", "ATR", "ACR", "OCR", "FPD")
OVO_FORWARD = ("REC", "SSR", "CRR")
OVO_LAYOUTS = (
    "ovo_bench_new.json: [{id, task, video, realtime, question, options, gt}] (backward and real-time) and "
    "[{id, task, video, ..., test_info: [{realtime, ...}]}] (forward)"
)
VIDEOMME_LAYOUTS = (
    "[{videoID, duration, question_id, task_type, question, options, answer}] as JSON, JSON lines or Parquet"
)


def _ovo_forward(base: str, task: str, entry: dict, problems: list[Problem]) -> list[Item]:
    """The test points of one OVO-Bench forward entry, as its evaluation code reads them: REC
    (activity; per test: realtime, count), SSR (per test: realtime, step, type), CRR (question;
    per test: realtime, type), where type 1 means the answer is Yes then."""
    video = text_field(entry, "video")
    tests = entry.get("test_info")
    if not isinstance(tests, list) or not tests:
        raise EntryError("no 'test_info' list of test times")
    query = ""  # SSR: each test point names its step
    if task == "REC":  # the question OVO-Bench builds from the activity
        query = "How many times did they " + text_field(entry, "activity") + "?"
    elif task == "CRR":
        query = text_field(entry, "question")
    out: list[Item] = []
    for j, test in enumerate(tests):
        qid = f"{base}/{j}"
        try:
            if not isinstance(test, dict):
                raise EntryError("test is not an object")
            if task == "REC":
                count = test.get("count")
                whole = isinstance(count, int | float) and not isinstance(count, bool) and float(count).is_integer()
                if not whole or count < 0:
                    raise EntryError(f"count {count!r} is not a whole number")
                answer = str(int(count))
            else:
                kind = test.get("type")
                if isinstance(kind, bool) or kind not in (0, 1):
                    raise EntryError(f"type {kind!r} is not 0 (No) or 1 (Yes)")
                answer = "Yes" if kind == 1 else "No"
            question = text_field(test, "step") if task == "SSR" else query
            at_s = parse_time(test.get("realtime"))
            prompt = ovo_forward_prompt(task, question)
            out.append(ForwardItem(qid, task, video, question, (), answer, prompt, at_s=at_s, group="forward"))
        except EntryError as exc:
            problems.append(Problem(qid, task, str(exc)))
    return out


def load_ovobench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """OVO-Bench: backward and real-time tasks asked at `realtime` seconds, and forward tasks asked
    at each of their test times."""
    path = Path(path)
    entries = records(load_data(path), path)
    check_layout(entries, path, ("task",), "OVO-Bench", OVO_LAYOUTS)
    problems: list[Problem] = []

    def qid(index: int, entry: Any) -> str:
        return str(entry.get("id", index)) if isinstance(entry, dict) else str(index)

    def parse(index: int, entry: dict) -> list[Item]:
        task = text_field(entry, "task")
        if task in OVO_FORWARD:
            return _ovo_forward(qid(index, entry), task, entry, problems)
        group = "backward" if task in OVO_BACKWARD else "real-time" if task in OVO_REAL_TIME else "other"
        options = raw_options(entry, "options")
        gt = entry.get("gt")
        if isinstance(gt, bool) or not isinstance(gt, int) or not 0 <= gt < len(options):
            raise EntryError(f"gt {gt!r} is not an option index 0-{len(options) - 1}")
        question = text_field(entry, "question")
        return [
            Item(
                qid=qid(index, entry),
                task=task,
                video=text_field(entry, "video"),
                question=question,
                options=tuple(options),
                answer=LETTERS[gt],
                prompt=ovo_choice_prompt(entry["question"], options),
                rule="ovobench",
                at_s=parse_time(entry.get("realtime")),
                group=group,
            )
        ]

    items, bad = collect(entries, parse, qid)
    return items, bad + problems


def load_videomme(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """Video-MME: asked after the whole video."""
    path = Path(path)
    entries = records(load_data(path), path)
    check_layout(entries, path, ("videoID", "question_id"), "Video-MME", VIDEOMME_LAYOUTS)

    def qid(index: int, entry: Any) -> str:
        return str(entry.get("question_id", index)) if isinstance(entry, dict) else str(index)

    def parse(index: int, entry: dict) -> list[Item]:
        options = raw_options(entry, "options")
        question = text_field(entry, "question")
        return [
            Item(
                qid=qid(index, entry),
                task=str(entry.get("task_type") or "unknown"),
                video=text_field(entry, "videoID"),
                question=question,
                options=strip_letters(options),
                answer=letter_field(entry.get("answer"), len(options)),
                prompt=videomme_prompt(entry["question"], options),
                rule="videomme",
                group=str(entry.get("duration") or ""),
                video_dirs=(VideoDir("data"),),
            )
        ]

    return collect(entries, parse, qid)


@dataclass(frozen=True)
class BenchSpec:
    """How a benchmark is read and run: the paper's re-indexing default and whether it streams."""

    name: str
    load: Callable[[str | Path], tuple[list[Item], list[Problem]]]
    reindex: str
    streaming: bool
    extensions: tuple[str, ...] = ()  # tried for a video named without its suffix, or with another one


BENCHES: dict[str, BenchSpec] = {
    "streamingbench": BenchSpec("StreamingBench", load_streamingbench, "lazy", True),
    "ovobench": BenchSpec("OVO-Bench (backward, real-time and forward)", load_ovobench, "lazy", True),
    "videomme": BenchSpec("Video-MME", load_videomme, "eager", False, (".mp4", ".MP4", ".mkv", ".webm", ".avi")),
    "mvbench": BenchSpec("MVBench", load_mvbench, "eager", False, (".mp4", ".webm", ".avi", ".mkv")),
}
