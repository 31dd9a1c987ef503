"""`HostStore`: every frame's keys and values in host memory, for ReKV's retrieval.

A chunk's new tokens are copied off the device once, after its prefill, layer by layer, with the
positions they were computed at; the keys stay rotated at those positions, so a frame brought
back needs no rotation. Each frame block (a run of one frame's tokens) also gets a representative
per layer: its mean key with RoPE taken off again, kept in fp32 next to the blocks (ReKV keeps
its representatives on the GPU; here they are host memory too, and counted as such).

On a CPU run host and device are the same memory; the store is still a copy of its own and its
bytes are counted apart from the cache's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hermes.memory.rivals.rekv import frame_runs
from hermes.memory.rope import RopeSpec, rotate_keys


class HostStore:
    """Frame blocks of one stream: per chunk and layer the keys and values (1, kv heads, n, dim) on
    the host; per block its chunk, start, length and frame; per layer the blocks' mean keys."""

    def __init__(self, rope: RopeSpec) -> None:
        self.rope = rope
        self._keys: list[list[torch.Tensor]] = []  # [chunk][layer]
        self._values: list[list[torch.Tensor]] = []
        self._positions: list[torch.Tensor] = []  # [chunk] (axes, n)
        self._index: list[list[torch.Tensor]] = []  # [layer][chunk] (blocks, kv heads, dim) fp32
        self.block_chunk = torch.zeros(0, dtype=torch.long)
        self.block_start = torch.zeros(0, dtype=torch.long)
        self.block_length = torch.zeros(0, dtype=torch.long)
        self.block_frame = torch.zeros(0, dtype=torch.long)
        self.next_position = 0  # one past the largest position of any token held

    def held(
        self,
    ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], list[torch.Tensor], list[list[torch.Tensor]]]:
        """What the store holds (a memory file's part): keys and values [chunk][layer], positions
        [chunk], mean keys [layer][chunk]."""
        return self._keys, self._values, self._positions, self._index

    def restore(
        self,
        keys: list[list[torch.Tensor]],
        values: list[list[torch.Tensor]],
        positions: list[torch.Tensor],
        index: list[list[torch.Tensor]],
    ) -> None:
        """Hold what `held` gave (the blocks' bookkeeping is set on its own)."""
        self._keys, self._values, self._positions, self._index = keys, values, positions, index

    def __len__(self) -> int:
        """Frame blocks held."""
        return self.block_frame.numel()

    def add(
        self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frames: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Copy one chunk into the store: `kv` per layer (1, kv heads, n, dim) as the model computed
        it at `positions` (axes, n), with each token's frame `frames` (n,)."""
        n = frames.numel()
        if n == 0:
            return
        starts = frame_runs(frames)
        lengths = torch.diff(torch.cat([starts, torch.tensor([n])]))
        chunk = len(self._keys)
        # `.to("cpu")` alone would alias the cache's storage on a CPU run; the store is its own copy.
        self._keys.append([k.to("cpu", copy=True) for k, _ in kv])
        self._values.append([v.to("cpu", copy=True) for _, v in kv])
        self._positions.append(positions.cpu().clone())
        if not self._index:
            self._index = [[] for _ in kv]
        owner = torch.repeat_interleave(torch.arange(starts.numel()), lengths)
        for layer, keys in enumerate(self._keys[-1]):
            plain = rotate_keys(keys[0].float(), -positions.cpu(), self.rope)  # (kv heads, n, dim), RoPE off
            sums = torch.zeros(starts.numel(), *plain.shape[::2]).index_add_(0, owner, plain.transpose(0, 1))
            self._index[layer].append(sums / lengths[:, None, None])
        self.block_chunk = torch.cat([self.block_chunk, torch.full_like(starts, chunk)])
        self.block_start = torch.cat([self.block_start, starts])
        self.block_length = torch.cat([self.block_length, lengths])
        self.block_frame = torch.cat([self.block_frame, frames.cpu()[starts]])
        self.next_position = max(self.next_position, int(positions.max()) + 1)

    def mean_keys(self, layer: int, heads: int) -> torch.Tensor:
        """(blocks, heads x dim): each block's mean key in `layer` before RoPE, each key head
        repeated for the query heads that share it (GQA), the heads side by side."""
        index = torch.cat(self._index[layer])  # (blocks, kv heads, dim)
        return index.repeat_interleave(heads // index.shape[1], dim=1).flatten(1)

    def gather(self, layer: int, picks: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (1, kv heads, tokens, dim) of `layer` for `picks` (block, tokens taken
        from its start), in the order given."""
        keys, values = [], []
        for block, n in picks:
            c, s = int(self.block_chunk[block]), int(self.block_start[block])
            keys.append(self._keys[c][layer][..., s : s + n, :])
            values.append(self._values[c][layer][..., s : s + n, :])
        return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)

    def positions(self, picks: Sequence[tuple[int, int]]) -> torch.Tensor:
        """(axes, tokens): the positions the tokens of `picks` were computed at."""
        return torch.cat(
            [
                self._positions[int(self.block_chunk[b])][:, int(self.block_start[b]) : int(self.block_start[b]) + n]
                for b, n in picks
            ],
            dim=1,
        )

    def kv_bytes(self) -> int:
        """Bytes of keys and values held."""
        return sum(t.nbytes for chunk in (*self._keys, *self._values) for t in chunk)

    def index_bytes(self) -> int:
        """Bytes of the blocks' mean keys."""
        return sum(t.nbytes for layer in self._index for t in layer)

    def nbytes(self) -> int:
        """Host memory of the store: keys, values and mean keys."""
        return self.kv_bytes() + self.index_bytes()
