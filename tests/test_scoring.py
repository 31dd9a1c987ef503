"""Tiers, recency and attention scores, omega^l, and cross-layer smoothing."""

import math

import pytest
import torch

from hermes.memory.scoring import layer_score, minmax, omega, recency
from hermes.memory.smoothing import smooth
from hermes.memory.tiers import Tier, TierMap


def test_tier_partition_matches_paper_split():
    tiers = TierMap.partition(28)
    assert tiers.layers(Tier.SENSORY) == [0, 1, 2]
    assert tiers.layers(Tier.WORKING) == list(range(3, 20))
    assert tiers.layers(Tier.LONG_TERM) == list(range(20, 28))
    assert (tiers.first_middle, tiers.first_deep) == (3, 20)


@pytest.mark.parametrize("n", range(3, 40))
def test_every_tier_exists(n):
    tiers = TierMap.partition(n)
    assert len(tiers) == n
    assert all(tiers.layers(t) for t in Tier)
    # Tiers are contiguous and ordered shallow -> deep.
    assert list(tiers.tiers) == sorted(tiers.tiers, key=list(Tier).index)


def test_too_few_layers_is_an_error():
    with pytest.raises(ValueError, match="at least 3"):
        TierMap.partition(2)


def test_recency_curve():
    r = recency(11, k=20.0)
    assert r[-1].item() == pytest.approx(1.0)
    assert r[0].item() == pytest.approx(0.0, abs=1e-8)
    # Before min-max, slot i is exp(-20 (10 - i)/10): the middle slot is e^-10.
    raw_mid = math.exp(-10)
    lo = math.exp(-20)
    assert r[5].item() == pytest.approx((raw_mid - lo) / (1 - lo), rel=1e-4)
    assert torch.all(r[1:] > r[:-1])
    assert recency(1, 20.0).tolist() == [1.0]


def test_omega_at_first_and_last_middle_layer():
    tiers = TierMap.partition(28)  # middle 3..19, deep from 20
    assert omega(3, tiers) == pytest.approx(0.75)
    assert omega(19, tiers) == pytest.approx(0.75 - 0.6 * 16 / 17)


def test_attention_score_and_tier_blend():
    tiers = TierMap.partition(10)  # 1 shallow, 6 middle, 3 deep
    probs = torch.zeros(2, 3, 5)
    probs[0, :, 1] = 1.0
    probs[1, :, 3] = 1.0
    w = probs.mean(dim=(0, 1))  # W of eq. 2: averaged over heads and guidance tokens
    assert w.tolist() == pytest.approx([0, 0.5, 0, 0.5, 0])
    r = recency(5, 20.0)
    assert torch.equal(layer_score(0, tiers, r, None), r)
    assert layer_score(9, tiers, r, w).tolist() == pytest.approx(minmax(w).tolist())
    om = omega(4, tiers)
    mid = layer_score(4, tiers, r, w)
    assert mid.tolist() == pytest.approx(((1 - om) * minmax(w) + om * r).tolist())
    with pytest.raises(ValueError, match="guidance attention"):
        layer_score(9, tiers, r, None)


def test_smoothing_by_identity():
    # Layer 1 (deeper) keeps tokens 10, 11, 13; layer 0 keeps 10, 12, 13.
    ids = [torch.tensor([10, 12, 13]), torch.tensor([10, 11, 13])]
    scores = [torch.tensor([0.2, 0.4, 0.6]), torch.tensor([1.0, 0.5, 0.25])]
    out = smooth(scores, ids, [0.3, 0.4])
    assert out[1].tolist() == pytest.approx([1.0, 0.5, 0.25])  # last layer unchanged
    # Token 12 is missing deeper: it keeps only its own share.
    assert out[0].tolist() == pytest.approx([0.7 * 0.2 + 0.3 * 1.0, 0.7 * 0.4, 0.7 * 0.6 + 0.3 * 0.25])


def test_smoothing_propagates_through_layers_and_slot_mode():
    ids = [torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([1, 2])]
    scores = [torch.zeros(2), torch.zeros(2), torch.tensor([1.0, 0.0])]
    out = smooth(scores, ids, [0.5, 0.5, 0.5])
    assert out[1].tolist() == pytest.approx([0.0, 0.5])
    assert out[0].tolist() == pytest.approx([0.0, 0.25])
    by_slot = smooth(scores, ids, [0.5, 0.5, 0.5], mode="slot")
    assert by_slot[1].tolist() == pytest.approx([0.5, 0.0])
