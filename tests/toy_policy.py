"""A toy memory policy with a question-time step, written as a plug-in would write one: this module
and one `register` call are all it takes for the stream, bench, eval, Compare and API front ends to
run it (tests/test_toy_policy.py).

`echo` keeps the newest tokens, as FIFO does, and at question time brings the newest frame's keys
and values in again, into the columns after the memory, before the question is read: a question
sees that frame twice. The copies keep the positions the frame was computed at, as ReKV's frames
do, so the question follows the memory as usual; everything is dropped with the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from hermes.engine.methods import Method
from hermes.engine.policy import Policy, QuestionCost, QuestionState, QuestionStep
from hermes.memory.cache import HermesCache
from hermes.memory.policies import StreamOrder
from hermes.memory.selection import TopK
from hermes.models.base import VideoLM

NAME = "echo"
CALLS: list[int] = []  # tokens each question brought in, every stream together


class EchoState(QuestionState):
    """One stream's echo: what the last question cost."""

    def __init__(self) -> None:
        self.last = QuestionCost()

    def room(self, frames: torch.Tensor) -> int:
        """The tokens of the chunk's largest frame: the columns an echo takes."""
        return int(torch.unique_consecutive(frames, return_counts=True)[1].max()) if frames.numel() else 0

    def forward(
        self,
        lm: VideoLM,
        memory: HermesCache,
        ids: torch.Tensor,
        positions: torch.Tensor,
        query: torch.Tensor,
        **kwargs: Any,
    ) -> torch.Tensor:
        start = time.perf_counter()
        layers = memory.kv_layers
        frames = layers[0].frames[layers[0].video_offset :]
        slots = (frames == frames[-1]).nonzero().squeeze(1) if frames.numel() else frames
        at, prefix = memory.prefix_len + memory.slots, memory.prefix_len + layers[0].video_offset
        for layer in layers:  # every layer the same columns: transformers builds one mask
            layer.take_columns(slots.numel())
        for layer in layers:
            index = (prefix + slots).to(layer.keys.device)
            layer.write_columns(at, layer.keys.index_select(-2, index), layer.values.index_select(-2, index))
        CALLS.append(int(slots.numel()))
        self.last = QuestionCost((time.perf_counter() - start) * 1000.0, int(slots.numel()), 0)
        return lm.forward(memory, ids, positions, **kwargs)

    def cost(self) -> QuestionCost:
        return self.last


@dataclass(frozen=True)
class Echo(QuestionStep):
    """The echo of the newest frame, as known before any stream."""

    batchable = False  # each question writes its own columns: its answer is decoded alone

    def device_room(self, block_tokens: int) -> int:
        return block_tokens

    def start(self, memory: HermesCache, name: str, host_cap: int | None) -> EchoState:
        return EchoState()


METHOD = Method(
    NAME,
    "Echo",
    "#0891b2",
    "FIFO, and the newest frame read again at question time",
    lambda config, scorer: Policy(scorer=scorer, selection=TopK(config.budget), question=Echo()),
    lambda config: StreamOrder(),
)
