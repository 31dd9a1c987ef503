"""StreamingSession: chunks in, compact memory kept, questions answered from it.

The data path of the paper as steps, one method each: `ingest` turns a chunk into the model's
inputs (`_inputs`: padded to the frame multiple, through the policy's input filter), prefills them
after the memory (`_prefill`), lets the policy compress the memory back to its budget
(`_compress`: guidance attention, scoring per tier, smoothing across layers, selection,
re-indexing; the guidance prompt rides on the prefill when the compression follows it)
and reports what that cost (`_report`), the phases timed by one `Stopwatch`. Questions are read by
a `MemoryReader` (hermes/engine/answering.py), which is given the model, the memory, the policy's
question-time state and the stream's progress, and leaves the memory exactly as it was.
Headless: the CLI, the web app, tests and benchmarks all drive it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
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
from hermes.engine.chunk import Chunk, StreamProgress
from hermes.engine.guidance import GuidanceProbe, Rider
from hermes.engine.methods import DEFAULT_POLICY, as_spec
from hermes.engine.metrics import Stopwatch
from hermes.engine.watch import AnswerWords, StandingQuestions, WatchCheck, WatchCost
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.compression import AttentionRecord, CompressionReport, compress
from hermes.memory.config import HermesConfig
from hermes.memory.snapshot import MemorySnapshot
from hermes.models.base import ChunkInputs, VideoLM

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
    guidance_ms: float  # of which the guidance pass (reading what it recorded, where it rode on the prefill)
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
    host_bytes: int = 0  # what the policy's question-time step holds in host memory (ReKV), after this chunk

    def numbers(self) -> ChunkReport:
        """This report without what a long history must not hold for every chunk: the attention
        record and the standing checks (a view keeps those apart, bounded)."""
        return replace(self, attention=(), watches=[], alerts=[])


class StreamingSession:
    """One stream, one memory: ingest chunks, answer questions at any moment.

    `policy` is a parsed `PolicySpec` (a name is parsed here, for a library caller, with `params`);
    `host_cap_bytes` bounds what its question-time step may keep in host memory (ReKV's store).
    With `guidance_rides` (the default), the guidance prompt rides on the prefill of a chunk that
    the compression follows, instead of a pass of its own after it (`Rider`): the same attention,
    for a fraction of the cost. Off, it is the separate pass, as the bench compares."""

    def __init__(
        self,
        lm: VideoLM,
        config: HermesConfig | None = None,
        policy: str = DEFAULT_POLICY,
        max_question_chars: int = MAX_QUESTION_CHARS,
        params: Mapping[str, Any] | None = None,
        host_cap_bytes: int | None = None,
        guidance_rides: bool = True,
    ) -> None:
        config = config or HermesConfig()
        if config.max_positions is None:
            config = config.with_(max_positions=lm.max_positions)
        self.lm = lm
        self.config = config
        self.host_cap_bytes = host_cap_bytes
        self.max_question_chars = max_question_chars
        self.policy = as_spec(policy, params).build(config)
        self.input_filter = self.policy.inputs(lm)
        self.guidance = GuidanceProbe(lm)
        self.guidance_rides = guidance_rides
        # Standing questions outlive a reset (they are the viewer's, not the stream's).
        self.standing = StandingQuestions(AnswerWords.for_lm(lm), max_chars=max_question_chars)
        self.reset()

    def reset(self, memory: HermesCache | None = None) -> None:
        """Forget the stream: a fresh memory holding only the text prefix (or `memory`, one loaded
        from a memory file, whose stream the caller then restores), and a fresh reader of it."""
        if memory is None:
            memory = HermesCache(
                self.lm.num_layers, self.lm.rope_spec(), self.config, self.policy.capacity, linear=self.lm.linear_layers
            )
            ids = self.lm.prefix_ids()
            self.lm.forward(memory, ids, torch.arange(ids.shape[-1])[None])
            memory.commit_prefix()
        self.memory = memory
        self.progress = StreamProgress()
        self.last_chunk: ChunkReport | None = None  # with the attention record of its compression
        self.watch_cost = WatchCost()
        self.input_filter.reset()
        self.question = self.policy.question.start(self.memory, self.policy.name, self.host_cap_bytes)
        self.reader = MemoryReader(self.lm, self.memory, self.question, self.progress, self.max_question_chars)
        self.standing.rearm()

    @property
    def frames_seen(self) -> int:
        return self.progress.frames_seen

    @property
    def stream_time_s(self) -> float:
        return self.progress.stream_time_s

    @property
    def chunks_seen(self) -> int:
        return self.progress.chunks_seen

    # -- streaming -----------------------------------------------------------------------------
    def ingest(self, chunk: Chunk) -> ChunkReport:
        """Prefill one chunk into the memory, then compress it back to the budget; StreamBound, the
        memory unchanged, when a bound of the policy stops the stream before it."""
        inputs, frame_ids, encoded = self._inputs(chunk)
        note = self.bound_note(inputs.num_tokens)
        if note is not None:
            raise StreamBound(note)
        clock, compactions = Stopwatch(self.lm.device), self.memory.compactions
        self._prefill(inputs, frame_ids, clock)
        lazy = self.memory.compactions > compactions
        compression = self._compress(clock)
        self.progress.advance(chunk)
        report = self._report(inputs, encoded, compression, clock, lazy, self.memory.compactions > compactions)
        if len(self.standing):
            report.watches, report.alerts = self.check_standing()
            self.watch_cost.add(report.watches, report.prefill_ms)
        self.progress.chunks_seen += 1
        self.last_chunk = report
        return report

    def _inputs(self, chunk: Chunk) -> tuple[ChunkInputs, torch.Tensor, int]:
        """The chunk as the model's inputs (after the policy's input filter), each token's frame in
        the stream, and the tokens encoded before the filter."""
        pixels = chunk.padded_pixels(self.lm.frame_multiple)  # Qwen merges frame pairs
        inputs = self.lm.chunk_inputs(pixels, self.config.fps, chunk.timestamps)
        encoded = inputs.num_tokens
        inputs = self.input_filter(inputs)
        ids = np.asarray(chunk.frame_ids)  # a padding frame counts as the chunk's last one
        return inputs, torch.as_tensor(ids[np.minimum(inputs.frames.numpy(), len(ids) - 1)]), encoded

    def _prefill(self, inputs: ChunkInputs, frame_ids: torch.Tensor, clock: Stopwatch) -> None:
        """Write the chunk's tokens after the memory and commit them as video slots."""
        with clock.phase("position"):  # a lazy compaction may run here
            self.memory.discard()  # a chunk follows the memory alone, never a reader's leftovers
            start = self.question.start_position(self.memory, inputs.num_tokens)
        with clock.phase("prefill"):
            positions = inputs.rel_positions + start
            self.memory.reserve(inputs.num_tokens + QUESTION_MARGIN + self.question.room(frame_ids))
            if inputs.num_tokens:  # an input filter may have dropped a static chunk whole
                rider, kwargs = self._rider(inputs), inputs.model_kwargs
                if rider is None:
                    self.lm.forward(self.memory, inputs.input_ids, positions, **kwargs)
                else:
                    ids, at = rider.extend(inputs.input_ids, positions)
                    self.guidance.ride(self.memory, rider, lambda: self.lm.forward(self.memory, ids, at, **kwargs))
                meta = ChunkMeta(frames=frame_ids, positions=positions, patches=inputs.patches)
                self.question.after_prefill(self.memory, meta)
                self.memory.commit(meta)

    def _rider(self, inputs: ChunkInputs) -> Rider | None:
        """The guidance prompt to carry on this chunk's prefill: when the compression after it will
        probe (the chunk takes the memory past its capacity) and `guidance_rides`; None otherwise,
        or when the chunk comes as embeddings (an input filter's), after which no ids can follow."""
        if not self.guidance_rides or "inputs_embeds" in inputs.model_kwargs:
            return None
        if not self.policy.over_capacity(self.memory.slots + inputs.num_tokens):
            return None
        return self.guidance.rider(self.memory, self.policy, self.reader.last_turn, inputs.num_tokens)

    def _compress(self, clock: Stopwatch) -> CompressionReport | None:
        """Back to the policy's capacity if the memory holds more: guidance pass, scoring,
        smoothing, selection, and re-indexing if eager; None when there was nothing to do."""
        if not self.policy.over_capacity(self.memory.slots):
            return None
        with clock.phase("guidance"):
            attention = self.guidance_attention()
        with clock.phase("evict"):
            compression = compress(self.memory, self.policy, attention)
        if self.config.reindex == "eager" and not self.policy.question.keeps_positions:
            with clock.phase("reindex"):
                self.memory.reindex()
        return compression

    def _report(
        self,
        inputs: ChunkInputs,
        encoded: int,
        compression: CompressionReport | None,
        clock: Stopwatch,
        lazy: bool,
        reindexed: bool,
    ) -> ChunkReport:
        """What the chunk cost and left behind; a lazy compaction before the prefill counts as
        compression and re-indexing."""
        progress = self.progress
        return ChunkReport(
            chunk_index=progress.chunks_seen,
            frames_seen=progress.frames_seen,
            stream_time_s=progress.stream_time_s,
            tokens=inputs.num_tokens,
            dropped=encoded - inputs.num_tokens,
            prefill_ms=clock["prefill"],
            compress_ms=clock.total("position", "guidance", "evict", "reindex"),
            guidance_ms=clock["guidance"],
            reindex_ms=(clock["position"] if lazy else 0.0) + clock["reindex"],
            evicted=sum(compression.evicted) if compression else 0,
            reindexed=reindexed,
            cache_bytes=self.memory.cache_bytes(),
            video_tokens_per_layer=self.memory.video_tokens_per_layer(),
            attention=compression.attention if compression else (),
            host_bytes=self.host_bytes(),
        )

    def check_standing(self) -> tuple[list[WatchCheck], list[AnswerUpdate]]:
        """Ask each standing question of the memory as it is now, read-only like any question, and
        write a short answer for each one that fired. Alerts are not remembered as the last turn, so
        watching never changes what the memory keeps."""
        reader = self.reader
        checks = self.standing.check(reader.first_token_logprobs, self.stream_time_s, self.lm.device)
        answer = self.standing.answer_tokens
        return checks, [reader.ask(check.question, answer, remember=False) for check in checks if check.fired]

    def guidance_attention(self) -> list[torch.Tensor | None] | None:
        """W per layer over its slots after the prefix, for the layers the policy probes; None when
        the policy needs no probe (`GuidanceProbe.attention`). The memory is left untouched."""
        return self.guidance.attention(self.memory, self.policy, self.reader.last_turn)

    def bound_note(self, tokens: int) -> str | None:
        """Why a next chunk of `tokens` tokens cannot go in (a bound of the policy: ReKV's host cap
        or positions); None when it can."""
        return self.question.bound_note(self.memory, tokens, self.config.chunk_frames, self.frames_seen)

    # -- reading: the `MemoryReader`'s questions (`query`: the words a question-time step reads) ----
    def ask_stream(
        self, question: str, max_new_tokens: int = MAX_NEW_TOKENS, remember: bool = True, query: str | None = None
    ) -> Iterator[AnswerUpdate]:
        """The answer from the memory as it is now, token by token (`MemoryReader.ask_stream`)."""
        return self.reader.ask_stream(question, max_new_tokens, remember, query)

    def ask(
        self, question: str, max_new_tokens: int = MAX_NEW_TOKENS, remember: bool = True, query: str | None = None
    ) -> AnswerUpdate:
        """The answer's last update: text, TTFT, TPOT, top log-probabilities (`MemoryReader.ask`)."""
        return self.reader.ask(question, max_new_tokens, remember, query)

    def first_token_logprobs(self, question: str, query: str | None = None) -> torch.Tensor:
        """The first answer token's log-probabilities (vocab,) (`MemoryReader.first_token_logprobs`)."""
        return self.reader.first_token_logprobs(question, query)

    def continuation_logprobs(
        self, question: str, continuation: list[int], query: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each continuation token's log-probability, and whether it is the greedy choice
        (`MemoryReader.continuation_logprobs`)."""
        return self.reader.continuation_logprobs(question, continuation, query)

    def host_bytes(self) -> int:
        """Host memory the policy's question-time step holds (ReKV's store of every frame)."""
        return self.question.host_bytes()

    def snapshot(self) -> MemorySnapshot:
        return self.memory.snapshot()
