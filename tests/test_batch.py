"""Batched answering (hermes.engine.batch): every answer in a batch is the answer asked alone.

Sessions hold different streams and different lengths (past the budget, still filling, a full
cache, FIFO), the questions have different lengths and token limits, and a row joins while the
others decode: each answer equals, token for token, the same question asked alone with
`StreamingSession.ask` (and transformers' `generate` on the session's cache), the first-token
log-probabilities agree within 1e-4, and every memory is bit-identical afterwards.
"""

from __future__ import annotations

import pytest

from hermes.engine import batch
from hermes.engine.batch import BatchDecoder
from hermes.engine.session import QuestionError, StreamingSession
from hermes.memory.config import HermesConfig
from tests.helpers import assert_same_memory, generate_on_cache, memory_state, random_chunk

FRAMES = 2
BUDGET = 150
# (policy, chunks, question, max new tokens): lengths differ, and rows finish at different steps.
CASES = [
    ("hermes", 4, "What is happening?", 9),
    ("fifo", 3, "Who?", 14),
    ("hermes", 1, "Describe the colours in the scene, from left to right, please.", 0),
    ("full", 3, "Where is the ball now?", 6),
]


def _sessions(lm) -> list[StreamingSession]:
    """One session per case, each streaming its own frames."""
    out = []
    for s, (policy, chunks, _, _) in enumerate(CASES):
        config = HermesConfig(budget=BUDGET, chunk_frames=FRAMES, fps=1.0)
        session = StreamingSession(lm, config, policy=policy)
        for i in range(chunks):
            session.ingest(random_chunk(i, FRAMES, seed=100 * s + i))
        out.append(session)
    return out


def _generated_alone(lm, session: StreamingSession, question: str, max_new_tokens: int) -> list[int]:
    """Token ids of the greedy answer through transformers' own `generate` on the session's cache."""
    if max_new_tokens == 0:
        return []
    tokens, _ = generate_on_cache(lm, session.memory, question, max_new_tokens)
    return [t for t in tokens if t not in lm.eos_token_ids]


def _run(decoder: BatchDecoder, join_later: dict[int, tuple] | None = None) -> dict:
    """Step until the batch is empty; rows in `join_later` ({step: (session, question, n, tag)}) are
    added before that step. Returns every update per tag."""
    updates: dict = {}
    step = 0
    while len(decoder) or (join_later and step <= max(join_later)):
        if join_later and step in join_later:
            decoder.add(*join_later[step])
        for row, update in decoder.step():
            updates.setdefault(row.tag, []).append((row, update))
        step += 1
    return updates


def test_a_batch_answers_each_question_as_asked_alone(lm):
    sessions = _sessions(lm)
    lengths = {s.memory.get_seq_length() for s in sessions}
    assert len(lengths) > 1, "the sessions should hold memories of different lengths"
    before = [memory_state(s.memory) for s in sessions]

    decoder = BatchDecoder(lm)
    for i in (0, 1, 2):
        decoder.add(sessions[i], CASES[i][2], CASES[i][3], tag=i)
    # The fourth question arrives while the others decode: it joins at step 3.
    updates = _run(decoder, {3: (sessions[3], CASES[3][2], CASES[3][3], 3)})
    assert len(decoder) == 0
    for s, b in zip(sessions, before, strict=True):
        assert_same_memory(b, s.memory)  # the batch never wrote into a memory

    for i, (session, (_, _, question, max_new)) in enumerate(zip(sessions, CASES, strict=True)):
        *streamed, (row, last) = updates[i]
        assert last.done and not any(u.done for _, u in streamed)
        alone = session.ask(question, max_new)
        assert row.generated == _generated_alone(lm, session, question, max_new)
        assert (last.text, last.tokens) == (alone.text, alone.tokens)
        assert [u.tokens for _, u in streamed] == list(range(1, alone.tokens + 1))  # streamed token by token
        assert [t for t, _ in last.top_logprobs] == [t for t, _ in alone.top_logprobs]
        assert (row.logprobs - session.first_token_logprobs(question)).abs().max().item() < 1e-4
        assert last.ttft_ms > 0 and last.frames_seen == session.frames_seen
        assert_same_memory(before[i], session.memory)
    # The batch recorded each answer on its session, as ask does (it prefixes the next guidance prompt).
    assert [len(s.reader.answers) for s in sessions] == [2, 2, 2, 2]
    assert sessions[0].reader.answers[0].text == sessions[0].reader.answers[1].text


def test_rows_of_equal_length_batch_without_padding(lm):
    # Past the budget every HERMES memory has the same length: the common case under load.
    sessions = [_sessions(lm)[0]]
    for seed in (7, 8):
        config = HermesConfig(budget=BUDGET, chunk_frames=FRAMES, fps=1.0)
        session = StreamingSession(lm, config)
        for i in range(4):
            session.ingest(random_chunk(i, FRAMES, seed=10 * seed + i))
        sessions.append(session)
    assert len({s.memory.get_seq_length() for s in sessions}) == 1
    decoder = BatchDecoder(lm)
    for i, s in enumerate(sessions):
        decoder.add(s, "What is happening?", 5, tag=i)
    updates = _run(decoder)
    for i, s in enumerate(sessions):
        row, last = updates[i][-1]
        assert last.text == s.ask("What is happening?", 5).text
        assert (row.logprobs - s.first_token_logprobs("What is happening?")).abs().max().item() < 1e-4


def test_the_batch_cache_grows_as_answers_get_longer(qwen_lm, monkeypatch):
    monkeypatch.setattr(batch, "ROOM", 1)  # no spare room: the second step grows the storage
    sessions = _sessions(qwen_lm)[:2]
    decoder = BatchDecoder(qwen_lm)
    for i, s in enumerate(sessions):
        decoder.add(s, "What is happening?", 12, tag=i)
    updates, grown = {}, set()
    while len(decoder):
        for row, update in decoder.step():
            updates[row.tag] = update
        if decoder.rows:
            grown.add(decoder._cache.kv_layers[0]._k.shape[-2])
    assert len(grown) > 1
    for i, s in enumerate(sessions):
        assert updates[i].tokens == 12 and updates[i].text == s.ask("What is happening?", 12).text


def test_a_dropped_row_is_not_recorded_and_the_others_go_on(llava_lm):
    lm = llava_lm
    sessions = _sessions(lm)[:2]
    decoder = BatchDecoder(lm)
    rows = [decoder.add(s, "What is happening?", 8, tag=i) for i, s in enumerate(sessions)]
    decoder.step()
    decoder.drop(rows[0])
    assert decoder.rows == [rows[1]]
    updates = _run(decoder)
    assert list(updates) == [1] and updates[1][-1][1].done
    assert sessions[0].reader.answers == [] and sessions[0].reader.last_turn is None
    assert updates[1][-1][1].text == sessions[1].ask("What is happening?", 8).text
    # A row dropped before it joined never runs.
    decoder.drop(decoder.add(sessions[0], "Why?", 4))
    assert len(decoder) == 0 and decoder.step() == []
    # Dropping the last running row keeps the rows waiting to join.
    running = decoder.add(sessions[0], "Why?", 4)
    decoder.step()
    waiting = decoder.add(sessions[1], "How?", 2, tag="w")
    decoder.drop(running)
    assert decoder.rows == [] and decoder.joining == [waiting]
    assert _run(decoder)["w"][-1][1].done


def test_bad_rows_are_refused_at_once(llava_lm, qwen_lm):
    session = _sessions(llava_lm)[0]
    decoder = BatchDecoder(llava_lm)
    with pytest.raises(QuestionError, match="empty"):
        decoder.add(session, "   ")
    empty = StreamingSession(llava_lm, HermesConfig(budget=BUDGET, chunk_frames=FRAMES, fps=1.0))
    with pytest.raises(QuestionError, match="No video yet"):
        decoder.add(empty, "What is happening?")
    with pytest.raises(ValueError, match="the batch's model"):
        BatchDecoder(qwen_lm).add(session, "What is happening?")
    assert len(decoder) == 0


def test_rows_past_the_memory_cap_wait_for_room(llava_lm):
    sessions = _sessions(llava_lm)[:3]
    one = max(sum(2 * k.numel() * k.element_size() for k, _ in s.memory.kv()) for s in sessions)
    decoder = BatchDecoder(llava_lm, max_bytes=int(1.5 * one))  # room for one copy at a time
    rows = [decoder.add(s, "What is happening?", 3 + i, tag=i) for i, s in enumerate(sessions)]
    held = []
    updates = {}
    while len(decoder):
        for row, update in decoder.step():
            updates[row.tag] = update
        held.append([r.tag for r in decoder.rows])
    # One row at a time: each joined when the one before had left.
    assert all(len(tags) <= 1 for tags in held) and [r.tag for r in rows] == [0, 1, 2]
    for i, s in enumerate(sessions):
        assert updates[i].done and updates[i].text == s.ask("What is happening?", 3 + i).text
