"""StreamingBench's proactive output: poll every second until the model says it is time, then answer.

The protocol of `src/benchmark/StreamingBenchProactive.py`: the clip starts at the question's
time_stamp; at time_stamp + 1 s, + 2 s, ... up to the reference time + 4 s, the model is asked
whether it is the right time to output the expected text (`proactive_poll_prompt`); at the first
reply containing "yes" it is asked the question itself, and polling stops. `src/data/count.py`
scores the last reply: on time when within 2 s of the reference time, right when it is on time and
contains the expected output (`proactive_correct`). Here the stream runs once from time_stamp, and
each poll reads the memory as it is at its second.

Two readings, as for the other questions: the text one is the benchmark's (the generated poll
reply says "yes"); the log-probability one fires at the first poll where p(yes) > 0.5 from the
first token (the standing questions' reading). Each fired reading generates the answer then.
Polls and answers are not remembered as the last turn (like standing questions), so polling never
changes what the memory keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes.engine.session import StreamingSession
from hermes.eval.items import ProactiveItem
from hermes.eval.prompts import proactive_answer_prompt
from hermes.eval.scorers import poll_says_yes, proactive_correct

POLL_MARGIN_S = 4.0  # polling runs until the reference time + 4 s
POLL_TOKENS = 8  # a yes or no, with room for "Yes, ..."
ANSWER_MIN_TOKENS = 16  # the expected output needs a generated answer, even with --max-new-tokens 0


def poll_times(item: ProactiveItem) -> list[float]:
    """time_stamp + 1 s, + 2 s, ... up to the reference time + 4 s."""
    times, t = [], item.start_s + 1.0
    while t <= item.expected_s + POLL_MARGIN_S + 1e-9:
        times.append(t)
        t += 1.0
    return times


@dataclass
class ProactiveWatch:
    """The polls of one proactive task so far, and each reading's reply once it fired."""

    item: ProactiveItem
    max_new_tokens: int
    polls: list[dict] = field(default_factory=list)
    text_reply: tuple[float, str] | None = None
    logprob_reply: tuple[float, str] | None = None
    ttft_ms: float | None = None

    @property
    def done(self) -> bool:
        return self.text_reply is not None and self.logprob_reply is not None

    def poll(self, session: StreamingSession, at_s: float, last: bool) -> dict | None:
        """Poll the memory as it is at `at_s`; the task's record once both readings have replied
        (or after the `last` poll), else None. QuestionError if the prompt is refused."""
        if self.done:
            return None
        item = self.item
        p_yes = session.standing.words.p_yes(session.first_token_logprobs(item.prompt, query=item.question))
        reply = (
            session.ask(item.prompt, POLL_TOKENS, remember=False, query=item.question).text
            if self.text_reply is None
            else None
        )
        self.polls.append({"t": at_s, "p_yes": p_yes, "reply": reply})
        answer: str | None = None
        if reply is not None and poll_says_yes(reply):
            answer = self._answer(session)
            self.text_reply = (at_s, answer)
        if self.logprob_reply is None and p_yes > 0.5:
            self.logprob_reply = (at_s, answer if answer is not None else self._answer(session))
        if last:  # never fired: the last poll's reply is the last word (count.py reads history[-1])
            self.text_reply = self.text_reply or (at_s, reply or "")
            self.logprob_reply = self.logprob_reply or (at_s, "")
        return self.record() if self.done else None

    def give_up(self) -> None:
        """Stop polling (the prompt was refused): the task is skipped, not scored."""
        self.text_reply = self.text_reply or (0.0, "")
        self.logprob_reply = self.logprob_reply or (0.0, "")

    def _answer(self, session: StreamingSession) -> str:
        tokens = max(self.max_new_tokens, ANSWER_MIN_TOKENS)
        question = self.item.question
        update = session.ask(proactive_answer_prompt(question), tokens, remember=False, query=question)
        self.ttft_ms = update.ttft_ms
        return update.text

    def record(self) -> dict:
        """The prediction fields of the task's results record, both readings scored by count.py."""
        item = self.item
        (text_s, text), (pred_s, pred_text) = self.text_reply, self.logprob_reply
        on_time, right = proactive_correct(text_s, item.expected_s, text, item.answer)
        pred_on_time, pred_right = proactive_correct(pred_s, item.expected_s, pred_text, item.answer)
        return {
            "pred": pred_s,
            "pred_text": pred_text,
            "pred_on_time": pred_on_time,
            "correct": pred_right,
            "text": text,
            "text_pred": text_s,
            "on_time": on_time,
            "text_correct": right,
            "text_counted": True,
            "polls": self.polls,
            "ttft_ms": self.ttft_ms,
        }
