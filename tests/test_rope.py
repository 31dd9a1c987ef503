"""The rotary delta against transformers' own rotary embeddings (Qwen2 RoPE, Qwen2.5-VL M-RoPE,
Qwen3-VL interleaved M-RoPE)."""

import pytest
import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from hermes.memory.rope import RopeSpec, compact_positions, dense_rank, rotate_keys

HEADS, N = 2, 40


def _unit_keys(d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, HEADS, N, d, generator=g)
    return k / k.norm(dim=-1, keepdim=True)


def _qwen2_rotary(head_dim: int = 64):
    cfg = Qwen2Config(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2)
    return Qwen2RotaryEmbedding(cfg), RopeSpec.from_config(head_dim, cfg.rope_parameters["rope_theta"])


def _at(rotary, raw: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    cos, sin = rotary(raw, position_ids)
    _, k = apply_rotary_pos_emb(raw, raw, cos, sin)
    return k


def test_spec_matches_transformers_frequencies():
    rotary, spec = _qwen2_rotary()
    torch.testing.assert_close(spec.inv_freq, rotary.inv_freq, rtol=0, atol=0)


@pytest.mark.parametrize("max_pos", [300, 3000])
def test_rope_delta_matches_direct_rotation(max_pos):
    rotary, spec = _qwen2_rotary()
    raw = _unit_keys(64)
    g = torch.Generator().manual_seed(1)
    p_old = torch.randint(0, max_pos, (N,), generator=g)
    p_new = torch.randint(0, max_pos, (N,), generator=g)
    k_old = _at(rotary, raw, p_old[None])
    expected = _at(rotary, raw, p_new[None])
    got = rotate_keys(k_old, (p_new - p_old)[None], spec)
    # transformers' own fp32 angles carry ~ulp(max_pos) of error; at 300 that is far below 1e-5.
    tol = 1e-5 if max_pos <= 300 else 1e-4
    assert (got - expected).abs().max().item() < tol
    # A wrong sign of the delta must be caught by the same comparison.
    wrong = rotate_keys(k_old, (p_old - p_new)[None], spec)
    assert (wrong - expected).abs().max().item() > 1e-2


def test_rope_delta_bf16_cache_is_rotated_in_fp32():
    rotary, spec = _qwen2_rotary()
    raw = _unit_keys(64, seed=2)
    p_old = torch.arange(N) + 20000
    p_new = torch.arange(N) + 5
    k_old = _at(rotary, raw, p_old[None])
    expected = _at(rotary, raw, p_new[None])
    got = rotate_keys(k_old.bfloat16(), (p_new - p_old)[None], spec)
    assert got.dtype == torch.bfloat16
    # The only error left is bf16 storage (in and out): about 2 ulps of a unit-norm component.
    assert (got.float() - expected).abs().max().item() < 2e-2
    naive = k_old.bfloat16()  # an unrotated key would be far off
    assert (naive.float() - expected).abs().max().item() > 5e-2


def _moved_keys(rotary, head_dim: int, seed: int):
    """Keys computed by `rotary` at random 3-axis positions, the same keys at other random positions,
    and both sets of positions."""
    raw = _unit_keys(head_dim, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    p_old = torch.randint(0, 300, (3, N), generator=g)
    p_new = torch.randint(0, 300, (3, N), generator=g)
    return _at(rotary, raw, p_old[:, None, :]), _at(rotary, raw, p_new[:, None, :]), p_old, p_new


def test_mrope_delta_matches_transformers_sections():
    head_dim, section = 128, [16, 24, 24]
    cfg = Qwen2_5_VLTextConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": section},
    )
    rotary = Qwen2_5_VLRotaryEmbedding(cfg)
    spec = RopeSpec.from_config(head_dim, 1e6, section)
    torch.testing.assert_close(spec.inv_freq, rotary.inv_freq, rtol=0, atol=0)
    k_old, expected, p_old, p_new = _moved_keys(rotary, head_dim, seed=3)
    got = rotate_keys(k_old, p_new - p_old, spec)
    assert (got - expected).abs().max().item() < 1e-5
    # Rotating every channel by the temporal delta alone (plain RoPE) must not match.
    plain = RopeSpec.from_config(head_dim, 1e6)
    wrong = rotate_keys(k_old, (p_new - p_old)[:1], plain)
    assert (wrong - expected).abs().max().item() > 1e-2


def _qwen3_rotary(head_dim: int = 128, section=(24, 20, 20), theta: float = 5e6):
    cfg = Qwen3VLTextConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": list(section)},
    )
    return Qwen3VLTextRotaryEmbedding(cfg)


def test_interleaved_layout_is_qwen3s():
    spec = RopeSpec.from_config(128, 5e6, (24, 20, 20), interleaved=True)
    axes = spec.channel_axes()
    assert axes[:9].tolist() == [0, 1, 2] * 3 and axes[57:].tolist() == [0, 1, 2, 0, 0, 0, 0]
    assert [int((axes == a).sum()) for a in range(3)] == [24, 20, 20]
    # The contiguous layout of the same sections is another map; both are recognised from the map.
    contiguous = RopeSpec.from_config(128, 5e6, (24, 20, 20))
    assert not torch.equal(contiguous.channel_axes(), axes)
    assert RopeSpec.from_channel_axes(spec.inv_freq, axes.tolist()).interleaved
    assert not RopeSpec.from_channel_axes(spec.inv_freq, contiguous.channel_axes().tolist()).interleaved
    assert RopeSpec.from_channel_axes(spec.inv_freq, [0] * 64).axes == 1
    with pytest.raises(ValueError, match="unsupported M-RoPE layout"):
        RopeSpec.from_channel_axes(spec.inv_freq, [2, 1, 0] * 21 + [0])
    with pytest.raises(ValueError, match="do not fit"):
        RopeSpec.from_config(16, 1e6, (2, 3, 3), interleaved=True)  # w would need channels 2, 5, 8 of 0-7


def test_interleaved_mrope_delta_matches_transformers_qwen3():
    head_dim, section = 128, (24, 20, 20)
    rotary = _qwen3_rotary(head_dim, section)
    spec = RopeSpec.from_config(head_dim, 5e6, section, interleaved=True)
    torch.testing.assert_close(spec.inv_freq, rotary.inv_freq, rtol=0, atol=0)
    k_old, expected, p_old, p_new = _moved_keys(rotary, head_dim, seed=5)
    got = rotate_keys(k_old, p_new - p_old, spec)
    assert (got - expected).abs().max().item() < 1e-5
    # Controls that must fail: the h and w deltas swapped, and the contiguous (Qwen2.5-VL) layout.
    swapped = rotate_keys(k_old, (p_new - p_old)[[0, 2, 1]], spec)
    assert (swapped - expected).abs().max().item() > 1e-2
    contiguous = RopeSpec.from_config(head_dim, 5e6, section)
    assert (rotate_keys(k_old, p_new - p_old, contiguous) - expected).abs().max().item() > 1e-2


def test_dense_rank_and_per_axis_compaction():
    assert dense_rank(torch.tensor([7, 3, 3, 9])).tolist() == [1, 0, 0, 2]
    pos = torch.tensor([[10, 10, 14, 14], [3, 5, 3, 5], [8, 9, 8, 9]])
    new = compact_positions(pos, base=4)
    assert new.tolist() == [[4, 4, 5, 5], [4, 5, 4, 5], [4, 5, 4, 5]]
