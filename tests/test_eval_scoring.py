"""Each benchmark's rule for a generated answer, against a table of crafted answers whose expected
scores were worked out by hand from the benchmarks' released scorers (StreamingBench's count.py,
OVO-Bench's OVOBenchScore.py, lmms-eval's Video-MME and MVBench utils); a changed rule disagrees
with the table. `tests/test_lmms_plugin.py` also checks the table against lmms-eval's own code."""

from __future__ import annotations

import statistics

import pytest

from hermes.eval import scorers
from hermes.eval.scorers import (
    credited,
    extract_mcq_answer,
    ovo_correct,
    poll_says_yes,
    proactive_correct,
    text_score,
)
from hermes.eval.summary import ANSWERED, official_scores, summarize

# (response, answer letter): StreamingBench, OVO-Bench, Video-MME, MVBench, each
# (what the rule reads, right?), or None where the rule does not count the answer. Four options.
TABLE: list[tuple[str, str, tuple | None, tuple, tuple, tuple | None]] = [
    # response, answer, StreamingBench (first character), OVO-Bench (letters present), Video-MME (extracted), MVBench
    ("B", "B", ("B", True), ("B", True), ("B", True), ("B", True)),
    ("(B)", "B", ("(", False), ("B", True), ("B", True), ("B", True)),
    ("Answer: B", "B", ("A", False), ("AB", True), ("B", True), ("B", True)),
    ("Answer: B", "A", ("A", True), ("AB", True), ("B", False), ("B", False)),  # the "A" of "Answer"
    ("b", "B", ("b", False), (None, False), (None, False), ("B", True)),
    ("I think it is C, not B", "B", ("I", False), ("BC", True), ("B", True), ("C", False)),
    ("", "B", None, (None, False), (None, False), None),
    ("  ", "B", (" ", False), (None, False), (None, False), None),
    ("A.", "B", ("A", False), ("A", False), ("A", False), ("A", False)),
    (" B", "B", (" ", False), ("B", True), ("B", True), ("B", True)),
    ("The answer is a", "B", ("T", False), (None, False), (None, False), ("A", False)),  # MVBench: the article "a"
    ("The answer is a", "A", ("T", False), (None, False), (None, False), ("A", True)),
    ("B. two", "B", ("B", True), ("B", True), ("B", True), ("B", True)),
    ("Both", "B", ("B", True), ("B", True), ("B", True), ("both", False)),
    ("none of them", "B", ("n", False), (None, False), (None, False), ("none of them", False)),
    ("The answer is (B).", "B", ("T", False), ("B", True), ("B", True), ("B", True)),
    ("\n\nB", "B", ("\n", False), ("B", True), ("B", True), ("B", True)),
    ("It is probably Banana", "B", ("I", False), ("B", True), ("B", True), ("it is probably banana", False)),
    ("A or B? I choose D", "D", ("A", False), ("ABD", True), ("A", False), ("A", False)),
    ("c", "C", ("c", False), (None, False), (None, False), ("C", True)),
]  # fmt: skip
RULES = ("streamingbench", "ovobench", "videomme", "mvbench")


def disagreements(rule: str, read) -> list[str]:
    """The table's rows where `read(text, answer)` -> TextScore differs from the expected column."""
    column = 2 + RULES.index(rule)
    out = []
    for row in TABLE:
        text, answer, expected = row[0], row[1], row[column]
        got = read(text, answer)
        seen = None if not got.counted else (got.pred, got.correct)
        if seen != expected:
            out.append(f"{text!r} (answer {answer}): expected {expected}, got {seen}")
    return out


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_scores_the_table_as_its_benchmark(rule: str) -> None:
    assert disagreements(rule, lambda text, answer: text_score(rule, text, answer, 4)) == []


def test_a_changed_rule_disagrees_with_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plausible misreadings of each rule, and the rules of the other benchmarks, all fail the table."""
    score = scorers.TextScore
    variants = {
        "streamingbench": [
            lambda t, a: score(t.strip()[:1] or None, t.strip()[:1] == a, bool(t.strip())),  # stripped
            lambda t, a: score(t[:1].upper() or None, t[:1].upper() == a, bool(t)),  # any case
            lambda t, a: score(t[:1] or None, t[:1] == a, True),  # empty answers counted
        ],
        "ovobench": [
            lambda t, a: scorers.ovobench(t.upper(), a, 4),  # any case
        ],
        "mvbench": [
            lambda t, a: scorers.TextScore(scorers.mvbench_process(t), scorers.mvbench_process(t) == a, True),
        ],
        "videomme": [
            lambda t, a: scorers.videomme(t.upper(), a, 4),
        ],
    }
    for rule, reads in variants.items():
        for read in reads:
            assert disagreements(rule, read), rule
        for other in RULES:
            if other != rule:
                assert disagreements(rule, lambda t, a, other=other: text_score(other, t, a, 4)), (rule, other)
    # Inside the rules: the extractor's ranking, and MVBench's left-out empties.
    monkeypatch.setitem(scorers._PRIORITY, "start", 1)
    assert disagreements("videomme", lambda t, a: text_score("videomme", t, a, 4))
    monkeypatch.undo()
    monkeypatch.setitem(scorers.RULES, "mvbench", lambda t, a, n: scorers.TextScore("", False, True))
    assert disagreements("mvbench", lambda t, a: text_score("mvbench", t, a, 4))


def test_lmms_extractor_details() -> None:
    # A later letter of one kind wins over an earlier one; "(X)" over "X."; choices limit the letters.
    assert extract_mcq_answer("(A) is wrong, (C) is right", "ABCD") == "C"
    assert extract_mcq_answer("A. no. B) yes", "ABCD") == "A"  # alone at the start beats everything
    assert extract_mcq_answer("E", "ABCD") == "" and extract_mcq_answer("E", "ABCDE") == "E"
    assert extract_mcq_answer("选C", "ABCD") == "C"


def test_mvbench_normalisation() -> None:
    # mcq_acc's process: "X. text" gives its letter, else punctuation goes and a lone letter is found.
    assert scorers.mvbench_process("c. the third") == "C"
    assert scorers.mvbench_process('"B"') == "B"
    assert scorers.mvbench_process("3.5 times") == "3.5 times"  # a period before a digit stays
    assert scorers.mvbench_process("It ran.") == "it ran"


def test_ovo_forward_scoring_follows_its_score_script() -> None:
    # REC: the digits of the response, joined, against the count.
    assert ovo_correct("REC", "3", "3") and ovo_correct("REC", "They did it 3 times.", "3")
    assert not ovo_correct("REC", "1 and 2", "2") and ovo_correct("REC", "1 and 2", "12")
    assert not ovo_correct("REC", None, "0") and not ovo_correct("REC", "none", "0")
    # SSR and CRR: exactly Y/N, or the expected word inside the response (case matters, as there).
    assert ovo_correct("SSR", "N", "No") and ovo_correct("CRR", "Y", "Yes") and not ovo_correct("CRR", "Y", "No")
    assert ovo_correct("SSR", "Yes.", "Yes") and not ovo_correct("SSR", "yes", "Yes")
    assert ovo_correct("CRR", "No, not yet", "No") and not ovo_correct("CRR", "No, not yet", "Yes")
    assert credited("SSR", "Yes or No", "No") == "No" and credited("SSR", "maybe", "Yes") is None
    assert credited("REC", "about 4", "4") == "4"


def test_proactive_scoring_follows_count_py() -> None:
    # On time within 2 s either side of the reference; right when on time and the output is inside.
    assert proactive_correct(7.0, 5.0, "red", "red") == (True, True)
    assert proactive_correct(3.0, 5.0, "it is red now", "red") == (True, True)
    assert proactive_correct(7.5, 5.0, "red", "red") == (False, False)
    assert proactive_correct(5.0, 5.0, "Red", "red") == (True, False)  # `in`, case-sensitive
    assert proactive_correct(9.0, 5.0, "no", "red") == (False, False)  # never said yes: the last poll, at +4 s
    # Polling stops at a reply with "yes" anywhere, in any case (even inside a word).
    assert poll_says_yes(" Yes.") and poll_says_yes("YES") and poll_says_yes("eyes")
    assert not poll_says_yes("no") and not poll_says_yes("")


def _summary(tasks: dict[str, tuple[float | None, float | None]], groups: dict | None = None) -> dict:
    rows = {t: {"accuracy": a, "text_accuracy": b} for t, (a, b) in tasks.items()}
    return {"tasks": rows, "groups": groups or {}, "overall": {"accuracy": 0.5, "text_accuracy": 0.25}}


def test_official_aggregates() -> None:
    # OVO-Bench's score.py: per group the mean of its tasks, overall the mean of the groups.
    summary = _summary({"EPM": (0.5, 1.0), "ASI": (1.0, 0.0), "OCR": (0.25, 0.5), "REC": (0.0, 0.0), "SSR": (1.0, 0.5)})
    scores = official_scores("ovobench", summary)
    assert scores["log-prob"] == pytest.approx({"backward": 75.0, "real-time": 25.0, "forward": 50.0, "overall": 50.0})
    assert scores["text"] == pytest.approx({"backward": 50.0, "real-time": 50.0, "forward": 25.0, "overall": 125 / 3})
    assert official_scores("ovobench", _summary({"EPM": (1.0, 1.0)}))["text"]["overall"] is None
    # MVBench: the mean of the task accuracies, each task as lmms-eval scores it.
    mv = official_scores("mvbench", _summary({"Action Sequence": (0.5, 1.0), "Object Shuffle": (1.0, None)}))
    assert mv == {"text": {"average": 100.0}, "log-prob": {"average": 75.0}}
    # Video-MME and StreamingBench: over all questions, and per group.
    groups = {"short": {"accuracy": 1.0, "text_accuracy": 0.5}}
    assert official_scores("videomme", _summary({}, groups))["text"] == {"short": 50.0, "overall": 25.0}


def test_mvbench_task_with_no_counted_answer_scores_zero_as_lmms_eval_aggregates() -> None:
    """Three tasks scored through the real records path: two all right, one whose generated answers
    are all empty. lmms-eval's mvbench_aggregate_results scores that task 0 (no answered prediction),
    so the average is 66.67, not the 100.00 of leaving the task out; a task without generated text
    at all (generation off) is left out, since lmms-eval would have no number for it either."""
    generated = {
        "Action Sequence": [("A", "A"), ("C", "C")],
        "Object Shuffle": [("B", "B"), ("", "A")],
        "Action Count": [("", "A"), ("   ", "B")],
    }
    records = {}
    for task, answers in generated.items():
        for i, (text, answer) in enumerate(answers):
            read = text_score("mvbench", text, answer, 3)
            records[f"{task}/{i}"] = {
                "qid": f"{task}/{i}",
                "task": task,
                "status": ANSWERED,
                "correct": True,
                "text": text,
                "text_correct": read.correct,
                "text_counted": read.counted,
            }
    # lmms-eval's rule, per task: 100 x right / answered over the non-empty predictions, else 0.
    expected = []
    for answers in generated.values():
        answered = [(t.strip(), a) for t, a in answers if t.strip() != ""]
        expected.append(100 * sum(t == a for t, a in answered) / len(answered) if answered else 0)
    assert statistics.fmean(expected) == pytest.approx(66.6667, abs=1e-3)
    summary = summarize(records, list(records))
    assert official_scores("mvbench", summary)["text"]["average"] == pytest.approx(statistics.fmean(expected))
    assert official_scores("mvbench", summary)["log-prob"]["average"] == pytest.approx(100.0)
    # No generated text in a task (generation was off there): left out, not scored 0.
    for qid in ("Action Count/0", "Action Count/1"):
        records[qid] |= {"text_correct": None, "text_counted": False}
    assert official_scores("mvbench", summarize(records, list(records)))["text"]["average"] == pytest.approx(100.0)
