"""The evaluation harness: the four annotation formats, streaming up to each question's time,
letter scoring, skips that are counted and never fatal, and resuming an interrupted run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes.cli.eval import add_eval_parser
from hermes.engine.session import StreamingSession
from hermes.engine.watch import AnswerWords
from hermes.eval import formats
from hermes.eval.formats import BENCHES, AnnotationError, ForwardItem, Item, parse_time
from hermes.eval.forward import credited, ovo_correct, ovo_scores
from hermes.eval.harness import (
    EvalSettings,
    VideoFinder,
    letter_in_text,
    letter_token_ids,
    read_results,
    run_eval,
    score_options,
)
from hermes.memory.config import HermesConfig
from hermes.video.chunking import Chunker
from hermes.video.clips import make_clip
from hermes.video.decoding import iter_frames
from tests.corpus import DAMAGED

FPS = 1.0  # whole seconds, so that the frames before a question time are easy to count
CHUNK = 4


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 s and 8 s clips in the layouts the benchmarks use, plus a file that is not a video."""
    root = tmp_path_factory.mktemp("videos")
    make_clip(root / "videos" / "long.mp4", 12.0, fps=4, size=(96, 64), needles={5.0: "red"})
    make_clip(root / "Ego4D" / "clips" / "ego.mp4", 8.0, fps=4, size=(96, 64))
    make_clip(root / "vmme001.mp4", 8.0, fps=4, size=(96, 64))
    make_clip(root / "star" / "Charades_v1_480" / "ch1.mp4", 8.0, fps=4, size=(96, 64))
    (root / "broken.mp4").write_bytes(b"this is not a video file at all" * 50)
    return root


def _write(path: Path, data: object, lines: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if lines:
        path.write_text("\n".join(json.dumps(r) for r in data) + "\n")
    else:
        path.write_text(json.dumps(data))
    return path


def streamingbench(path: Path) -> Path:
    opts = ["A. a red frame", "B. a blue frame", "C. nothing", "D. a cat"]
    return _write(
        path,
        [
            {
                "time": "[0:00:00 - 0:01:00]",
                "video_path": "./videos/long.mp4",
                "video_categories": "test",
                "questions": [
                    {"task_type": "Object Perception", "question": "What is shown now?", "time_stamp": "00:00:09",
                     "answer": "B", "options": opts},
                    {"task_type": "Object Perception", "question": "What was shown?", "time_stamp": "00:00:05",
                     "answer": "A", "options": opts},
                    {"task_type": "Object Perception", "question": "Bad time", "time_stamp": "soon",
                     "answer": "A", "options": opts},
                ],
            },
            {"video_path": "./videos/missing.mp4", "questions": [
                {"task_type": "Text Recognition", "question": "Lost?", "time_stamp": "00:00:02", "answer": "C",
                 "options": opts}]},
            {"video_path": "broken.mp4", "questions": [
                {"task_type": "Text Recognition", "question": "Broken?", "time_stamp": "00:00:02", "answer": "D",
                 "options": opts}]},
            {"video_path": "./videos/long.mp4", "questions": "not a list"},
        ],
    )  # fmt: skip


def ovobench(path: Path) -> Path:
    return _write(
        path,
        [
            {"id": 7, "task": "EPM", "video": "Ego4D/clips/ego.mp4", "realtime": 6, "question": "Where?",
             "answer": "table", "options": ["table", "floor", "sink"], "gt": 0},
            {"id": 8, "task": "OCR", "video": "Ego4D/clips/ego.mp4", "realtime": 2.5, "question": "What text?",
             "options": ["x", "y"], "gt": 1},
            {"id": 10, "task": "STU", "video": "Ego4D/clips/ego.mp4", "realtime": 3, "question": "Bad gt",
             "options": ["1", "2"], "gt": 5},
            # Forward active responding, in the released file's format: test points with their times.
            {"id": 9, "task": "REC", "video": "videos/long.mp4", "activity": "wave a hand", "start_times": [2],
             "end_times": [4], "test_info": [{"realtime": 3, "count": 0}, {"realtime": 6, "count": 1},
                                             {"realtime": 9.0, "count": 1}]},
            {"id": 11, "task": "SSR", "video": "videos/long.mp4", "tutorial": "Box", "all_steps": ["open the box",
             "close the box"], "start_time": [1, 6], "end_time": [4, 9], "test_info": [
                {"realtime": 2, "step": "open the box", "type": 1},
                {"realtime": 5, "step": "close the box", "type": 0},
                {"realtime": 7, "step": "close the box", "type": 1},
                {"realtime": 8, "step": "close the box", "type": "maybe"}]},
            {"id": 12, "task": "CRR", "video": "Ego4D/clips/ego.mp4", "question": "What colour is the flash?",
             "answer": "red", "ask_time": 1, "clue_time": 5, "test_info": [
                {"realtime": 1, "type": 0}, {"realtime": 4, "type": 0}, {"realtime": 6, "type": 1}]},
            {"id": 13, "task": "CRR", "video": "Ego4D/clips/ego.mp4", "question": "No tests?", "test_info": []},
        ],
    )  # fmt: skip


def videomme(path: Path) -> Path:
    opts = ["A. one", "B. two", "C. three", "D. four"]
    rows = [
        {"video_id": "001", "duration": "short", "videoID": "vmme001", "question_id": "001-1",
         "task_type": "Counting Problem", "question": "How many?", "options": opts, "answer": "B"},
        {"video_id": "001", "duration": "short", "videoID": "vmme001", "question_id": "001-2",
         "task_type": "Action Reasoning", "question": "Why?", "options": opts, "answer": "D"},
        {"video_id": "002", "duration": "long", "videoID": "vmme404", "question_id": "002-1",
         "task_type": "Action Reasoning", "question": "Gone?", "options": opts, "answer": "A"},
        {"video_id": "003", "duration": "long", "videoID": "vmme001", "question_id": "003-1",
         "task_type": "Action Reasoning", "question": "Letter?", "options": opts, "answer": "E"},
    ]  # fmt: skip
    return _write(path, rows, lines=True)


def mvbench(folder: Path) -> Path:
    _write(
        folder / "action_sequence.json",
        [
            {"video": "ch1.mp4", "question": "What happened after the box?", "candidates": ["sat", "ran", "ate"],
             "answer": "ran", "start": 2.0, "end": 6.0},
            {"video": "ch1.mp4", "question": "Not a candidate", "candidates": ["a", "b"], "answer": "c"},
        ],
    )  # fmt: skip
    _write(
        folder / "object_shuffle.json",
        [{"video": "ch1.mp4", "question": "Where is the ball?", "candidates": ["left", "right"], "answer": "left"}],
    )
    return folder


WRITERS = {"streamingbench": streamingbench, "ovobench": ovobench, "videomme": videomme}


def annotations(bench: str, tmp: Path) -> Path:
    if bench == "mvbench":
        return mvbench(tmp / "mvbench_json")
    return WRITERS[bench](tmp / f"{bench}.json")


@pytest.fixture
def session(llava_lm) -> StreamingSession:
    return StreamingSession(llava_lm, HermesConfig(budget=600, chunk_frames=CHUNK, fps=FPS), policy="hermes")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- formats --------------------------------------------------------------------------------------


def test_parse_time() -> None:
    assert parse_time("00:01:05") == 65.0
    assert parse_time("1:05") == 65.0
    assert parse_time("12.5") == 12.5
    assert parse_time(7) == 7.0
    for bad in ("soon", "-3", True, None, "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_time(bad)


def test_streamingbench_format(tmp_path: Path) -> None:
    items, problems = formats.load_streamingbench(streamingbench(tmp_path / "sb.json"))
    first = items[0]
    assert (first.qid, first.task, first.video, first.at_s, first.answer) == (
        "0.0",
        "Object Perception",
        "./videos/long.mp4",
        9.0,
        "B",
    )
    assert first.options == ("a red frame", "a blue frame", "nothing", "a cat")  # letters stripped
    assert items[1].at_s == 5.0
    assert {p.qid: p.reason for p in problems} == {
        "0.2": "time 'soon' is not HH:MM:SS or seconds",
        "3": "no 'questions' list",
    }
    assert first.prompt().splitlines() == [
        "What is shown now?",
        "A. a red frame",
        "B. a blue frame",
        "C. nothing",
        "D. a cat",
        "Answer with the option's letter from the given choices directly.",
    ]


def test_ovobench_format(tmp_path: Path) -> None:
    items, problems = formats.load_ovobench(ovobench(tmp_path / "ovo.json"))
    assert [(i.qid, i.task, i.group, i.answer, i.at_s) for i in items] == [
        ("7", "EPM", "backward", "A", 6.0),
        ("8", "OCR", "real-time", "B", 2.5),
        ("9/0", "REC", "forward", "0", 3.0),
        ("9/1", "REC", "forward", "1", 6.0),
        ("9/2", "REC", "forward", "1", 9.0),
        ("11/0", "SSR", "forward", "Yes", 2.0),
        ("11/1", "SSR", "forward", "No", 5.0),
        ("11/2", "SSR", "forward", "Yes", 7.0),
        ("12/0", "CRR", "forward", "No", 1.0),
        ("12/1", "CRR", "forward", "No", 4.0),
        ("12/2", "CRR", "forward", "Yes", 6.0),
    ]
    reasons = {p.qid: p.reason for p in problems}
    assert reasons == {
        "10": "gt 5 is not an option index 0-1",
        "11/3": "type 'maybe' is not 0 (No) or 1 (Yes)",
        "13": "no 'test_info' list of test times",
    }
    forward = {i.qid: i for i in items if isinstance(i, ForwardItem)}
    # OVO-Bench's own prompts (constant.py), filled as its build_prompt does.
    assert forward["9/0"].prompt().startswith("You're watching a video in which people may perform")
    assert "answer the following question: How many times did they wave a hand?\n" in forward["9/0"].prompt()
    assert "whole procedures: \nclose the box\nYour task" in forward["11/1"].prompt()
    assert forward["12/0"].prompt().endswith("Do not include any additional text or explanation in your response.")
    assert "What colour is the flash?" in forward["12/0"].prompt() and forward["12/0"].options == ()


def test_ovo_scoring_follows_its_score_script() -> None:
    # REC: the digits of the response, joined, against the count.
    assert ovo_correct("REC", "3", "3") and ovo_correct("REC", "They did it 3 times.", "3")
    assert not ovo_correct("REC", "1 and 2", "2") and ovo_correct("REC", "1 and 2", "12")
    assert not ovo_correct("REC", None, "0") and not ovo_correct("REC", "none", "0")
    # SSR and CRR: exactly Y/N, or the expected word inside the response (case matters, as there).
    assert ovo_correct("SSR", "N", "No") and ovo_correct("CRR", "Y", "Yes") and not ovo_correct("CRR", "Y", "No")
    assert ovo_correct("SSR", "Yes.", "Yes") and not ovo_correct("SSR", "yes", "Yes")
    assert ovo_correct("CRR", "No, not yet", "No") and not ovo_correct("CRR", "No, not yet", "Yes")
    assert credited("SSR", "Yes or No", "No") == "No" and credited("SSR", "maybe", "Yes") is None
    assert credited("REC", "about 4", "4") == "4"
    summary = {
        "tasks": {t: {"accuracy": a} for t, a in {"EPM": 0.5, "ASI": 1.0, "OCR": 0.25, "REC": 0.0, "SSR": 1.0}.items()}
    }
    scores = ovo_scores(summary)
    # Per group the mean of its tasks, overall the mean of the groups.
    assert scores == pytest.approx({"backward": 75.0, "real-time": 25.0, "forward": 50.0, "overall": 50.0})
    assert ovo_scores({"tasks": {"EPM": {"accuracy": 1.0}}})["overall"] is None


def test_videomme_format_jsonl(tmp_path: Path) -> None:
    items, problems = formats.load_videomme(videomme(tmp_path / "vmme.jsonl"))
    assert [(i.qid, i.video, i.group, i.answer, i.at_s) for i in items] == [
        ("001-1", "vmme001", "short", "B", None),
        ("001-2", "vmme001", "short", "D", None),
        ("002-1", "vmme404", "long", "A", None),
    ]
    assert [p.qid for p in problems] == ["003-1"] and "answer 'E'" in problems[0].reason


def test_mvbench_format(tmp_path: Path) -> None:
    items, problems = formats.load_mvbench(mvbench(tmp_path / "json"))
    seq = next(i for i in items if i.qid == "action_sequence/0")
    assert (seq.task, seq.answer, seq.start_s, seq.end_s, seq.options) == (
        "Action Sequence",
        "B",
        2.0,
        6.0,
        ("sat", "ran", "ate"),
    )
    assert seq.video_dirs == ("star/Charades_v1_480",)
    shuffle = next(i for i in items if i.task == "Object Shuffle")
    assert (shuffle.answer, shuffle.start_s, shuffle.end_s) == ("A", 0.0, None)
    assert [(p.qid, p.task) for p in problems] == [("action_sequence/1", "Action Sequence")]


def test_unreadable_annotation_files(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="not found"):
        formats.load_ovobench(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(AnnotationError, match="not JSON"):
        formats.load_videomme(tmp_path / "bad.json")
    (tmp_path / "scalar.json").write_text("42")
    with pytest.raises(AnnotationError, match="list of entries"):
        formats.load_streamingbench(tmp_path / "scalar.json")
    (tmp_path / "v.parquet").write_bytes(b"PAR1")
    with pytest.raises(AnnotationError, match="convert it to JSON"):
        formats.load_videomme(tmp_path / "v.parquet")


# -- scoring ----------------------------------------------------------------------------------------


def test_letter_ids_and_scores(llava_lm) -> None:
    ids = letter_token_ids(llava_lm, 4)
    # The tiny tokenizer is byte-level: "A" is byte 65, and " A" is two tokens, so it is not a letter id.
    assert ids == [[65], [66], [67], [68]]
    logp = torch.full((300,), -10.0)
    logp[66], logp[68] = -1.0, -0.5
    assert score_options(logp, [[65], [66, 67], [68]]) == {"A": -10.0, "B": -1.0, "C": -0.5}


def test_letter_in_text() -> None:
    assert letter_in_text("(B) a blue frame", 4) == "B"
    assert letter_in_text("The answer is C.", 4) == "C"
    assert letter_in_text("Answer: E", 4) is None
    assert letter_in_text("Apples", 4) is None


def test_video_finder(videos: Path, tmp_path: Path) -> None:
    finder = VideoFinder(videos, (".mp4",))

    def item(video: str, dirs: tuple[str, ...] = ()) -> Item:
        return Item("q", "t", video, "?", ("a", "b"), "A", video_dirs=dirs)

    assert finder.find(item("./videos/long.mp4"))[0] == videos / "videos" / "long.mp4"
    assert finder.find(item("vmme001"))[0] == videos / "vmme001.mp4"  # extension added
    assert finder.find(item("ch1.mp4", ("star/Charades_v1_480",)))[0] == videos / "star/Charades_v1_480/ch1.mp4"
    assert finder.find(item("elsewhere/ego.mp4"))[0] == videos / "Ego4D/clips/ego.mp4"  # by file name
    path, why = finder.find(item("nothing.mp4"))
    assert path is None and "video not found" in why
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.mp4").write_bytes(b"")
    (tmp_path / "b" / "x.mp4").write_bytes(b"")
    (tmp_path / "frames.mp4").mkdir()
    assert "ambiguous" in VideoFinder(tmp_path).find(item("x.mp4"))[1]
    assert "is a folder" in VideoFinder(tmp_path).find(item("frames.mp4"))[1]


# -- end to end ---------------------------------------------------------------------------------------


def _frames_until(path: Path, at_s: float | None, start: float = 0.0, end: float | None = None) -> int:
    return sum(1 for f in iter_frames(path, FPS, start=start, end=end) if at_s is None or f.t <= at_s)


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_eval_end_to_end(bench: str, llava_lm, session, videos: Path, tmp_path: Path) -> None:
    spec = BENCHES[bench]
    items, problems = spec.load(annotations(bench, tmp_path))
    out = tmp_path / "results.jsonl"
    summary = run_eval(llava_lm, spec, items, problems, session, videos, out, EvalSettings(max_new_tokens=3), False)
    records = {r["qid"]: r for r in _records(out)}
    answered = [r for r in records.values() if r["status"] == "answered"]
    assert answered, records
    finder = VideoFinder(videos, spec.extensions)
    for item in items:
        record = records[item.qid]
        if record["status"] != "answered":
            continue
        # Streamed exactly up to the question's time (or the clip's end), from the clip's start.
        path = finder.find(item)[0]
        assert record["frames_seen"] == _frames_until(path, item.at_s, item.start_s, item.end_s)
        if isinstance(item, ForwardItem):
            _check_forward(item, record)
            continue
        scores = record["option_logprobs"]
        assert sorted(scores) == list("ABCD"[: len(item.options)])
        assert record["pred"] == max(scores, key=scores.get)
        assert record["correct"] == (record["pred"] == item.answer)
        assert isinstance(record["text"], str) and record["ttft_ms"] > 0
    skipped = [r for r in records.values() if r["status"] == "skipped"]
    assert summary["skipped"] == len(skipped) == len(records) - len(answered)
    assert summary["overall"]["answered"] == len(answered)
    assert summary["overall"]["correct"] == sum(r["correct"] for r in answered)
    assert sum(summary["skipped_by_reason"].values()) == len(skipped)
    assert summary["not_run"] == 0
    expected_skips = {
        "streamingbench": {"malformed entry": 2, "video not found": 1, "Cannot read video": 1},
        "ovobench": {"malformed entry": 3},
        "videomme": {"malformed entry": 1, "video not found": 1},
        "mvbench": {"malformed entry": 1},
    }[bench]
    assert summary["skipped_by_reason"] == expected_skips


def test_a_damaged_video_answers_what_came_before_the_damage(llava_lm, session, corpus, tmp_path: Path) -> None:
    opts = ["A. one", "B. two", "C. three", "D. four"]
    questions = [
        {"task_type": "Counting Problem", "question": q, "time_stamp": t, "answer": "A", "options": opts}
        for q, t in [("Before?", "00:00:03"), ("After?", "00:00:06")]
    ]
    path = _write(tmp_path / "damaged.json", [{"video_path": DAMAGED.name, "questions": questions}])
    spec = BENCHES["streamingbench"]
    items, _ = spec.load(path)
    out = tmp_path / "results.jsonl"
    videos = corpus[DAMAGED.name].parent
    summary = run_eval(llava_lm, spec, items, [], session, videos, out, EvalSettings(max_new_tokens=0), False)
    before, after = _records(out)
    assert before["status"] == "answered" and before["frames_seen"] == 4  # frames at 0 to 3 s
    assert after["status"] == "skipped" and "is damaged after 0:04" in after["reason"]
    assert summary["skipped_by_reason"] == {"video damaged": 1}


def _check_forward(item: ForwardItem, record: dict) -> None:
    """A forward test point's record: the prediction and its score as OVO-Bench reads them."""
    assert record["group"] == "forward" and record["answer"] == item.answer and record["ttft_ms"] > 0
    if item.task == "REC":  # a count: the digits of the generated answer
        assert record["p_yes"] is None and record["pred"] == credited("REC", record["text"], item.answer)
        assert record["correct"] == ovo_correct("REC", record["text"], item.answer)
    else:  # yes/no: from p(yes), with the model's answer words
        assert 0.0 <= record["p_yes"] <= 1.0
        assert record["pred"] == ("Yes" if record["p_yes"] > 0.5 else "No")
        assert record["correct"] == (record["pred"] == item.answer)
        assert record["text_pred"] == credited(item.task, record["text"], item.answer)


def test_ovobench_forward_scores_every_test_point(llava_lm, session, videos: Path, tmp_path: Path) -> None:
    spec = BENCHES["ovobench"]
    items, problems = spec.load(ovobench(tmp_path / "ovo.json"))
    out = tmp_path / "ovo.jsonl"
    summary = run_eval(llava_lm, spec, items, problems, session, videos, out, EvalSettings(max_new_tokens=3), False)
    records = {r["qid"]: r for r in _records(out)}
    forward = [i for i in items if isinstance(i, ForwardItem)]
    assert len(forward) == 9
    finder = VideoFinder(videos, spec.extensions)
    for item in forward:  # every test point asked, at its own time
        record = records[item.qid]
        assert record["status"] == "answered", record
        assert record["frames_seen"] == _frames_until(finder.find(item)[0], item.at_s)
        _check_forward(item, record)
    # The summary: per task as OVO-Bench scores it, and its group averages and overall score.
    by_task: dict[str, list[bool]] = {}
    for item in forward:
        by_task.setdefault(item.task, []).append(records[item.qid]["correct"])
    for task, correct in by_task.items():
        assert summary["tasks"][task]["answered"] == len(correct)
        assert summary["tasks"][task]["accuracy"] == pytest.approx(sum(correct) / len(correct))
    scores = ovo_scores(summary)
    assert scores["forward"] == pytest.approx(100 * np.mean([np.mean(c) for c in by_task.values()]))
    assert scores["backward"] == 100 * summary["tasks"]["EPM"]["accuracy"]
    assert scores["real-time"] == 100 * summary["tasks"]["OCR"]["accuracy"]
    assert scores["overall"] == pytest.approx(np.mean([scores["backward"], scores["real-time"], scores["forward"]]))


def _streamed_until(lm, config, video: Path, until_s: float) -> StreamingSession:
    """A fresh session that has seen `video` up to `until_s` only."""
    fresh = StreamingSession(lm, config, policy="hermes")
    chunker = Chunker(CHUNK)
    for frame in iter_frames(video, FPS):
        if frame.t > until_s:
            break
        chunk = chunker.push(frame)
        if chunk is not None:
            fresh.ingest(chunk)
    fresh.ingest(chunker.flush())
    return fresh


def test_forward_p_yes_matches_a_fresh_stream(llava_lm, session, videos: Path, tmp_path: Path) -> None:
    """A forward test point's p(yes) is that of a session that saw the video up to its time only."""
    spec = BENCHES["ovobench"]
    items, _ = spec.load(ovobench(tmp_path / "ovo.json"))
    item = next(i for i in items if i.qid == "11/1")  # SSR at 5 s
    out = tmp_path / "one.jsonl"
    run_eval(llava_lm, spec, [item], [], session, videos, out, EvalSettings(max_new_tokens=0), False)
    record = _records(out)[0]

    fresh = _streamed_until(llava_lm, session.config, videos / "videos" / "long.mp4", 5.0)
    expected = AnswerWords.for_lm(llava_lm).p_yes(fresh.first_token_logprobs(item.prompt()))
    assert record["p_yes"] == pytest.approx(expected, abs=1e-5)
    assert record["frames_seen"] == 6 and record["text"] == "" and record["text_pred"] is None


def test_scores_match_a_fresh_stream(llava_lm, session, videos: Path, tmp_path: Path) -> None:
    """The recorded letter log-probabilities are those of a session that saw frames 0..5 s only."""
    spec = BENCHES["streamingbench"]
    items, _ = spec.load(streamingbench(tmp_path / "sb.json"))
    item = next(i for i in items if i.at_s == 5.0)
    single = Item(item.qid, item.task, item.video, item.question, item.options, item.answer, at_s=5.0)
    out = tmp_path / "one.jsonl"
    run_eval(llava_lm, spec, [single], [], session, videos, out, EvalSettings(max_new_tokens=0), False)
    record = _records(out)[0]

    fresh = _streamed_until(llava_lm, session.config, videos / "videos" / "long.mp4", 5.0)
    logp = fresh.first_token_logprobs(single.prompt())
    expected = [float(logp[ord(letter)]) for letter in "ABCD"]
    assert np.allclose([record["option_logprobs"][k] for k in "ABCD"], expected, atol=1e-4)
    assert record["frames_seen"] == 6 and record["text"] == "" and record["ttft_ms"] is None


def test_resume_appends_only_what_is_missing(llava_lm, session, videos: Path, tmp_path: Path) -> None:
    spec = BENCHES["videomme"]
    items, problems = spec.load(videomme(tmp_path / "v.jsonl"))
    out = tmp_path / "r.jsonl"
    first = run_eval(llava_lm, spec, items, problems, session, videos, out, EvalSettings(0, limit=1), False)
    assert first["overall"]["answered"] == 1 and first["questions"] == 2  # one question plus the malformed entry
    lines = out.read_text().splitlines()
    # A run killed mid-write leaves half a line; resuming drops it and appends whole lines only.
    with out.open("a") as f:
        f.write('{"qid": "001-2", "stat')
    summary = run_eval(llava_lm, spec, items, problems, session, videos, out, EvalSettings(0), False)
    after = out.read_text().splitlines()
    assert after[: len(lines)] == lines
    new = [json.loads(line) for line in after[len(lines) :]]
    assert "001-1" not in {r["qid"] for r in new}  # answered before: not asked again
    assert {r["qid"] for r in new if r["status"] == "answered"} == {"001-2"}
    assert summary["overall"]["answered"] == 2 and summary["skipped"] == 2 and summary["not_run"] == 0
    assert set(read_results(out)) == {"001-1", "001-2", "002-1", "003-1"}


def test_eval_cli(llava_lm, videos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    ann = ovobench(tmp_path / "ovo.json")
    out = tmp_path / "ovo.jsonl"
    argv = ["eval", "--bench", "ovobench", "--annotations", str(ann), "--videos", str(videos), "--out", str(out)]
    args = parser.parse_args([*argv, "--model", "tiny", "--fps", "1", "--budget", "600", "--no-progress"])
    assert args.reindex is None and args.policy == "hermes"
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert (
        "OVO-Bench" in table
        and "lazy re-indexing" in table
        and "| EPM | 1 |" in table
        and "| REC | 3 |" in table
        and "| *forward* | 9 |" in table
        and "| **overall** | 11 |" in table
        and "OVO-Bench score" in table
    )
    summary = json.loads((tmp_path / "ovo.summary.json").read_text())
    assert summary["settings"]["reindex"] == "lazy" and summary["skipped"] == 3
    assert set(summary["ovo"]) == {"backward", "real-time", "forward", "overall"}
    assert f"overall {summary['ovo']['overall']:.2f}" in table
    videomme_args = parser.parse_args(
        ["eval", "--bench", "videomme", "--annotations", str(ann), "--videos", str(videos), "--limit", "0"]
    )
    with pytest.raises(ValueError, match="--limit"):
        videomme_args.func(videomme_args)
    threads_args = parser.parse_args([*argv, "--threads", "-1"])
    with pytest.raises(ValueError, match="--threads"):  # it used to be ignored
        threads_args.func(threads_args)


def test_qwen_streams_pairs_and_long_prompts_are_skipped(qwen_lm, videos: Path, tmp_path: Path) -> None:
    """Qwen2.5-VL pads odd chunks to frame pairs: the frames seen still count real frames only.
    A prompt past the engine's length limit is skipped and counted, not fatal."""
    opts = ["A. yes", "B. no"]
    ann = _write(
        tmp_path / "sb.json",
        [
            {
                "video_path": "videos/long.mp4",
                "questions": [
                    {"task_type": "T", "question": "Now?", "time_stamp": "00:00:04", "answer": "A", "options": opts},
                    {
                        "task_type": "T",
                        "question": "x" * 2000,
                        "time_stamp": "00:00:06",
                        "answer": "B",
                        "options": opts,
                    },
                    {"task_type": "T", "question": "Later?", "time_stamp": "00:00:07", "answer": "B", "options": opts},
                ],
            }
        ],
    )
    spec = BENCHES["streamingbench"]
    items, problems = spec.load(ann)
    session = StreamingSession(qwen_lm, HermesConfig(budget=200, chunk_frames=3, fps=FPS))
    out = tmp_path / "q.jsonl"
    summary = run_eval(qwen_lm, spec, items, problems, session, videos, out, EvalSettings(0), False)
    records = {r["qid"]: r for r in _records(out)}
    assert records["0.0"]["frames_seen"] == 5 and records["0.2"]["frames_seen"] == 8  # t = 0..4 s, then 0..7 s
    assert records["0.1"]["status"] == "skipped" and "characters long" in records["0.1"]["reason"]
    assert summary["skipped_by_reason"] == {"question too long": 1}
    assert summary["overall"]["answered"] == 2 and summary["overall"]["text_accuracy"] is None


# -- sharded across processes -----------------------------------------------------------------------


def sharded(path: Path) -> Path:
    """Five videos (one missing), questions at times, and a malformed entry: shards of 2 get 3 + 2."""
    opts = ["A. a red frame", "B. a blue frame", "C. nothing"]

    def q(at: str, answer: str) -> dict:
        return {"task_type": "Object Perception", "question": f"What at {at}?", "time_stamp": at, "answer": answer,
                "options": opts}  # fmt: skip

    return _write(
        path,
        [
            {"video_path": "videos/long.mp4", "questions": [q("00:00:03", "A"), q("00:00:01", "B")]},
            {"video_path": "Ego4D/clips/ego.mp4", "questions": [q("00:00:02", "C")]},
            {"video_path": "videos/missing.mp4", "questions": [q("00:00:02", "A")]},
            {"video_path": "vmme001.mp4", "questions": [q("00:00:03", "B"), q("soon", "A")]},
            {"video_path": "star/Charades_v1_480/ch1.mp4", "questions": [q("00:00:01", "C")]},
        ],
    )


def _without_timings(records: dict[str, dict]) -> dict[str, dict]:
    return {q: {k: v for k, v in r.items() if k != "ttft_ms"} for q, r in records.items()}


def test_shards_merge_into_the_single_process_results_and_resume_alone(qwen_lm, videos: Path, tmp_path: Path) -> None:
    """In one process, shard by shard: each streams only its videos into its own part, the one that
    completes the set merges; a part cut short resumes on its own, and the merge is the same again."""
    from hermes.eval.shard import Shard, part_path

    spec = BENCHES["streamingbench"]
    items, problems = spec.load(sharded(tmp_path / "sb.json"))
    config = HermesConfig(budget=100, chunk_frames=2, fps=FPS)
    settings = EvalSettings(max_new_tokens=0)

    def run(out: Path, shard: Shard | None = None) -> dict | None:
        session = StreamingSession(qwen_lm, config)
        return run_eval(qwen_lm, spec, items, problems, session, videos, out, settings, False, shard=shard)

    single = run(tmp_path / "single.jsonl")
    out = tmp_path / "sharded.jsonl"
    assert run(out, Shard(1, 2)) is None and not out.exists()  # shard 0 has not run yet
    parts = [part_path(out, r, 2) for r in range(2)]
    streamed = [{r["video"] for r in read_results(p).values() if r["status"] == "answered"} for p in parts]
    assert streamed[1] == {"Ego4D/clips/ego.mp4", "vmme001.mp4"}
    merged = run(out, Shard(0, 2))
    assert merged == single
    assert _without_timings(read_results(out)) == _without_timings(read_results(tmp_path / "single.jsonl"))
    assert [json.loads(line)["qid"] for line in out.read_text().splitlines()] == [
        json.loads(line)["qid"] for line in (tmp_path / "single.jsonl").read_text().splitlines()
    ]
    # Resume: shard 1 lost its last answer; it asks that one question again, and merges.
    lines = parts[1].read_text().splitlines()
    parts[1].write_text("\n".join(lines[:-1]) + "\n")
    before = parts[0].read_bytes()
    assert run(out, Shard(1, 2)) == single
    assert parts[0].read_bytes() == before and len(parts[1].read_text().splitlines()) == len(lines)


def test_eval_sharded_by_a_launcher_equals_one_process(videos: Path, tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 2 -m hermes eval ...`: two CPU processes, each with its share of the
    videos and its own results file, give exactly the predictions and the summary of one process."""
    import subprocess
    import sys

    from hermes.cli.main import main

    ann = sharded(tmp_path / "sb.json")
    common = ["--bench", "streamingbench", "--annotations", str(ann), "--videos", str(videos), "--model", "tiny-qwen"]
    common += ["--fps", "1", "--chunk-frames", "2", "--budget", "100", "--max-new-tokens", "2", "--no-progress"]
    assert main(["eval", *common, "--out", str(tmp_path / "one.jsonl")]) == 0
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    done = subprocess.run(
        [*launcher, "hermes", "eval", *common, "--out", str(tmp_path / "two.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| **overall** |" in done.stdout  # the shard that merged printed the table
    for rank in range(2):
        assert (tmp_path / f"two.part-{rank}-of-2.jsonl").is_file()
    one, two = read_results(tmp_path / "one.jsonl"), read_results(tmp_path / "two.jsonl")
    assert _without_timings(one) == _without_timings(two)
    assert {r["pred"] for r in one.values() if r["status"] == "answered"}  # predictions to compare
    summaries = [json.loads((tmp_path / f"{name}.summary.json").read_text()) for name in ("one", "two")]
    assert summaries[0] == summaries[1]


def test_shard_from_the_launchers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes.eval.shard import Shard

    assert Shard.from_env({}) == Shard(0, 1) and not Shard.from_env({}).sharded
    shard = Shard.from_env({"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"})
    assert shard.take(list("abcdefg")) == ["b", "e"] and shard.owner(4) == 1
    assert shard.part(tmp_path / "r.jsonl") == tmp_path / "r.part-1-of-3.jsonl"
    assert Shard().part(tmp_path / "r.jsonl") == tmp_path / "r.jsonl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert shard.local_device() is None  # no GPU: the CPU, as without a launcher
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert shard.local_device({"LOCAL_RANK": "3"}) == "cuda:1"  # one GPU per process, round robin
    for bad in ({"RANK": "3", "WORLD_SIZE": "3"}, {"RANK": "x", "WORLD_SIZE": "2"}):
        with pytest.raises(ValueError, match="shard"):
            Shard.from_env(bad)
