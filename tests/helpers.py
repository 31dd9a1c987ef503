"""Helpers shared by several test files."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from hermes.engine.batch import BatchDecoder
from hermes.engine.chunk import Chunk
from hermes.engine.session import ChunkReport, StreamingSession
from hermes.memory.cache import HermesCache
from hermes.memory.rope import RopeSpec
from hermes.runtime.settings import StreamSettings
from hermes.serving.live import LiveStream

T = TypeVar("T")

# Small settings for live streams in tests: the memory fills within a short clip.
SMALL = StreamSettings(budget=400, chunk_frames=2, fps=0.5)


def chunk_report(frames_seen: int = 0, stream_time_s: float = 0.0, **numbers: float) -> ChunkReport:
    """A chunk's report with the given numbers (`cache_bytes`, `prefill_ms`, ...), the others 0."""
    fields = {"prefill_ms": 0.0, "compress_ms": 0.0, "guidance_ms": 0.0, "reindex_ms": 0.0, "cache_bytes": 0}
    fields |= {"chunk_index": 0, "tokens": 0, "evicted": 0, "reindexed": False, "video_tokens_per_layer": []}
    return ChunkReport(frames_seen=frames_seen, stream_time_s=stream_time_s, **(fields | numbers))


def rope_by(keys: torch.Tensor, delta: int, spec: RopeSpec) -> torch.Tensor:
    """RoPE by `delta` positions, written out: pairs (x_i, x_{i+d/2}) turned by delta * theta_i."""
    half = keys.shape[-1] // 2
    angle = delta * spec.inv_freq.double()
    cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
    x1, x2 = keys[..., :half], keys[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def random_chunk(index: int, n: int = 2, size: int = 64, seed: int | None = None) -> Chunk:
    """Chunk `index` of a stream of `n`-frame chunks, one frame a second: random `size` x `size`
    frames drawn from `seed` (by default the index, so that every chunk differs)."""
    pixels = np.random.default_rng(index if seed is None else seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    ids = np.arange(index * n, (index + 1) * n)
    return Chunk(pixels, ids.astype(float), ids, ids, chunk_index=index)


def memory_state(memory: HermesCache) -> tuple:
    """Everything a memory holds, copied: keys and values (of the memory, no scratch tokens), each
    layer's bookkeeping, a hybrid model's linear-attention states (the working ones, which the model
    reads next), its storage, its next position and the tokens it has seen."""
    assert memory.get_seq_length() == memory.prefix_len + memory.slots, "scratch tokens left in the memory"
    kv = [(k.clone(), v.clone()) for k, v in memory.kv()]
    books = [
        (layer.stream_ids.clone(), layer.frames.clone(), layer.positions.clone(), layer.scores.clone())
        for layer in memory.kv_layers
    ]
    states = [t.clone() for layer in memory.state_layers for t in layer.states().values()]
    return kv, books, states, memory.storage(), memory.next_position, memory.tokens_seen


def assert_same_memory(before: tuple, memory: HermesCache, storage: bool = True) -> None:
    """`memory` holds bit for bit what `before` (a `memory_state`) recorded; `storage=False` for
    another memory of the same stream, whose buffers are its own."""
    after = memory_state(memory)
    assert len(before[0]) == len(after[0])
    for (k0, v0), (k1, v1) in zip(before[0], after[0], strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    for b0, b1 in zip(before[1], after[1], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(b0[:3], b1[:3], strict=True))
        assert torch.equal(b0[3].isnan(), b1[3].isnan()) and torch.equal(b0[3].nan_to_num(), b1[3].nan_to_num())
    assert len(before[2]) == len(after[2]) and all(torch.equal(x, y) for x, y in zip(before[2], after[2], strict=True))
    assert before[4:] == after[4:]
    if storage:
        assert before[3] == after[3]


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, step: float = 0.05) -> T:
    """The first truthy value of `predicate()` within `timeout` seconds; its last value otherwise."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


@contextlib.contextmanager
def hold_answers(session: StreamingSession) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold `session`'s answers after their first token until the gate opens (at the latest on exit).

    Answers decode in the model thread's batch: once a row of `session` has its first token (and
    the viewer has it), the thread waits before the batch's next step."""
    first, gate = threading.Event(), threading.Event()
    real = BatchDecoder.step

    def held(decoder: BatchDecoder):
        if not first.is_set() and any(row.session is session and row.tokens for row in decoder.rows):
            first.set()
            gate.wait(10)
        return real(decoder)

    BatchDecoder.step = held
    try:
        yield first, gate
    finally:
        gate.set()  # never leave the model thread waiting, even when the test fails
        BatchDecoder.step = real


def generate_on_cache(
    lm, cache: HermesCache, question: str, max_new_tokens: int, name: str = "cache"
) -> tuple[list[int], torch.Tensor]:
    """Greedy answer through transformers' own `generate` on `cache`, passed as `name` (`cache` or
    its pre-rename name `past_key_values`): the answer's token ids, and the first token's log-probabilities."""
    ids = lm.question_ids(question)
    n = ids.shape[-1]
    with cache.scratch(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # `past_key_values` is the pre-rename name of `cache`
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones(1, cache.get_seq_length() + n, dtype=torch.long),
            position_ids=cache.position_ids(n),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            **{name: cache},
        )
    return out.sequences[0, n:].tolist(), torch.log_softmax(out.scores[0][0].float(), dim=-1)


def streamed(stream: LiveStream, clip: Path, **kw) -> LiveStream:
    """Stream a whole clip as fast as the model goes and wait for the last chunk."""
    stream.start_file(clip, speed="max", **kw)
    assert wait_for(lambda: stream.status().state == "finished" and not stream.status().queued_chunks, 60)
    assert stream.worker.wait_idle(stream.key, 60)
    return stream


def qwen_frames(n: int, seed: int = 0, size: int = 224) -> np.ndarray:
    """`n` random frames. At 224 x 224 a frame pair fills the tiny Qwen processors' minimum pixel
    volume, so neither a 2-frame chunk nor a whole short video is resized: both see the frames at
    the same resolution."""
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def whole_video_inputs(lm, frames: np.ndarray, question: str, fps: float):
    """What the model's own processor makes of the whole video at once, between the memory's text
    prefix and the question: the reference that a stream of chunks is held to."""
    prefix, asked = lm.prefix_ids()[0], lm.question_ids(question)[0]
    text = (
        lm.tokenizer.decode(prefix, skip_special_tokens=False)
        + lm.processor.video_token
        + lm.tokenizer.decode(asked, skip_special_tokens=False)
    )
    meta = {"fps": fps, "total_num_frames": len(frames), "frames_indices": list(range(len(frames)))}
    return lm.processor(
        text=text, videos=[list(frames)], video_metadata=[meta], do_sample_frames=False, return_tensors="pt"
    )


def pair_chunks(frames: np.ndarray, fps: float = 1.0) -> list[Chunk]:
    """`frames` as chunks of one frame pair each (Qwen merges frame pairs), at `fps`."""
    out = []
    for i in range(0, len(frames), 2):
        idx = np.arange(i, i + 2)
        out.append(Chunk(frames[i : i + 2], idx / fps, idx, idx, chunk_index=i // 2))
    return out
