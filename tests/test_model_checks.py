"""A checkpoint whose config cannot describe its weights is refused in one line, before it computes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hermes.models.loading import ModelLoadError, load_video_lm
from hermes.models.tiny import ensure_tiny


def _edited(tmp_path: Path, arch: str, edit) -> Path:
    """A copy of the tiny `arch` checkpoint whose text config `edit` changes."""
    out = tmp_path / arch
    shutil.copytree(ensure_tiny(arch, 4 if arch != "qwen3_5" else 12), out)
    config = json.loads((out / "config.json").read_text())
    edit(config["text_config"])
    (out / "config.json").write_text(json.dumps(config))
    return out


def _layers(n: int):
    def edit(c: dict) -> None:
        c["num_hidden_layers"] = n
        c.pop("layer_types", None)  # left to the config's default for n layers

    return edit


@pytest.mark.parametrize(("layers", "says"), [(3, "does not build"), (6, "no weights for layers")])
def test_a_layer_count_that_disagrees_with_the_weights_is_refused(tmp_path, layers, says):
    path = _edited(tmp_path, "llava_onevision", _layers(layers))
    with pytest.raises(ModelLoadError, match=says) as err:
        load_video_lm(str(path), dtype="fp32")
    assert "\n" not in str(err.value) and "layer count disagrees" in str(err.value)


def test_a_config_its_own_class_refuses_is_one_line(tmp_path):
    path = _edited(tmp_path, "llava_onevision", lambda c: c.update(num_hidden_layers=6))  # 4 layer kinds
    with pytest.raises(ModelLoadError, match=r"its config is invalid: .*num_hidden_layers") as err:
        load_video_lm(str(path), dtype="fp32")
    assert "\n" not in str(err.value)


def test_a_rotary_that_turns_no_channel_is_refused(tmp_path):
    def no_rotary(c: dict) -> None:
        c["rope_parameters"]["partial_rotary_factor"] = 0.0

    path = _edited(tmp_path, "qwen3_5", no_rotary)
    with pytest.raises(ModelLoadError, match="its rotary turns 0 channels of a") as err:
        load_video_lm(str(path), dtype="fp32")
    assert "\n" not in str(err.value)


def test_the_tiny_checkpoints_pass_the_checks():
    lm = load_video_lm("tiny-qwen35", dtype="fp32")
    assert 0 < lm.rope_spec().rotary_dim < lm.head_dim  # Qwen3.5's partial rotary
    assert not any(p.requires_grad for p in lm.model.parameters())
