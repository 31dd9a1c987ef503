"""Several policies on one evaluation: each gets its own memory, and every video is decoded once.

A `PolicyGroup` stands where the harness streams a single session: each chunk of decoded frames
goes into every policy's session in turn, and each question is then asked of each memory. Each
policy's records go to a results file of its own (`policy_out`), so each resumes and is scored
exactly as a run of that policy alone; `render_policy_table` puts their accuracies side by side.
"""

from __future__ import annotations

from pathlib import Path

from hermes.engine.chunk import Chunk
from hermes.engine.session import ChunkReport, StreamingSession
from hermes.memory.config import HermesConfig


class PolicyGroup:
    """Policies' sessions fed the same chunks, for the harness's streaming loop."""

    def __init__(self, sessions: dict[str, StreamingSession]) -> None:
        if not sessions:
            raise ValueError("a policy group needs at least one policy")
        configs = {s.config for s in sessions.values()}
        if len(configs) != 1:
            raise ValueError("the policies of one evaluation share one memory configuration")
        self.sessions = sessions
        self._first = next(iter(sessions.values()))

    @property
    def config(self) -> HermesConfig:
        return self._first.config

    @property
    def frames_seen(self) -> int:
        return self._first.frames_seen

    @property
    def stream_time_s(self) -> float:
        return self._first.stream_time_s

    def reset(self) -> None:
        for session in self.sessions.values():
            session.reset()

    def ingest(self, chunk: Chunk) -> ChunkReport:
        """The chunk into every memory; the first policy's report (they saw the same frames)."""
        reports = [session.ingest(chunk) for session in self.sessions.values()]
        return reports[0]


def policy_out(out: str | Path, policy: str) -> Path:
    """The results file of `policy` in a run of several: results-BENCH.POLICY.jsonl."""
    out = Path(out)
    return out.with_name(f"{out.stem}.{policy}{out.suffix}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def render_policy_table(summaries: dict[str, dict], title: str) -> str:
    """One accuracy table, a column per policy: text accuracy % (the benchmark's rule on the
    generated text) / log-prob accuracy %, per task, per group and overall."""
    policies = list(summaries)
    first = summaries[policies[0]]
    lines = [
        title,
        "",
        "Accuracy %, text (the benchmark's rule) / log-prob (best option letter); answered questions in brackets.",
        "",
        "| task | " + " | ".join(map(str, policies)) + " |",
        "|---|" + "---:|" * len(policies),
    ]

    def row(name: str, pick) -> str:
        cells = []
        for p in policies:
            a = pick(summaries[p])
            cells.append("-" if a is None else f"{_pct(a['text_accuracy'])} / {_pct(a['accuracy'])} ({a['answered']})")
        return f"| {name} | " + " | ".join(cells) + " |"

    lines += [row(task, lambda s, t=task: s["tasks"].get(t)) for task in first["tasks"]]
    lines += [row(f"*{group}*", lambda s, g=group: s["groups"].get(g)) for group in first["groups"]]
    lines.append(row("**overall**", lambda s: s["overall"]))
    return "\n".join(lines)
