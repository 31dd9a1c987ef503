"""Stream benchmark videos through a session and score multiple-choice questions.

One session per video: the video streams from its start, and each question is asked when the
stream reaches its time (streaming benchmarks) or after the whole clip (offline ones), from the
memory as it is then. The prediction is the option letter whose token has the highest
first-token log-probability; the generated text is recorded too. Every question appends one JSON
line to the results file as soon as it is scored, so an interrupted run resumes where it stopped.
Several processes can share the videos (`hermes.eval.shard`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hermes.engine.session import QuestionError, StreamingSession
from hermes.eval.formats import LETTERS, BenchSpec, ForwardItem, Item, Problem
from hermes.eval.forward import answer_forward
from hermes.eval.shard import Shard, merge_lock, merge_parts, part_path
from hermes.models.base import VideoLM
from hermes.serving.replay import play
from hermes.video.decoding import UntilDamage, VideoError, iter_frames

ANSWERED, SKIPPED = "answered", "skipped"


@dataclass
class EvalSettings:
    """What a run does besides the model and the files."""

    max_new_tokens: int = 16  # 0: score only, no generated text
    limit: int | None = None  # the first N questions of the file


def letter_token_ids(lm: VideoLM, n: int) -> list[list[int]]:
    """Token ids that spell option letter i on its own ("A" and " A" where each is one token)."""
    out = []
    for letter in LETTERS[:n]:
        ids = set()
        for variant in (letter, f" {letter}"):
            tokens = lm.tokenizer.encode(variant, add_special_tokens=False)
            if len(tokens) == 1:
                ids.add(tokens[0])
        if not ids:  # a tokenizer without a one-token letter: its first piece still carries the choice
            ids.add(lm.tokenizer.encode(letter, add_special_tokens=False)[0])
        out.append(sorted(ids))
    return out


def score_options(logprobs: torch.Tensor, letter_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """Each option letter's log-probability: the best among the tokens that spell it."""
    return {LETTERS[i]: float(logprobs[list(ids)].max()) for i, ids in enumerate(letter_ids)}


def letter_in_text(text: str, n: int) -> str | None:
    """The first stand-alone option letter in a generated answer ("B", "(B)", "B. ..."), if any."""
    match = re.search(rf"(?<![A-Za-z])([A-{LETTERS[n - 1]}])(?![A-Za-z])", text)
    return match.group(1) if match else None


class VideoFinder:
    """Find a video under the root: as written, under a task's folder, with a known extension, or
    by file name anywhere below the root (an index built on first need)."""

    def __init__(self, root: str | Path, extensions: Sequence[str] = ()) -> None:
        self.root = Path(root)
        self.extensions = tuple(extensions)
        self._by_name: dict[str, list[Path]] | None = None

    def find(self, item: Item) -> tuple[Path | None, str]:
        """(path, "") when found, else (None, why)."""
        rel = Path(os.path.normpath(item.video))
        names = [rel, *(rel.with_name(rel.name + ext) for ext in self.extensions if not rel.suffix)]
        bases = [self.root, *(self.root / d for d in item.video_dirs)]
        for base in bases:
            for name in names:
                path = name if name.is_absolute() else base / name
                if path.is_file():
                    return path, ""
                if path.is_dir():
                    return None, f"{path} is a folder (of frames?), not a video file"
        found = {p for name in names for p in self._index().get(name.name, [])}
        if len(found) == 1:
            return found.pop(), ""
        if found:
            return None, f"{item.video} is ambiguous under {self.root}: {len(found)} files have that name"
        return None, f"video not found: {item.video} (looked under {self.root})"

    def _index(self) -> dict[str, list[Path]]:
        if self._by_name is None:
            self._by_name = defaultdict(list)
            if self.root.is_dir():
                for dirpath, _, files in os.walk(self.root):
                    for name in files:
                        self._by_name[name].append(Path(dirpath) / name)
        return self._by_name


# -- results file -------------------------------------------------------------------------------


def read_results(path: str | Path, repair: bool = True) -> dict[str, dict]:
    """The last record of each question in a results file. A torn last line is ignored and, with
    `repair` (for the file this process appends to), cut from the file."""
    path = Path(path)
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        # Killed while writing (or, in another shard's file, still writing): skip the partial line,
        # and cut it from our own file so that appends start clean.
        data = data[: data.rfind(b"\n") + 1]
        if repair:
            path.write_bytes(data)
    records: dict[str, dict] = {}
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            records[str(record["qid"])] = record
    return records


def _skip(item: Item | Problem, reason: str) -> dict:
    return {"qid": item.qid, "task": item.task, "status": SKIPPED, "reason": reason}


# -- streaming ------------------------------------------------------------------------------------


def _stream_video(
    session: StreamingSession, path: Path, items: list[Item], letter_ids: list[list[int]], settings: EvalSettings
) -> Iterator[dict]:
    """Stream one video (from the items' start to their end) and yield a record per question.

    Questions are asked in time order once the stream has passed their time; questions without a
    time, or past the end, after the last frame. In a file damaged part-way, the questions from the
    damage on (and those without a time) are skipped with the reason.
    """
    session.reset()
    config = session.config
    first = items[0]
    timed = [it.at_s for it in items if it.at_s is not None]
    end = first.end_s
    if len(timed) == len(items):  # every question has a time: decode no further than the last one needs
        last = max(timed) + 1.0 / config.fps
        end = last if end is None else min(end, last)
    frames = UntilDamage(iter_frames(path, config.fps, start=first.start_s, end=end))
    for event in play(session, frames, items, lambda it: it.at_s, stop_when_done=True):
        if isinstance(event, Item):
            damage = frames.damage
            # Asked before the frame that failed, a question sees what it would in a whole file.
            if damage is not None and (event.at_s is None or event.at_s >= damage.at_s):
                yield _skip(event, str(damage))
            else:
                yield _ask(session, event, letter_ids, settings)


def _ask(session: StreamingSession, item: Item, letter_ids: list[list[int]], settings: EvalSettings) -> dict:
    """Score one question from the memory as it is now; a record for the results file."""
    try:
        if isinstance(item, ForwardItem):  # OVO-Bench forward: yes/no or a count, scored as OVO-Bench does
            scored = answer_forward(session, item, settings.max_new_tokens)
        else:
            scored = _answer_choice(session, item, letter_ids, settings)
    except QuestionError as exc:
        return _skip(item, str(exc))
    return {
        "qid": item.qid,
        "task": item.task,
        "group": item.group,
        "status": ANSWERED,
        "video": item.video,
        "at_s": item.at_s,
        "stream_s": session.stream_time_s,
        "frames_seen": session.frames_seen,
        "answer": item.answer,
        **scored,
    }


def _answer_choice(session: StreamingSession, item: Item, letter_ids: list[list[int]], settings: EvalSettings) -> dict:
    """A multiple-choice question's prediction fields: the letter with the highest first-token
    log-probability, and the letter in the generated text."""
    n = len(item.options)
    prompt = item.prompt()
    scores = score_options(session.first_token_logprobs(prompt), letter_ids[:n])
    answer = session.ask(prompt, settings.max_new_tokens) if settings.max_new_tokens > 0 else None
    pred = max(scores, key=scores.__getitem__)
    text = answer.text if answer else ""
    return {
        "pred": pred,
        "correct": pred == item.answer,
        "option_logprobs": scores,
        "text": text,
        "text_pred": letter_in_text(text, n),
        "ttft_ms": answer.ttft_ms if answer else None,
    }


def _by_video(items: list[Item]) -> list[list[Item]]:
    """Questions grouped by (video, start, end), in order of first appearance."""
    groups: dict[tuple, list[Item]] = {}
    for item in items:
        groups.setdefault((item.video, item.start_s, item.end_s), []).append(item)
    return list(groups.values())


def run_eval(
    lm: VideoLM,
    spec: BenchSpec,
    items: list[Item],
    problems: list[Problem],
    session: StreamingSession,
    videos: str | Path,
    out: str | Path,
    settings: EvalSettings,
    progress: bool = True,
    shard: Shard | None = None,
) -> dict | None:
    """Score every question not answered yet, appending a record per question; the summary.

    `settings.limit` keeps the first N questions; malformed entries are always reported. With a
    `shard` (default: one process) of several processes, this one streams its share of the videos into its own part file
    (`Shard.part`), and returns None while other shards are still running; the one that finds
    every part complete merges them into `out` and returns the summary of the whole evaluation.
    """
    from tqdm import tqdm

    items = items[: settings.limit] if settings.limit is not None else items
    shard = shard or Shard()
    out = Path(out)
    part = shard.part(out)
    part.parent.mkdir(parents=True, exist_ok=True)
    groups = _by_video(items)
    mine = shard.take(groups)
    own_problems = problems if shard.rank == 0 else []
    done = {q for q, r in read_results(part).items() if r["status"] == ANSWERED}
    finder = VideoFinder(videos, spec.extensions)
    letter_ids = letter_token_ids(lm, max((len(it.options) for it in items), default=0))
    total = sum(len(group) for group in mine)
    left = sum(it.qid not in done for group in mine for it in group)
    bar = tqdm(total=total, initial=total - left, unit="question", disable=not progress, file=sys.stderr)
    with bar, part.open("a", encoding="utf-8") as sink:

        def write(record: dict) -> None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()  # one whole line per question, on disk before the next one starts
            if record["qid"] not in malformed:
                bar.update(1)

        malformed = {p.qid for p in own_problems}
        for problem in own_problems:
            write(_skip(problem, f"malformed entry: {problem.reason}"))
        for whole in mine:
            group = [it for it in whole if it.qid not in done]
            if not group:
                continue
            path, why = finder.find(group[0])
            if path is None:
                for item in group:
                    write(_skip(item, why))
                continue
            answered: set[str] = set()
            try:
                for record in _stream_video(session, path, group, letter_ids, settings):
                    answered.add(record["qid"])
                    write(record)
            except VideoError as exc:
                for item in group:
                    if item.qid not in answered:
                        write(_skip(item, str(exc)))
    qids = [it.qid for it in items] + [p.qid for p in problems]
    if not shard.sharded:
        return summarize(read_results(out), qids)
    with merge_lock(out):
        parts = [read_results(part_path(out, rank, shard.world), repair=False) for rank in range(shard.world)]
        owned = [(q, shard.owner(i)) for i, group in enumerate(groups) for q in (it.qid for it in group)]
        owned += [(p.qid, 0) for p in problems]
        if not all(q in parts[rank] for q, rank in owned):
            return None  # a shard is still streaming (or stopped): the last one to finish merges
        merged = merge_parts(out, shard.world, parts, [p.qid for p in problems], [[it.qid for it in g] for g in groups])
    return summarize(merged, qids)


def summarize(records: dict[str, dict], qids: Sequence[str]) -> dict:
    """Per-task, per-group and overall accuracy of the questions in `qids`, and the skips by reason."""
    chosen = [records[q] for q in dict.fromkeys(qids) if q in records]
    answered = [r for r in chosen if r["status"] == ANSWERED]

    def accuracy(rows: list[dict]) -> dict:
        correct = sum(r["correct"] for r in rows)
        generated = [r for r in rows if r.get("ttft_ms") is not None]  # --max-new-tokens 0 generates nothing
        text = sum(r.get("text_pred") == r["answer"] for r in generated)
        return {
            "answered": len(rows),
            "correct": correct,
            "accuracy": correct / len(rows) if rows else None,
            "text_accuracy": text / len(generated) if generated else None,
        }

    tasks: dict[str, list[dict]] = defaultdict(list)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in answered:
        tasks[r["task"]].append(r)
        if r.get("group"):
            groups[r["group"]].append(r)
    skipped = [r for r in chosen if r["status"] == SKIPPED]
    reasons = Counter(_reason_kind(r["reason"]) for r in skipped)
    skipped_tasks = Counter(r["task"] for r in skipped)
    return {
        "overall": accuracy(answered),
        "tasks": {t: accuracy(rows) | {"skipped": skipped_tasks.get(t, 0)} for t, rows in sorted(tasks.items())}
        | {t: accuracy([]) | {"skipped": n} for t, n in sorted(skipped_tasks.items()) if t not in tasks},
        "groups": {g: accuracy(rows) for g, rows in sorted(groups.items())},
        "questions": len(dict.fromkeys(qids)),
        "skipped": len(skipped),
        "skipped_by_reason": dict(reasons.most_common()),
        "not_run": len(dict.fromkeys(qids)) - len(chosen),
    }


_REASON_KINDS = {
    "malformed entry": "malformed entry",
    "video not found": "video not found",
    "ambiguous": "ambiguous video name",
    "is a folder": "video is a folder",
    "Cannot read video": "Cannot read video",
    "is damaged": "video damaged",
    "characters long": "question too long",
}


def _reason_kind(reason: str) -> str:
    """A reason without the per-question details, for counting."""
    return next((kind for key, kind in _REASON_KINDS.items() if key in reason), reason.split(":")[0][:80])


def render_summary(summary: dict, title: str) -> str:
    """The summary as a Markdown table plus the skip counts."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}"

    lines = [
        f"{title}",
        "",
        "| task | answered | correct | accuracy % | text accuracy % | skipped |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, a: dict, skipped: object) -> str:
        return (
            f"| {name} | {a['answered']} | {a['correct']} | {pct(a['accuracy'])} "
            f"| {pct(a['text_accuracy'])} | {skipped} |"
        )

    lines += [row(task, a, a["skipped"]) for task, a in summary["tasks"].items()]
    lines += [row(f"*{group}*", a, "") for group, a in summary["groups"].items()]
    lines.append(row("**overall**", summary["overall"], summary["skipped"]))
    if summary["skipped"]:
        reasons = ", ".join(f"{k}: {n}" for k, n in summary["skipped_by_reason"].items())
        lines += ["", f"Skipped {summary['skipped']} of {summary['questions']} questions ({reasons})."]
    if summary["not_run"]:
        lines += ["", f"{summary['not_run']} questions not run yet (interrupted?): run again to resume."]
    return "\n".join(lines)
