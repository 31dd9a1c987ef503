"""`rekv`: a window of recent frames on the device, every frame in host memory, retrieval per
question (ReKV, Di et al., ICLR 2025).

While streaming, each chunk's keys and values are copied, frame block by frame block, into a
`HostStore` (host memory, with the positions they were computed at), and the device keeps only
the newest whole frames that fit in the budget (`FrameWindow`, a sliding window). When a question
arrives, the question's own words (no chat template, no instructions, no options, as ReKV's
`video_qa` code passes `question`) are read once after the memory; every layer ranks the frames
that have left its window by the similarity between their mean query and each frame's mean key,
both taken before RoPE with the heads side by side (ReKV's `_calc_block_topk`), and attends to its
best `top_k` frames at the positions they were computed at while the whole prompt is read and the
answer decoded; then they are dropped again. The similarity is a plain dot product, as ReKV's
code computes it (`get_cosine_similarity` does not normalise); `similarity="cosine"` gives the
paper's wording.

Which context the answer reads (`context`): `window` (the default here) attends the prefix, the
window and the frames retrieved from outside it, each at the position it was computed at;
`retrieved` is the context ReKV's own code builds (its `rekv_attention.py`): the prefix and the best
`top_k` frames chosen among all frames, the window included only where chosen, re-rotated to
contiguous positions after the prefix in stream order, and the question after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.selection import Merge, TopK
from hermes.memory.tiers import Tier

SIMILARITIES = ("dot", "cosine")
CONTEXTS = ("window", "retrieved")


@dataclass(frozen=True)
class FrameRetrieval:
    """ReKV's constants and its question-time rule. As a scorer it ranks by recency (the window
    drops the oldest frames first)."""

    top_k: int = 64  # frames retrieved per layer: ReKV's `retrieve_size` default
    similarity: str = "dot"  # "dot" as ReKV's code ranks, or "cosine" as its paper says
    context: str = "window"  # what the answer reads: the window and the retrieved, or the retrieved alone

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"rekv.top_k must be at least 1 frame, got {self.top_k}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"rekv.similarity must be one of {', '.join(SIMILARITIES)}, got {self.similarity!r}")
        if self.context not in CONTEXTS:
            raise ValueError(f"rekv.context must be one of {', '.join(CONTEXTS)}, got {self.context!r}")

    @property
    def contiguous(self) -> bool:
        """Whether the answer reads the retrieved frames alone, re-rotated after the prefix (ReKV's code)."""
        return self.context == "retrieved"

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        return torch.arange(inputs.num_slots, dtype=torch.float32)

    def rank(self, query: torch.Tensor, frame_keys: torch.Tensor) -> torch.Tensor:
        """Indices of `frame_keys` (frames, heads x dim) from the most to the least similar to
        `query` (heads x dim), by dot product or cosine (`similarity`), ties going to the older frame."""
        keys, q = frame_keys.float(), query.float()
        cosine = self.similarity == "cosine"
        sim = torch.nn.functional.cosine_similarity(keys, q[None], dim=-1) if cosine else keys @ q
        return torch.sort(sim, descending=True, stable=True).indices

    @staticmethod
    def tokens_to_bring(lengths: torch.Tensor, k: int) -> int:
        """Tokens every layer brings back: those of the `k` shortest frames among `lengths`, so
        that any layer's best `k` frames hold at least as many (transformers builds one mask, so
        every layer must hold the same number of tokens)."""
        return int(lengths.sort().values[:k].sum())

    @staticmethod
    def take(order: torch.Tensor, lengths: torch.Tensor, tokens: int) -> list[tuple[int, int]]:
        """(frame, tokens taken) for the frames of `order` (best first) until `tokens` are taken:
        the last frame cut to fit. Returned in stream order."""
        picked, left = [], tokens
        for i in order.tolist():
            if left <= 0:
                break
            n = min(int(lengths[i]), left)
            picked.append((i, n))
            left -= n
        return sorted(picked)


@dataclass(frozen=True)
class FrameWindow(TopK):
    """The newest whole frames that fit in `capacity` video slots per layer; the oldest go first.

    Whole frames, so that a frame is either on the device or retrievable from the host store,
    never both in part. Every layer keeps the same frames (the same length); no summary slot."""

    def plan(
        self, scores: torch.Tensor, ids: torch.Tensor, frames: torch.Tensor, tier: Tier
    ) -> tuple[torch.Tensor, list[Merge]]:
        """The slots of the newest frames whose tokens fit in the capacity (stream order)."""
        starts = frame_runs(frames)
        ends = torch.cat([starts[1:], torch.tensor([frames.numel()])])
        from_end = frames.numel() - starts  # tokens from each frame's start to the newest slot
        first = starts[from_end <= self.capacity]
        begin = int(first.min()) if first.numel() else int(ends[-1]) if ends.numel() else 0
        return torch.arange(begin, frames.numel()), []


def frame_runs(frames: torch.Tensor) -> torch.Tensor:
    """Start index of each run of equal frame indices: a frame block (its tokens are contiguous)."""
    frames = torch.as_tensor(frames, dtype=torch.long)
    if frames.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    new = torch.ones_like(frames, dtype=torch.bool)
    new[1:] = frames[1:] != frames[:-1]
    return new.nonzero().squeeze(1)
