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


def test_stream_a_folder_of_frames(tmp_path):
    """`hermes stream FOLDER`: a folder of PNGs streams like a video, one image per frame at --fps by
    default, or recorded at --folder-fps; a folder without images is one clear line."""
    import numpy as np
    from PIL import Image

    folder = tmp_path / "frames"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i + 1}.png")
    base = [sys.executable, "-m", "hermes", "stream", str(folder), "--model", "tiny", "--json"]
    base += ["--ask", "2:What?", "--chunk-frames", "2", "--fps", "1", "--max-new-tokens", "2"]
    out = subprocess.run(base, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    (answer,) = [e for e in events if e["event"] == "answer"]
    assert answer["question"] == "What?" and answer["frames_seen"] == 3
    assert [e for e in events if e["event"] == "chunk"][-1]["frames_seen"] == 6
    out = subprocess.run([*base, "--folder-fps", "2"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    chunks = [json.loads(line) for line in out.stdout.splitlines() if '"chunk"' in line]
    assert chunks[-1]["frames_seen"] == 3  # 6 images at 2 fps are 3 s: 3 frames at 1 fps
    (tmp_path / "empty").mkdir()
    out = subprocess.run([*base[:4], str(tmp_path / "empty"), *base[5:]], capture_output=True, text=True, timeout=240)
    assert out.returncode == 2 and "a folder without frame images" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


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


def test_the_offline_hint_names_the_download_command_of_the_installed_hub(clips, capsys, monkeypatch):
    import huggingface_hub

    from hermes.models.loading import download_command

    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model"], "hf download nobody")
    monkeypatch.setattr(huggingface_hub, "__version__", "0.33.2")  # before the `hf` command
    assert download_command("nobody/x") == "huggingface-cli download nobody/x"
    monkeypatch.setattr(huggingface_hub, "__version__", "1.0.0rc1")
    assert download_command("nobody/x") == "hf download nobody/x"


def test_empty_question_and_bad_ask(clips, capsys):
    args = ["stream", str(clips["short"]), "--model", "tiny", "--chunk-frames", "4", "--fps", "1", "--budget", "300"]
    _expect_error(capsys, [*args, "--ask", "2:   "], "question is empty")
    _expect_error(capsys, [*args, "--ask", "soon:What?"], "SECONDS:QUESTION")


def test_bad_memory_options_fail_before_the_model_loads(clips, capsys):
    # --fps 0 is refused (it used to fall back to the model's rate), and before the model would load.
    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model", "--fps", "0"], "fps")
    _expect_error(capsys, ["stream", str(clips["short"]), "--model", "nobody/no-such-model", "--budget", "0"], "budget")


def _events(capsys, argv) -> list[dict]:
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_watch_prints_a_check_per_chunk_and_leaves_the_cache_as_it_was(clips, capsys):
    # The command as is (defaults: one 16-frame chunk of this short clip) ...
    plain = ["stream", str(clips["short"]), "--model", "tiny", "--json"]
    watched = _events(capsys, [*plain, "--watch", "Is there a red circle?"])
    chunks = [e for e in watched if e["event"] == "chunk"]
    checks = [e for e in watched if e["event"] == "watch"]
    assert len(checks) == len(chunks) >= 1
    assert all(0.0 <= c["p_yes"] <= 1.0 and c["question"] == "Is there a red circle?" for c in checks)
    assert [c["cache_bytes"] for c in chunks] == [
        c["cache_bytes"] for c in _events(capsys, plain) if c["event"] == "chunk"
    ]

    # ... and a longer stream that evicts, with two standing questions firing at once (a low threshold).
    args = [*plain, "--chunk-frames", "2", "--fps", "1", "--budget", "300", "--max-new-tokens", "3"]
    questions = ["Is there a red circle?", "Is it dark?"]
    events = _events(capsys, [*args, "--watch", questions[0], "--watch", questions[1], "--watch-threshold", "0.01"])
    chunks = [e for e in events if e["event"] == "chunk"]
    checks = [e for e in events if e["event"] == "watch"]
    alerts = [e for e in events if e["event"] == "answer"]
    assert len(chunks) == 4 and chunks[-1]["evicted"] > 0
    assert len(checks) == 2 * len(chunks)
    for chunk, pair in zip(chunks, zip(checks[::2], checks[1::2], strict=True), strict=True):
        assert [c["question"] for c in pair] == questions
        for c in pair:
            assert c["at_s"] == chunk["stream_time_s"] and 0.0 <= c["p_yes"] <= 1.0
            # What a check costs, alone and against the chunk's prefill.
            assert c["check_ms"] > 0 and c["check_over_prefill"] == pytest.approx(c["check_ms"] / chunk["prefill_ms"])
    assert [c["fired"] for c in checks] == [True, True] + [False] * 6  # above from the start: once each
    assert [(a["question"], a["alert"], a["at_s"]) for a in alerts] == [(q, True, 1.0) for q in questions]
    assert all(a["tokens"] <= 3 and a["ttft_ms"] > 0 for a in alerts)
    baseline = [e["cache_bytes"] for e in _events(capsys, args) if e["event"] == "chunk"]
    assert [c["cache_bytes"] for c in chunks] == baseline


def test_watch_transcript_and_bad_standing_questions(clips, capsys):
    args = ["stream", str(clips["short"]), "--model", "tiny", "--chunk-frames", "4", "--fps", "1", "--budget", "300"]
    assert main([*args, "--watch", "Is there a red circle?", "--watch-threshold", "0.01", "--max-new-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.count("ALERT (p(yes)") == 1 and "Is there a red circle?" in out
    assert "standing questions: 2 checks" in err and "of its prefill" in err
    # Refused before the model loads (this one does not exist), each with one clear line.
    early = ["stream", str(clips["short"]), "--model", "nobody/no-such-model"]
    _expect_error(capsys, [*early, "--watch", "  "], "standing question is empty")
    _expect_error(capsys, [*early, "--watch", "x" * 1001], "1,001 characters long")
    five = [arg for i in range(5) for arg in ("--watch", f"Is it {i}?")]
    _expect_error(capsys, [*early, *five], "At most 4")
    _expect_error(capsys, [*early, "--watch", "Is it on?", "--watch", "Is it on?"], "Already watching")
    _expect_error(capsys, [*early, "--watch", "Is it on?", "--watch-threshold", "1"], "strictly between 0 and 1")
