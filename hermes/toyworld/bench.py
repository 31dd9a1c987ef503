"""The toy-world memory benchmark: every memory policy at several budgets, on the held-out clips.

Each held-out clip is decoded once (through `hermes.video`, as any file) and streamed chunk by chunk
into one `StreamingSession` per policy (`PolicyGroup`, as `hermes eval --policies` does), at each
budget; `full` keeps everything, so it runs once. After every chunk each memory reads its standing
questions (the forward kind); at each question's time each memory is asked it (the app's path: the
question after the memory, scratch tokens, the answer remembered as the last turn). A question is
right when its answer word has the highest first-token log-probability among its options (chance
is one over the options); the greedy answer is kept too. A forward question's checks are right when
p(yes) > 0.5 exactly while its object is on screen; its score is the balanced accuracy of its
checks (the mean of the yes and the no checks' accuracies, chance 50%), and its onsets are on time
when it says yes at the first check that shows them.

Confidence intervals are 95% percentile bootstrap intervals over clips (questions of one clip are
not independent), with a fixed seed.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hermes.engine.methods import policy_names
from hermes.engine.session import ChunkReport, StreamingSession
from hermes.eval.policies import PolicyGroup
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.runtime.driver import play
from hermes.toyworld.diagnostics import held_shares
from hermes.toyworld.files import ToyWorldError
from hermes.toyworld.heldout import ANNOTATIONS, MANIFEST, check_videos
from hermes.toyworld.questions import AGES, BACKWARD, FORWARD, KINDS, REAL_TIME, SIDES, TASKS, YES_NO
from hermes.toyworld.world import WORLD_FPS
from hermes.video.frames_folder import iter_video

BOOTSTRAP = 2000
BUDGET_SHARES = ((1, 8), (1, 4), (1, 2))  # budgets as shares of a held-out stream's video tokens
FULL = "full"


def benchmark_policies() -> list[str]:
    """Every method the policy registry has (so a new one joins by registering), and hermes+dtd."""
    methods = [name for name in policy_names() if "+" not in name]
    return [FULL, *(m for m in methods if m != FULL), "hermes+dtd"]


@dataclass(frozen=True)
class ToyQuestion:
    """A real-time or backward question of the held-out file."""

    qid: str
    kind: str
    task: str
    video: str
    at: int
    text: str
    options: tuple[str, ...]
    answer: str
    age: str | None
    evidence: tuple[int, int] | None = None  # the frames [start, end) that answer it
    wording: str | None = None  # the second world's wording set: "train" or "heldout" (never trained on)


@dataclass(frozen=True)
class ToyStanding:
    """A forward question: whether its answer is yes after each number of steps checked."""

    qid: str
    video: str
    text: str
    truth: dict[int, bool]
    onsets: tuple[int, ...]


@dataclass
class HeldOut:
    """The held-out set as the benchmark reads it."""

    root: Path
    questions: list[ToyQuestion]
    standing: list[ToyStanding]
    frames: int
    chunk_frames: int
    videos: list[str] = field(default_factory=list)


def _entry(e: Any, i: int) -> tuple[str, str]:
    if not isinstance(e, dict):
        raise ToyWorldError(f"entry {i} is not an object")
    kind, task = e.get("kind"), e.get("task")
    if kind not in KINDS:
        raise ToyWorldError(f"entry {e.get('id', i)}: unknown question kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if task not in TASKS[kind]:
        raise ToyWorldError(f"entry {e.get('id', i)}: task {task!r} is not a {kind} task ({', '.join(TASKS[kind])})")
    return kind, task


def load_heldout(root: str | Path) -> HeldOut:
    """The held-out set in `root` (toyworld.json, manifest.json, videos with their events files);
    ToyWorldError naming the first thing that is wrong."""
    root = Path(root)
    try:
        entries = json.loads((root / ANNOTATIONS).read_text(encoding="utf-8"))
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["spec"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ToyWorldError(f"{root}: not a toy-world set ({ANNOTATIONS} and {MANIFEST}): {exc}") from None
    if not isinstance(entries, list):
        raise ToyWorldError(f"{root / ANNOTATIONS}: expected a list of entries")
    questions, standing = [], []
    try:
        for i, e in enumerate(entries):
            kind, task = _entry(e, i)
            if kind == FORWARD:
                truth = {int(t["realtime"]) + 1: bool(t["type"]) for t in e["test_info"]}
                standing.append(ToyStanding(str(e["id"]), e["video"], e["question"], truth, tuple(e["onsets"])))
            else:
                options = tuple(e["options"])
                questions.append(
                    ToyQuestion(
                        str(e["id"]),
                        kind,
                        task,
                        e["video"],
                        int(e["at"]),
                        e["question"],
                        options,
                        options[int(e["gt"])],
                        e.get("age"),
                        tuple(e["evidence"]) if e.get("evidence") else None,
                        e.get("wording"),
                    )
                )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ToyWorldError(f"{root / ANNOTATIONS}: entry {i} is missing or misstates a field ({exc})") from None
    videos = list(dict.fromkeys([q.video for q in questions] + [s.video for s in standing]))
    check_videos(root, [{"video": v} for v in videos])
    return HeldOut(root, questions, standing, int(manifest["frames"]), int(manifest["chunk_frames"]), videos)


def stream_tokens(lm: VideoLM, held: HeldOut) -> int:
    """Video tokens a held-out stream puts in the memory: every frame's, and a newline per chunk."""
    per_frame = tokens_per_frame(lm)
    chunks = -(-held.frames // held.chunk_frames)
    return held.frames * per_frame + chunks * (len(lm.chunk_inputs(_blank(1), WORLD_FPS).frames) - per_frame)


def tokens_per_frame(lm: VideoLM) -> int:
    one, two = (len(lm.chunk_inputs(_blank(n), WORLD_FPS).frames) for n in (1, 2))
    return two - one


def _blank(n: int) -> np.ndarray:
    return np.zeros((n, 56, 56, 3), dtype=np.uint8)


def default_budgets(lm: VideoLM, held: HeldOut) -> list[int]:
    total = stream_tokens(lm, held)
    return [total * a // b for a, b in BUDGET_SHARES]


def check_budgets(lm: VideoLM, budgets: Sequence[int]) -> list[int]:
    """The budgets, each at least one frame's tokens; ValueError otherwise."""
    per_frame = tokens_per_frame(lm)
    for b in budgets:
        if b < per_frame:
            raise ValueError(
                f"budget {b} is too small for one frame: a frame of this model is {per_frame} tokens, so a budget "
                f"must be at least {per_frame}"
            )
    return list(budgets)


# -- running ----------------------------------------------------------------------------------------


@dataclass
class Answers:
    """What one policy at one budget answered: a record per question and per standing check."""

    questions: list[dict] = field(default_factory=list)
    checks: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    cache_bytes: list[int] = field(default_factory=list)  # each clip's peak
    host_bytes: list[int] = field(default_factory=list)


def _ask(session: StreamingSession, q: ToyQuestion, option_ids: dict[str, int], per_frame: int) -> dict:
    evidence = q.evidence if q.kind == BACKWARD else None
    held = held_shares(session.memory, session.frames_seen - 1, evidence, per_frame)  # before asking: as asked
    logp = session.first_token_logprobs(q.text)
    scores = {o: float(logp[option_ids[o]]) for o in q.options}
    text = session.ask(q.text, max_new_tokens=1).text.strip()
    pred = max(scores, key=scores.__getitem__)
    return {
        "qid": q.qid,
        "video": q.video,
        "kind": q.kind,
        "task": q.task,
        "age": q.age,
        "answer": q.answer,
        "pred": pred,
        "correct": pred == q.answer,
        "text": text,
        "text_correct": text == q.answer,
        "wording": q.wording,
        **held,
    }


def run_clip(
    lm: VideoLM,
    held: HeldOut,
    video: str,
    group: PolicyGroup,
    results: dict[str, Answers],
    frames: list,
    per_frame: int,
) -> None:
    """Stream one clip into every memory of `group`, asking its questions; records into `results`.
    `per_frame`: the model's tokens a frame (`tokens_per_frame`), for what a memory held when asked."""
    questions = [q for q in held.questions if q.video == video]
    standing = [s for s in held.standing if s.video == video]
    option_ids = {o: int(lm.tokenizer.convert_tokens_to_ids(o)) for q in questions for o in q.options}
    group.reset()
    peaks = dict.fromkeys(group.sessions, 0)
    for session in group.sessions.values():
        session.standing.set_questions([s.text for s in standing])
    for event in play(group, frames, questions, lambda q: q.at - 1):
        if isinstance(event, ChunkReport):
            for name, session in group.sessions.items():
                peaks[name] = max(peaks[name], session.memory.cache_bytes())
                for check in session.last_chunk.watches:
                    results[name].checks[f"{video}\n{check.question}"].append((session.frames_seen, check.p_yes))
            continue
        for name, session in group.sessions.items():
            results[name].questions.append(_ask(session, event, option_ids, per_frame))
    for name, session in group.sessions.items():
        results[name].cache_bytes.append(peaks[name])
        results[name].host_bytes.append(session.host_bytes())


def run(
    lm: VideoLM,
    held: HeldOut,
    policies: Sequence[str],
    budgets: Sequence[int],
    videos: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[tuple[str, int | None], Answers]:
    """Every policy at every budget (full once, budget None) on the first `videos` clips."""
    results: dict[tuple[str, int | None], Answers] = defaultdict(Answers)
    # Results are keyed by the policy's name (a parsed policy knows its parameters; the run's
    # settings record them), each session built from the policy as given.
    given = {str(p): p for p in policies}
    runs: list[tuple[int | None, list[str]]] = []
    if FULL in given:
        runs.append((None, [FULL]))
    runs += [(b, [p for p in given if p != FULL]) for b in budgets if any(p != FULL for p in given)]
    chosen = held.videos[:videos] if videos else held.videos
    per_frame = tokens_per_frame(lm)
    for i, video in enumerate(chosen):
        frames = list(iter_video(held.root / video, WORLD_FPS))
        for budget, names in runs:
            config = HermesConfig(budget=budget or 1, chunk_frames=held.chunk_frames, fps=WORLD_FPS)
            group = PolicyGroup({n: StreamingSession(lm, config, policy=given[n]) for n in names})
            per = {n: results[(n, budget)] for n in names}
            run_clip(lm, held, video, group, per, frames, per_frame)
        if progress is not None:
            progress(f"clip {i + 1}/{len(chosen)}: {video}")
    return dict(results)


# -- scoring ----------------------------------------------------------------------------------------


def _bootstrap(per_video: dict[str, tuple[float, float]], rng: np.random.Generator) -> tuple[float, float, float]:
    """(estimate, low, high): the pooled ratio sum(hits)/sum(n) over clips, with a 95% percentile
    bootstrap interval that resamples clips."""
    if not per_video:
        return (float("nan"),) * 3
    hits, n = (np.asarray(v, dtype=float) for v in zip(*per_video.values(), strict=True))
    idx = rng.integers(0, len(n), (BOOTSTRAP, len(n)))
    ratios = hits[idx].sum(1) / np.maximum(n[idx].sum(1), 1e-9)
    return float(hits.sum() / n.sum()), float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def _accuracy(rows: list[dict], rng: np.random.Generator) -> tuple[float, float, float]:
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        per[r["video"]][0] += r["correct"]
        per[r["video"]][1] += 1
    return _bootstrap({v: (h, n) for v, (h, n) in per.items()}, rng)


def forward_scores(held: HeldOut, answers: Answers) -> dict[str, dict]:
    """Per standing question: balanced accuracy of its checks, and its onsets on time / missed."""
    out = {}
    for s in held.standing:
        checks = answers.checks.get(f"{s.video}\n{s.text}")
        if not checks:
            continue
        yes = [(p > 0.5) == s.truth[at] for at, p in checks if s.truth.get(at)]
        no = [(p > 0.5) == s.truth[at] for at, p in checks if s.truth.get(at) is False]
        parts = [np.mean(x) for x in (yes, no) if x]
        said = {at for at, p in checks if p > 0.5}
        # An onset can be caught at the first check after it when the newest frame then still shows it.
        firsts = [min((at for at, _ in checks if at - 1 >= o), default=None) for o in s.onsets]
        seen = [at for at in firsts if at is not None and s.truth.get(at)]
        out[s.qid] = {
            "video": s.video,
            "balanced": float(np.mean(parts)),
            "onsets": len(seen),
            "on_time": sum(at in said for at in seen),
        }
    return out


def summarize(held: HeldOut, answers: Answers, seed: int = 0) -> dict:
    """Accuracy (with its interval) per kind, per backward age, and the forward scores."""
    rng = np.random.default_rng(seed)
    rows = answers.questions
    summary: dict[str, Any] = {
        kind: _accuracy([r for r in rows if r["kind"] == kind], rng) for kind in (REAL_TIME, BACKWARD)
    }
    for age in AGES:
        summary[age] = _accuracy([r for r in rows if r["kind"] == BACKWARD and r["age"] == age], rng)
    fw = forward_scores(held, answers)
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in fw.values():
        per[s["video"]][0] += s["balanced"]
        per[s["video"]][1] += 1
    summary[FORWARD] = _bootstrap({v: (h, n) for v, (h, n) in per.items()}, rng)
    onsets = sum(s["onsets"] for s in fw.values())
    summary["on_time"] = sum(s["on_time"] for s in fw.values()) / onsets if onsets else float("nan")
    summary["text"] = float(np.mean([r["text_correct"] for r in rows])) if rows else float("nan")
    summary["cache_kib"] = float(np.mean(answers.cache_bytes)) / 1024 if answers.cache_bytes else 0.0
    summary["host_kib"] = float(np.mean(answers.host_bytes)) / 1024 if answers.host_bytes else 0.0
    summary["questions"] = {k: sum(r["kind"] == k for r in rows) for k in (REAL_TIME, BACKWARD)} | {FORWARD: len(fw)}
    return summary


def wording_scores(rows: list[dict], seed: int = 0) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Accuracy with its interval per (wording set, kind), for the questions that name their wording."""
    rng = np.random.default_rng(seed)
    out = {}
    for wording in sorted({r["wording"] for r in rows if r.get("wording")}):
        for kind in (REAL_TIME, BACKWARD):
            chosen = [r for r in rows if r.get("wording") == wording and r["kind"] == kind]
            if chosen:
                out[(wording, kind)] = _accuracy(chosen, rng)
    return out


def render_wordings(results: dict[tuple[str, int | None], Answers]) -> str:
    """A markdown table: per policy and budget, real-time and backward accuracy in the training
    wordings and in the held-out ones ('' when no question names its wording)."""
    lines = []
    for (policy, budget), answers in results.items():
        scores = wording_scores(answers.questions)
        if scores:
            cells = " | ".join(
                _cell(scores.get((w, k), float("nan"))) for w in ("train", "heldout") for k in (REAL_TIME, BACKWARD)
            )
            lines.append(f"| {'all' if budget is None else budget} | {policy} | {cells} |")
    if not lines:
        return ""
    head = (
        "| budget | policy | real-time, trained wordings | backward, trained | real-time, held-out wordings "
        "| backward, held-out |"
    )
    return "\n".join([head, "|---:|---|---:|---:|---:|---:|", *lines])


# Tasks whose questions have two answers are scored per answer too: a model that gives one answer
# to all of a task's questions scores near chance on the task, and 100 and 0 on its two answers.
TWO_WAY = frozenset((*YES_NO, *SIDES))
TASK_ORDER = tuple(t for kind in (REAL_TIME, BACKWARD) for t in TASKS[kind])


def _task_key(name: str) -> tuple[int, str]:
    task = name.split(" ")[0]
    return (TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), name)


def task_scores(rows: list[dict], seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """Accuracy with its interval per task ("OJR"), and per answer of a two-answer task ("STU left")."""
    rng = np.random.default_rng(seed)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["task"]].append(r)
        if r["answer"] in TWO_WAY:
            groups[f"{r['task']} {r['answer']}"].append(r)
    return {name: _accuracy(groups[name], rng) for name in sorted(groups, key=_task_key)}


def render_tasks(results: dict[tuple[str, int | None], Answers]) -> str:
    """A markdown table: per policy and budget, the accuracy of each task and of each answer of the
    two-answer tasks ('' when there are no questions)."""
    scores = {key: task_scores(answers.questions) for key, answers in results.items()}
    columns = sorted({c for s in scores.values() for c in s}, key=_task_key)
    if not columns:
        return ""
    lines = ["| budget | policy | " + " | ".join(columns) + " |", "|---:|---|" + "---:|" * len(columns)]
    for (policy, budget), s in scores.items():
        cells = " | ".join(_cell(s.get(c, float("nan"))) for c in columns)
        lines.append(f"| {'all' if budget is None else budget} | {policy} | {cells} |")
    return "\n".join(lines)


def chance(held: HeldOut) -> dict[str, float]:
    """Each column's chance level: the mean of one over the options of its questions (50% forward)."""

    def mean_inv(qs: list[ToyQuestion]) -> float:
        return float(np.mean([1 / len(q.options) for q in qs])) if qs else float("nan")

    out = {kind: mean_inv([q for q in held.questions if q.kind == kind]) for kind in (REAL_TIME, BACKWARD)}
    for age in AGES:
        out[age] = mean_inv([q for q in held.questions if q.kind == BACKWARD and q.age == age])
    out[FORWARD] = 0.5
    return out


def write_results(path: str | Path, held: HeldOut, results: dict, summaries: dict, settings: dict) -> None:
    doc = {
        "settings": settings,
        "chance": chance(held),
        "summaries": [{"policy": p, "budget": b, **s} for (p, b), s in summaries.items()],
        "answers": [{"policy": p, "budget": b, **r} for (p, b), a in results.items() for r in a.questions],
    }
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def compare_runs(base: list[dict], other: list[dict], seed: int = 0) -> list[dict]:
    """Per (policy, budget) in both runs and per question kind (and backward age): both accuracies and
    other minus base in points, with a 95% paired bootstrap interval that resamples clips (each clip's
    questions answered by both, so the clip's own difficulty cancels). `base` and `other` are two bench
    runs' `answers`, on the same clips."""
    rng = np.random.default_rng(seed)
    index = {(r["policy"], r["budget"], r["qid"]): r for r in base}
    rows: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for r in other:
        if (key := (r["policy"], r["budget"], r["qid"])) in index:
            rows[(r["policy"], r["budget"])].append((index[key], r))
    out = []
    for (policy, budget), pairs in rows.items():
        for kind in (REAL_TIME, BACKWARD, *AGES):
            chosen = [(a, b) for a, b in pairs if kind in (a["kind"], a["age"] if a["kind"] == BACKWARD else None)]
            if chosen:
                out.append({"policy": policy, "budget": budget, "kind": kind, **_paired(chosen, rng)})
    return out


def _paired(pairs: list[tuple[dict, dict]], rng: np.random.Generator) -> dict[str, float]:
    """Base and other accuracy (%), and their difference with its clip-resampled 95% interval."""
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for a, b in pairs:
        per[a["video"]][0] += a["correct"]
        per[a["video"]][1] += b["correct"]
        per[a["video"]][2] += 1
    hits_a, hits_b, n = (np.asarray(v, dtype=float) for v in zip(*per.values(), strict=True))
    idx = rng.integers(0, len(n), (BOOTSTRAP, len(n)))
    diffs = (hits_b[idx].sum(1) - hits_a[idx].sum(1)) / n[idx].sum(1)
    return {
        "base": 100 * hits_a.sum() / n.sum(),
        "other": 100 * hits_b.sum() / n.sum(),
        "diff": 100 * (hits_b.sum() - hits_a.sum()) / n.sum(),
        "low": 100 * float(np.percentile(diffs, 2.5)),
        "high": 100 * float(np.percentile(diffs, 97.5)),
        "questions": int(n.sum()),
    }


def render_comparison(rows: list[dict]) -> str:
    """`compare_runs` as a Markdown table."""
    lines = [
        "| policy | budget | questions | n | base % | other % | other - base (95% paired interval) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        budget = "all" if r["budget"] is None else r["budget"]
        lines.append(
            f"| {r['policy']} | {budget} | {r['kind']} | {r['questions']} | {r['base']:.1f} | {r['other']:.1f} | "
            f"{r['diff']:+.1f} ({r['low']:+.1f} to {r['high']:+.1f}) |"
        )
    return "\n".join(lines)


def log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the table --------------------------------------------------------------------------------------

COLUMNS = (REAL_TIME, BACKWARD, *AGES, FORWARD)


def _cell(value: tuple[float, float, float] | float) -> str:
    if isinstance(value, tuple):
        mid, low, high = value
        return "-" if np.isnan(mid) else f"{100 * mid:.1f} ({100 * low:.0f}-{100 * high:.0f})"
    return "-" if np.isnan(value) else f"{100 * value:.1f}"


def _budget_label(budget: int | None, total: int) -> str:
    if budget is None:
        return f"all ({total})"
    share = budget / total
    return f"{budget} ({share:.3g} of {total})"


def render_table(held: HeldOut, summaries: dict[tuple[str, int | None], dict], total: int) -> str:
    """One markdown table: a row per policy and budget; accuracy % with its 95% interval per kind,
    backward by the age of its evidence, forward (balanced, and onsets on time), cache KiB."""
    first = next(iter(summaries.values()))
    counts = first["questions"]
    head = (
        f"| budget (video tokens per layer) | policy | real-time ({counts[REAL_TIME]}) | backward ({counts[BACKWARD]}) "
        f"| early | middle | late | forward ({counts[FORWARD]}) | on time | cache KiB |"
    )
    lines = [head, "|---|---|" + "---:|" * 8]
    odds = chance(held)
    lines.append("| | *chance* | " + " | ".join(_cell(odds[c]) for c in COLUMNS) + " | | |")
    for (policy, budget), s in summaries.items():
        cache = f"{s['cache_kib']:.1f}" + (f" + {s['host_kib']:.1f} host" if s["host_kib"] else "")
        cells = " | ".join(_cell(s[c]) for c in COLUMNS)
        lines.append(f"| {_budget_label(budget, total)} | {policy} | {cells} | {_cell(s['on_time'])} | {cache} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class ForgettingCheck:
    """The benchmark's own check that memory matters here: at the budget nearest a quarter of a
    stream, fifo's early-evidence backward accuracy is near chance (within 15 points) while full's
    is not (above 80%); if fifo could keep up, the world would be too easy to tell memories apart."""

    budget: int
    fifo: float
    full: float
    chance: float

    @property
    def met(self) -> bool:
        return self.fifo <= self.chance + 0.15 and self.full >= 0.80

    def __str__(self) -> str:
        return (
            f"check (memory matters): early-evidence backward at budget {self.budget}: fifo {_cell(self.fifo)}%, "
            f"chance {_cell(self.chance)}%, full {_cell(self.full)}%: {'met' if self.met else 'missed'}"
        )


def forgetting_check(
    summaries: dict, budgets: Sequence[int], total: int, odds: dict[str, float]
) -> ForgettingCheck | None:
    """The check at the budget nearest a quarter of a stream; None unless fifo and full both ran."""
    budget = min(budgets, key=lambda b: abs(b - total / 4))
    fifo, full = summaries.get(("fifo", budget)), summaries.get((FULL, None))
    if fifo is None or full is None:
        return None
    return ForgettingCheck(budget, fifo["early"][0], full["early"][0], odds["early"])
