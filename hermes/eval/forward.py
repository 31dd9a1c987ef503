"""OVO-Bench forward active responding (REC, SSR, CRR): asked at every test time, scored as OVO-Bench does.

The benchmark's protocol (JoeLeelyf/OVO-Bench: utils/OVOBench.py, utils/chunk_videos.py): each
forward item has test points (`test_info`), each with a time; at each one the model has seen the
video from its start up to that time and is asked the task's prompt (`OVO_FORWARD_PROMPTS`). Here
the video streams once, and each test point is asked when the stream passes its time, from the
memory as it is then.

Predictions. SSR and CRR are yes/no: the prediction is "Yes" when p(yes) > 0.5 in the first-token
log-probabilities, with the model's own answer words (the standing questions' `AnswerWords`), as
the harness scores option letters; the generated text is scored too, as text accuracy. REC asks
for a count: the prediction is the greedy answer's text (at least REC_MIN_NEW_TOKENS tokens).

Scoring follows utils/OVOBenchScore.py (`ovo_correct`): REC is right when the digits of the
response, joined, spell the count; SSR and CRR when the response is exactly "Y"/"N" as expected,
or contains "Yes"/"No" as expected. Each test point counts once. score.py's summary: per task the
mean over its test points, per group (backward, real-time, forward) the mean of its tasks'
accuracies, overall the mean of the three groups (`ovo_scores`).
"""

from __future__ import annotations

import re
import statistics

from hermes.engine.session import StreamingSession
from hermes.eval.formats import OVO_BACKWARD, OVO_FORWARD, OVO_REAL_TIME, ForwardItem

REC_MIN_NEW_TOKENS = 8  # a count needs a generated answer, even with --max-new-tokens 0
OVO_GROUPS = {"backward": OVO_BACKWARD, "real-time": OVO_REAL_TIME, "forward": OVO_FORWARD}


def ovo_correct(task: str, response: str | None, expected: str) -> bool:
    """Whether OVO-Bench's scorer credits `response` for a forward test point expecting `expected`
    (the count for REC, "Yes" or "No" for SSR and CRR)."""
    if response is None:
        return False
    if task == "REC":
        return "".join(re.findall(r"\d+", response)) == expected
    if (response == "N" and expected == "No") or (response == "Y" and expected == "Yes"):
        return True
    return expected in response


def credited(task: str, text: str, expected: str) -> str | None:
    """What OVO-Bench's scorer reads in a generated text: the count (REC), or the yes/no answer it
    credits ("Yes" or "No"; `expected` when it would credit both, None when neither)."""
    if task == "REC":
        return "".join(re.findall(r"\d+", text))
    yes, no = ovo_correct(task, text, "Yes"), ovo_correct(task, text, "No")
    if yes and no:
        return expected
    return "Yes" if yes else "No" if no else None


def answer_forward(session: StreamingSession, item: ForwardItem, max_new_tokens: int) -> dict:
    """Ask one forward test point of the memory as it is now; the record's prediction fields
    (pred, correct, p_yes, text, text_pred, ttft_ms). QuestionError if the prompt is refused."""
    prompt = item.prompt()
    if item.task == "REC":
        answer = session.ask(prompt, max(max_new_tokens, REC_MIN_NEW_TOKENS))
        pred = credited(item.task, answer.text, item.answer)
        return {
            "pred": pred,
            "correct": ovo_correct(item.task, answer.text, item.answer),
            "p_yes": None,
            "text": answer.text,
            "text_pred": pred,
            "ttft_ms": answer.ttft_ms,
        }
    p_yes = session.standing.words.p_yes(session.first_token_logprobs(prompt))
    pred = "Yes" if p_yes > 0.5 else "No"
    answer = session.ask(prompt, max_new_tokens) if max_new_tokens > 0 else None
    return {
        "pred": pred,
        "correct": ovo_correct(item.task, pred, item.answer),
        "p_yes": p_yes,
        "text": answer.text if answer else "",
        "text_pred": credited(item.task, answer.text, item.answer) if answer else None,
        "ttft_ms": answer.ttft_ms if answer else None,
    }


def ovo_scores(summary: dict) -> dict:
    """OVO-Bench's summary of a harness summary, in percent, as its score.py computes it: per group
    the mean of its tasks' accuracies, and overall the mean of the three groups (None until every
    group has an answered task)."""
    out: dict[str, float | None] = {}
    for group, tasks in OVO_GROUPS.items():
        accuracies = [
            summary["tasks"][t]["accuracy"]
            for t in tasks
            if t in summary["tasks"] and summary["tasks"][t]["accuracy"] is not None
        ]
        out[group] = 100 * statistics.fmean(accuracies) if accuracies else None
    groups = [out[g] for g in OVO_GROUPS]
    out["overall"] = statistics.fmean(groups) if None not in groups else None
    return out


def render_ovo_scores(scores: dict) -> str:
    """One line: the three group averages and the overall score."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    parts = " · ".join(f"{group} {pct(scores[group])}" for group in OVO_GROUPS)
    overall = pct(scores["overall"]) if scores["overall"] is not None else "- (needs all three groups)"
    return (
        f"OVO-Bench score (mean of the task accuracies per group, then of the groups, as its score.py): "
        f"{parts} · overall {overall}"
    )
