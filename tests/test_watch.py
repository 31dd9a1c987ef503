"""Standing questions: answer words, p(yes), hysteresis, bad input, and a memory left bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.engine.session import MAX_QUESTION_CHARS, StreamingSession
from hermes.engine.watch import MAX_STANDING, AnswerWords, StandingQuestions, WatchError
from hermes.memory.config import HermesConfig
from tests.helpers import assert_same_memory, memory_state, random_chunk

FRAMES = 2  # per chunk: small, and even for Qwen2.5-VL
QUESTIONS = ("Is there a red circle?", "Is the scene dark?")


def _session(lm, budget: int = 150) -> StreamingSession:
    return StreamingSession(lm, HermesConfig(budget=budget, chunk_frames=FRAMES, fps=1.0))


def test_answer_words_are_the_first_tokens_of_yes_and_no(lm):
    words = AnswerWords.for_lm(lm)
    assert words.yes and words.no and not set(words.yes) & set(words.no)
    # The tiny models' byte-level tokenizer starts "Yes"/"YES" with "Y" and "yes" with "y".
    assert sorted(lm.tokenizer.decode([i]) for i in words.yes) == ["Y", "y"]
    assert sorted(lm.tokenizer.decode([i]) for i in words.no) == ["N", "n"]
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    logp = torch.full((vocab,), -30.0)
    logp[list(words.yes)] = torch.log(torch.tensor(0.3))
    logp[list(words.no)] = torch.log(torch.tensor(0.1))
    # Each side sums over its spellings: 0.6 against 0.2.
    assert words.p_yes(logp) == pytest.approx(0.75, abs=1e-6)


def test_bad_standing_questions_get_clear_messages(llava_lm):
    standing = StandingQuestions(AnswerWords.for_lm(llava_lm), max_chars=MAX_QUESTION_CHARS)
    with pytest.raises(WatchError, match="empty"):
        standing.add("   ")
    with pytest.raises(WatchError, match="1,001 characters long; the limit is 1,000"):
        standing.add("x" * 1001)
    for i in range(MAX_STANDING):
        standing.add(f" Is there a cat number {i}? ")
    assert standing.questions[0] == "Is there a cat number 0?"  # stripped
    with pytest.raises(WatchError, match="Already watching"):
        standing.add("Is there a cat number 1?")
    with pytest.raises(WatchError, match=f"At most {MAX_STANDING} standing questions"):
        standing.add("Is there a dog?")
    with pytest.raises(WatchError, match="Not watching for 'Is there a dog\\?'"):
        standing.remove("Is there a dog?")
    standing.remove("Is there a cat number 2?")
    assert len(standing) == MAX_STANDING - 1
    standing.add("Is there a dog?")  # room again
    for bad in (0.0, 1.0, -0.5, 2.0):
        with pytest.raises(WatchError, match="strictly between 0 and 1"):
            standing.set_threshold(bad)


def test_hysteresis_fires_on_crossing_only(llava_lm):
    words = AnswerWords.for_lm(llava_lm)
    vocab = llava_lm.model.get_output_embeddings().weight.shape[0]

    def logprobs(p_yes: float) -> torch.Tensor:
        logp = torch.full((vocab,), -50.0)
        logp[words.yes[0]] = float(np.log(p_yes))
        logp[words.no[0]] = float(np.log(1 - p_yes))
        return logp

    standing = StandingQuestions(words, max_chars=MAX_QUESTION_CHARS, threshold=0.6)
    standing.add("Is the bird flying?")
    sequence = [0.2, 0.7, 0.9, 0.65, 0.6, 0.3, 0.8, 0.8]
    fired = []
    for p in sequence:
        (check,) = standing.check(lambda q, p=p: logprobs(p), at_s=0.0, device=None)
        assert check.p_yes == pytest.approx(p, abs=1e-5)
        fired.append(check.fired)
    # Fires above 0.6; stays quiet while above; 0.6 itself counts as fallen back.
    assert fired == [False, True, False, False, False, False, True, False]
    standing.rearm()  # a new stream: it may fire again at once
    (check,) = standing.check(lambda q: logprobs(0.8), at_s=0.0, device=None)
    assert check.fired


def test_checks_read_the_memory_and_leave_it_bit_identical(lm):
    watched, plain = _session(lm), _session(lm)
    # A threshold this low fires at the first check, so alerts are written too.
    watched.standing.set_threshold(0.01)
    for q in QUESTIONS:
        watched.standing.add(q)
    watched.standing.answer_tokens = 3
    for i in range(5):
        report = watched.ingest(random_chunk(i, FRAMES))
        base = plain.ingest(random_chunk(i, FRAMES))
        assert [c.question for c in report.watches] == list(QUESTIONS)
        for check in report.watches:
            assert 0.0 <= check.p_yes <= 1.0 and check.check_ms > 0
            assert check.at_s == report.stream_time_s
            # The check read the memory as a question would: the same first-token distribution.
            assert check.p_yes == pytest.approx(
                watched.standing.words.p_yes(watched.first_token_logprobs(check.question)), abs=1e-5
            )
        fired = [c.question for c in report.watches if c.fired]
        assert fired == (list(QUESTIONS) if i == 0 else [])  # hysteresis: once, while it stays above
        assert [a.question for a in report.alerts] == fired
        assert all(a.done and a.tokens <= 3 and a.ttft_ms > 0 for a in report.alerts)
        assert base.watches == [] and base.alerts == []
        assert report.cache_bytes == base.cache_bytes
        assert_same_memory(memory_state(plain.memory), watched.memory, storage=False)
    assert watched.memory.tokens_seen > 150  # the budget was passed: compression ran with watches on
    # Alerts are not turns of the conversation: the guidance prompt never saw them.
    assert watched.reader.answers == [] and watched.reader.last_turn is None


def test_standing_questions_outlive_a_reset_and_rearm(llava_lm):
    session = _session(llava_lm)
    session.standing.set_threshold(0.01)
    session.standing.add(QUESTIONS[0])
    assert session.ingest(random_chunk(0, FRAMES)).watches[0].fired
    assert not session.ingest(random_chunk(1, FRAMES)).watches[0].fired
    session.reset()
    assert session.standing.questions == [QUESTIONS[0]]
    assert session.ingest(random_chunk(0, FRAMES)).watches[0].fired
    session.standing.remove(QUESTIONS[0])
    assert session.ingest(random_chunk(1, FRAMES)).watches == []
