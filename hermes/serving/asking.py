"""One live stream's questions: those asked (answered at once from its memories, ahead of its
pending chunks, in the answer batch every stream on the model shares) and those standing (the
watchlist, asked of every memory after each chunk)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from hermes.engine.session import MAX_NEW_TOKENS, QuestionError, validate_question
from hermes.models.base import VideoLM
from hermes.serving.answers import AnswerBatch, AnswerTicket, TooManyQuestions
from hermes.serving.jobs import Priority
from hermes.serving.memories import StreamMemories
from hermes.serving.state import Lifecycle
from hermes.serving.watching import Watchlist
from hermes.serving.worker import ModelWorker

# Questions of one stream being answered or waiting at once; more are told to wait. With the round of
# turns on the model thread (hermes.serving.turns), this keeps one viewer from filling the answer
# batch and Gradio's answer slots.
MAX_QUESTIONS_IN_FLIGHT = 2
WAIT_FOR_ANSWER = (
    f"Wait for your previous answer: at most {MAX_QUESTIONS_IN_FLIGHT} questions of a viewer are answered at once."
)
# A question's length in the model's tokens: its prefill against the whole memory comes before the
# first word of the answer, and every viewer waits for it (characters do not bound it: an emoji
# takes several tokens of a byte-level vocabulary).
MAX_QUESTION_TOKENS = 512


def question_within_tokens(lm: VideoLM, question: str) -> str:
    """`question`, unless it takes more than MAX_QUESTION_TOKENS of `lm`'s tokens: QuestionError then."""
    tokens = int(lm.encode(question).shape[-1])
    if tokens > MAX_QUESTION_TOKENS:
        raise QuestionError(
            f"The question is {tokens:,} tokens long for this model; the limit is {MAX_QUESTION_TOKENS:,} tokens. "
            "Ask it in fewer words."
        )
    return question


class Asked(Protocol):
    """What the questions need of their stream (a `LiveStream`)."""

    lm: VideoLM
    worker: ModelWorker
    key: str
    life: Lifecycle
    watchlist: Watchlist

    def locked(self, move: Callable, *args: object) -> object:
        """`move(*args)` under the stream's lock."""

    def check_open(self) -> None:
        """RuntimeError once the stream was closed."""

    def touch(self) -> None:
        """Renew the stream's lease."""


class StreamQuestions:
    """One stream's asked and standing questions (the module's docstring says how each is answered)."""

    def __init__(self, stream: Asked, memories: StreamMemories) -> None:
        self.stream = stream
        self._memories = memories  # touched in jobs on the model thread only
        # Every stream on this model answers in one batch: questions asked together decode together.
        self._answers = stream.worker.batch(stream.lm, lambda: AnswerBatch(stream.lm))

    def ask(self, question: str, max_new_tokens: int = MAX_NEW_TOKENS) -> AnswerTicket:
        """Queue a question ahead of pending chunks; read the answer from the ticket's events().
        QuestionError at once for an empty question, one over MAX_QUESTION_TOKENS of the model's
        tokens, or one more than MAX_QUESTIONS_IN_FLIGHT of this stream's."""
        q = question_within_tokens(self.stream.lm, validate_question(question))
        # Checked and queued together, under the lock: two questions at once cannot both pass.
        ticket = self.stream.locked(self._queue, q, max_new_tokens)
        self.stream.touch()
        return ticket

    def _queue(self, question: str, max_new_tokens: int) -> AnswerTicket:
        self.stream.check_open()
        worker, key = self.stream.worker, self.stream.key
        if worker.backlog(key, Priority.QUESTION) >= MAX_QUESTIONS_IN_FLIGHT:
            raise TooManyQuestions(WAIT_FOR_ANSWER)
        ticket = AnswerTicket(question, self.stream.life.generation)
        answer = partial(self._memories.answer, ticket.generation, ticket, max_new_tokens)
        worker.submit(answer, Priority.QUESTION, key, ticket.fail_job, self._answers)
        return ticket

    def watch(self, question: str) -> list[str]:
        """Add a standing question, asked of every memory after each chunk from the next one on;
        the questions watched now. WatchError at once for an empty, too long, repeated or fifth
        question (the stream goes on)."""
        return self._hand_to_memories(self.stream.watchlist.add(question))

    def unwatch(self, question: str) -> list[str]:
        """Stop watching for a standing question; the questions watched now. WatchError when it
        is not watched."""
        return self._hand_to_memories(self.stream.watchlist.remove(question))

    def _hand_to_memories(self, watching: list[str]) -> list[str]:
        """Give the memories the standing questions (on the model thread); `watching` back."""
        stream = self.stream
        gen = stream.life.generation
        stream.touch()
        stream.worker.submit(
            lambda: self._memories.watch(gen, stream.watchlist.questions), Priority.CONTROL, stream.key
        )
        return watching
