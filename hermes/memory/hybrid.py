"""`HybridCache`: a transformers Cache whose sequence length is its attention layers' length.

A hybrid model's linear-attention layers hold fixed-size states. Up to transformers 5.24 a
Cache's `get_seq_length()` skipped them and read the first attention layer; from 5.25 each
linear layer counts every token ever fed through it, scratch passes included, and `Cache` reads
layer 0, which in Qwen3.5 is a linear layer. The memory's length is what its attention layers
hold (prefix and slots), so this cache reads it there, on every release.
"""

from __future__ import annotations

from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin


class HybridCache(Cache):
    """A Cache of attention layers and, for a hybrid model, linear-attention layers among them."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens held by attention layer `layer_idx`; a linear layer is read as the first attention layer."""
        if layer_idx >= len(self.layers):
            return 0
        if isinstance(self.layers[layer_idx], LinearAttentionCacheLayerMixin):
            if layer_idx != 0:
                raise ValueError(f"layer {layer_idx} is linear attention: it holds a state, not a sequence")
            linear = LinearAttentionCacheLayerMixin
            layer_idx = next((i for i, layer in enumerate(self.layers) if not isinstance(layer, linear)), -1)
            if layer_idx < 0:
                raise ValueError("a cache of linear-attention layers only has no sequence length")
        return self.layers[layer_idx].get_seq_length()
