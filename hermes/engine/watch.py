"""Standing questions: yes/no questions the memory is asked after every chunk, firing alerts.

A stream can hold up to MAX_STANDING questions ("Is there a red circle?", "Has someone entered?").
After each chunk is ingested and compressed, the session reads each one from its memory through
the same read-only path as a question (scratch tokens, dropped afterwards), and turns the
first-token log-probabilities into p(yes) against p(no), with the tokens the model's own chat
template would start its answer with. A question fires when p(yes) rises above the threshold, and
not again until it has fallen back to the threshold or below (hysteresis), so a scene that stays
true alerts once. A check costs one forward pass over the question's few tokens against the
compact cache, so it is cheap next to the chunk's prefill; each check's cost is measured.

This module holds the questions and their state; `StreamingSession` (hermes/engine/session.py)
reads the memory for it and writes the short answer when one fires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from hermes.engine.metrics import now_ms
from hermes.models.base import VideoLM

MAX_STANDING = 4
DEFAULT_THRESHOLD = 0.5
ALERT_NEW_TOKENS = 32  # the short answer written when a standing question fires
YES_WORDS = ("Yes", "yes", "YES")
NO_WORDS = ("No", "no", "NO")


class WatchError(ValueError):
    """A standing question that cannot be added or removed, with the reason."""


def validate_standing(question: str | None, watching: Sequence[str], max_chars: int, limit: int = MAX_STANDING) -> str:
    """The question, stripped, if it can join `watching`; WatchError (empty, too long, already
    watched, or one too many) otherwise."""
    q = (question or "").strip()
    if not q:
        raise WatchError("The standing question is empty: type a yes/no question, e.g. 'Is someone at the door?'.")
    if len(q) > max_chars:
        raise WatchError(
            f"The standing question is {len(q):,} characters long; the limit is {max_chars:,} characters, "
            "so that it fits in the positions reserved after the video memory."
        )
    if q in watching:
        raise WatchError(f"Already watching for {q!r}.")
    if len(watching) >= limit:
        raise WatchError(
            f"At most {limit} standing questions at once (each is asked after every chunk): "
            f"remove one of {', '.join(repr(w) for w in watching)} first."
        )
    return q


def check_removable(question: str | None, watching: Sequence[str]) -> str:
    """The question, stripped, if it is being watched; WatchError naming the ones that are."""
    q = (question or "").strip()
    if not q:
        raise WatchError("Choose the standing question to remove.")
    if q not in watching:
        known = ", ".join(repr(w) for w in watching) if watching else "none"
        raise WatchError(f"Not watching for {q!r}, so there is nothing to remove (watching: {known}).")
    return q


def check_threshold(threshold: float) -> float:
    """The threshold, if it lies strictly between 0 and 1; WatchError otherwise."""
    if not 0.0 < threshold < 1.0:
        raise WatchError(f"The alert threshold is a probability strictly between 0 and 1; got {threshold:g}.")
    return float(threshold)


@dataclass(frozen=True)
class AnswerWords:
    """The first tokens of "Yes" and "No" (in their usual spellings) as the model's chat template
    would start the assistant's answer with them."""

    yes: tuple[int, ...]
    no: tuple[int, ...]

    @classmethod
    def for_lm(cls, lm: VideoLM) -> AnswerWords:
        """Answer words of `lm`: each word is tokenized after the question's template tail, since a
        BPE tokenizer may split a word differently at the start of a turn than after a space."""
        tail = lm.question_ids("?")[0].tolist()
        tail_text = lm.tokenizer.decode(tail)

        def first(word: str) -> int:
            ids = lm.encode(tail_text + word)[0].tolist()
            if ids[: len(tail)] == tail and len(ids) > len(tail):
                return ids[len(tail)]
            return int(lm.encode(word)[0, 0])  # the tail merged with the word: its own first token

        yes = {first(w) for w in YES_WORDS}
        no = {first(w) for w in NO_WORDS}
        # A token that starts both words says nothing either way (a byte-level tokenizer splits "Yes"
        # and "No" into distinct first bytes, so this only matters for odd vocabularies).
        shared = yes & no
        if yes == shared or no == shared:
            raise ValueError(f"{lm.source}: the tokenizer starts 'Yes' and 'No' with the same token")
        return cls(tuple(sorted(yes - shared)), tuple(sorted(no - shared)))

    def p_yes(self, logprobs: torch.Tensor) -> float:
        """p(yes) / (p(yes) + p(no)) from first-token log-probabilities (vocab,), each side summed
        over its spellings."""
        yes = torch.logsumexp(logprobs[list(self.yes)].float(), 0)
        no = torch.logsumexp(logprobs[list(self.no)].float(), 0)
        return float(torch.sigmoid(yes - no))


@dataclass(frozen=True)
class WatchCheck:
    """One standing question read from the memory after one chunk."""

    question: str
    at_s: float  # stream time of the memory it read
    p_yes: float
    fired: bool  # p(yes) rose above the threshold at this check
    check_ms: float  # the read alone: the question's forward pass and p(yes), not the alert's answer


@dataclass
class WatchCost:
    """What the standing checks of a stream have cost so far, as running totals: a stream keeps
    these, not every check, so that its memory stays flat however long it runs."""

    checks: int = 0
    check_ms: float = 0.0
    chunks: int = 0  # chunks after which the memory was checked
    share: float = 0.0  # summed over those chunks: the time of their checks / their prefill's

    def add(self, checks: Sequence[WatchCheck], prefill_ms: float) -> None:
        """Count the checks made after one chunk whose prefill took `prefill_ms`."""
        if not checks:
            return
        spent = sum(c.check_ms for c in checks)
        self.checks += len(checks)
        self.check_ms += spent
        if prefill_ms > 0:
            self.chunks += 1
            self.share += spent / prefill_ms

    def summary(self) -> str:
        """One line: the mean check, and the mean share of a chunk's prefill that its checks took."""
        share = f"{100 * self.share / self.chunks:.1f}%" if self.chunks else "-"
        return (
            f"standing questions: {self.checks} checks, {self.check_ms / max(1, self.checks):.1f} ms each on "
            f"average; a chunk's checks took {share} of its prefill on average"
        )


class StandingQuestions:
    """Up to `limit` standing questions of one memory, each with its hysteresis state.

    `check(read, at_s)` asks each one through `read` (question -> first-token log-probabilities,
    read-only) and says which fired. The order of the questions is the order they were added in.
    """

    def __init__(
        self,
        words: AnswerWords,
        max_chars: int,
        threshold: float = DEFAULT_THRESHOLD,
        limit: int = MAX_STANDING,
        answer_tokens: int = ALERT_NEW_TOKENS,
    ) -> None:
        self.words = words
        self.max_chars = max_chars
        self.threshold = check_threshold(threshold)
        self.limit = limit
        self.answer_tokens = answer_tokens
        self._above: dict[str, bool] = {}  # question -> p(yes) above the threshold at its last check

    @property
    def questions(self) -> list[str]:
        return list(self._above)

    def __len__(self) -> int:
        return len(self._above)

    def add(self, question: str) -> str:
        """Watch for `question` from the next chunk on; returns it stripped. WatchError if it is
        empty, too long, already watched, or one too many."""
        q = validate_standing(question, self.questions, self.max_chars, self.limit)
        self._above[q] = False
        return q

    def remove(self, question: str) -> str:
        """Stop watching for `question`; WatchError if it is not watched."""
        q = check_removable(question, self.questions)
        del self._above[q]
        return q

    def set_questions(self, questions: Sequence[str]) -> None:
        """Watch exactly `questions`, a list its owner has checked question by question (as a live
        stream checks its viewer's with `validate_standing`): those already watched keep their
        state, the others start fresh, in the list's order."""
        self._above = {q: self._above.get(q, False) for q in questions}

    def alert_state(self) -> dict[str, bool]:
        """Each question, in order, and whether its p(yes) was above the threshold at its last check."""
        return dict(self._above)

    def set_alert_state(self, above: Mapping[str, bool]) -> None:
        """Watch exactly the questions of `above` (checked when they were first added), each in its
        saved alert state: a stream loaded from its memory file alerts as the saved one would."""
        self._above = {str(q): bool(v) for q, v in above.items()}

    def set_threshold(self, threshold: float) -> None:
        self.threshold = check_threshold(threshold)

    def rearm(self) -> None:
        """Forget the hysteresis state (a new stream): each question may fire at its next check."""
        self._above = dict.fromkeys(self._above, False)

    def check(self, read: Callable[[str], torch.Tensor], at_s: float, device: torch.device | None) -> list[WatchCheck]:
        """Read each question through `read` and update its state; one WatchCheck per question."""
        out = []
        for q, was_above in list(self._above.items()):
            t0 = now_ms(device)
            p = self.words.p_yes(read(q))
            check_ms = now_ms(device) - t0
            above = p > self.threshold
            self._above[q] = above
            out.append(WatchCheck(question=q, at_s=at_s, p_yes=p, fired=above and not was_above, check_ms=check_ms))
        return out
