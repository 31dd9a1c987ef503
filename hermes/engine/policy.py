"""A memory policy in the engine: the protocol every front end calls, and its no-op defaults.

A `Policy` is the memory's own parts (`hermes.memory.policies.MemoryPolicy`: scorer, smoothing,
selection) and what acts around the memory: an input filter before the prefill, and a question-time
step. The session, batch decoding, admission, serving and the bench call this protocol and never
ask which policy they hold; the registry that names the policies is `hermes.engine.methods`.

A question-time step is described once per policy (`QuestionStep`: the device room and host
memory it needs, whether its answers can share a batch, whether it keeps positions as computed),
and each stream gets its own `QuestionState` from it (what the step keeps while the stream runs,
where new tokens go, the bound it stops at, the forward pass over a question and what that cost).
The defaults do nothing: a question reads the memory as it is. ReKV's retrieval from a host store
is one implementation (`hermes.engine.retrieval`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from hermes.engine.filtering import FilteredInputs, InputFilter, Unfiltered
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.persist import QUESTION_PARTS, MemoryFile, MemoryFileError
from hermes.memory.policies import MemoryPolicy, PolicyError
from hermes.models.base import VideoLM


@dataclass
class QuestionCost:
    """What a question-time step cost one question: its part of the TTFT (None: the step does
    nothing), the tokens each layer brought in, and their device bytes over all layers."""

    ms: float | None = None
    tokens: int = 0
    bytes: int = 0


class QuestionState:
    """One stream's side of a question-time step. The default keeps nothing and brings nothing in."""

    def room(self, frames: torch.Tensor) -> int:
        """Device columns to reserve with a chunk of `frames` (per token) for what a question brings in."""
        return 0

    def start_position(self, memory: HermesCache, tokens: int) -> int:
        """Where a chunk of `tokens` tokens starts; the memory may compact its positions first (lazily)."""
        return memory.start_position(tokens)

    def next_position(self, memory: HermesCache) -> int:
        """Where a question's tokens go."""
        return memory.next_position

    def bound_note(self, memory: HermesCache, tokens: int, frames: int, frames_seen: int) -> str | None:
        """Why a next chunk of `tokens` tokens in `frames` frames cannot go in; None when it can."""
        return None

    def after_prefill(self, memory: HermesCache, meta: ChunkMeta) -> None:
        """Called with the chunk `meta` describes, just written after the memory, before it is committed."""

    def forward(
        self,
        lm: VideoLM,
        memory: HermesCache,
        ids: torch.Tensor,
        positions: torch.Tensor,
        query: torch.Tensor,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The model over a question's tokens `ids` after the memory (scratch tokens the caller
        drops); `query` (1, n) holds the question's own words, without the prompt around them."""
        return lm.forward(memory, ids, positions, **kwargs)

    def host_bytes(self) -> int:
        """Host memory the step holds for this stream."""
        return 0

    def cost(self) -> QuestionCost:
        """What the last question's step cost."""
        return QuestionCost()

    def pack(self) -> MemoryFile | None:
        """What the step keeps of this stream, for its memory file (`hermes.memory.persist`); None
        when it keeps nothing."""
        return None

    def unpack(self, memory: MemoryFile) -> None:
        """Take back what `pack` wrote into the (checked) memory file `memory`; MemoryFileError when
        the file holds a question-time part that this step does not keep."""
        if any(key in memory.header for key in QUESTION_PARTS):
            raise MemoryFileError("the memory file is damaged: its host store does not match its policy")


@dataclass(frozen=True)
class QuestionStep:
    """A policy's question-time step, as known before any stream. The default brings nothing in, so
    answers read the memory as it is and can be decoded together from copies of it."""

    batchable: ClassVar[bool] = True  # a question can be answered from a copy of the memory in a batch
    keeps_host_store: ClassVar[bool] = False  # it holds frames in host memory, up to a cap
    keeps_positions: ClassVar[bool] = False  # tokens stay where they were computed: never re-indexed

    def device_room(self, block_tokens: int) -> int:
        """Tokens a question may add to every layer, when a frame block takes at most `block_tokens`."""
        return 0

    def start(self, memory: HermesCache, name: str, host_cap: int | None) -> QuestionState:
        """This step's state for a stream held in `memory` (`name`: the policy's, for its messages)."""
        return QuestionState()


@dataclass(frozen=True)
class Policy(MemoryPolicy):
    """A policy built for one memory configuration: its memory parts, an optional input filter and
    a question-time step. `name` is its parsed name (`hermes.engine.methods.PolicySpec`), which
    carries its label, colour and plots."""

    name: str = ""
    input_filter: InputFilter | None = None
    question: QuestionStep = QuestionStep()

    @property
    def positions_grow(self) -> bool:
        """Whether the stream's positions grow without bound (nothing evicted, or never re-indexed),
        so that the stream ends where the model's positions do."""
        return self.capacity is None or self.question.keeps_positions

    @property
    def fixed_size(self) -> bool:
        """Whether the device cache stays a fixed size once full: something is evicted, and questions
        bring nothing in."""
        return self.capacity is not None and self.question.device_room(1) == 0

    def check(self, lm: VideoLM) -> None:
        """PolicyError when `lm` cannot run this policy (a backbone that cannot hand its chunks to an
        input filter)."""
        if self.input_filter is not None and lm.no_input_filter is not None:
            raise PolicyError(f"{self.name}: {lm.no_input_filter}")

    def inputs(self, lm: VideoLM) -> FilteredInputs | Unfiltered:
        """One stream's input filter over `lm`'s chunk inputs (it remembers the last frame it saw)."""
        self.check(lm)
        return Unfiltered() if self.input_filter is None else FilteredInputs(lm, self.input_filter)
