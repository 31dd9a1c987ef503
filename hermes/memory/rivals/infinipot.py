"""`infinipot-v`: temporal-axis redundancy (TaR) and value norm (VaN), InfiniPot-V (Kim et al.,
NeurIPS 2025), as its released code (`process_kv_cache` in `kvcache_utils.py`) computes them.

Compression runs whenever the cache passes its budget C (section 3.4), which is when the engine
calls the policy. The layer then holds N video tokens, N // F frames' worth of them at F tokens a
frame, and the newest int(N // F * `query_ratio`) frames are TaR's reference (section 3.2). An
older token's TaR score is minus the cosine similarity of its key with the key at the same patch
in each reference frame, averaged over the reference frames: a token that repeats what the newest
frames show is redundant. TaR's budget, C - round((1 - `tar_ratio`) C), holds the reference
frames whole and is filled up with the least redundant older tokens. VaN (section 3.3): the rest
of C goes by the L2 norm of the value, every TaR pick pinned above the largest norm.

Differences from the code (docs/design.md, "Rivals"): scores are per layer, the per-head TaR
and VaN averaged over the KV heads, since this memory keeps one set of slots per layer; a token
is compared at its own patch, where the code reshapes the older tokens into rows of F (after a
partial eviction, a token's place in that row is no longer its patch); F is the largest frame
held, and the reference is at least one frame; with 1D RoPE (LLaVA-OneVision) keys are compared
before RoPE, since there the same patch of two frames sits hundreds of positions apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hermes.memory.scorer import Guidance, LayerInputs
from hermes.memory.tiers import Tier


@dataclass(frozen=True)
class TarVan:
    """TaR picks and the reference frames pinned, the rest ranked by value norm."""

    tar_ratio: float = 0.5  # share of the budget chosen by TaR (reference frames included)
    query_ratio: float = 0.25  # share of the frames' worth of tokens held, newest first, used as TaR's reference

    def __post_init__(self) -> None:
        if not 0.0 <= self.tar_ratio <= 1.0:
            raise ValueError(f"infinipot-v.tar_ratio must lie in [0, 1], got {self.tar_ratio}")
        if not 0.0 < self.query_ratio <= 1.0:
            raise ValueError(f"infinipot-v.query_ratio must lie in (0, 1], got {self.query_ratio}")

    def guidance(self, tier: Tier) -> Guidance | None:
        return None

    def reference(self, frames: torch.Tensor) -> torch.Tensor:
        """Which slots belong to the reference: the newest int(tokens // F * query_ratio) frames,
        at least one, where F, the tokens of a whole frame, is the largest frame held."""
        held, counts = torch.unique(frames, return_counts=True)
        per_frame = int(counts.max())
        n = max(1, int(frames.numel() // per_frame * self.query_ratio))
        return frames >= held[-min(n, held.numel())]

    @staticmethod
    def comparable_keys(inputs: LayerInputs) -> torch.Tensor:
        """(kv heads, slots, dim) fp32 keys that TaR compares. With M-RoPE, the cached keys, as the
        code compares them: one patch of two frames shares its h and w rotations and differs on the
        temporal channels only. With 1D RoPE, the keys before RoPE: there one patch of two frames
        sits a whole number of frames apart on every channel, which would swamp the cosine."""
        if inputs.rope is None or inputs.rope.axes != 1:
            return inputs.keys[0].float()
        return inputs.keys_before_rope()[0]

    def redundancy(self, inputs: LayerInputs, reference: torch.Tensor) -> torch.Tensor:
        """TaR per slot: minus the mean cosine similarity, over heads and reference frames, of the
        slot's key with the key at its patch in each reference frame (0 where no reference frame
        has that patch; the reference slots themselves score 0)."""
        keys = self.comparable_keys(inputs)
        unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
        patches, frames = inputs.patches.to(keys.device), inputs.frames.to(keys.device)
        reference = reference.to(keys.device)
        total = torch.zeros(inputs.num_slots, device=keys.device)
        count = torch.zeros(inputs.num_slots, device=keys.device)
        for frame in torch.unique(frames[reference]):
            at = (frames == frame).nonzero().squeeze(1)
            table = torch.full((int(patches.max()) + 1,), -1, dtype=torch.long, device=keys.device)
            table[patches[at]] = at
            match = table[patches]
            has = (match >= 0) & ~reference
            cos = (unit * unit[:, match.clamp(min=0)]).sum(-1).mean(0)  # mean over heads
            total += torch.where(has, cos, 0.0)
            count += has.float()
        return -(total / count.clamp(min=1)).cpu()

    def score(self, inputs: LayerInputs) -> torch.Tensor:
        inputs.need("keys", "values", "frames", "patches", "slots_kept")
        reference = self.reference(inputs.frames)
        van = inputs.values[0].float().norm(dim=-1).mean(0).cpu()  # (slots,), mean over heads
        tar_budget = inputs.slots_kept - round((1.0 - self.tar_ratio) * inputs.slots_kept)
        older = (~reference).nonzero().squeeze(1)
        picks = max(0, min(tar_budget - int(reference.sum()), older.numel()))
        pinned = reference.clone()
        if picks:
            tar = self.redundancy(inputs, reference)[older]
            pinned[older[torch.topk(tar, picks).indices]] = True
        # Pinned slots outrank every other; among themselves and among the rest, VaN decides.
        return van + pinned.float() * (float(van.max()) + 1.0)
