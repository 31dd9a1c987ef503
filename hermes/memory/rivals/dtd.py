"""`+dtd`: differential token dropping before the prefill, TimeChat-Online (Yao et al., 2025).

Section 3.2 of the paper and its released `token_drop` (feature method): a visual token is
dropped when its feature (the vision encoder's output for that patch, as the language model
would embed it) has a cosine similarity above `threshold` with the feature at the same patch of
the previous frame. The previous frame is the one as encoded, all its patches, not what was kept
of it. The first frame of a stream is always kept whole. Across chunks the last frame of a chunk
is the previous frame of the next chunk's first, so a stream drops what a whole video would.
Text tokens (the chunk's newline, Qwen's timestamps) are never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

Previous = tuple[torch.Tensor, torch.Tensor] | None  # (patches, features) of the last frame seen


@dataclass(frozen=True)
class DifferentialDrop:
    """Drops visual tokens that barely changed from the same patch of the previous frame."""

    threshold: float = 0.5  # cosine similarity; TimeChat-Online's released scripts run 0.5

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"dtd.threshold is a cosine similarity and must lie in [-1, 1], got {self.threshold}")

    def select(
        self,
        features: torch.Tensor,
        frames: torch.Tensor,
        patches: torch.Tensor,
        visual: torch.Tensor,
        previous: Previous = None,
    ) -> tuple[torch.Tensor, Previous]:
        """Which of a chunk's tokens to keep (n,) bool, and the last visual frame, for the next chunk.

        `features` (n, d) are the tokens' input embeddings; `frames`, `patches` and `visual` (n,)
        say each token's frame, its patch within the frame and whether it is a visual token.
        """
        kept = torch.ones(frames.numel(), dtype=torch.bool)
        feats = features.float().cpu()
        for frame in torch.unique(frames[visual]):
            at = ((frames == frame) & visual).nonzero().squeeze(1)
            if previous is not None:
                prev_patches, prev_feats = previous
                table = torch.full((int(max(patches[at].max(), prev_patches.max())) + 1,), -1, dtype=torch.long)
                table[prev_patches] = torch.arange(prev_patches.numel())
                match = table[patches[at]]
                has = match >= 0
                sim = F.cosine_similarity(feats[at], prev_feats[match.clamp(min=0)], dim=-1)
                kept[at[has & (sim > self.threshold)]] = False
            previous = (patches[at].clone(), feats[at].clone())
        return kept, previous
