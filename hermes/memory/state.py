"""`StateLayer`: the memory of a linear-attention layer (Gated DeltaNet), a fixed-size state.

Hybrid models (Qwen3.5) keep no keys and values in three layers of four: each such layer folds the
past into a causal convolution's last inputs and a recurrent state, whose sizes do not depend on
how much was seen. The model reads and writes them through transformers' `LinearAttentionLayer`
interface, in place. This layer adds what a HERMES memory needs of every layer: a chunk's update
is kept (`commit`), and anything written after it (a question, its answer, a guidance prompt) is
undone (`discard`), bit for bit, so that asking never changes what the stream remembers.

The committed states are a second copy of the same size, written in place: a stream allocates
nothing for its states after the first chunk, and `discard` copies only when something was written.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionLayer


class StateLayer(LinearAttentionLayer):
    """A linear-attention layer's convolution and recurrent states, with a committed copy of each."""

    def __init__(self) -> None:
        super().__init__(number_of_states=1)
        self._saved: dict[str, torch.Tensor] = {}  # committed copies, by state name
        self._saved_previous = False  # whether the committed memory had seen any token
        self._dirty = False  # whether the model wrote since the last commit or discard
        # The pass's leading tokens that the states keep; the rest ride on it (`HermesCache.riding`).
        self.keep: int | None = None

    # -- the transformers interface: states made outside inference mode, writes tracked ----------
    def lazy_initialization(self, *args: object, **kwargs: object) -> None:
        # The model runs in inference mode; a state made there could not be restored in place later.
        with torch.inference_mode(False):
            super().lazy_initialization(*args, **kwargs)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: object) -> torch.Tensor:
        self._dirty = True
        full = super().update_conv_state(conv_states, state_idx, **kwargs)
        riding = 0 if self.keep is None else conv_states.shape[-1] - self.keep
        if riding > 0:
            # The convolution's state is its last inputs: those before the riding tokens.
            state = self.conv_states[state_idx]
            kept = full[..., : full.shape[-1] - riding][..., -state.shape[-1] :]
            state.copy_(torch.nn.functional.pad(kept, (state.shape[-1] - kept.shape[-1], 0)))
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: object
    ) -> torch.Tensor:
        # A one-token decode step updates the convolution state in place without telling the cache;
        # it always writes the recurrent state next, which marks the layer as changed.
        self._dirty = True
        return super().update_recurrent_state(recurrent_states, state_idx, **kwargs)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("a HermesCache holds one stream: beam search and batch expansion are not supported")

    batch_repeat_interleave = batch_select_indices = reorder_cache

    # -- memory ---------------------------------------------------------------------------------
    def states(self) -> dict[str, torch.Tensor]:
        """The working states by name (what the model reads next), once the layer has been written."""
        named = {"conv": self.conv_states[0], "recurrent": self.recurrent_states[0]}
        return {name: t for name, t in named.items() if t is not None}

    def commit(self) -> None:
        """What the model wrote becomes the memory."""
        with torch.inference_mode(False):
            for name, t in self.states().items():
                if name not in self._saved:
                    self._saved[name] = torch.empty_like(t)
                self._saved[name].copy_(t)
        self._saved_previous = self.has_previous_state[0]
        self._dirty = False

    def committed(self) -> tuple[dict[str, torch.Tensor], bool]:
        """The committed states by name, and whether the memory had seen any token (a memory file's part)."""
        return dict(self._saved), bool(self._saved_previous)

    def discard(self) -> None:
        """Put the states back as the last commit left them, in place."""
        if not self._dirty:
            return
        with torch.inference_mode(False):
            for name, t in self.states().items():
                saved = self._saved.get(name)
                if saved is None:  # written for the first time by scratch tokens: nothing to keep
                    t.zero_()
                else:
                    t.copy_(saved)
        self.has_previous_state[0] = self._saved_previous
        self._dirty = False

    def reset(self) -> None:
        """Forget the stream, keeping the storage."""
        super().reset()
        for t in self._saved.values():
            t.zero_()
        self._saved_previous = False
        self._dirty = False

    def nbytes(self) -> int:
        """Bytes of the committed states: constant once the first token is in."""
        return sum(t.numel() * t.element_size() for t in self._saved.values())

    def storage(self) -> list[int]:
        """Data pointers of the working and committed states (they never move once made)."""
        return [t.data_ptr() for t in (*self.states().values(), *self._saved.values())]
