"""Guidance prompts and the attention they pay to the cache (the pseudo-query of eq. 2).

While streaming, the real question is unknown, so a generic prompt stands in for it: a global
one (the story so far) for deep layers, and a hybrid one (the story, then the current scene) for
middle layers. The hybrid prompt starts with the global one, so that a single forward pass over
it serves both: under causal attention the global tokens' queries see exactly what they would in
a pass of their own. The attention is computed from the true hidden states of a forward pass over the
prompt, with SDPA left in place: a hook on each attention module rebuilds q = RoPE(q_proj(h))
and takes the keys from the cache layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb, repeat_kv

# Short on purpose: the guidance pass runs after every chunk past the budget, and its cost grows
# with the prompt's length (a byte-level tokenizer spends one token per character).
GLOBAL_PROMPT = "Recall the story: main actors, key events, timeline."
LOCAL_PROMPT = "This scene: objects, fine actions, where things are."
# The history (last question and answer) is cut to this many tokens: it carries the user's
# interest, and an uncapped answer would make every later compression pay for its length.
HISTORY_TOKENS = 32


def guidance_texts(last_turn: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """The (history, global, local) parts of the guidance. History is the last question and
    answer, once there is one. Deep layers read history + global; middle layers the hybrid
    prompt, history + global + local."""
    history = f"Q: {last_turn[0]} A: {last_turn[1]} " if last_turn else ""
    return history, GLOBAL_PROMPT, LOCAL_PROMPT


class _ProbeDone(Exception):
    """Raised by the probe once the last layer it needs is recorded."""


class AttentionProbe:
    """Context manager: records, per decoder layer, the attention the new tokens pay to every key.

    After a forward pass, `weights[l]` is a (keys,) tensor: the softmax over all keys (causal
    among the new tokens), averaged over heads and over the new tokens (or over
    `queries[l]`, a slice of them). With `stop_early`, the forward
    pass is cut short after the deepest recorded layer (the outputs are then not needed).
    """

    def __init__(
        self,
        attention_modules: Sequence[torch.nn.Module],
        layers: Iterable[int],
        queries: Mapping[int, slice] | None = None,
        stop_early: bool = False,
    ) -> None:
        self.modules = attention_modules
        self.layers = sorted(set(layers))
        self.queries = dict(queries or {})
        self.stop_early = stop_early
        self.weights: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> AttentionProbe:
        for layer in self.layers:
            module = self.modules[layer]
            self._handles.append(module.register_forward_hook(self._hook(layer), with_kwargs=True))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return exc_type is _ProbeDone  # our own early stop is not an error

    def _hook(self, layer: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            batch, n_new, _ = hidden.shape
            q = module.q_proj(hidden).view(batch, n_new, -1, module.head_dim).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
            # The cache layer already holds the new tokens' keys (the module appended them). Scale q,
            # not the (heads x new x keys) scores, and mask only the new keys: the old ones are
            # visible to every new token.
            rows = self.queries.get(layer, slice(None))
            keys = repeat_kv(cache.layers[module.layer_idx].keys, module.num_key_value_groups)
            scores = torch.matmul(q[:, :, rows].float() * module.scaling, keys.float().transpose(-1, -2))
            causal = torch.ones(n_new, n_new, dtype=torch.bool, device=scores.device).triu(1)[rows]
            scores[..., -n_new:].masked_fill_(causal, float("-inf"))
            self.weights[layer] = scores.softmax(dim=-1)[0].mean(dim=(0, 1))
            if self.stop_early and layer == self.layers[-1]:
                # Deeper layers and the LM head would only be thrown away: skip them.
                raise _ProbeDone

        return hook
