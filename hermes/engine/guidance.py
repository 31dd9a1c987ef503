"""Guidance prompts and the attention they pay to the cache (the pseudo-query of eq. 2).

While streaming, the real question is unknown, so a generic prompt stands in for it: a global
one (the story so far) for deep layers, and a hybrid one (the story, then the current scene) for
middle layers. The hybrid prompt starts with the global one, so that a single forward pass over
it serves both: under causal attention the global tokens' queries see exactly what they would in
a pass of their own. The attention is computed from the true hidden states of a forward pass over the
prompt, with SDPA left in place: a hook on each attention module rebuilds q = RoPE(q_proj(h))
(q_norm first where the model has one, as Qwen3-VL does; the query half only where q_proj also
gives each head an output gate, as Qwen3.5's does; RoPE on the channels the model rotates, the
first ones, where its rotary is partial) and takes the keys from the cache layer. Each hook runs
on its layer's device, so a model spread over several GPUs is probed where each layer's memory
lives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from hermes.memory.cache import HermesCache
from hermes.memory.config import HermesConfig
from hermes.memory.policies import MemoryPolicy
from hermes.models.base import VideoLM

# Short on purpose: the guidance pass runs after every chunk past the budget, and its cost grows
# with the prompt's length (25 or 26 tokens with the real Qwen vocabularies; a tiny model's
# byte-level tokenizer spends one token per character).
GLOBAL_PROMPT = "Recall the story: main actors, key events, timeline."
LOCAL_PROMPT = "This scene: objects, fine actions, where things are."
# Bytes of fp32 attention scores the probe holds at once: small on a CPU (see `mean_attention`),
# large where an accelerator's allocator keeps its buffers and each block costs kernel launches.
PROBE_BLOCK_BYTES = 4 * 2**20
PROBE_BLOCK_BYTES_ACCELERATOR = 512 * 2**20


def guidance_prompt(
    encode: Callable[[str], torch.Tensor],
    opening: str,
    last_turn: tuple[str, str] | None = None,
    history_tokens: int = HermesConfig.history_tokens,
) -> tuple[torch.Tensor, int]:
    """Ids (1, n) of the guidance prompt, and the length of its global part.

    The prompt is `opening` (what closes the video in the chat template), the history once there
    is one, the global prompt, then the local one: deep layers read the global part (history +
    global), middle layers the whole hybrid prompt. The history (the last question and its answer)
    carries the user's interest into the guidance; question and answer are cut to `history_tokens`
    each on its own, so that a long question cannot push the answer out, and a long answer does not
    make every later compression pay for its length.
    """
    parts = [encode(opening)]
    if last_turn is not None and history_tokens > 0:
        question, answer = last_turn
        parts += [
            encode("Q: "),
            encode(question)[:, :history_tokens],
            encode(" A: "),
            encode(answer)[:, :history_tokens],
            encode(" "),
        ]
    parts.append(encode(GLOBAL_PROMPT))
    global_ids = torch.cat(parts, dim=-1)
    return torch.cat([global_ids, encode(" " + LOCAL_PROMPT)], dim=-1), global_ids.shape[-1]


def mean_attention(q: torch.Tensor, keys: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """(keys,): the softmax attention of the queries `q` (1, heads, rows, dim), already scaled, over
    `keys` (1, kv heads, keys, dim), averaged over heads and rows. The last `causal.shape[-1]` keys
    are hidden from a row where `causal` (rows, new keys) is True.

    Computed in fp32, query heads grouped by the key head they share (GQA), so that the keys are not
    copied per query head, and a block of rows at a time: on a CPU, buffers past a few MiB come from
    fresh pages, whose faults cost as much as the arithmetic, while small blocks reuse the heap.
    """
    kv_heads, total = keys.shape[1], keys.shape[-2]
    heads, rows, dim = q.shape[1:]
    groups = heads // kv_heads
    grouped = q[0].float().view(kv_heads, groups, rows, dim)
    keys_t = keys[0].float().transpose(-1, -2)  # (kv heads, dim, keys)
    budget = PROBE_BLOCK_BYTES if keys.device.type == "cpu" else PROBE_BLOCK_BYTES_ACCELERATOR
    block = max(1, budget // (heads * total * 4))
    sums = torch.zeros(total, device=keys.device)
    for i in range(0, rows, block):
        part = grouped[:, :, i : i + block]
        scores = torch.matmul(part.reshape(kv_heads, -1, dim), keys_t)
        scores.view(kv_heads, groups, -1, total)[..., total - causal.shape[-1] :].masked_fill_(
            causal[i : i + block], float("-inf")
        )
        sums += scores.softmax(dim=-1).sum(dim=(0, 1))
    return sums / (heads * rows)


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
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            n_new = hidden.shape[1]
            # Only the rows read are projected: a guidance prompt riding on a chunk is a few dozen
            # rows of a pass of hundreds.
            rows = self.queries.get(layer, slice(None))
            cos, sin = (t[..., rows, :] for t in kwargs["position_embeddings"])
            q = head_queries(module, hidden[:, rows]).transpose(1, 2)
            rotary = cos.shape[-1]  # partial rotary (Qwen3.5): the first channels turn, the rest pass
            q_rot, _ = apply_rotary_pos_emb(q[..., :rotary], q[..., :rotary], cos, sin)
            q = torch.cat([q_rot, q[..., rotary:]], dim=-1)
            # The cache layer already holds the new tokens' keys (the module appended them); only
            # those are masked, the old ones are visible to every new token.
            causal = torch.ones(n_new, n_new, dtype=torch.bool, device=q.device).triu(1)[rows]
            keys = cache.layers[module.layer_idx].keys
            self.weights[layer] = mean_attention(q * module.scaling, keys, causal)
            if self.stop_early and layer == self.layers[-1]:
                # Deeper layers and the LM head would only be thrown away: skip them.
                raise _ProbeDone

        return hook


def head_queries(module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """An attention module's queries of `hidden` before RoPE, (batch, tokens, heads, head_dim): the
    query half only where q_proj also gives each head an output gate (Qwen3.5), normalised where
    the model normalises each head's query (Qwen3)."""
    batch, n_new, _ = hidden.shape
    q = module.q_proj(hidden)
    if q.shape[-1] == 2 * module.o_proj.in_features:  # Qwen3.5: each head's query, then its gate
        q = q.view(batch, n_new, -1, 2 * module.head_dim)[..., : module.head_dim]
    q = q.reshape(batch, n_new, -1, module.head_dim)
    if getattr(module, "q_norm", None) is not None:
        q = module.q_norm(q)
    return q


def tokens_needed(attention_layers: Sequence[int], queries: Mapping[int, slice], n: int) -> list[int]:
    """Per decoder layer up to the deepest probed one, how many leading tokens of an `n`-token pass
    the probe still needs there: the most that any probed layer at or below it reads.
    `attention_layers[l]` is the decoder layer of probed layer l.

    Attention is causal, so the first k tokens' states never depend on the later ones: once the
    layers that read the whole prompt are passed, the layers above need only its leading part (the
    global prompt, for HERMES's deep layers)."""
    stops = {attention_layers[layer]: rows.indices(n)[1] for layer, rows in queries.items()}
    needed, most = [], 0
    for decoder_layer in range(max(stops), -1, -1):
        most = max(most, stops.get(decoder_layer, 0))
        needed.append(most)
    return needed[::-1]


@contextlib.contextmanager
def leading_tokens_only(decoder_layers: Sequence[torch.nn.Module], needed: Sequence[int], n: int) -> Iterator[None]:
    """Within: decoder layer l runs on the first `needed[l]` tokens of an `n`-token pass only (see
    `tokens_needed`); the model's per-token arguments (positions, rotary tables, masks) are cut to
    match. The cache then holds fewer scratch tokens, which the memory drops anyway."""

    def hook(tokens: int):
        def cut(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                args = (args[0][:, :tokens], *args[1:])
            else:
                kwargs["hidden_states"] = kwargs["hidden_states"][:, :tokens]
            return args, {key: _cut(key, value, tokens, n) for key, value in kwargs.items()}

        return cut

    handles = [
        layer.register_forward_pre_hook(hook(tokens), with_kwargs=True)
        for layer, tokens in zip(decoder_layers, needed, strict=False)
        if tokens < n
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _cut(key: str, value: object, tokens: int, n: int) -> object:
    """A decoder layer's keyword argument for the first `tokens` of `n` new tokens."""
    if value is None or tokens == n:
        return value
    if key == "position_embeddings":  # (cos, sin), tokens on the second-to-last axis
        return tuple(t[..., :tokens, :] for t in value)
    if key in ("position_ids", "cache_position"):  # tokens on the last axis
        return value[..., :tokens]
    if key == "attention_mask" and isinstance(value, torch.Tensor):
        # (batch, heads, queries, keys) or (batch, keys): the new tokens are the last keys.
        keys = value[..., : value.shape[-1] - (n - tokens)]
        return keys[:, :, :tokens] if keys.dim() == 4 else keys
    if isinstance(value, torch.Tensor):
        raise _CannotCut(key)
    return value


class _CannotCut(ValueError):
    """A decoder layer got a per-token argument this module does not know how to cut (another
    transformers release, say): the pass then runs on every token, as it always may."""


def probe_attention(
    lm: VideoLM, memory: HermesCache, ids: torch.Tensor, queries: dict[int, slice]
) -> dict[int, torch.Tensor]:
    """The attention (over every key) that the `queries` tokens of `ids`, read after the memory,
    pay in each of their layers, from one forward pass; the memory is left untouched.

    The pass does only the work the probe reads: it stops after the deepest probed layer (no
    deeper layers, no LM head), and above the last layer that reads the whole of `ids` it carries
    only the leading tokens the layers above read (`tokens_needed`)."""
    n = ids.shape[-1]
    positions = memory.next_position + torch.arange(n)[None]
    modules = lm.attention_modules()
    needed = tokens_needed([module.layer_idx for module in modules], queries, n)
    try:
        with (
            memory.scratch(),
            leading_tokens_only(lm.language_model.layers, needed, n),
            AttentionProbe(modules, list(queries), queries, stop_early=True) as probe,
        ):
            lm.forward(memory, ids, positions)
    except _CannotCut:
        with memory.scratch(), AttentionProbe(modules, list(queries), queries, stop_early=True) as probe:
            lm.forward(memory, ids, positions)
    return probe.weights


@dataclass(frozen=True)
class Rider:
    """A guidance prompt carried on a chunk's prefill, after the chunk's tokens: its tokens read the
    memory and the chunk as a separate pass after the chunk's commit would, for a fraction of the
    cost (a separate pass of a few dozen tokens reads every weight for a few rows). `queries`: per
    probed layer, the rows it reads, counted in the whole pass."""

    ids: torch.Tensor  # (1, tail)
    queries: dict[int, slice]
    chunk: int  # the chunk's tokens, before the prompt's

    @property
    def tail(self) -> int:
        return self.ids.shape[-1]

    def needed(self, attention_layers: Sequence[int], num_layers: int) -> list[int]:
        """Per decoder layer, the leading tokens of the pass it runs on: the chunk, and of the
        prompt what the probed layers at or above it read (`tokens_needed`); the chunk alone above
        the deepest probed layer."""
        needed = tokens_needed(attention_layers, self.queries, self.chunk + self.tail)
        return needed + [self.chunk] * (num_layers - len(needed))

    def extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's ids and positions with the prompt after them, at the positions text takes
        after the chunk (every rotary axis advancing together)."""
        after = int(positions.max()) + 1 + torch.arange(self.tail, device=positions.device)
        extra = after.expand(*positions.shape[:-1], self.tail)
        return torch.cat([input_ids, self.ids.to(input_ids.device)], -1), torch.cat([positions, extra], -1)


class GuidanceProbe:
    """The attention a policy's layers score by, measured by probe passes over a memory.

    HERMES's layers read one forward pass over the guidance prompt: a layer that reads the global
    query takes the global part's queries, one that reads the hybrid query the whole prompt. The
    prompt can also ride on the prefill of the chunk before the compression (`rider`, `ride`),
    which then reads the attention it recorded. StreamMem's layers read a pass over the chat
    template's tokens after the video. The prompt is tokenized again only when the conversation's
    last turn changes, not for every chunk."""

    def __init__(self, lm: VideoLM) -> None:
        self.lm = lm
        self._prompt: tuple[tuple, torch.Tensor, int] | None = None  # ((turn, history cap), ids, global part)
        self._ridden: dict[int, torch.Tensor] | None = None  # what the last rider recorded, unread

    def prompt(self, last_turn: tuple[str, str] | None, history_tokens: int) -> tuple[torch.Tensor, int]:
        """The guidance prompt's ids after `last_turn` (the last question and answer, each cut to
        `history_tokens`), and the length of its global part."""
        key = (last_turn, history_tokens)
        if self._prompt is None or self._prompt[0] != key:
            ids, n_global = guidance_prompt(self.lm.encode, self.lm.video_close, last_turn, history_tokens)
            self._prompt = (key, ids, n_global)
        return self._prompt[1], self._prompt[2]

    def rider(
        self, memory: HermesCache, policy: MemoryPolicy, last_turn: tuple[str, str] | None, chunk_tokens: int
    ) -> Rider | None:
        """The guidance prompt to carry on the prefill of a chunk of `chunk_tokens` tokens, for the
        layers of `policy` that read it; None when no layer does, or one reads another pass."""
        wanted = _wanted(memory, policy)
        if not wanted or any(query not in ("global", "hybrid") for query in wanted.values()):
            return None
        ids, n_global = self.prompt(last_turn, policy.history_tokens)
        part = {"global": slice(chunk_tokens, chunk_tokens + n_global), "hybrid": slice(chunk_tokens, None)}
        return Rider(ids, {layer: part[query] for layer, query in wanted.items()}, chunk_tokens)

    def ride(self, memory: HermesCache, rider: Rider, forward: Callable[[], object]) -> None:
        """Run `forward`, the prefill carrying `rider` (its ids and positions from `Rider.extend`),
        and record the attention its prompt pays, for the next `attention` call; the memory is
        left holding the chunk alone, to commit.

        The prompt goes only as deep as the probe reads: above the last layer that reads all of it,
        only its leading part (`Rider.needed`), and none of it above the deepest probed layer."""
        self._ridden = None
        modules = self.lm.attention_modules()
        needed = rider.needed([module.layer_idx for module in modules], self.lm.num_layers)
        queries, n = rider.queries, rider.chunk + rider.tail
        try:
            with (
                self.lm.riding(memory, rider.chunk),
                leading_tokens_only(self.lm.language_model.layers, needed, n),
                AttentionProbe(modules, queries, queries) as probe,
            ):
                forward()
        except _CannotCut:
            memory.discard()  # the chunk's half-run pass: the memory is as the last commit left it
            with self.lm.riding(memory, rider.chunk), AttentionProbe(modules, queries, queries) as probe:
                forward()
        self._ridden = probe.weights

    def attention(
        self, memory: HermesCache, policy: MemoryPolicy, last_turn: tuple[str, str] | None
    ) -> list[torch.Tensor | None] | None:
        """W per layer over its slots after the prefix, for the layers `policy` probes; None when it
        needs no probe. Read from the rider of the chunk just committed, when it carried one; else
        from probe passes now. The memory is left untouched."""
        wanted = _wanted(memory, policy)
        weights, self._ridden = self._ridden or {}, None
        if not wanted:
            return None
        guided = [layer for layer, query in wanted.items() if query in ("global", "hybrid") and layer not in weights]
        if guided:
            ids, n_global = self.prompt(last_turn, policy.history_tokens)
            part = {"global": slice(0, n_global), "hybrid": slice(None)}
            weights |= probe_attention(self.lm, memory, ids, {layer: part[wanted[layer]] for layer in guided})
        templated = [layer for layer, query in wanted.items() if query == "template"]
        if templated:
            weights |= probe_attention(self.lm, memory, self.lm.template_ids(), dict.fromkeys(templated, slice(None)))
        p, s = memory.prefix_len, memory.slots
        return [weights[layer][p : p + s] if layer in weights else None for layer in range(len(memory.kv_layers))]


def _wanted(memory: HermesCache, policy: MemoryPolicy) -> dict[int, str]:
    """The query each probed HERMES layer of `memory` reads under `policy` ('global', 'hybrid',
    'template'); layers that read none are left out."""
    queries = {layer: policy.guidance(tier) for layer, tier in enumerate(memory.tiers.tiers)}
    return {layer: query for layer, query in queries.items() if query is not None}
