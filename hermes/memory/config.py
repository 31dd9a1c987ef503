"""Every constant of the HERMES algorithm in one place, with the paper's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

Alignment = Literal["identity", "slot"]
SummaryMode = Literal["deep", "all", "none"]
Reindex = Literal["lazy", "eager"]


@dataclass(frozen=True)
class HermesConfig:
    """Settings of the hierarchical memory (docs/design.md, "The algorithm").

    `budget` is |M|, the number of video slots each layer keeps. Layers with a summary slot keep
    |M| video slots plus the summary; the others keep that slot as one extra video slot, so that
    every layer has the same length (transformers builds one attention mask for all layers).
    """

    budget: int = 4096
    # Eq. 1: R_i = exp(-k d_i) with d_i the normalised distance from the newest slot.
    recency_k: float = 20.0
    # Middle layers: omega^l = omega0 - gamma * (l - l_s) / (l_d - l_s).
    omega0: float = 0.75
    gamma: float = 0.6
    # Once a question is answered, its words and the answer's lead the guidance prompt, each cut to
    # this many tokens (0: the prompt never carries the conversation). Each token costs a compressing
    # chunk what one of the chunk's own tokens costs (docs/performance.md, "The guidance pass").
    history_tokens: int = 24
    shallow_fraction: float = 0.1
    deep_fraction: float = 0.3
    # Cross-layer smoothing strength per tier: (sensory, working, long-term).
    smoothing: tuple[float, float, float] = (0.1, 0.3, 0.4)
    alignment: Alignment = "identity"
    summary: SummaryMode = "deep"
    reindex: Reindex = "lazy"
    # Lazy re-indexing compacts once next position + new tokens + margin would pass max_positions.
    # None means "take it from the model" (max_position_embeddings); tests set it small.
    max_positions: int | None = None
    position_margin: int = 2048
    chunk_frames: int = 16
    fps: float = 0.5

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"budget must be at least 1 video token, got {self.budget}")
        if self.recency_k <= 0:
            raise ValueError("recency_k (the forgetting rate k) must be positive")
        check_history_tokens(self.history_tokens)
        if not all(0.0 <= lam <= 1.0 for lam in self.smoothing):
            raise ValueError(f"smoothing strengths must lie in [0, 1], got {self.smoothing}")
        if self.alignment not in ("identity", "slot"):
            raise ValueError(f"alignment must be 'identity' or 'slot', got {self.alignment!r}")
        if self.summary not in ("deep", "all", "none"):
            raise ValueError(f"summary must be 'deep', 'all' or 'none', got {self.summary!r}")
        if self.reindex not in ("lazy", "eager"):
            raise ValueError(f"reindex must be 'lazy' or 'eager', got {self.reindex!r}")
        if self.chunk_frames < 1:
            raise ValueError("chunk_frames must be at least 1")
        if self.fps <= 0:
            raise ValueError("fps must be positive")

    def with_(self, **changes: object) -> HermesConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain-data view, for JSON reports."""
        return asdict(self)


def check_history_tokens(n: int) -> None:
    """ValueError unless `n` can cap the guidance history: 0 (none) or more tokens."""
    if n < 0:
        raise ValueError(f"history_tokens must be 0 (no history) or more, got {n}")
