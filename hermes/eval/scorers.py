"""Each benchmark's own rule for reading a generated answer, as its released code applies it.

`text_score(rule, text, answer, n_options)` says what the rule reads in `text` (`pred`), whether
that is right (`correct`), and whether the answer counts at all (`counted`: some scorers leave
certain answers out of the denominator). The rules:

- "streamingbench": StreamingBench's `src/data/count.py` (`count`): the answer's first character,
  as generated (no stripping, no case folding), against the answer letter. An empty answer is not
  counted: the SQA branch skips it, and the real-time branch would stop on it with an IndexError.
- "ovobench": OVO-Bench's `utils/OVOBenchScore.py` (`calculate_score_backward_realtime`): right when
  the answer letter occurs anywhere in the response (case-sensitive).
- "videomme": lmms-eval's `tasks/videomme/utils.py` (`videomme_process_results`, with
  `extract_characters_regex` = `tasks/_task_utils/mcq_extract.py` `extract_mcq_answer` over A-D),
  aggregated by `videomme_aggregate_results` (the extracted letter equal to the answer). Every
  answer counts; one without a letter is wrong.
- "mvbench": lmms-eval's `tasks/mvbench/utils.py` (`mvbench_process_results`, `mcq_acc`) after
  `api/task.py` strips the response; `mvbench_aggregate_results` leaves answers that are empty
  (after stripping) out of the denominator.

OVO-Bench's forward tasks (`ovo_correct`) and StreamingBench's proactive output
(`proactive_correct`) have rules of their own, below.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass

LETTERS = string.ascii_uppercase
PROACTIVE_WINDOW_S = 2.0  # count.py: the reply is on time within 2 s of the reference time


@dataclass(frozen=True)
class TextScore:
    """What a rule reads in an answer, whether it is right, and whether it counts."""

    pred: str | None
    correct: bool
    counted: bool = True


def streamingbench(text: str, answer: str, n_options: int) -> TextScore:
    """count.py: `question[model][0] == question["answer"]`, empty answers left out."""
    if not text:
        return TextScore(None, False, counted=False)
    return TextScore(text[0], text[0] == answer)


def ovobench(text: str, answer: str, n_options: int) -> TextScore:
    """OVOBenchScore.py: `int(gt in response)`; `pred` lists the option letters the response contains."""
    present = "".join(letter for letter in LETTERS[:n_options] if letter in text)
    return TextScore(present or None, answer in text)


# -- lmms-eval's multiple-choice extractor (tasks/_task_utils/mcq_extract.py) ------------------------

_ANSWER_PHRASES = (
    "the answer is",
    "answer is",
    "the correct answer is",
    "correct answer is",
    "the best answer is",
    "best answer is",
    "the correct option is",
    "correct option is",
    "the best option is",
    "best option is",
    "the choice is",
    "choice is",
    "the correct choice is",
    "correct choice is",
    "i choose",
    "i select",
    "i pick",
    "my answer is",
    "my choice is",
    "옵션",
    "정답은",
    "답은",
    "답:",
    "答案是",
    "答案为",
    "选",
    "答えは",
)
# Higher wins; within one kind, the later position wins.
_PRIORITY = {
    "start": 10,
    "end": 9,
    "phrase": 7,
    "parentheses": 6,
    "period": 5,
    "colon": 4,
    "right_paren": 3,
    "space": 2,
}
_SUFFIXED = {"period": "{}.", "colon": "{}:", "right_paren": "{})", "space": "{} "}


def extract_mcq_answer(response: str, choices: str) -> str:
    """The choice letter lmms-eval reads in a response, or "" (`extract_mcq_answer`).

    Every way a letter can appear is a candidate, ranked by kind (alone at the start, alone at the
    end, after an answer phrase, "(B)", "B.", "B:", "B)", "B "), then by position (the last one);
    only when there is none, any occurrence of a choice letter at all."""
    if not response or not response.strip():
        return ""
    text = response.strip()
    for char in ",.!?;:'\"":
        text = text.strip(char)
    text = f" {text} "
    candidates: list[tuple[int, int, str]] = []  # (priority, position, letter)
    for ch in choices:
        if f"({ch})" in text:
            candidates.append((_PRIORITY["parentheses"], text.rfind(f"({ch})"), ch))
        for kind, pattern in _SUFFIXED.items():
            if pattern.format(ch) in text:
                candidates.append((_PRIORITY[kind], text.rfind(pattern.format(ch)), ch))
    lower = text.lower()
    for phrase in _ANSWER_PHRASES:
        at = lower.find(phrase)
        if at != -1:
            for ch in choices:
                found = text.find(ch, at + len(phrase))  # anywhere after the phrase, even inside a word
                if found != -1:
                    candidates.append((_PRIORITY["phrase"], found, ch))
    alone = text.strip()
    for ch in choices:
        if alone.startswith(ch) and (len(alone) == 1 or not alone[1].isalpha()):
            candidates.append((_PRIORITY["start"], 0, ch))
        if alone.endswith(ch) and (len(alone) == 1 or not alone[-2].isalpha()):
            candidates.append((_PRIORITY["end"], len(text) - 1, ch))
    if not candidates:
        candidates = [(0, text.rfind(ch), ch) for ch in choices if ch in text]
    # Python's sort is stable and lmms-eval sorts with reverse=True, which keeps equal keys in their
    # order of insertion: the first candidate with the highest (priority, position) wins.
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else ""


def videomme(text: str, answer: str, n_options: int) -> TextScore:
    """videomme_aggregate_results: `pred_answer == answer`, pred_answer extracted over A-D."""
    pred = extract_mcq_answer(text, "ABCD")
    return TextScore(pred or None, pred == answer)


# -- lmms-eval's MVBench scorer (tasks/mvbench/utils.py) -----------------------------------------------

# Both as written there. The period pattern's "(?!<=\d)" is a look-ahead, not a look-behind: it
# removes every period not followed by a digit.
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA = re.compile(r"(\d)(\,)(\d)")
_PUNCT = (";", r"/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_OPTION = re.compile(r"^([A-E])\.\s*(.+)$", re.IGNORECASE)
_SINGLE = re.compile(r"\b([A-E])\b", re.IGNORECASE)
# mcq_acc passes re.UNICODE (32) where re.sub takes its count: at most 32 periods go.
_PERIOD_COUNT = re.UNICODE


def _mvbench_punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        if p + " " in text or " " + p in text or _COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out, _PERIOD_COUNT)


def mvbench_process(answer: str) -> str:
    """mcq_acc's `process`: the option letter ("B. ...", or a lone letter anywhere, any case), else
    the answer normalised (punctuation, quotes and parentheses removed, lower case)."""
    match = _OPTION.match(answer.strip())
    if match:
        return match.group(1).upper()
    answer = answer.replace("\n", " ").replace("\t", " ").strip()
    answer = _mvbench_punctuation(answer)
    answer = answer.strip("'").strip('"').strip(")").strip("(").strip().lower()
    letter = _SINGLE.search(answer)
    return letter.group(1).upper() if letter else answer


def mvbench(text: str, answer: str, n_options: int) -> TextScore:
    """mcq_acc(gt letter, stripped response), empty responses left out of the denominator."""
    response = text.strip()
    if response == "":
        return TextScore(None, False, counted=False)
    pred = mvbench_process(response)
    return TextScore(pred, pred == mvbench_process(answer))


RULES: dict[str, Callable[[str, str, int], TextScore]] = {
    "streamingbench": streamingbench,
    "ovobench": ovobench,
    "videomme": videomme,
    "mvbench": mvbench,
}


def text_score(rule: str, text: str, answer: str, n_options: int) -> TextScore:
    """Score a multiple-choice answer by the named benchmark's rule."""
    return RULES[rule](text, answer, n_options)


# -- OVO-Bench forward active responding (utils/OVOBenchScore.py, calculate_score_forward) ------------


def ovo_correct(task: str, response: str | None, expected: str) -> bool:
    """Whether OVO-Bench credits `response` for a forward test point expecting `expected` (the
    count for REC, "Yes" or "No" for SSR and CRR): REC when the digits of the response, joined,
    spell the count; SSR and CRR when the response is exactly "Y"/"N" as expected, or contains
    "Yes"/"No" as expected."""
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


# -- StreamingBench proactive output (src/data/count.py, task "proactive") ------------------------------


def poll_says_yes(reply: str) -> bool:
    """StreamingBenchProactiveEval stops polling when `'yes' in response.strip().lower()`."""
    return "yes" in reply.strip().lower()


def proactive_correct(reply_s: float, expected_s: float, reply: str, expected: str) -> tuple[bool, bool]:
    """(on time, right): the last reply within 2 s of the reference time, and, on time, the
    expected output inside it."""
    on_time = -PROACTIVE_WINDOW_S <= reply_s - expected_s <= PROACTIVE_WINDOW_S
    return on_time, on_time and expected in reply
