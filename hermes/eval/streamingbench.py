"""StreamingBench's annotation files, in every layout its release has (THUNLP-MT/StreamingBench,
`src/data/`), read into questions with the benchmark's own prompts.

- `questions_real.json` and `questions_omni.json`: [{video_path, questions: [{task_type, question,
  time_stamp "HH:MM:SS", options ["A. ..."], answer "C"}]}], asked at time_stamp while streaming.
- `questions_sqa.json`: a list of lists, one per video, of such entries; each question's prompt
  carries the video's earlier questions and their right answers (`StreamingBenchSQA.py`).
- `questions_proactive*.json`: questions with `ground_truth_time_stamp` and `ground_truth_output`
  instead of options: polled every second from time_stamp (`hermes.eval.proactive`).

The task groups are the paper's: real-time visual understanding (the ten tasks of the real file),
omni-source understanding and contextual understanding (whose tasks come from the omni, SQA and
proactive files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermes.eval.items import (
    AnnotationError,
    EntryError,
    Item,
    ProactiveItem,
    Problem,
    letter_field,
    load_data,
    parse_time,
    raw_options,
    records,
    strip_letters,
    text_field,
)
from hermes.eval.prompts import (
    SB_OPTIONS,
    proactive_poll_prompt,
    streamingbench_options,
    streamingbench_prompt,
    streamingbench_sqa_context,
    streamingbench_sqa_prompt,
)

OMNI_SOURCE = ("Emotion Recognition", "Scene Understanding", "Source Discrimination", "Multimodal Alignment")
CONTEXTUAL = (
    "Misleading Context Understanding",
    "Anomaly Context Understanding",
    "Sequential Question Answering",
    "Proactive Output",
)
LAYOUTS = (
    "real-time and omni-source [{video_path, questions: [{task_type, question, time_stamp, options, answer}]}] "
    "(questions_real.json, questions_omni.json); sequential [[{video_path, questions: [...]}, ...], ...] "
    "(questions_sqa.json); proactive [{video_path, questions: [{task_type, question, time_stamp, "
    "ground_truth_time_stamp, ground_truth_output}]}] (questions_proactive.json)"
)


def task_group(task: str) -> str:
    """The paper's group of a task type."""
    return "omni-source" if task in OMNI_SOURCE else "contextual" if task in CONTEXTUAL else "real-time"


def _choice(qid: str, video: str, q: dict, context: str | None) -> Item:
    """A multiple-choice question; `context` (SQA): the earlier questions of its video."""
    task = str(q.get("task_type") or "unknown")
    question = text_field(q, "question")
    options = raw_options(q, "options", at_least=SB_OPTIONS)
    return Item(
        qid=qid,
        task=task,
        video=video,
        question=question,
        options=strip_letters(streamingbench_options(options)),
        answer=letter_field(q.get("answer"), SB_OPTIONS),
        prompt=streamingbench_prompt(q["question"], options)
        if context is None
        else streamingbench_sqa_prompt(context, q["question"], options),
        rule="streamingbench",
        at_s=parse_time(q.get("time_stamp")),
        group=task_group(task),
    )


def _proactive(qid: str, video: str, q: dict) -> ProactiveItem:
    task = str(q.get("task_type") or "Proactive Output")
    question = text_field(q, "question")
    output = q.get("ground_truth_output")
    if not isinstance(output, str | int | float) or isinstance(output, bool) or not str(output):
        raise EntryError("no 'ground_truth_output'")
    start, expected = parse_time(q.get("time_stamp")), parse_time(q.get("ground_truth_time_stamp"))
    if expected < start:
        raise EntryError(f"ground_truth_time_stamp {q['ground_truth_time_stamp']!r} is before time_stamp")
    return ProactiveItem(
        qid=qid,
        task=task,
        video=video,
        question=question,
        options=(),
        answer=str(output),
        prompt=proactive_poll_prompt(q["question"], str(output)),
        start_s=start,
        group=task_group(task),
        expected_s=expected,
    )


def _entry(qid: str, entry: Any, problems: list[Problem], context: str | None) -> tuple[list[Item], str | None]:
    """The questions of one {video_path, questions} entry, and (SQA) the video's context after them:
    `context` is the context so far, None outside a sequence."""
    if not isinstance(entry, dict):
        raise EntryError("entry is not an object")
    video = text_field(entry, "video_path")
    questions = entry.get("questions")
    if not isinstance(questions, list) or not questions:
        raise EntryError("no 'questions' list")
    out: list[Item] = []
    for j, q in enumerate(questions):
        sub = f"{qid}.{j}"
        try:
            if not isinstance(q, dict):
                raise EntryError("question is not an object")
            if "ground_truth_time_stamp" in q:
                out.append(_proactive(sub, video, q))
                continue
            out.append(_choice(sub, video, q, context))
            if context is not None:  # SQA: the next question sees this one and its right answer
                options = raw_options(q, "options")
                context = streamingbench_sqa_context(
                    context, str(q["time_stamp"]), q["question"], options, str(q["answer"])
                )
        except EntryError as exc:
            task = q.get("task_type") if isinstance(q, dict) else None
            problems.append(Problem(sub, str(task or "unknown"), str(exc)))
    return out, context


def load_streamingbench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """Any of StreamingBench's question files: real-time, omni-source, sequential or proactive."""
    path = Path(path)
    entries = records(load_data(path), path)
    if entries and not any(isinstance(e, list) or (isinstance(e, dict) and "questions" in e) for e in entries):
        raise AnnotationError(f"{path.name} is not in a layout StreamingBench reads. It accepts: {LAYOUTS}")
    items: list[Item] = []
    problems: list[Problem] = []
    for index, entry in enumerate(entries):
        # A list is one video's sequence (SQA): each question sees the ones before it as context.
        sequence = entry if isinstance(entry, list) else [entry]
        context = "" if isinstance(entry, list) else None
        for j, part in enumerate(sequence):
            qid = f"{index}.{j}" if isinstance(entry, list) else str(index)
            try:
                found, context = _entry(qid, part, problems, context)
                items += found
            except EntryError as exc:
                problems.append(Problem(qid, "unknown", str(exc)))
    return items, problems
