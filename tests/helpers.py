"""Helpers shared by several test files."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

import torch

from hermes.engine.batch import BatchDecoder
from hermes.engine.session import StreamingSession
from hermes.memory.cache import HermesCache


@contextlib.contextmanager
def hold_answers(session: StreamingSession) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold `session`'s answers after their first token until the gate opens (at the latest on exit).

    Answers decode in the model thread's batch: once a row of `session` has its first token (and
    the viewer has it), the thread waits before the batch's next step."""
    first, gate = threading.Event(), threading.Event()
    real = BatchDecoder.step

    def held(decoder: BatchDecoder):
        if not first.is_set() and any(row.session is session and row.tokens for row in decoder.rows):
            first.set()
            gate.wait(10)
        return real(decoder)

    BatchDecoder.step = held
    try:
        yield first, gate
    finally:
        gate.set()  # never leave the model thread waiting, even when the test fails
        BatchDecoder.step = real


def generate_on_cache(
    lm, cache: HermesCache, question: str, max_new_tokens: int, name: str = "cache"
) -> tuple[list[int], torch.Tensor]:
    """Greedy answer through transformers' own `generate` on `cache`, passed as `name` (`cache` or
    its pre-rename name `past_key_values`): the answer's token ids, and the first token's log-probabilities."""
    ids = lm.question_ids(question)
    n = ids.shape[-1]
    with cache.scratch(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # `past_key_values` is the pre-rename name of `cache`
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones(1, cache.get_seq_length() + n, dtype=torch.long),
            position_ids=cache.position_ids(n),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            **{name: cache},
        )
    return out.sequences[0, n:].tolist(), torch.log_softmax(out.scores[0][0].float(), dim=-1)
