"""Shared fixtures: offline hub, a per-session model cache, tiny models and ffmpeg clips."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before anything imports huggingface_hub: tests never touch the network, and tiny models are
# built once per test session into a temporary cache that CLI subprocesses inherit too.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HERMES_CACHE"] = tempfile.mkdtemp(prefix="hermes-test-cache-")

from hermes.video.clips import make_clip
from tests.corpus import make_corpus


@pytest.fixture(scope="session")
def llava_lm():
    """The tiny LLaVA-OneVision (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny")


@pytest.fixture(scope="session")
def qwen_lm():
    """The tiny Qwen2.5-VL (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny-qwen")


@pytest.fixture(scope="session")
def qwen3_lm():
    """The tiny Qwen3-VL (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny-qwen3")


@pytest.fixture(scope="session", params=["llava", "qwen", "qwen3"])
def lm(request):
    """Each tiny architecture in turn."""
    return request.getfixturevalue(f"{request.param}_lm")


@pytest.fixture(scope="session")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small synthetic clips: 'short' (8 s, 4 fps, 160x120, a red needle at 5 s)."""
    root = tmp_path_factory.mktemp("clips")
    return {"short": make_clip(root / "short.mp4", 8.0, fps=4, size=(160, 120), needles={5.0: "red"})}


@pytest.fixture
def worker():
    """A model thread of the test's own, stopped afterwards."""
    from hermes.serving.worker import ModelWorker

    w = ModelWorker()
    yield w
    w.stop()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Videos as browsers, phones and cameras write them (tests/corpus.py), made once per session."""
    return make_corpus(tmp_path_factory.mktemp("corpus"))
