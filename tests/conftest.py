"""Shared fixtures: offline hub, a per-session model cache, tiny models and ffmpeg clips.

The tiny models load in fp32 whatever this processor's `--dtype auto` would pick (bf16 with AMX or
AVX-512 BF16): the tests that compare numbers are about behaviour, and pin the precision they need."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

# Before anything imports huggingface_hub: tests never touch the network, and tiny models are
# built once per test session into a temporary cache that CLI subprocesses inherit too.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HERMES_CACHE"] = tempfile.mkdtemp(prefix="hermes-test-cache-")

from hermes.video.clips import make_clip
from tests.corpus import make_corpus

# torch's CPU threads as the session starts. A command run in-process with --threads sets them for the
# whole process; each test gets them back (a sum split over other threads rounds otherwise).
SESSION_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _session_threads():
    yield
    if torch.get_num_threads() != SESSION_THREADS:
        torch.set_num_threads(SESSION_THREADS)


@pytest.fixture(scope="session")
def llava_lm():
    """The tiny LLaVA-OneVision (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny", dtype="fp32")


@pytest.fixture(scope="session")
def qwen_lm():
    """The tiny Qwen2.5-VL (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny-qwen", dtype="fp32")


@pytest.fixture(scope="session")
def qwen3_lm():
    """The tiny Qwen3-VL (4 layers), loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny-qwen3", dtype="fp32")


@pytest.fixture(scope="session")
def qwen35_lm():
    """The tiny Qwen3.5 (12 layers: 9 linear attention, 3 full attention), through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm("tiny-qwen35", dtype="fp32")


@pytest.fixture(scope="session", params=["llava", "qwen", "qwen3", "qwen35"])
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


@pytest.fixture(scope="session")
def eval_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clips in the layouts the benchmarks use (MVBench's original: whole videos and a folder of
    frames at 3 fps), plus a file that is not a video."""
    from tests.eval_helpers import frames_folder

    root = tmp_path_factory.mktemp("videos")
    make_clip(root / "videos" / "long.mp4", 12.0, fps=4, size=(96, 64), needles={5.0: "red"})
    make_clip(root / "Ego4D" / "clips" / "ego.mp4", 8.0, fps=4, size=(96, 64))
    make_clip(root / "vmme001.mp4", 8.0, fps=4, size=(96, 64))
    make_clip(root / "star" / "Charades_v1_480" / "ch1.mp4", 8.0, fps=4, size=(96, 64))
    make_clip(root / "perception" / "videos" / "ch1.mp4", 3.0, fps=4, size=(96, 64))
    frames_folder(root / "tvqa" / "frames_fps3_hq" / "s01e01_clip", 15)  # 5 s at 3 fps
    (root / "broken.mp4").write_bytes(b"this is not a video file at all" * 50)
    return root


@pytest.fixture(scope="session")
def lmms_layout_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MVBench's videos as lmms-eval keeps them ($HF_HOME/mvbench_video): the bounded tasks' clips
    already cut (3 s, where the original clips stream 4 and 2 s), and Video-MME's under videomme/data."""
    root = tmp_path_factory.mktemp("hf")
    make_clip(root / "mvbench_video" / "star" / "Charades_segment" / "ch1.mp4", 3.0, fps=4, size=(96, 64))
    make_clip(root / "mvbench_video" / "perception" / "videos" / "ch1.mp4", 3.0, fps=4, size=(96, 64))
    make_clip(root / "mvbench_video" / "tvqa" / "video_fps3_hq_segment" / "s01e01_clip.mp4", 3.0, fps=3, size=(96, 64))
    make_clip(root / "videomme" / "data" / "vmme001.mp4", 6.0, fps=4, size=(96, 64))
    return root


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the browser tests (tests/browsers.py)."""
    from tests.browsers import chromium

    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def camera_browser():
    """A headless Chromium whose webcam is Chromium's fake capture device (tests/browsers.py)."""
    from tests.browsers import CAMERA_ARGS, chromium

    with chromium(CAMERA_ARGS) as b:
        yield b
