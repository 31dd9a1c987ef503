"""Rotary position bookkeeping: rotate cached keys to new positions, and compaction plans.

Cached keys already carry RoPE(p_old). Rotating them by RoPE(p_new - p_old) gives exactly the key
the model would have computed at p_new, so re-indexing never re-runs the model. For M-RoPE each
frequency channel belongs to one axis (t, h or w) and is rotated by that axis' own delta. Which
channel follows which axis is the model's layout: contiguous sections for Qwen2.5-VL
(`mrope_section` [16, 24, 24]: channels 0-15 t, 16-39 h, 40-63 w), interleaved for Qwen3-VL
(t, h, w, t, h, w, ... up to 3 x the h and w sections, the remaining channels t).

Partial rotary (Qwen3.5: `partial_rotary_factor` 0.25, 64 of 256 channels per head): the model
rotates only the first `rotary_dim` channels of each head and passes the others through, so a
re-index rotates exactly those and leaves the rest bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeSpec:
    """The rotary frequencies of a model: inv_freq (head_dim/2,) and, for M-RoPE, its sections and
    whether the axes take their channels in contiguous sections or interleaved."""

    inv_freq: torch.Tensor
    mrope_section: tuple[int, ...] | None = None
    interleaved: bool = False

    def __post_init__(self) -> None:
        if self.mrope_section is None:
            if self.interleaved:
                raise ValueError("interleaved is a layout of M-RoPE sections; give mrope_section too")
            return
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.inv_freq.numel():
            raise ValueError(
                f"mrope_section {self.mrope_section} must be 3 sections (t, h, w) summing to "
                f"head_dim/2 = {self.inv_freq.numel()}"
            )
        _, h, w = self.mrope_section
        n = self.inv_freq.numel()
        # Interleaved, the last h channel is 3h - 2 and the last w channel 3w - 1.
        if self.interleaved and (3 * h - 2 >= n or 3 * w - 1 >= n):
            raise ValueError(f"interleaved sections {self.mrope_section} do not fit in {n} channels")

    @property
    def axes(self) -> int:
        """Number of position axes: 1 for RoPE, 3 for M-RoPE."""
        return 1 if self.mrope_section is None else 3

    @property
    def rotary_dim(self) -> int:
        """Channels of a head that rotate: the first ones; any after them pass through unrotated."""
        return 2 * self.inv_freq.numel()

    def channel_axes(self) -> torch.Tensor:
        """For each frequency channel, the position axis that drives it."""
        n = self.inv_freq.numel()
        if self.mrope_section is None:
            return torch.zeros(n, dtype=torch.long)
        if self.interleaved:
            # Qwen3-VL's recomposition: channels 1, 4, 7, ... (3 x the h section) take h, channels
            # 2, 5, 8, ... (3 x the w section) take w, every other channel t.
            axes = torch.zeros(n, dtype=torch.long)
            for axis in (1, 2):
                axes[axis : 3 * self.mrope_section[axis] : 3] = axis
            return axes
        # Qwen2.5-VL's recomposition: section i follows axis i % 3.
        return torch.cat([torch.full((k,), i % 3, dtype=torch.long) for i, k in enumerate(self.mrope_section)])

    @classmethod
    def from_channel_axes(cls, inv_freq: torch.Tensor, axes: Sequence[int]) -> RopeSpec:
        """The spec whose channels follow `axes` (one axis per channel), as read from a model's
        rotary module; ValueError for a layout that is neither plain, contiguous nor interleaved."""
        axes = torch.as_tensor(list(axes), dtype=torch.long)
        if not bool(axes.any()):
            return cls(inv_freq)
        section = tuple(int((axes == a).sum()) for a in range(3))
        for interleaved in (False, True):
            try:
                spec = cls(inv_freq, section, interleaved)
            except ValueError:
                continue
            if torch.equal(spec.channel_axes(), axes):
                return spec
        raise ValueError(f"unsupported M-RoPE layout (channel -> axis {axes.tolist()})")

    @classmethod
    def from_config(
        cls, head_dim: int, theta: float, mrope_section: Sequence[int] | None = None, interleaved: bool = False
    ) -> RopeSpec:
        """Default (unscaled) RoPE frequencies, as transformers computes them."""
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        return cls(inv_freq, tuple(mrope_section) if mrope_section is not None else None, interleaved)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Apply RoPE(delta) to keys of shape (..., N, head_dim); delta is (axes, N) positions. Only the
    first `spec.rotary_dim` channels turn (all of them unless the model's rotary is partial).

    The rotation runs in fp32 whatever the cache dtype (a bf16 angle of a large position is off by
    whole radians). The angles are formed in fp64 and reduced modulo 2 pi there: an fp32 product
    delta * theta of a shift of 30K positions is already off by 1e-3 rad, while cos and sin of
    the reduced angle are exact enough in fp32 and many times cheaper than of the raw fp64 angle.
    """
    if delta.dim() == 1:
        delta = delta.unsqueeze(0)
    if delta.shape != (spec.axes, keys.shape[-2]):
        raise ValueError(f"delta must have shape {(spec.axes, keys.shape[-2])}, got {tuple(delta.shape)}")
    device = keys.device
    # MPS has no fp64; there the fp32 angle is the best available.
    wide = torch.float32 if device.type == "mps" else torch.float64
    inv_freq = spec.inv_freq.to(device=device, dtype=wide)
    axes = spec.channel_axes().to(device)
    angle = torch.remainder(delta.to(device=device, dtype=wide)[axes].T * inv_freq, 2 * math.pi).float()  # (N, D/2)
    cos, sin = angle.cos(), angle.sin()
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    rotary = spec.rotary_dim
    if keys.shape[-1] < rotary:
        raise ValueError(f"keys have {keys.shape[-1]} channels, fewer than the {rotary} that rotate")
    k = keys[..., :rotary].float()
    out = (k * cos + _rotate_half(k) * sin).to(keys.dtype)
    return out if keys.shape[-1] == rotary else torch.cat([out, keys[..., rotary:]], dim=-1)


def dense_rank(values: torch.Tensor) -> torch.Tensor:
    """Rank of each value among the distinct values (0, 1, 2, ...), keeping order and ties."""
    _, inverse = torch.unique(values, sorted=True, return_inverse=True)
    return inverse


def compact_positions(positions: torch.Tensor, base: int) -> torch.Tensor:
    """Left-compaction of (axes, N) positions: p_new^d = base + rank_d(p_old^d), axis by axis.

    For 1D RoPE every video token has its own position, so this is base + slot index. For
    M-RoPE the t, h and w coordinates are compacted independently (paper section 11.2).
    """
    return torch.stack([base + dense_rank(axis) for axis in positions]) if positions.numel() else positions.clone()
