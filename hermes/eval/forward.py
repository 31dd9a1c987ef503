"""OVO-Bench forward active responding (REC, SSR, CRR): asked at every test time, scored as OVO-Bench does.

The benchmark's protocol (JoeLeelyf/OVO-Bench: utils/OVOBench.py, utils/chunk_videos.py): each
forward item has test points (`test_info`), each with a time; at each one the model has seen the
video from its start up to that time and is asked the task's prompt (`hermes.eval.prompts`). Here
the video streams once, and each test point is asked when the stream passes its time, from the
memory as it is then.

Predictions. SSR and CRR are yes/no: the prediction is "Yes" when p(yes) > 0.5 in the first-token
log-probabilities, with the model's own answer words (the standing questions' `AnswerWords`), as
the harness scores option letters; the generated text is scored too, as text accuracy. REC asks
for a count: the prediction is the greedy answer's text (at least REC_MIN_NEW_TOKENS tokens).

Scoring follows utils/OVOBenchScore.py (`hermes.eval.scorers.ovo_correct`). Each test point
counts once.
"""

from __future__ import annotations

from hermes.engine.session import StreamingSession
from hermes.eval.items import ForwardItem
from hermes.eval.scorers import credited, ovo_correct

REC_MIN_NEW_TOKENS = 8  # a count needs a generated answer, even with --max-new-tokens 0


def answer_forward(session: StreamingSession, item: ForwardItem, max_new_tokens: int) -> dict:
    """Ask one forward test point of the memory as it is now; the record's prediction fields
    (pred, correct, p_yes, text, text_pred, ttft_ms). QuestionError if the prompt is refused."""
    prompt = item.prompt
    if item.task == "REC":
        answer = session.ask(prompt, max(max_new_tokens, REC_MIN_NEW_TOKENS), query=item.question)
        pred = credited(item.task, answer.text, item.answer)
        return {
            "pred": pred,
            "correct": ovo_correct(item.task, answer.text, item.answer),
            "p_yes": None,
            "text": answer.text,
            "text_pred": pred,
            "text_correct": ovo_correct(item.task, answer.text, item.answer),
            "text_counted": True,
            "ttft_ms": answer.ttft_ms,
        }
    p_yes = session.standing.words.p_yes(session.first_token_logprobs(prompt, query=item.question))
    pred = "Yes" if p_yes > 0.5 else "No"
    answer = session.ask(prompt, max_new_tokens, query=item.question) if max_new_tokens > 0 else None
    return {
        "pred": pred,
        "correct": ovo_correct(item.task, pred, item.answer),
        "p_yes": p_yes,
        "text": answer.text if answer else "",
        "text_pred": credited(item.task, answer.text, item.answer) if answer else None,
        "text_correct": ovo_correct(item.task, answer.text, item.answer) if answer else None,
        "text_counted": answer is not None,
        "ttft_ms": answer.ttft_ms if answer else None,
    }
