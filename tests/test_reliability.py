"""Awkward videos through the whole engine path (CLI): empty, tiny, short and huge ones, and every
kind of file that browsers, phones and cameras write (tests/corpus.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.cli.main import main
from hermes.video.clips import make_clip
from tests.corpus import (
    DAMAGED_AFTER_S,
    DAMAGED_TO_THE_END,
    REFUSED,
    SCRAMBLED_LIGHT,
    STREAMED,
    Clip,
    ffmpeg_frame_times,
    skipped_notes,
)

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


@pytest.mark.parametrize("clip", STREAMED, ids=lambda clip: clip.name)
def test_every_kind_of_video_streams(corpus, capsys, clip: Clip):
    assert main(["stream", str(corpus[clip.name]), "--model", "tiny", *SMALL]) == 0
    chunks = [e for e in _events(capsys) if e["event"] == "chunk"]
    assert chunks[-1]["frames_seen"] == clip.frames


@pytest.mark.parametrize("clip", REFUSED, ids=lambda clip: clip.name)
def test_files_without_a_readable_video_are_refused_with_the_reason(corpus, capsys, clip: Clip):
    assert main(["stream", str(corpus[clip.name]), "--model", "tiny", *SMALL]) == 2
    out = capsys.readouterr()
    assert out.err == f"error: Cannot read video '{clip.name}': {clip.refused}\n"
    assert [json.loads(line)["event"] for line in out.out.splitlines()] == ["error"]


def test_a_file_that_decodes_no_further_streams_to_its_last_good_frame_and_is_asked_about(corpus, capsys, llava_lm):
    # The question's time is past the damage: it is answered from what was read. (`llava_lm` has the
    # tiny model built already, so that stderr holds only what the command says.)
    name = DAMAGED_TO_THE_END.name
    args = ["stream", str(corpus[name]), "--model", "tiny", "--ask", "6:What is there?", *SMALL]
    assert main(args) == 2
    out = capsys.readouterr()
    events = [json.loads(line) for line in out.out.splitlines()]
    good = DAMAGED_AFTER_S + 1  # frames at 0, 1, ... 4 s
    assert [e for e in events if e["event"] == "chunk"][-1]["frames_seen"] == good
    [answer] = [e for e in events if e["event"] == "answer"]
    assert answer["frames_seen"] == good and answer["frames_in_memory"] == good
    sentence = (
        f"'{name}' is damaged after 0:0{DAMAGED_AFTER_S}: the stream stopped at the last good frame, "
        "and what was read stays in memory."
    )
    assert events[-1] == {"event": "error", "message": sentence}
    assert out.err == f"error: {sentence}\n"


def test_4kb_of_damaged_bytes_skip_what_ffmpeg_skips_and_the_stream_goes_to_the_end(corpus, capsys, llava_lm):
    # Every frame (4 fps): the frames streamed are those FFmpeg's own decoder decodes.
    path = corpus[SCRAMBLED_LIGHT.name]
    args = ["stream", str(path), "--model", "tiny", "--fps", "4", "--chunk-frames", "8", "--budget", "300", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    events = [json.loads(line) for line in out.out.splitlines()]
    decoded = len(ffmpeg_frame_times(path))
    assert [e for e in events if e["event"] == "chunk"][-1]["frames_seen"] == decoded < 32
    skips = [e for e in events if e["event"] == "skipped"]
    assert [e["note"] for e in skips] == skipped_notes(path, [i / 4 for i in range(32)])
    assert sum(e["frames"] for e in skips) == 32 - decoded and out.err == ""


def test_a_bad_file_is_one_error_line_on_stderr(tmp_path):
    # A subprocess, so that whatever decord writes from C++ to descriptor 2 would show.
    notes = tmp_path / "notes.mp4"
    notes.write_text("this is not a video\n" * 50)
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "hermes", "stream", str(notes), "--model", "tiny"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "error: Cannot read video 'notes.mp4': not a video file, or its header is damaged\n"
