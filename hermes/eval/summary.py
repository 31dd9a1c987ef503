"""The results file, and the summary of a run: per task, per group, overall and as each benchmark
aggregates itself, both accuracies side by side, and every question that could not be used, named."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from hermes.eval.formats import OVO_BACKWARD, OVO_FORWARD, OVO_REAL_TIME

ANSWERED, SKIPPED = "answered", "skipped"
OVO_GROUPS = {"backward": OVO_BACKWARD, "real-time": OVO_REAL_TIME, "forward": OVO_FORWARD}
ACCURACIES = {"text": "text_accuracy", "log-prob": "accuracy"}  # the official rule first, as papers report it


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


def accuracy(rows: list[dict]) -> dict:
    """Both accuracies of answered records: by log-probability over all of them, and by the
    benchmark's rule over those it counts (`text_counted`; none without generated text).
    `text_generated` counts the records with generated text, counted or not."""
    correct = sum(bool(r["correct"]) for r in rows)
    scored = [r for r in rows if r.get("text_counted")]
    text = sum(bool(r.get("text_correct")) for r in scored)
    out = {
        "answered": len(rows),
        "correct": correct,
        "accuracy": correct / len(rows) if rows else None,
        "text_generated": sum(r.get("text_correct") is not None for r in rows),
        "text_scored": len(scored),
        "text_correct": text,
        "text_accuracy": text / len(scored) if scored else None,
    }
    timed = [r for r in rows if "on_time" in r]  # StreamingBench's proactive output: count.py's time accuracy
    if timed:
        out["on_time_accuracy"] = sum(bool(r["on_time"]) for r in timed) / len(timed)
    return out


def summarize(records: dict[str, dict], qids: Sequence[str]) -> dict:
    """Per-task, per-group and overall accuracy of the questions in `qids`, the skips by reason,
    and every skipped question or entry with its reason."""
    wanted = list(dict.fromkeys(qids))
    chosen = [records[q] for q in wanted if q in records]
    answered = [r for r in chosen if r["status"] == ANSWERED]
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
        "questions": len(wanted),
        "skipped": len(skipped),
        "skipped_by_reason": dict(reasons.most_common()),
        "unusable": [{"qid": r["qid"], "task": r["task"], "reason": r["reason"]} for r in skipped],
        "not_run": len(wanted) - len(chosen),
    }


_REASON_KINDS = {
    "malformed entry": "malformed entry",
    "video not found": "video not found",
    "ambiguous": "ambiguous video name",
    "is a folder": "video is a folder",
    "frame rate is not known": "video is a folder",
    "Cannot read video": "Cannot read video",
    "is damaged": "video damaged",
    "characters long": "question too long",
}


def _reason_kind(reason: str) -> str:
    """A reason without the per-question details, for counting."""
    return next((kind for key, kind in _REASON_KINDS.items() if key in reason), reason.split(":")[0][:80])


# -- each benchmark's own aggregate ------------------------------------------------------------------


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _ovo(summary: dict, key: str) -> dict[str, float | None]:
    """score.py: per group the mean of its tasks' accuracies; overall the mean of the three groups
    (None until every group has an answered task)."""
    tasks = summary["tasks"]
    out = {g: _mean([tasks[t][key] for t in names if t in tasks]) for g, names in OVO_GROUPS.items()}
    out["overall"] = statistics.fmean(out.values()) if None not in out.values() else None
    return out


def _mvbench(summary: dict, key: str) -> dict[str, float | None]:
    """The mean of the task accuracies (lmms-eval scores each task; MVBench's tasks have 200
    questions each, so on the full set this is also the mean over questions). A task whose
    generated answers were all left uncounted (empty) scores 0, as `mvbench_aggregate_results`
    scores it; a task with no answered question, or no generated text at all, is left out."""

    def task_score(t: dict) -> float | None:
        if key == "text_accuracy" and t[key] is None and t.get("text_generated"):
            return 0.0
        return t[key]

    return {"average": _mean([task_score(t) for t in summary["tasks"].values()])}


def _by_group(summary: dict, key: str) -> dict[str, float | None]:
    """Each group and all questions together (count.py's "total"; videomme_aggregate_results)."""
    return {g: a[key] for g, a in summary["groups"].items()} | {"overall": summary["overall"][key]}


OFFICIAL: dict[str, tuple[str, Callable[[dict, str], dict[str, float | None]]]] = {
    "streamingbench": ("StreamingBench, per group and over all questions, as count.py", _by_group),
    "ovobench": ("OVO-Bench, the mean of the task accuracies per group, then of the groups, as score.py", _ovo),
    "videomme": ("Video-MME, per duration and over all questions, as lmms-eval's videomme_perception_score", _by_group),
    "mvbench": ("MVBench, the mean of lmms-eval's mvbench_accuracy over the tasks", _mvbench),
}


def official_scores(bench: str, summary: dict) -> dict[str, dict[str, float | None]]:
    """The benchmark's own aggregate of a summary, in percent, for each accuracy."""
    combine = OFFICIAL[bench][1]
    return {
        kind: {k: None if v is None else 100 * v for k, v in combine(summary, key).items()}
        for kind, key in ACCURACIES.items()
    }


def _pct(v: float | None, scale: float = 100.0) -> str:
    return "-" if v is None else f"{scale * v:.2f}"


def render_official(bench: str, scores: dict[str, dict[str, float | None]]) -> str:
    """One line per accuracy: the benchmark's own aggregate."""
    lines = [f"Score of {OFFICIAL[bench][0]}:"]
    for kind, parts in scores.items():
        lines.append(f"  {kind}: " + " · ".join(f"{k} {_pct(v, 1.0)}" for k, v in parts.items()))
    return "\n".join(lines)


def render_summary(summary: dict, title: str, named: int = 10) -> str:
    """The summary as a Markdown table, the skip counts and the first `named` unusable questions."""
    lines = [
        f"{title}",
        "",
        "| task | answered | text scored | text correct | text accuracy % | log-prob correct | log-prob accuracy % "
        "| skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, a: dict, skipped: object) -> str:
        return (
            f"| {name} | {a['answered']} | {a['text_scored']} | {a['text_correct']} | {_pct(a['text_accuracy'])} "
            f"| {a['correct']} | {_pct(a['accuracy'])} | {skipped} |"
        )

    lines += [row(task, a, a["skipped"]) for task, a in summary["tasks"].items()]
    lines += [row(f"*{group}*", a, "") for group, a in summary["groups"].items()]
    lines.append(row("**overall**", summary["overall"], summary["skipped"]))
    timed = {t: a["on_time_accuracy"] for t, a in summary["tasks"].items() if "on_time_accuracy" in a}
    for task, value in timed.items():
        lines += [
            "",
            f"{task}: replied within 2 s of the reference time in {_pct(value)} % (count.py's time accuracy).",
        ]
    if summary["skipped"]:
        reasons = ", ".join(f"{k}: {n}" for k, n in summary["skipped_by_reason"].items())
        lines += ["", f"Skipped {summary['skipped']} of {summary['questions']} questions ({reasons}):"]
        lines += [f"- {u['qid']} ({u['task']}): {u['reason']}" for u in summary["unusable"][:named]]
        if len(summary["unusable"]) > named:
            lines.append(f"- ... and {len(summary['unusable']) - named} more, all listed in the summary file")
    if summary["not_run"]:
        lines += ["", f"{summary['not_run']} questions not run yet (interrupted?): run again to resume."]
    return "\n".join(lines)
