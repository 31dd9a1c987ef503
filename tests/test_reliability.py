"""Awkward videos through the whole engine path (CLI): empty, tiny, short and huge ones."""

from __future__ import annotations

import json

import pytest

from hermes.cli.main import main
from hermes.video.clips import make_clip

SMALL = ["--chunk-frames", "4", "--fps", "1", "--budget", "300", "--max-new-tokens", "2", "--json"]


def _events(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize(
    ("name", "seconds", "size", "frames"),
    [
        ("one_frame.mp4", 0.1, (160, 120), 1),  # a single frame
        ("short.mp4", 2.0, (160, 120), 2),  # shorter than one chunk
        ("huge.mp4", 2.0, (3840, 2160), 2),  # 4K: downscaled, not refused
    ],
)
@pytest.mark.parametrize("model", ["tiny", "tiny-qwen"])
def test_awkward_videos_stream_and_answer(tmp_path, capsys, name, seconds, size, frames, model):
    clip = make_clip(tmp_path / name, seconds, fps=10, size=size)
    assert main(["stream", str(clip), "--model", model, "--ask", "0:What is there?", *SMALL]) == 0
    events = _events(capsys)
    answers = [e for e in events if e["event"] == "answer"]
    assert len(answers) == 1 and answers[0]["frames_seen"] == 1
    assert [e for e in events if e["event"] == "chunk"][-1]["frames_seen"] == frames


def test_zero_frame_and_empty_files(tmp_path, capsys):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    assert main(["stream", str(empty), "--model", "tiny", *SMALL]) == 2
    assert "empty.mp4" in capsys.readouterr().err
    no_frames = make_clip(tmp_path / "no_frames.mp4", 0.0)
    assert main(["stream", str(no_frames), "--model", "tiny", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "no_frames.mp4" in err and "Traceback" not in err
