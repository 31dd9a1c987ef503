"""Means of cached keys and values, for the slots that stand for several tokens: the summary slot
(Algorithm 1's running mean of every token evicted from its layer) and a merge group's prototype.

Keys are rotated to the one position their mean will sit at before they are averaged, so that
they average in one phase; the sums are taken in fp32 whatever the cache's dtype. These are pure
functions of tensors: `HermesLayer` says which columns, shifts and counts.
"""

from __future__ import annotations

import torch

from hermes.memory.rope import RopeSpec, rotate_keys


def phase_aligned(
    keys: torch.Tensor, values: torch.Tensor, columns: torch.Tensor, shift: torch.Tensor, rope: RopeSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values (batch, heads, columns, dim) at `columns`, in fp32, each key first
    rotated by its column's `shift` (axes, n) of positions."""
    idx = columns.to(keys.device)
    k = rotate_keys(keys.index_select(-2, idx), shift, rope).float()
    return k, values.index_select(-2, idx).float()


def running_mean(
    keys: torch.Tensor,
    values: torch.Tensor,
    count: int,
    summary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's summary key and value once the m tokens `keys`, `values` are folded into the
    `summary` (key, value) of `count` = n tokens: v = (n v + sum V) / (n + m), and so for keys."""
    m = keys.shape[-2]
    k_sum, v_sum = keys.sum(dim=-2, keepdim=True), values.sum(dim=-2, keepdim=True)
    if summary is not None:
        k_sum = k_sum + count * summary[0].float()
        v_sum = v_sum + count * summary[1].float()
    return k_sum / (count + m), v_sum / (count + m)


def group_mean(
    keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A merge group's prototype key and value: the mean of the group's, or their sum weighed by
    `weights` (one per token, summing to 1)."""
    if weights is None:
        return keys.mean(-2, True), values.mean(-2, True)
    w = weights.float().to(keys.device)[:, None]
    return (keys * w).sum(-2, True), (values * w).sum(-2, True)
