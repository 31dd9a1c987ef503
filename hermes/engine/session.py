"""StreamingSession: chunks in, compact memory kept, questions answered from it.

The data path of the paper, one call per step: `ingest` prefills a chunk into the cache, runs the
guidance pass and lets the policy evict (scoring per tier, smoothing across layers, Top-K with a
summary, re-indexing); `ask` appends the question after the memory, decodes greedily and leaves
the memory exactly as it was. Headless: the CLI, the web app, tests and benchmarks all drive it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hermes.engine.answering import (
    MAX_NEW_TOKENS,
    MAX_QUESTION_CHARS,
    AnswerUpdate,
    MemoryReader,
    QuestionError,
    validate_question,
)
from hermes.engine.chunk import Chunk
from hermes.engine.filtering import FilteredInputs, check_input_filter
from hermes.engine.guidance import guidance_prompt, probe_attention
from hermes.engine.metrics import memory_reading, now_ms
from hermes.engine.retrieval import HostRetrieval, RetrievalCost
from hermes.engine.watch import AnswerWords, StandingQuestions, WatchCheck, WatchCost
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.compression import AttentionRecord, compress
from hermes.memory.config import HermesConfig
from hermes.memory.policies import make_policy
from hermes.memory.rivals.host_store import HostStore
from hermes.memory.snapshot import MemorySnapshot
from hermes.models.base import VideoLM

# The reading side's names, re-exported: callers take a session's whole interface from here.
__all__ = [
    "MAX_NEW_TOKENS",
    "MAX_QUESTION_CHARS",
    "QUESTION_MARGIN",
    "AnswerUpdate",
    "ChunkReport",
    "QuestionError",
    "StreamBound",
    "StreamingSession",
    "validate_question",
]

# Scratch room kept after the memory for a question and its answer, so that asking allocates
# nothing in the common case (a longer one grows the storage once).
QUESTION_MARGIN = 256


class StreamBound(RuntimeError):
    """The stream cannot take another chunk (a bound of its policy is reached), with the reason."""


@dataclass
class ChunkReport:
    """What one chunk cost and left behind."""

    chunk_index: int
    frames_seen: int
    stream_time_s: float
    tokens: int  # prefilled, after the input filter
    prefill_ms: float
    compress_ms: float  # everything after the prefill: guidance, scoring, eviction, re-indexing
    guidance_ms: float  # of which the guidance pass
    reindex_ms: float  # of which re-indexing: a lazy compaction before the prefill, or the eager one
    evicted: int
    reindexed: bool
    cache_bytes: int
    video_tokens_per_layer: list[int]
    # Guidance attention of this chunk's compression, per layer: (stream ids, weights) over the
    # layer's video slots before eviction, or None where the layer was not probed. Empty when
    # no compression ran. The UI draws it; the memory does not keep it.
    attention: tuple[AttentionRecord | None, ...] = ()
    dropped: int = 0  # tokens the policy's input filter dropped before the prefill
    # The standing questions read from the memory after this chunk, and the short answer of each
    # one that fired (in the same order as the fired checks).
    watches: list[WatchCheck] = field(default_factory=list)
    alerts: list[AnswerUpdate] = field(default_factory=list)
    host_bytes: int = 0  # a retrieval policy's host store (ReKV), after this chunk


class StreamingSession(MemoryReader):
    """One stream, one memory: ingest chunks, answer questions at any moment."""

    def __init__(
        self,
        lm: VideoLM,
        config: HermesConfig | None = None,
        policy: str = "hermes",
        max_question_chars: int = MAX_QUESTION_CHARS,
        params: Mapping[str, Any] | None = None,
        host_cap_bytes: int | None = None,
    ) -> None:
        config = config or HermesConfig()
        self.host_cap_bytes = host_cap_bytes  # a retrieval policy's host store stops the stream there
        self.max_question_chars = max_question_chars
        if config.max_positions is None:
            config = config.with_(max_positions=lm.max_positions)
        self.lm = lm
        self.config = config
        self.policy = make_policy(policy, config, params)
        self.input_filter = None
        if self.policy.input_filter is not None:
            check_input_filter(lm, self.policy.name)
            self.input_filter = FilteredInputs(lm, self.policy.input_filter)
        # Standing questions outlive a reset (they are the viewer's, not the stream's).
        self.standing = StandingQuestions(AnswerWords.for_lm(lm), max_chars=max_question_chars)
        self.reset()

    # -- lifecycle ----------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the stream: a fresh memory holding only the text prefix."""
        self.memory = HermesCache(
            self.lm.num_layers, self.lm.rope_spec(), self.config, self.policy.capacity, linear=self.lm.linear_layers
        )
        ids = self.lm.prefix_ids()
        self.lm.forward(self.memory, ids, torch.arange(ids.shape[-1])[None])
        self.memory.commit_prefix()
        self.frames_seen = 0
        self.stream_time_s = 0.0
        self.chunks_seen = 0
        self.last_chunk: ChunkReport | None = None  # with the attention record of its compression
        self.watch_cost = WatchCost()
        self.answers: list[AnswerUpdate] = []  # the last ANSWERS_KEPT
        self.last_turn: tuple[str, str] | None = None
        self._guidance: tuple[tuple[str, str] | None, torch.Tensor, int] | None = None
        if self.input_filter is not None:
            self.input_filter.reset()
        rule = self.policy.retrieval
        self.retrieval = (
            None if rule is None else HostRetrieval(rule, self.memory, self.policy.name, self.host_cap_bytes)
        )
        self.standing.rearm()

    # -- streaming -----------------------------------------------------------------------
    def ingest(self, chunk: Chunk) -> ChunkReport:
        """Prefill one chunk into the memory, then compress it back to the budget: guidance pass,
        score per tier, smooth, Top-K with the summary, and re-index positions if eager."""
        pixels = chunk.pixels
        multiple = self.lm.frame_multiple
        if len(pixels) % multiple:  # Qwen2.5-VL and Qwen3-VL merge frame pairs: repeat the last frame
            pixels = np.concatenate([pixels, np.repeat(pixels[-1:], multiple - len(pixels) % multiple, axis=0)])
        inputs = self.lm.chunk_inputs(pixels, self.config.fps, chunk.timestamps)
        encoded = inputs.num_tokens
        if self.input_filter is not None:
            inputs = self.input_filter(inputs)
        ids = np.asarray(chunk.frame_ids)
        frame_ids = torch.as_tensor(ids[np.minimum(inputs.frames.numpy(), len(ids) - 1)])
        device = self.lm.device

        note = self.bound_note(inputs.num_tokens)
        if note is not None:
            raise StreamBound(note)
        t0 = now_ms(device)
        self.memory.discard()  # a chunk follows the memory alone, never a reader's leftovers
        compactions = self.memory.compactions
        # A lazy compaction may run here; never for a retrieval policy (see `HostRetrieval`).
        start = self.memory.start_position(inputs.num_tokens) if self.retrieval is None else self.next_position()
        t_lazy = now_ms(device)
        lazy = self.memory.compactions > compactions
        positions = inputs.rel_positions + start
        room = 0 if self.retrieval is None else self.retrieval.room(frame_ids)
        self.memory.reserve(inputs.num_tokens + QUESTION_MARGIN + room)
        if inputs.num_tokens:  # an input filter may have dropped a static chunk whole
            self.lm.forward(self.memory, inputs.input_ids, positions, **inputs.model_kwargs)
            meta = ChunkMeta(frames=frame_ids, positions=positions, patches=inputs.patches)
            if self.retrieval is not None:  # every frame to host memory, as computed, before the window moves on
                self.retrieval.keep(self.memory, meta)
            self.memory.commit(meta)
        t1 = now_ms(device)
        report, guidance_ms, reindex_ms = None, 0.0, t_lazy - t0 if lazy else 0.0
        capacity = self.policy.capacity
        if capacity is not None and self.memory.slots > capacity:
            attention = self.guidance_attention()
            t_guided = now_ms(device)
            guidance_ms = t_guided - t1
            report = compress(self.memory, self.policy, attention)
            if self.config.reindex == "eager" and self.retrieval is None:  # rekv keeps original positions
                t_kept = now_ms(device)
                self.memory.reindex()
                reindex_ms += now_ms(device) - t_kept
        t2 = now_ms(device)

        self.frames_seen += chunk.num_frames
        self.stream_time_s = chunk.end
        out = ChunkReport(
            chunk_index=self.chunks_seen,
            frames_seen=self.frames_seen,
            stream_time_s=self.stream_time_s,
            tokens=inputs.num_tokens,
            dropped=encoded - inputs.num_tokens,
            prefill_ms=t1 - t_lazy,
            compress_ms=(t2 - t1) + (t_lazy - t0),
            guidance_ms=guidance_ms,
            reindex_ms=reindex_ms,
            evicted=sum(report.evicted) if report else 0,
            reindexed=self.memory.compactions > compactions,  # lazily before the prefill, or eagerly after
            cache_bytes=self.memory.cache_bytes(),
            video_tokens_per_layer=self.memory.video_tokens_per_layer(),
            attention=report.attention if report else (),
            host_bytes=self.host_bytes(),
        )
        if len(self.standing):
            out.watches, out.alerts = self.check_standing()
            self.watch_cost.add(out.watches, out.prefill_ms)
        self.chunks_seen += 1
        self.last_chunk = out
        return out

    def check_standing(self) -> tuple[list[WatchCheck], list[AnswerUpdate]]:
        """Ask each standing question of the memory as it is now, read-only like any question, and
        write a short answer for each one that fired. Alerts are not remembered as the last turn, so
        watching never changes what the memory keeps."""
        checks = self.standing.check(self.first_token_logprobs, self.stream_time_s, self.lm.device)
        alerts = [
            self.ask(check.question, self.standing.answer_tokens, remember=False) for check in checks if check.fired
        ]
        return checks, alerts

    def guidance_attention(self) -> list[torch.Tensor | None] | None:
        """W per layer over its slots after the prefix, for the layers the policy probes; None when
        the policy needs no probe. The memory is left untouched.

        HERMES's layers read one forward pass over the guidance prompt: a layer that reads the
        global query takes the global part's queries, one that reads the hybrid query the whole
        prompt. StreamMem's layers read a pass over the chat template's tokens after the video."""
        tiers = self.memory.tiers
        wanted = {layer: self.policy.guidance(tier) for layer, tier in enumerate(tiers.tiers)}
        if all(query is None for query in wanted.values()):
            return None
        weights: dict[int, torch.Tensor] = {}
        guided = [layer for layer, query in wanted.items() if query in ("global", "hybrid")]
        if guided:
            ids, n_global = self._guidance_ids()
            part = {"global": slice(0, n_global), "hybrid": slice(None)}
            weights |= probe_attention(self.lm, self.memory, ids, {layer: part[wanted[layer]] for layer in guided})
        templated = [layer for layer, query in wanted.items() if query == "template"]
        if templated:
            weights |= probe_attention(
                self.lm, self.memory, self.lm.template_ids(), {layer: slice(None) for layer in templated}
            )
        p, s = self.memory.prefix_len, self.memory.slots
        return [weights[layer][p : p + s] if layer in weights else None for layer in range(len(tiers))]

    # -- a retrieval policy's host store (ReKV) ------------------------------------------
    @property
    def store(self) -> HostStore | None:
        """A retrieval policy's host store of every frame; None for other policies."""
        return None if self.retrieval is None else self.retrieval.store

    @property
    def last_retrieval(self) -> RetrievalCost | None:
        """What the last question's retrieval cost; None for other policies."""
        return None if self.retrieval is None else self.retrieval.last

    def next_position(self) -> int:
        """Where new tokens go: after the memory (and a retrieval policy's stored frames)."""
        return self.memory.next_position if self.retrieval is None else self.retrieval.next_position(self.memory)

    def host_bytes(self) -> int:
        """Host memory of a retrieval policy's store; 0 for other policies."""
        return 0 if self.store is None else self.store.nbytes()

    def bound_note(self, tokens: int) -> str | None:
        """Why a next chunk of `tokens` tokens cannot go in (a retrieval policy's host cap or
        positions); None when it can."""
        if self.retrieval is None:
            return None
        return self.retrieval.bound_note(self.memory, tokens, self.config.chunk_frames, self.frames_seen)

    def _forward_question(
        self, ids: torch.Tensor, positions: torch.Tensor, query: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        """The model over question tokens after the memory, as scratch tokens; a retrieval policy
        first brings back each layer's best frames for the `query` tokens (`HostRetrieval.forward`)."""
        if self.retrieval is None:
            return self.lm.forward(self.memory, ids, positions, **kwargs)
        return self.retrieval.forward(self.lm, self.memory, ids, positions, query, **kwargs)

    def _guidance_ids(self) -> tuple[torch.Tensor, int]:
        """The guidance prompt's ids and the length of its global part. Tokenized again only when
        the last question and answer change, not for every chunk."""
        if self._guidance is None or self._guidance[0] != self.last_turn:
            ids, n_global = guidance_prompt(self.lm.encode, self.lm.video_close, self.last_turn)
            self._guidance = (self.last_turn, ids, n_global)
        return self._guidance[1], self._guidance[2]

    # -- reading ---------------------------------------------------------------------------
    def frames_in_memory(self) -> int:
        """Distinct frames of which at least one token is still kept in some layer."""
        return self.memory.snapshot().frames_in_memory()

    def snapshot(self) -> MemorySnapshot:
        return self.memory.snapshot()

    def metrics(self) -> dict:
        """Current numbers for the CLI, the UI and benchmarks."""
        mem = memory_reading(self.lm.device)
        return {
            "frames_seen": self.frames_seen,
            "stream_time_s": self.stream_time_s,
            "cache_bytes": self.memory.cache_bytes(),
            "host_bytes": self.host_bytes(),
            "video_tokens_per_layer": self.memory.video_tokens_per_layer(),
            "rss_bytes": mem.rss_bytes,
            "gpu_allocated_bytes": mem.gpu_allocated_bytes,
            "gpu_peak_bytes": mem.gpu_peak_bytes,
        }
