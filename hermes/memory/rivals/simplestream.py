"""`simplestream`: the newest few frames and nothing else, SimpleStream (arXiv 2604.02317).

SimpleStream's code (EvolvingLMMs-Lab/SimpleStream, `lib/recent_window_eval.py`,
`query_recent_window`) cuts the stream into one-second chunks at 1 fps and answers each question
from the last N of them (`--recent_frames_only`; 4 in the paper's headline numbers): the newest N
frames, all their tokens, no memory bank, no retrieval, no compression. Here each layer keeps
every slot of the newest `frames` frames after every chunk and drops the rest. The token budget
does not apply: the memory holds N frames' worth of tokens, whatever |M| is.

Where the frames are merged in pairs (Qwen2.5-VL, Qwen3-VL: one frame block per pair), a pair is
kept or dropped whole, so an odd N keeps one frame more. Differences from the code (docs/design.md,
"Rivals"): the kept frames were encoded chunk by chunk after the memory, as every policy here
encodes them, where SimpleStream encodes the N frames afresh for each question, after a bare user
turn, as images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.selection import Merge, TopK
from hermes.memory.tiers import Tier


@dataclass(frozen=True)
class RecentWindow:
    """SimpleStream's constant, the frames kept; as a scorer, recency (the window needs no score)."""

    frames: int = 4  # SimpleStream's recent_frames_only in the paper's main results

    def __post_init__(self) -> None:
        if self.frames < 1:
            raise ValueError(f"simplestream.frames must be at least 1 frame, got {self.frames}")

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        return torch.arange(inputs.num_slots, dtype=torch.float32)


@dataclass(frozen=True)
class RecentFrames(TopK):
    """Every slot of the newest `window` frames, in every layer; no summary.

    The window is counted in frames, not slots, so `capacity` is 0: every chunk is compressed, down
    to the window, whatever its tokens (`frames_kept` says how many frames that is)."""

    capacity: int = 0
    window: int = RecentWindow.frames

    @property
    def frames_kept(self) -> int | None:
        """Frames a layer keeps: the window."""
        return self.window

    def slot_bound(self, block_tokens: int, frames_per_block: int) -> int:
        """The blocks of the window's frames, at most `block_tokens` tokens each."""
        return -(-self.window // frames_per_block) * block_tokens

    def plan(
        self, scores: torch.Tensor, ids: torch.Tensor, frames: torch.Tensor, tier: Tier
    ) -> tuple[torch.Tensor, list[Merge]]:
        """The slots whose frame is among the newest `window` frame indices (stream order)."""
        if frames.numel() == 0:
            return torch.zeros(0, dtype=torch.long), []
        return (frames > int(frames.max()) - self.window).nonzero().squeeze(1), []
