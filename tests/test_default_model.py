"""The model served when none is named follows the device; --model and $HERMES_MODEL still win."""

from __future__ import annotations

import pytest

from hermes.models.loading import CPU_DEFAULT_MODEL, DEFAULT_MODEL, default_model, requested_model
from hermes.serving import keep_up_hint, load_model_or_fallback
from hermes.serving.model import fallback_model


def test_the_default_follows_the_device() -> None:
    assert default_model("cuda") == DEFAULT_MODEL == "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"
    assert default_model("cuda:1") == DEFAULT_MODEL
    assert default_model("cpu") == CPU_DEFAULT_MODEL == "Qwen/Qwen3.5-0.8B"


def test_model_and_the_variable_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_MODEL", raising=False)
    assert requested_model(None, "cpu") == CPU_DEFAULT_MODEL
    assert requested_model(None, "cuda") == DEFAULT_MODEL
    monkeypatch.setenv("HERMES_MODEL", "tiny-qwen")
    assert requested_model(None, "cpu") == "tiny-qwen"
    assert requested_model("tiny", "cpu") == "tiny"


def test_the_stand_in_has_the_defaults_architecture() -> None:
    assert fallback_model(CPU_DEFAULT_MODEL) == "tiny-qwen35-24"
    assert fallback_model(DEFAULT_MODEL, "cpu") == "tiny-24"  # asked for by name: its own architecture
    assert fallback_model("nobody/else", "cpu") == "tiny-qwen35-24"
    assert fallback_model("nobody/else", "cuda") == "tiny-24"


def test_offline_the_cpu_default_falls_back_to_a_toy_model_else_a_random_qwen35(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hermes.models import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm, error = load_model_or_fallback(None, device="cpu")
    assert CPU_DEFAULT_MODEL in error and lm.source == "toy2" and lm.dtype_name == "fp32"
    for alias in ("toy2", "toy"):
        monkeypatch.setitem(loading.TRAINED_ALIASES, alias, loading.TOY_MODEL_DIR.parent / "missing")
    lm, error = load_model_or_fallback(None, device="cpu")
    assert CPU_DEFAULT_MODEL in error and lm.random_weights
    assert (lm.arch, lm.num_layers, lm.kv_layers) == ("qwen3_5", 24, 6)  # Qwen3.5-0.8B's layer pattern


def test_the_hint_names_the_model_that_keeps_up() -> None:
    assert keep_up_hint(DEFAULT_MODEL, "cpu").startswith(f"{CPU_DEFAULT_MODEL} reads about 1 frame/s")
    assert CPU_DEFAULT_MODEL not in keep_up_hint(CPU_DEFAULT_MODEL, "cpu")
    assert "fewer frames per second" in keep_up_hint(DEFAULT_MODEL, "cuda")
