"""The CLI end to end: an ffmpeg clip streamed with --json, and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hermes.cli.main import main


@pytest.mark.parametrize("model", ["tiny", "tiny-qwen"])
def test_stream_json_end_to_end(model, clips):
    cmd = [
        sys.executable,
        "-m",
        "hermes",
        "stream",
        str(clips["short"]),
        "--model",
        model,
        "--json",
        "--ask",
        "2:What is happening?",
        "--ask",
        "6:What colour was the flash?",
        "--chunk-frames",
        "4",
        "--fps",
        "1",
        "--budget",
        "300",
        "--max-new-tokens",
        "4",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    chunks = [e for e in events if e["event"] == "chunk"]
    answers = [e for e in events if e["event"] == "answer"]
    assert [a["question"] for a in answers] == ["What is happening?", "What colour was the flash?"]
    # Questions are answered once the stream reaches them: frames at 0, 1, 2 s, then up to 6 s.
    assert [a["frames_seen"] for a in answers] == [3, 7]
    assert all(a["ttft_ms"] > 0 and len(a["top_logprobs"]) == 5 for a in answers)
    assert chunks[-1]["frames_seen"] == 8  # 8 s at 1 fps
    for c in chunks:
        assert set(c) >= {"frames_seen", "video_tokens_per_layer", "cache_bytes", "prefill_ms", "compress_ms"}
        assert c["guidance_ms"] <= c["compress_ms"] and c["reindex_ms"] <= c["compress_ms"]
        assert isinstance(c["reindexed"], bool)
    assert max(max(c["video_tokens_per_layer"]) for c in chunks) <= 301
    assert chunks[-1]["video_tokens_per_layer"][-1] == 300  # evicted down to the budget


def test_readable_transcript(clips, capsys):
    assert (
        main(
            [
                "stream",
                str(clips["short"]),
                "--model",
                "tiny",
                "--ask",
                "3:Describe it",
                "--chunk-frames",
                "4",
                "--fps",
                "1",
                "--budget",
                "300",
                "--max-new-tokens",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Q: Describe it" in out and "TTFT" in out and "frames in memory" in out


def _expect_error(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and fragment in err
    assert "Traceback" not in err


def test_corrupt_and_fake_videos(tmp_path, clips, capsys):
    corrupt = tmp_path / "corrupt.mp4"
    data = clips["short"].read_bytes()
    corrupt.write_bytes(data[:64] + b"\x00garbage" * 500)
    _expect_error(capsys, ["stream", str(corrupt), "--model", "tiny"], "corrupt.mp4")
    fake = tmp_path / "notes.mp4"
    fake.write_text("this is not a video\n" * 20)
    _expect_error(capsys, ["stream", str(fake), "--model", "tiny"], "notes.mp4")
    _expect_error(capsys, ["stream", str(tmp_path / "missing.mp4"), "--model", "tiny"], "missing.mp4")


def test_unknown_model_offline(clips, capsys):
    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model"], "HF_HUB_OFFLINE")


def test_empty_question_and_bad_ask(clips, capsys):
    args = ["stream", str(clips["short"]), "--model", "tiny", "--chunk-frames", "4", "--fps", "1", "--budget", "300"]
    _expect_error(capsys, [*args, "--ask", "2:   "], "question is empty")
    _expect_error(capsys, [*args, "--ask", "soon:What?"], "SECONDS:QUESTION")


def test_bad_memory_options_fail_before_the_model_loads(clips, capsys):
    # --fps 0 is refused (it used to fall back to the model's rate), and before the model would load.
    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model", "--fps", "0"], "fps")
    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model", "--budget", "0"], "budget")
