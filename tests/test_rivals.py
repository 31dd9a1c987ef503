"""The rival methods against independent computations of their rules, on small hand-made tensors.

Each rule is recomputed here with plain loops (not the module's vectorised code), on inputs built
so that the rule has one clear answer: static patches for redundancy and for differential token
dropping, known value norms, known proxy attention.
"""

from __future__ import annotations

import math

import pytest
import torch

from hermes.engine.methods import PolicyError, PolicySpec, make_policy, parse_policy, policy_names
from hermes.memory.cache import ChunkMeta, HermesCache, rank_within_frame
from hermes.memory.compression import compress
from hermes.memory.config import HermesConfig
from hermes.memory.rivals.dtd import DifferentialDrop
from hermes.memory.rivals.infinipot import TarVan
from hermes.memory.rivals.sink import SinkWindow
from hermes.memory.rivals.streammem import FramePrototypes, ProxyAttention
from hermes.memory.rope import RopeSpec
from hermes.memory.scorer import LayerInputs
from hermes.memory.selection import TopK
from hermes.memory.tiers import Tier, TierMap
from tests.helpers import rope_by

HEADS, DIM, LAYERS = 2, 8, 3
TIERS = TierMap((Tier.SENSORY, Tier.WORKING, Tier.LONG_TERM))


def filled_cache(
    policy: str,
    keys: torch.Tensor,
    values: torch.Tensor,
    frames: torch.Tensor,
    budget: int,
    dtype: torch.dtype = torch.float32,
    params: dict | None = None,
):
    """A 1D-RoPE cache whose every layer holds the same video slots `keys`/`values` (heads, n, dim)
    for tokens of `frames`, at positions 0..n-1 (no prefix), under `policy` with `params`."""
    config = HermesConfig(budget=budget)
    pol = make_policy(policy, config, params)
    spec = RopeSpec(1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM)))
    cache = HermesCache(LAYERS, spec, config, pol.capacity)
    n = frames.numel()
    for layer in range(LAYERS):
        cache.update(keys[None].to(dtype), values[None].to(dtype), layer)
    cache.commit(ChunkMeta(frames=frames, positions=torch.arange(n)))
    return cache, pol, spec


# -- names and parameters ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, words",
    [
        ("lru", "unknown policy"),
        ("dtd", "needs a method before it"),
        ("+dtd", "needs a method before it"),
        ("hermes+dtd+dtd", "twice"),
        ("hermes+blur", "unknown input filter"),
    ],
)
def test_bad_names_say_why_and_list_the_choices(name, words):
    with pytest.raises(PolicyError) as e:
        make_policy(name, HermesConfig())
    assert words in str(e.value)
    assert "infinipot-v" in str(e.value) and "dtd" in str(e.value)  # the choices


@pytest.mark.parametrize(
    "params, words",
    [
        ({"infinipot-v.tar_ratio": 1.5}, "[0, 1]"),
        ({"infinipot-v.query_ratio": 0}, "(0, 1]"),
        ({"dtd.threshold": 2}, "[-1, 1]"),
        ({"sink.sinks": -1}, "0 or more"),
        ({"infinipot-v.window": 3}, "unknown parameter"),
        ({"sink.sinks": 2}, "no part of"),
    ],
)
def test_bad_parameters_fail_clearly(params, words):
    name = "sink" if "sink.sinks" in params and params["sink.sinks"] < 0 else "infinipot-v+dtd"
    with pytest.raises(PolicyError) as e:
        make_policy(name, HermesConfig(), params)
    assert words in str(e.value)


def test_names_compose_and_parameters_reach_their_dataclass():
    spec = parse_policy("Hermes+DTD")
    assert spec.name == "hermes+dtd" and (spec.method.name, [f.name for f in spec.filters]) == ("hermes", ["dtd"])
    pol = make_policy("fifo+dtd", HermesConfig(budget=7), {"dtd.threshold": 0.9})
    assert (
        pol.name == PolicySpec("fifo+dtd", {"dtd.threshold": 0.9})
        and pol.input_filter == DifferentialDrop(0.9)
        and pol.capacity == 7
    )
    assert make_policy("infinipot-v", HermesConfig(), {"infinipot-v.tar_ratio": "0.25"}).scorer == TarVan(0.25)
    assert {"sink", "infinipot-v", "streammem", "hermes+dtd", "fifo+dtd"} <= set(policy_names())
    with pytest.raises(PolicyError, match="below the budget"):
        make_policy("sink", HermesConfig(budget=4))


# -- sink --------------------------------------------------------------------------------------
def test_sink_keeps_the_first_video_tokens_of_the_stream_and_the_newest():
    n, budget, sinks = 20, 7, SinkWindow().sinks
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(HEADS, n, DIM, generator=g), torch.randn(HEADS, n, DIM, generator=g)
    cache, pol, _ = filled_cache("sink", keys, values, torch.arange(n) // 4, budget)
    compress(cache, pol)
    expected = list(range(sinks)) + list(range(n - (budget - sinks), n))
    for layer in cache.layers:
        assert layer.video_ids.tolist() == expected
    # The sinks outlive later chunks too: they are the stream's first tokens, not the oldest held.
    scores = SinkWindow(2).score(LayerInputs(0, TIERS, 5, None, stream_ids=torch.tensor([0, 1, 9, 10, 11])))
    assert torch.topk(scores, 3).indices.sort().values.tolist() == [0, 1, 4]


# -- SimpleStream -----------------------------------------------------------------------------------
def test_simplestream_keeps_every_token_of_the_newest_frames_and_nothing_else():
    # Frames of 3, 2, 3, 1 and 2 tokens (their sizes differ: a whole frame is kept however long).
    frames = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4])
    g = torch.Generator().manual_seed(4)
    keys, values = torch.randn(HEADS, 11, DIM, generator=g), torch.randn(HEADS, 11, DIM, generator=g)
    cache, pol, _ = filled_cache("simplestream", keys, values, frames, budget=100)
    assert pol.scorer.frames == 4  # SimpleStream's paper: the last 4 frames
    compress(cache, pol)  # the budget (100) does not matter: the window is counted in frames
    for layer in cache.layers:
        assert layer.video_ids.tolist() == [3, 4, 5, 6, 7, 8, 9, 10]  # frames 1 to 4, whole
        assert torch.equal(layer.keys[0, :, :8], keys[:, 3:]) and torch.equal(layer.values[0, :, :8], values[:, 3:])
    two = make_policy("simplestream", HermesConfig(budget=100), {"simplestream.frames": "2"})
    assert two.scorer.frames == 2 and two.selection.frames_kept == 2
    cache, _, _ = filled_cache("simplestream", keys, values, frames, budget=100)
    compress(cache, two)
    assert all(layer.video_ids.tolist() == [8, 9, 10] for layer in cache.layers)  # frames 3 and 4
    with pytest.raises(PolicyError, match="at least 1"):
        make_policy("simplestream", HermesConfig(), {"simplestream.frames": 0})
    assert make_policy("simplestream+dtd", HermesConfig()).input_filter == DifferentialDrop()


# -- InfiniPot-V -----------------------------------------------------------------------------------
def _infinipot_case():
    """4 frames x 4 patches. Patches 0 and 1 show the same thing in every frame (static keys);
    patches 2 and 3 change. Values have known norms."""
    frames, patches = torch.arange(16) // 4, torch.arange(16) % 4
    g = torch.Generator().manual_seed(1)
    static = torch.randn(HEADS, 2, DIM, generator=g)
    keys = torch.randn(HEADS, 16, DIM, generator=g)
    for t in range(16):
        if patches[t] < 2:
            keys[:, t] = static[:, patches[t]] * (1 + 0.1 * int(frames[t]))  # same direction
    # Per head, so that the mean over heads ranks differently from either head or their maximum.
    norms = torch.tensor(
        [[9, 8, 1, 2, 7, 6, 3, 4, 5, 10, 11, 12, 1, 1, 1, 1], [1, 2, 9, 9, 2, 2, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1]]
    ).float()
    direction = torch.randn(HEADS, 16, DIM, generator=g)
    values = direction / direction.norm(dim=-1, keepdim=True) * norms[:, :, None]
    return keys, values, frames, patches, norms.mean(0)


def _expected_infinipot(keys, values, frames, patches, keep, tar_ratio=0.5, query_ratio=0.25):
    held = sorted(set(frames.tolist()))
    per_frame = max(frames.tolist().count(f) for f in held)
    ref_frames = held[-max(1, int(len(frames) // per_frame * query_ratio)) :]
    reference = [t for t in range(len(frames)) if int(frames[t]) in ref_frames]
    older = [t for t in range(len(frames)) if t not in reference]
    tar = {}
    for t in older:
        sims = []
        for f in ref_frames:
            match = [u for u in reference if int(frames[u]) == f and int(patches[u]) == int(patches[t])]
            if match:
                u = match[0]
                per_head = [
                    float(torch.dot(keys[h, t], keys[h, u]) / (keys[h, t].norm() * keys[h, u].norm()))
                    for h in range(HEADS)
                ]
                sims.append(sum(per_head) / HEADS)
        tar[t] = -(sum(sims) / len(sims)) if sims else 0.0
    tar_budget = keep - round((1 - tar_ratio) * keep)
    picks = sorted(older, key=lambda t: tar[t], reverse=True)[: max(0, tar_budget - len(reference))]
    pinned = set(reference) | set(picks)
    van = {t: sum(float(values[h, t].norm()) for h in range(HEADS)) / HEADS for t in range(len(frames))}
    rest = sorted((t for t in range(len(frames)) if t not in pinned), key=lambda t: (van[t], t), reverse=True)
    return sorted(pinned | set(rest[: keep - len(pinned)]))


def test_infinipot_keeps_the_newest_frames_the_least_redundant_and_then_the_largest_values():
    keys, values, frames, patches, _ = _infinipot_case()
    keep = 10  # TaR: 5 slots, of which the 4 reference tokens (frame 3); VaN: 5
    cache, pol, _ = filled_cache("infinipot-v", keys, values, frames, keep)
    compress(cache, pol)
    expected = _expected_infinipot(keys, values, frames, patches, keep)
    for layer in cache.layers:
        assert layer.video_ids.tolist() == expected
    kept = set(expected)
    assert {12, 13, 14, 15} <= kept  # the reference frame, whatever its value norms (all 1)
    # The one TaR pick, the least redundant older token, is a changing patch (2 or 3), and kept.
    scorer = TarVan()
    inputs = LayerInputs(0, TIERS, 16, None, keys[None], values[None], torch.arange(16), frames, patches, keep)
    pick = int(torch.argmax(scorer.redundancy(inputs, scorer.reference(frames))[:12]))
    assert int(patches[pick]) >= 2 and pick in kept
    assert len(expected) == keep


def test_infinipot_redundancy_is_high_for_static_patches():
    keys, values, frames, patches, _ = _infinipot_case()
    inputs = LayerInputs(0, TIERS, 16, None, keys[None], values[None], torch.arange(16), frames, patches, 8)
    scorer = TarVan()
    tar = scorer.redundancy(inputs, scorer.reference(frames))
    static = [t for t in range(12) if patches[t] < 2]
    moving = [t for t in range(12) if patches[t] >= 2]
    assert all(abs(float(tar[t]) + 1.0) < 1e-5 for t in static)  # cosine 1 with the same patch
    assert max(float(tar[t]) for t in static) < min(float(tar[t]) for t in moving)


def test_infinipot_value_norm_is_the_mean_over_heads_of_each_heads_norm():
    keys, values, frames, patches, mean_norms = _infinipot_case()
    # Keep 8: the TaR share (4) is the reference frame alone, so every older slot scores its VaN.
    inputs = LayerInputs(0, TIERS, 16, None, keys[None], values[None], torch.arange(16), frames, patches, 8)
    scores = TarVan().score(inputs)
    assert torch.allclose(scores[:12], mean_norms[:12], atol=1e-5)
    assert float(scores[12:].min()) > float(scores[:12].max())  # the reference frame pinned above


def _official_tar_val(keys, values, keep, per_frame, tar_ratio=0.5, query_ratio=0.25):
    """InfiniPot-V's `process_kv_cache` (method "infinipot-v", formerly "tar_val") written out for
    one layer: `keys`, `values` (kv heads, n, dim) are the video tokens in cache order; the newest
    query frames' worth of tokens are the reference; the older tokens are cut into rows of
    `per_frame` and compared position by position; top-`keep` per head. Returns per head the
    indices kept."""
    heads, n, dim = keys.shape
    frames_held = n // per_frame
    attn_budget = round((1 - tar_ratio) * keep)
    tar_budget = keep - attn_budget
    query_frames = int(frames_held * query_ratio)
    query_length = query_frames * per_frame
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
    query = unit[:, n - query_length :].reshape(heads, query_frames, per_frame, dim)
    older = unit[:, : n - query_length].reshape(heads, -1, per_frame, dim)
    score = -(query[:, :, None] * older[:, None]).sum(-1).mean(1).reshape(heads, -1)
    kept = []
    for h in range(heads):
        tar = torch.cat([score[h].topk(tar_budget - query_length).indices, torch.arange(n - query_length, n)])
        van = values[h].norm(dim=-1)
        van[tar] = values.norm(dim=-1).max() + 1
        kept.append(sorted(van.topk(keep).indices.tolist()))
    return kept


@pytest.mark.parametrize("rope, dtype", [("1d", torch.float32), ("1d", torch.bfloat16), ("mrope", torch.float32)])
def test_infinipot_steady_state_keeps_what_the_official_code_keeps(rope, dtype):
    """A cache past its first compressions: 12 old frames partly kept (2 of 4 patches each, laid out
    so that a token's place in a row of 4 is its patch, where the official reshape and a per-patch
    comparison agree) and a new 4-frame chunk. 40 tokens are 10 frames' worth, so the reference is
    int(10 * 0.25) = 2 frames (a quarter of the 16 distinct frames would be 4, the whole TaR budget);
    TaR: 12 - 8 = 4 picks. One KV head, so per layer is per head. With 1D RoPE the cache holds the
    keys rotated to their positions and TaR compares them before RoPE (a 16-bit cache from its
    origin keys); with M-RoPE as cached."""
    per_frame, keep = 4, 24
    old_frames = torch.arange(24) // 2
    frames = torch.cat([old_frames, 12 + torch.arange(16) // 4])
    patches = torch.arange(40) % 4
    g = torch.Generator().manual_seed(11)
    keys = torch.randn(1, 40, DIM, generator=g)
    # Some patches barely change, so that redundancy ranks the older tokens by a wide margin.
    keys[:, :32] += 2.0 * (patches[:32] < 2)[None, :, None] * keys[:, 32 + patches[:32]]
    values = torch.randn(1, 40, DIM, generator=g).to(dtype).float()
    positions = frames * per_frame + patches  # where the tokens were computed, gaps left by eviction
    if rope == "1d":
        spec = RopeSpec(1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM)))
        cached = _rope_at(keys, positions, spec)
        axes_positions = positions
    else:
        spec = RopeSpec(1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM)), (2, 1, 1))
        cached = keys
        axes_positions = torch.stack([frames, patches // 2, patches % 2])
    config = HermesConfig(budget=keep)
    pol = make_policy("infinipot-v", config)
    cache = HermesCache(LAYERS, spec, config, pol.capacity)
    for start, end in ((0, 24), (24, 40)):
        for layer in range(LAYERS):
            cache.update(cached[None, :, start:end].to(dtype), values[None, :, start:end].to(dtype), layer)
        cache.commit(ChunkMeta(frames[start:end], axes_positions[..., start:end], patches[start:end]))
    compress(cache, pol)
    [expected] = _official_tar_val(keys, values, keep, per_frame)
    for layer in cache.layers:
        assert layer.video_ids.tolist() == expected
    assert set(range(32, 40)) <= set(expected)  # the reference: frames 14 and 15
    assert len(set(expected) & set(range(32))) == 16  # the 4 TaR picks and 12 by value norm


# -- StreamMem -----------------------------------------------------------------------------------
def _rope_at(keys: torch.Tensor, positions: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Each key (..., n, dim) turned by RoPE to its own position (n,), written out."""
    return torch.stack([rope_by(keys[..., t, :], int(p), spec) for t, p in enumerate(positions)], dim=-2)


@pytest.mark.parametrize("prototype", ["weighted", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streammem_keeps_top_attention_and_one_prototype_per_frame_that_loses_tokens(dtype, prototype):
    """The prototype of a frame's evicted tokens is their saliency-weighted mean (the paper's Eq. 2,
    the default), or their plain mean with `streammem.prototype=mean`."""
    frames = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    attention = torch.tensor([0.30, 0.01, 0.02, 0.20, 0.15, 0.03, 0.10, 0.05, 0.04])
    g = torch.Generator().manual_seed(2)
    keys, values = torch.randn(HEADS, 9, DIM, generator=g), torch.randn(HEADS, 9, DIM, generator=g)
    budget = 6
    keys, values = keys.to(dtype).float(), values.to(dtype).float()  # what a 16-bit cache holds
    params = {} if prototype == "weighted" else {"streammem.prototype": prototype}
    cache, pol, spec = filled_cache("streammem", keys, values, frames, budget, dtype, params)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    assert pol.guidance(Tier.SENSORY) == "template"
    compress(cache, pol, [attention] * LAYERS)
    # By hand: the best k tokens plus a prototype per frame among the rest must fit in 6. k = 3
    # (0, 3, 4) leaves frames 0, 1 and 2 with evicted tokens: 3 + 3 = 6. Each prototype sits at
    # its frame's best evicted token: 2 (frame 0), 5 (frame 1), 6 (frame 2).
    groups = {2: [2, 1], 5: [5], 6: [6, 7, 8]}
    expected = [0, 2, 3, 4, 5, 6]
    for layer in cache.layers:
        assert layer.video_ids.tolist() == expected
        k, v = layer.keys[0], layer.values[0]
        for slot, token in enumerate(expected):
            group = groups.get(token, [token])
            a = (
                attention[group] / attention[group].sum()
                if prototype == "weighted"
                else torch.full((len(group),), 1 / len(group))
            )
            want_v = sum(a[j] * values[:, t] for j, t in enumerate(group))
            want_k = sum(a[j] * rope_by(keys[:, t], token - t, spec) for j, t in enumerate(group))
            assert torch.allclose(v[:, slot].float(), want_v, atol=atol)
            assert torch.allclose(k[:, slot].float(), want_k, atol=atol)
            if layer._k0 is not None:  # a 16-bit cache's origin key: the prototype at its own origin
                assert torch.allclose(layer._k0[0, :, slot].float(), want_k, atol=atol)


def test_streammem_weighted_and_plain_prototypes_differ_and_none_keeps_top_k():
    scores, frames = torch.tensor([0.9, 0.6, 0.3, 0.1]), torch.tensor([0, 0, 0, 0])
    plan = FramePrototypes(2).plan(scores, torch.arange(4), frames, Tier.SENSORY)
    assert plan[0].tolist() == [0, 1]  # the best token, then the frame's prototype in its best evicted slot
    (merge,) = plan[1]
    assert merge.slots.tolist() == [1, 2, 3] and torch.allclose(merge.weights, torch.tensor([0.6, 0.3, 0.1]))
    assert FramePrototypes(2, weighted=False).plan(scores, torch.arange(4), frames, Tier.SENSORY)[1][0].weights is None
    none = make_policy("streammem", HermesConfig(budget=2), {"streammem.prototype": "none"})
    assert type(none.selection) is TopK
    with pytest.raises(PolicyError, match="prototype must be one of weighted, mean, none"):
        make_policy("streammem", HermesConfig(budget=2), {"streammem.prototype": "max"})


# -- HERMES's variants (parameters, off by default) --------------------------------------------------
def _hermes_after(params: dict, attention: torch.Tensor, frames: torch.Tensor, budget: int) -> HermesCache:
    g = torch.Generator().manual_seed(5)
    n = frames.numel()
    keys, values = torch.randn(HEADS, n, DIM, generator=g), torch.randn(HEADS, n, DIM, generator=g)
    cache, pol, _ = filled_cache("hermes", keys, values, frames, budget, params=params)
    compress(cache, pol, [attention] * LAYERS)
    return cache


def test_the_newest_frame_guard_keeps_the_newest_frame_in_every_layer():
    frames = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    attention = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.01, 0.02])  # the deep layer looks away from now
    plain = _hermes_after({}, attention, frames, budget=4)
    assert 3 not in plain.kv_layers[-1].frames.tolist()  # the paper's HERMES loses the present in its deep layer
    guarded = _hermes_after({"hermes.keep_newest": True}, attention, frames, budget=4)
    for layer in guarded.kv_layers:
        assert (layer.video_ids[layer.frames[layer.video_offset :] == 3]).tolist() == [6, 7]
    assert [layer.slots for layer in guarded.kv_layers] == [layer.slots for layer in plain.kv_layers]


def test_hermes_with_frame_prototypes_keeps_one_merged_token_per_frame_and_no_summary():
    frames = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    attention = torch.tensor([0.30, 0.01, 0.02, 0.20, 0.15, 0.03, 0.10, 0.05, 0.04])
    plain = _hermes_after({}, attention, frames, budget=6)
    assert all(layer.has_summary for layer in plain.kv_layers[-1:])  # the deep tier folds into a summary
    merged = _hermes_after({"hermes.prototypes": True}, attention, frames, budget=6)
    for layer in merged.kv_layers:
        assert not layer.has_summary and layer.slots == 6
        assert set(layer.frames.tolist()) == {0, 1, 2}  # every frame that lost tokens keeps a prototype
    with pytest.raises(PolicyError, match=r"'hermes\.prototypes': takes true or false, got 'maybe'"):
        make_policy("hermes", HermesConfig(budget=6), {"hermes.prototypes": "maybe"})
    off = make_policy("hermes", HermesConfig(budget=6), {"hermes.prototypes": "false"})  # as --param gives it
    assert type(off.selection) is TopK


def test_streammem_plan_falls_back_to_top_k_when_frames_outnumber_slots():
    plan = FramePrototypes(2).plan(torch.tensor([0.5, 0.1, 0.9, 0.2]), torch.arange(4), torch.arange(4), Tier.SENSORY)
    assert plan[0].tolist() == [0, 2] and plan[1] == []
    with pytest.raises(ValueError, match="needs attention"):
        ProxyAttention().score(LayerInputs(0, TIERS, 3, None))


# -- differential token dropping --------------------------------------------------------------------
def test_dtd_drops_patches_that_match_the_previous_frame():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 16, generator=g)
    f0 = base
    f1 = base.clone()
    f1[3] = torch.randn(16, generator=g)  # patch 3 changes
    f2 = f1 * 2.0  # same directions: every patch static by cosine
    f2[0] = -f1[0]  # but patch 0 turns around
    text = torch.randn(1, 16, generator=g)
    features = torch.cat([f0, f1, f2, text])
    frames = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [2])
    visual = torch.tensor([True] * 12 + [False])
    patches = rank_within_frame(frames)
    keep, last = DifferentialDrop(0.5).select(features, frames, patches, visual)
    # By hand: frame 0 kept whole; frame 1 keeps patch 3 only; frame 2 keeps patch 0 only; text kept.
    assert (~keep).nonzero().squeeze(1).tolist() == [4, 5, 6, 9, 10, 11]
    # Independent: cosine against the same patch of the previous frame as encoded (not as kept).
    for t in range(4, 12):
        cos = torch.nn.functional.cosine_similarity(features[t], features[t - 4], dim=0)
        assert bool(keep[t]) == (float(cos) <= 0.5)
    # The next chunk compares its first frame with this chunk's last one.
    keep2, _ = DifferentialDrop(0.5).select(
        f2.clone(), torch.zeros(4, dtype=torch.long), torch.arange(4), torch.ones(4, dtype=torch.bool), last
    )
    assert not keep2.any()


def test_rank_within_frame():
    assert rank_within_frame(torch.tensor([0, 0, 0, 2, 2, 5])).tolist() == [0, 1, 2, 0, 1, 0]
    assert math.isclose(float(ChunkMeta(torch.tensor([1, 1]), torch.arange(2)).patches[1]), 1.0)
