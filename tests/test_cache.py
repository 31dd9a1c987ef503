"""The HERMES memory on plain tensors: eviction, summary, re-indexing and the baselines."""

import pytest
import torch

from hermes.engine.methods import make_policy
from hermes.memory.cache import SUMMARY_ID, ChunkMeta, HermesCache
from hermes.memory.compression import compress
from hermes.memory.config import HermesConfig
from hermes.memory.rope import RopeSpec, dense_rank, rotate_keys
from hermes.memory.scorer import LayerInputs
from hermes.memory.selection import top_k
from hermes.memory.tiers import Tier

LAYERS, HEADS, HEAD_DIM, PREFIX = 6, 2, 16, 5


class Stream:
    """Feeds random chunks into a memory and remembers every token's original key and value."""

    def __init__(self, config: HermesConfig, policy: str = "hermes", axes: int = 1, seed: int = 0, dtype=torch.float32):
        self.dtype = dtype
        section = (2, 3, 3) if axes == 3 else None
        self.spec = RopeSpec.from_config(HEAD_DIM, 10000.0, section)
        self.policy = make_policy(policy, config)
        self.memory = HermesCache(LAYERS, self.spec, config, self.policy.capacity)
        self.gen = torch.Generator().manual_seed(seed)
        self.keys: dict[int, torch.Tensor] = {}  # (layer, stream id) -> key at original position
        self.values: dict[int, torch.Tensor] = {}
        self.orig_pos: dict[int, torch.Tensor] = {}
        self._write(*self._kv(PREFIX))
        self.memory.commit_prefix()
        self.frame = 0

    def _write(self, ks, vs):
        for layer, k, v in zip(self.memory.layers, ks, vs, strict=True):
            layer.update(k, v)

    def _kv(self, n):
        ks = [torch.randn(1, HEADS, n, HEAD_DIM, generator=self.gen).to(self.dtype) for _ in range(LAYERS)]
        vs = [torch.randn(1, HEADS, n, HEAD_DIM, generator=self.gen).to(self.dtype) for _ in range(LAYERS)]
        return ks, vs

    def attention(self):
        return [torch.rand(self.memory.slots, generator=self.gen) for _ in range(LAYERS)]

    def chunk(self, n: int, frames: int = 2, do_compress: bool = True):
        start = self.memory.start_position(n)
        axes = self.spec.axes
        if axes == 1:
            pos = (start + torch.arange(n))[None]
        else:  # a frames x (n/frames) grid: t by frame, h/w by token within the frame
            per = n // frames
            t = torch.arange(frames).repeat_interleave(per)
            hw = torch.arange(per).repeat(frames)
            pos = start + torch.stack([t, hw // 2, hw % 2])
        meta = ChunkMeta(frames=self.frame + torch.arange(n) * frames // n, positions=pos)
        self.frame += frames
        ks, vs = self._kv(n)
        first = self.memory.tokens_seen
        for i in range(n):
            for layer in range(LAYERS):
                self.keys[layer, first + i] = ks[layer][0, :, i]
                self.values[layer, first + i] = vs[layer][0, :, i]
            self.orig_pos[first + i] = pos[:, i]
        self._write(ks, vs)
        self.memory.commit(meta)
        if not do_compress:
            return None, None
        probed = any(self.policy.guidance(t) is not None for t in self.memory.tiers.tiers)
        att = self.attention() if probed else None
        expected = None
        if self.policy.capacity is not None and self.memory.slots > self.policy.capacity:
            expected = self.expected_scores(att)
        report = compress(self.memory, self.policy, att)
        if report is not None and self.memory.config.reindex == "eager":
            self.memory.reindex()
        return report, expected

    def expected_scores(self, att):
        """Score, then smooth, straight from the policy's parts."""
        tiers, layers = self.memory.tiers, self.memory.layers
        raw = [
            self.policy.scorer.score(
                LayerInputs(i, tiers, layer.video_ids.numel(), None if att is None else att[i][layer.video_offset :])
            )
            for i, layer in enumerate(layers)
        ]
        if self.policy.smoothing is None:
            return raw
        return self.policy.smoothing(raw, [layer.video_ids for layer in layers], tiers)


def _expected_keep(scores, ids, k):
    # Independent of top_k: sort by (score, newer) descending with Python's sort.
    order = sorted(range(len(ids)), key=lambda i: (float(scores[i]), int(ids[i])), reverse=True)
    return sorted(int(ids[i]) for i in order[:k])


def test_top_k_ties_go_to_newer_and_stream_order():
    kept = top_k(torch.tensor([0.5, 0.9, 0.5, 0.5, 0.1]), torch.arange(5), 3)
    assert kept.tolist() == [1, 2, 3]


@pytest.mark.parametrize("summary", ["deep", "all", "none"])
def test_eviction_sizes_order_and_topk(summary):
    budget = 12
    s = Stream(HermesConfig(budget=budget, summary=summary))
    capacity = s.policy.capacity
    assert capacity == budget + (0 if summary == "none" else 1)
    for step in range(9):
        before = [layer.video_ids.clone() for layer in s.memory.layers]
        _, expected = s.chunk(7)
        lengths = {layer.keys.shape[-2] for layer in s.memory.layers}
        if expected is None:
            continue
        assert lengths == {PREFIX + capacity}, f"step {step}"
        assert {layer.values.shape[-2] for layer in s.memory.layers} == {PREFIX + capacity}
        for i, layer in enumerate(s.memory.layers):
            ids = layer.video_ids
            assert torch.all(ids[1:] > ids[:-1]), "kept tokens must stay in stream order"
            with_summary = s.policy.selection.summarises(s.memory.tiers[i])
            assert layer.has_summary == with_summary
            k = capacity - (1 if with_summary else 0)
            pre_ids = torch.cat([before[i], torch.arange(s.memory.tokens_seen - 7, s.memory.tokens_seen)])
            assert ids.tolist() == _expected_keep(expected[i], pre_ids, k)
    assert s.memory.video_tokens_per_layer()[-1] == budget


def test_layers_keep_different_tokens_and_smoothing_changes_choice():
    s = Stream(HermesConfig(budget=10))
    for _ in range(6):
        s.chunk(6)
    sets = [tuple(layer.video_ids.tolist()) for layer in s.memory.layers]
    assert len(set(sets)) > 1  # hierarchical: not one shared window
    # Shallow layer 0 (recency, weakly smoothed) keeps mostly the newest tokens.
    newest = set(range(s.memory.tokens_seen - 11, s.memory.tokens_seen))
    assert len(set(sets[0]) & newest) >= 8


def test_summary_is_running_mean_of_everything_evicted():
    s = Stream(HermesConfig(budget=8))  # lazy, no position limit: positions never move
    deep = s.memory.tiers.layers(Tier.LONG_TERM)
    compressions = 0
    while compressions < 2:
        report, _ = s.chunk(6)
        compressions += report is not None
    p = s.memory.prefix_len
    for layer_idx in deep:
        layer = s.memory.layers[layer_idx]
        assert int(layer.stream_ids[0]) == SUMMARY_ID
        evicted = sorted(set(range(s.memory.tokens_seen)) - set(layer.video_ids.tolist()))
        assert layer.summary_count == len(evicted)
        v_mean = torch.stack([s.values[layer_idx, t] for t in evicted]).mean(0)
        torch.testing.assert_close(layer.values[0, :, p], v_mean, atol=1e-5, rtol=1e-5)
        # Keys: each rotated from its own position to the summary's position, then averaged.
        rotated = [
            rotate_keys(s.keys[layer_idx, t][:, None, :], (p - s.orig_pos[t])[:, None], s.spec)[:, 0] for t in evicted
        ]
        torch.testing.assert_close(layer.keys[0, :, p], torch.stack(rotated).mean(0), atol=1e-5, rtol=1e-5)
        assert layer.positions[:, 0].tolist() == [p]
    # Layers without a summary fold nothing.
    assert all(s.memory.layers[i].summary_count == 0 for i in range(LAYERS) if i not in deep)


def test_eager_reindex_contiguous_and_keys_rotated():
    s = Stream(HermesConfig(budget=9, reindex="eager"))
    for _ in range(5):
        s.chunk(5)
    p = s.memory.prefix_len
    for li, layer in enumerate(s.memory.layers):
        assert layer.positions[0].tolist() == list(range(p, p + s.memory.slots))
        off = layer.video_offset
        for j, t in enumerate(layer.video_ids.tolist()):
            new = layer.positions[:, off + j]
            expected = rotate_keys(s.keys[li, t][:, None, :], (new - s.orig_pos[t])[:, None], s.spec)[:, 0]
            torch.testing.assert_close(layer.keys[0, :, p + off + j], expected, atol=1e-5, rtol=1e-5)
    assert s.memory.next_position == p + s.memory.slots


def test_lazy_reindex_waits_for_the_limit():
    cfg = HermesConfig(budget=9, reindex="lazy", max_positions=80, position_margin=10)
    s = Stream(cfg)
    p = s.memory.prefix_len
    while s.memory.next_position + 5 + cfg.position_margin <= 80:
        s.chunk(5)
        assert s.memory.compactions == 0
        for layer in s.memory.layers:
            # Untouched: every video token still sits at its original position.
            original = [int(s.orig_pos[t][0]) for t in layer.video_ids.tolist()]
            assert layer.positions[0, layer.video_offset :].tolist() == original
    assert s.memory.tokens_seen > 40  # evictions left gaps and positions ran far past the budget
    start = s.memory.start_position(5)
    assert s.memory.compactions == 1
    for layer in s.memory.layers:
        assert layer.positions[0].tolist() == list(range(p, p + s.memory.slots))
    assert start == p + s.memory.slots


def test_mrope_compaction_is_per_axis():
    s = Stream(HermesConfig(budget=8, reindex="eager"), axes=3)
    for _ in range(4):
        s.chunk(8, frames=2)
    p = s.memory.prefix_len
    for layer in s.memory.layers:
        off = layer.video_offset
        ids = layer.video_ids.tolist()
        original = torch.stack([s.orig_pos[t] for t in ids], dim=1)
        for axis in range(3):
            expected = p + off + dense_rank(original[axis])
            assert layer.positions[axis, off:].tolist() == expected.tolist()
        # Two frames per chunk: many tokens share a temporal coordinate, so the t axis is not
        # simply the slot index as a 1D compaction would make it.
        assert len(set(layer.positions[0, off:].tolist())) < len(ids)


def test_fifo_keeps_exactly_the_newest():
    budget = 10
    s = Stream(HermesConfig(budget=budget), policy="fifo")
    for _ in range(7):
        s.chunk(4)
        seen = s.memory.tokens_seen
        for layer in s.memory.layers:
            assert layer.video_ids.tolist() == list(range(max(0, seen - budget), seen))
            assert not layer.has_summary


def test_full_never_evicts():
    s = Stream(HermesConfig(budget=4), policy="full")
    for _ in range(5):
        report, _ = s.chunk(6)
        assert report is None
    assert s.memory.video_tokens_per_layer() == [30] * LAYERS


def test_unknown_policy_and_snapshot():
    with pytest.raises(ValueError, match="hermes, fifo, full"):
        make_policy("lru", HermesConfig())
    s = Stream(HermesConfig(budget=6))
    for _ in range(3):
        s.chunk(4)
    snap = s.memory.snapshot()
    assert len(snap.layers) == LAYERS
    deep = snap.layers[-1]
    assert deep.tier is Tier.LONG_TERM
    assert deep.stream_ids[0] == SUMMARY_ID and deep.frames[0] == -1
    assert deep.positions.shape == (1, 7)
    assert snap.cache_bytes == s.memory.cache_bytes()
    assert snap.frames_in_memory() == len({f for layer in snap.layers for f in layer.frames.tolist() if f >= 0})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reset_empties_the_memory_and_keeps_its_storage(dtype):
    """transformers' `reset` zeroes a cache's values and keeps its objects: so does the memory's
    (origin keys included, in 16 bits)."""
    s = Stream(HermesConfig(budget=6), dtype=dtype)
    for _ in range(3):
        s.chunk(4)
    storage = s.memory.storage()
    s.memory.reset()
    assert s.memory.storage() == storage  # the same tensors, not new ones
    assert s.memory.get_seq_length() == 0 and s.memory.slots == 0 and s.memory.tokens_seen == 0
    assert all(bool((t == 0).all()) for layer in s.memory.layers for t in layer._buffers())
    s._write(*s._kv(PREFIX))  # a new stream fills the same storage
    s.memory.commit_prefix()
    s.chunk(4)
    assert s.memory.storage() == storage and s.memory.prefix_len == PREFIX and s.memory.slots == 4
