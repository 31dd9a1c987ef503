"""The read side of a stream's memory: questions, answers and log-probabilities, as scratch tokens.

A question is prefilled after the memory, the answer decoded greedily after it, and both are
dropped at the end (`HermesCache.scratch`), so that reading never changes what the stream
remembers. A `MemoryReader` is given what it reads: the model, the memory, the policy's
question-time state (where a question goes, and the forward pass over it: ReKV brings frames back
first) and the stream's progress. A `StreamingSession` makes one per stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from hermes.engine.chunk import StreamProgress
from hermes.engine.metrics import now_ms
from hermes.engine.policy import QuestionCost, QuestionState
from hermes.memory.cache import HermesCache
from hermes.models.base import VideoLM

MAX_QUESTION_CHARS = 1000
MAX_NEW_TOKENS = 64
# Finished answers a session keeps (the last one also prefixes the guidance prompt): a stream
# keeps what its next step needs, not its whole history, so that it stays flat however long it runs.
ANSWERS_KEPT = 8


class QuestionError(ValueError):
    """A question the engine will not take (empty, or too long), with the reason."""


def validate_question(question: str | None, max_chars: int = MAX_QUESTION_CHARS) -> str:
    """The question, stripped; QuestionError if it is empty or longer than `max_chars`."""
    q = (question or "").strip()
    if not q:
        raise QuestionError("The question is empty: type something to ask about the video.")
    if len(q) > max_chars:
        raise QuestionError(
            f"The question is {len(q):,} characters long; the limit is {max_chars:,} characters, "
            "so that it fits in the positions reserved after the video memory."
        )
    return q


@dataclass
class AnswerUpdate:
    """The answer so far; `done` on the last update, which carries the timings."""

    question: str
    text: str
    done: bool = False
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens: int = 0
    top_logprobs: list[tuple[str, float]] = field(default_factory=list)
    frames_seen: int = 0
    frames_in_memory: int = 0
    at_s: float = 0.0
    # The policy's question-time step: its part of the TTFT (ReKV: similarity search and
    # host-to-device copy, over all layers), the tokens each layer brought in, and their device
    # bytes over all layers.
    retrieval_ms: float | None = None
    retrieved_tokens: int = 0
    retrieved_bytes: int = 0
    # The memory on the device, and what the question-time step holds in host memory (ReKV's
    # store), when the question was read.
    cache_bytes: int = 0
    host_bytes: int = 0

    def finished(self, tokens: int, first_ms: float, end_ms: float) -> AnswerUpdate:
        """The last update of an answer of `tokens` tokens: done, with the time per output token
        from the first token (at `first_ms`) to the end (at `end_ms`)."""
        tpot = (end_ms - first_ms) / (tokens - 1) if tokens > 1 else None
        return replace(self, done=True, tokens=tokens, tpot_ms=tpot)


def top_logprobs(lm: VideoLM, logp: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
    """The `k` most likely tokens of log-probabilities `logp` (vocab,), as (text, log-probability)."""
    top = torch.topk(logp, k)
    return [(lm.tokenizer.decode([int(i)]), float(v)) for v, i in zip(top.values, top.indices, strict=True)]


class MemoryReader:
    """Questions read from one stream's memory as it is now. It keeps the last ANSWERS_KEPT finished
    answers and the last turn, which prefixes the next guidance prompt."""

    def __init__(
        self,
        lm: VideoLM,
        memory: HermesCache,
        question: QuestionState,
        progress: StreamProgress,
        max_question_chars: int = MAX_QUESTION_CHARS,
    ) -> None:
        self.lm = lm
        self.memory = memory
        self.question = question
        self.progress = progress
        self.max_question_chars = max_question_chars
        self.answers: list[AnswerUpdate] = []  # the last ANSWERS_KEPT
        self.last_turn: tuple[str, str] | None = None

    def check_question(self, question: str) -> str:
        """The question, stripped; QuestionError if there is no video yet, or it is empty or too long."""
        if self.progress.frames_seen == 0:
            raise QuestionError("No video yet: start a stream first, then ask about what it shows.")
        return validate_question(question, self.max_question_chars)

    @torch.inference_mode()
    def ask_stream(
        self, question: str, max_new_tokens: int = MAX_NEW_TOKENS, remember: bool = True, query: str | None = None
    ) -> Iterator[AnswerUpdate]:
        """Answer from the memory as it is now, streaming the text token by token.

        TTFT runs from this call to the first decoded token. The memory is not changed: the
        question and answer are scratch tokens of the cache, dropped at the end. `remember=False`
        keeps the answer out of `answers` and of the next guidance prompt (a standing question's alert).
        `query`: the words the policy's question-time step reads the question by (`query_ids`).
        """
        q = self.check_question(question)
        device = self.lm.device
        t0 = now_ms(device)
        with self.memory.scratch():
            logp, pos = self.read_question(q, query)
            token = int(logp.argmax())
            t_first = now_ms(device)
            update = self.first_update(q, logp, t_first - t0, self.question.cost())
            generated: list[int] = []
            eos = self.lm.eos_token_ids
            while token not in eos and len(generated) < max_new_tokens:
                generated.append(token)
                update.text, update.tokens = self.lm.decode(generated), len(generated)
                yield replace(update)
                if len(generated) == max_new_tokens:
                    break
                logits = self.lm.forward(self.memory, torch.tensor([[token]], device=device), torch.tensor([[pos]]))
                pos += 1
                token = int(logits[0, -1].argmax())
        update = update.finished(len(generated), t_first, now_ms(device))
        if remember:
            self.record_answer(update)
        yield replace(update)

    def first_update(
        self, question: str, logp: torch.Tensor, ttft_ms: float, cost: QuestionCost | None = None
    ) -> AnswerUpdate:
        """The update an answer starts with, once its first token is read from `logp` (vocab,):
        the most likely first tokens, what the memory has seen and keeps, and what the policy's
        question-time step `cost` (none for an answer decoded in a batch)."""
        cost = cost or QuestionCost()
        return AnswerUpdate(
            question=question,
            text="",
            ttft_ms=ttft_ms,
            top_logprobs=top_logprobs(self.lm, logp),
            frames_seen=self.progress.frames_seen,
            frames_in_memory=self.memory.snapshot().frames_in_memory(),
            at_s=self.progress.stream_time_s,
            retrieval_ms=cost.ms,
            retrieved_tokens=cost.tokens,
            retrieved_bytes=cost.bytes,
            cache_bytes=self.memory.cache_bytes(),
            host_bytes=self.question.host_bytes(),
        )

    def record_answer(self, update: AnswerUpdate) -> None:
        """Keep a finished answer (from `ask_stream` or a batch): it joins `answers`, and it and its
        question prefix the next guidance prompt."""
        self.answers.append(update)
        del self.answers[:-ANSWERS_KEPT]
        self.last_turn = (update.question, update.text)

    def query_ids(self, question: str, query: str | None) -> torch.Tensor:
        """The tokens (1, n) a question-time step reads the question by: `query`'s own words, no chat
        template around them, as ReKV retrieves with the question alone; `question` when `query` is
        None or blank. A benchmark's prompt wraps the question in instructions and options, so the
        harness passes the question itself as `query`."""
        return self.lm.encode((query or "").strip() or question)

    def read_question(self, question: str, query: str | None = None) -> tuple[torch.Tensor, int]:
        """Prefill the question after the memory, as scratch tokens, through the policy's
        question-time step (given the `query` words, see `query_ids`); log-probabilities of the first
        answer token, and the position that follows the question."""
        ids = self.lm.question_ids(question)
        pos = self.question.next_position(self.memory)
        positions = pos + torch.arange(ids.shape[-1])[None]
        logits = self.question.forward(self.lm, self.memory, ids, positions, self.query_ids(question, query))
        return torch.log_softmax(logits[0, -1].float(), dim=-1), pos + ids.shape[-1]

    @torch.inference_mode()
    def first_token_logprobs(self, question: str, query: str | None = None) -> torch.Tensor:
        """Log-probabilities (vocab,) of the first answer token; the memory is not changed.

        Multiple-choice scoring reads the option letters from this. `query` as for `ask_stream`.
        """
        q = self.check_question(question)
        with self.memory.scratch():
            return self.read_question(q, query)[0]

    @torch.inference_mode()
    def continuation_logprobs(
        self, question: str, continuation: list[int], query: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-probability (n,) of each token of `continuation` as the start of the answer, and
        whether each is the greedy choice there (n,); the memory is not changed.

        One forward pass over the question and the continuation, like a reader of the memory."""
        if not continuation:
            raise ValueError("the continuation is empty")
        q = self.check_question(question)
        ids = self.lm.question_ids(q)
        target = torch.tensor([continuation], device=ids.device)
        n = len(continuation)
        with self.memory.scratch():
            positions = self.question.next_position(self.memory) + torch.arange(ids.shape[-1] + n)[None]
            tokens, query_ids = torch.cat([ids, target], dim=-1), self.query_ids(q, query)
            logits = self.question.forward(self.lm, self.memory, tokens, positions, query_ids, logits_to_keep=n + 1)
        logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)  # the logits before each continuation token
        return logp.gather(-1, target[0, :, None].to(logp.device))[:, 0], logp.argmax(-1).cpu() == target[0].cpu()

    def ask(
        self, question: str, max_new_tokens: int = MAX_NEW_TOKENS, remember: bool = True, query: str | None = None
    ) -> AnswerUpdate:
        """Answer and return the final update (text, TTFT, TPOT, top log-probabilities)."""
        return deque(self.ask_stream(question, max_new_tokens, remember, query), maxlen=1)[0]
