"""`BufferLayer`: one decoder layer's keys and values in a buffer that new tokens are written into.

The part of the transformers layer interface that any preallocated cache layer shares: the model
writes its new keys and values after the columns in use (`update`), and reads the columns in use
back as views, with no copy. Subclasses say how the buffer is made (`lazy_initialization`) and how
it grows (`reserve`): `HermesLayer` holds one stream's memory, the engine's `BatchLayer` several
sessions' copies side by side.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin


def kv_bytes(tokens: int, heads: int, head_dim: int, itemsize: int, tensors: int = 2) -> int:
    """Bytes of `tokens` tokens of one layer: `tensors` tensors (key and value; a third where an
    origin key is kept) of `heads` heads of `head_dim` numbers of `itemsize` bytes each."""
    return tensors * tokens * heads * head_dim * itemsize


def grown_buffer(t: torch.Tensor, size: int, used: int) -> torch.Tensor:
    """A new buffer like `t` (batch, heads, columns, dim) with `size` columns, its first `used`
    columns copied from `t`."""
    # A question longer than the reserved margin grows the buffer inside the model's inference
    # mode; a buffer made there could not be rewritten in place by a later eviction.
    with torch.inference_mode(False):
        out = t.new_empty(*t.shape[:2], size, t.shape[-1])
        out[..., :used, :] = t[..., :used, :]
    return out


class BufferLayer(CacheLayerMixin):
    """Keys and values (batch, heads, columns, dim) in a buffer: columns [start, length) are in use."""

    is_sliding = False

    def __init__(self) -> None:
        # CacheLayerMixin.__init__ would assign `keys` and `values`, which here are views of the buffer.
        self.is_initialized = False
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.start = 0
        self.length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[..., self.start : self.length, :]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[..., self.start : self.length, :]

    @property
    def device(self) -> torch.device | None:
        return None if self._k is None else self._k.device

    def used_bytes(self) -> int:
        """Bytes of the keys and values in use, every row: what a model reads, and a copy takes."""
        if self._k is None:
            return 0
        batch, heads, _, dim = self._k.shape
        return batch * kv_bytes(self.get_seq_length(), heads, dim, self._k.element_size())

    def reserve(self, n: int) -> None:
        """Make room in the buffer for `n` more columns."""
        raise NotImplementedError

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns after the ones in use, and return all of them (views, no copy)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self.reserve(n)
        self._k[..., self.length : self.length + n, :] = key_states
        self._v[..., self.length : self.length + n, :] = value_states
        self.length += n
        return self.keys, self.values

    def take_columns(self, n: int) -> None:
        """Take `n` more columns into use without writing them: the caller fills them
        (`write_columns`) before the model reads them. Every layer must take the same number
        before a forward pass, since transformers sizes one mask from the first layer."""
        self.reserve(n)
        self.length += n

    def write_columns(self, at: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `keys` and `values` (batch, heads, n, dim) into the columns from `at`, which
        must already be in use."""
        n = keys.shape[-2]
        if at < self.start or at + n > self.length:
            raise ValueError(f"columns {at}..{at + n} are not in use ({self.start}..{self.length})")
        self._k[..., at : at + n, :] = keys.to(self._k.device, self._k.dtype, non_blocking=True)
        self._v[..., at : at + n, :] = values.to(self._v.device, self._v.dtype, non_blocking=True)

    def columns(self, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the buffer's columns [0, stop) (views, no copy)."""
        return self._k[..., :stop, :], self._v[..., :stop, :]

    def restore_columns(self, keys: torch.Tensor, values: torch.Tensor, allocated: int, device: torch.device) -> None:
        """A new buffer of `allocated` columns on `device`, its first columns holding `keys` and
        `values` (batch, heads, n, dim), as `columns` gave them."""
        shape = (*keys.shape[:2], allocated, keys.shape[3])
        n = keys.shape[2]
        with torch.inference_mode(False):  # storage the engine rewrites in place later (see grown_buffer)
            self._k = torch.zeros(shape, dtype=keys.dtype, device=device)
            self._v = torch.zeros(shape, dtype=keys.dtype, device=device)
            self._k[..., :n, :], self._v[..., :n, :] = keys, values
        self.is_initialized = True
        self.start, self.length = 0, n

    def get_seq_length(self, *_: object) -> int:
        return self.length - self.start

    def get_mask_sizes(self, query: int | torch.Tensor) -> tuple[int, int]:
        # transformers passes the query length; releases before 5.x passed the cache positions.
        n = query if isinstance(query, int) else query.shape[-1]
        return self.get_seq_length() + n, 0

    def get_max_length(self) -> int:
        return -1
