"""Every official annotation layout, read from a small file written in exactly that layout, with
each benchmark's own prompt; unknown layouts and malformed entries are reported, never fatal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hermes.eval.formats import load_ovobench, load_videomme
from hermes.eval.items import AnnotationError, ForwardItem, ProactiveItem, VideoDir, parse_time
from hermes.eval.mvbench import load_mvbench
from hermes.eval.streamingbench import load_streamingbench
from tests.eval_helpers import (
    VIDEOMME_ROWS,
    mvbench,
    ovobench,
    streamingbench,
    streamingbench_omni,
    streamingbench_proactive,
    streamingbench_sqa,
    videomme,
    videomme_parquet,
    write_json,
)

SB_INSTRUCTION = (
    "You are an advanced video question-answering AI assistant. You have been provided with some frames from the "
    "video and a multiple-choice question related to the video. Your task is to carefully analyze the video and "
    "provide the best answer to question, choosing from the four options provided. Respond with only the letter "
    "(A, B, C, or D) of the correct option."
)


def test_parse_time() -> None:
    assert parse_time("00:01:05") == 65.0
    assert parse_time("1:05") == 65.0
    assert parse_time("12.5") == 12.5
    assert parse_time(7) == 7.0
    for bad in ("soon", "-3", True, None, "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_time(bad)


def test_streamingbench_real(tmp_path: Path) -> None:
    items, problems = load_streamingbench(streamingbench(tmp_path / "questions_real.json"))
    first = items[0]
    assert (first.qid, first.task, first.video, first.at_s, first.answer, first.group, first.rule) == (
        "0.0",
        "Object Perception",
        "./videos/long.mp4",
        9.0,
        "B",
        "real-time",
        "streamingbench",
    )
    assert first.options == ("a red frame", "a blue frame", "nothing", "a cat")  # letters stripped
    assert items[1].at_s == 5.0
    assert {p.qid: p.reason for p in problems} == {
        "0.2": "time 'soon' is not HH:MM:SS or seconds",
        "3": "no 'questions' list",
    }
    # StreamingBench.py's PROMPT_TEMPLATE, then "The best option is:".
    assert first.prompt == (
        f"{SB_INSTRUCTION}\n\nQuestion: What is shown now?\n\nOptions:\nA. a red frame\nB. a blue frame\n"
        "C. nothing\nD. a cat\n\nThe best option is:"
    )


def test_streamingbench_omni_groups_and_options(tmp_path: Path) -> None:
    items, problems = load_streamingbench(streamingbench_omni(tmp_path / "questions_omni.json"))
    assert [(i.task, i.group) for i in items] == [
        ("Emotion Recognition", "omni-source"),
        ("Anomaly Context Understanding", "contextual"),
    ]
    feel, odd = items
    assert "Options:\nA. happy\nB. sad\nC. angry\nD. calm\n\n" in feel.prompt  # lettered as the benchmark does
    assert odd.options == ("a", "b", "c", "d") and "E. ." not in odd.prompt  # four of six shown, as there
    assert [(p.qid, p.reason) for p in problems] == [("0.2", "'options' is not a list of at least 4 options")]


def test_streamingbench_sqa(tmp_path: Path) -> None:
    items, problems = load_streamingbench(streamingbench_sqa(tmp_path / "questions_sqa.json"))
    assert [(i.qid, i.at_s, i.answer, i.group) for i in items] == [
        ("0.0.0", 2.0, "A", "contextual"),
        ("0.1.0", 5.0, "D", "contextual"),
    ]
    assert [p.qid for p in problems] == ["1.0.0"]
    first, second = (i.prompt for i in items)
    assert "correct option.\n\n\n\nHere is the question." in first  # no context before the first question
    # The second carries the first question and its right answer (StreamingBenchSQA.py's context).
    assert (
        "correct option.\n\nHere are the contextual information related to the video. Please answer the questions "
        "based on the contextual information: At timestamp 00:00:02, the following question and answer occurred: "
        "Question: Who serves?; Options: A. Ma Lin., B. Xu xin., C. 4., D. 7.; Answer: A; \n\nHere is the question. "
        "Answer it and don't confuse it with the previous conversation.\nQuestion: How many points has he now?\n\n"
        "Options:\nA. Ma Lin.\nB. Xu xin.\nC. 4.\nD. 7.\n\nThe best option is:"
    ) in second


def test_streamingbench_proactive(tmp_path: Path) -> None:
    items, problems = load_streamingbench(streamingbench_proactive(tmp_path / "questions_proactive.json"))
    (item,) = items
    assert isinstance(item, ProactiveItem)
    assert (item.start_s, item.expected_s, item.answer, item.at_s, item.group) == (2.0, 5.0, "red", None, "contextual")
    assert item.prompt == (
        "You are an advanced image question-answering AI assistant. You have been provided with images and a "
        "question related to the images. Your task is to carefully analyze the images and provide the answer to the "
        "question. You need to carefully confirm whether the images content meet the conditions of the question, "
        'and then output the correct content.\n\nQuestion: When the screen turns red, output "red". Is it the right '
        'time to output "red"? You can only answer yes or no.\n\nThe answer is:\n'
    )
    assert [(p.qid, p.reason) for p in problems] == [("1.0", "ground_truth_time_stamp '00:00:03' is before time_stamp")]


def test_ovobench(tmp_path: Path) -> None:
    items, problems = load_ovobench(ovobench(tmp_path / "ovo.json"))
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
    assert {p.qid: p.reason for p in problems} == {
        "10": "gt 5 is not an option index 0-1",
        "11/3": "type 'maybe' is not 0 (No) or 1 (Yes)",
        "13": "no 'test_info' list of test times",
    }
    # constant.py's BR_PROMPT_TEMPLATE, the options on one line as build_prompt writes them.
    assert items[0].prompt == (
        "\nQuestion: Where?\nOptions:\nA. table; B. floor; C. sink;\n\nRespond only with the letter corresponding to "
        "your chosen option (e.g., A, B, C). \nDo not include any additional text or explanation in your response.\n"
    )
    forward = {i.qid: i for i in items if isinstance(i, ForwardItem)}
    assert forward["9/0"].prompt.startswith("\nYou're watching a video in which people may perform")
    assert "answer the following question: How many times did they wave a hand?\n" in forward["9/0"].prompt
    assert "whole procedures: \nclose the box\nYour task" in forward["11/1"].prompt
    assert forward["12/0"].prompt.endswith("Do not include any additional text or explanation in your response.\n")
    assert "What colour is the flash?" in forward["12/0"].prompt and forward["12/0"].options == ()


VIDEOMME_PROMPT = (
    "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
    "Respond with only the letter (A, B, C, or D) of the correct option.\nHow many?\nA. one\nB. two\nC. three\n"
    "D. four\n\nAnswer with the option's letter from the given choices directly."
)


@pytest.mark.parametrize("layout", ["jsonl", "parquet"])
def test_videomme(layout: str, tmp_path: Path) -> None:
    path = videomme(tmp_path / "v.jsonl") if layout == "jsonl" else videomme_parquet(tmp_path / "test.parquet")
    items, problems = load_videomme(path)
    assert [(i.qid, i.video, i.group, i.answer, i.at_s) for i in items] == [
        ("001-1", "vmme001", "short", "B", None),
        ("001-2", "vmme001", "short", "D", None),
        ("002-1", "vmme404", "long", "A", None),
    ]
    assert [p.qid for p in problems] == ["003-1"] and "answer 'E'" in problems[0].reason
    # lmms-eval's videomme_doc_to_text with videomme.yaml's post-prompt.
    first = items[0]
    assert first.prompt == VIDEOMME_PROMPT and first.rule == "videomme"
    assert first.video_dirs == (VideoDir("data"),)  # lmms-eval keeps them in videomme/data


def test_one_line_and_wrapped_files(tmp_path: Path) -> None:
    one = write_json(tmp_path / "one.jsonl", VIDEOMME_ROWS[:1], lines=True)  # a single object
    assert [i.qid for i in load_videomme(one)[0]] == ["001-1"]
    wrapped = write_json(tmp_path / "wrapped.json", {"data": VIDEOMME_ROWS[:2]})
    assert [i.qid for i in load_videomme(wrapped)[0]] == ["001-1", "001-2"]


def test_parquet_without_an_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = videomme_parquet(tmp_path / "test.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were not installed
    with pytest.raises(AnnotationError, match=r"reading Parquet needs pyarrow: pip install pyarrow"):
        load_videomme(path)


def test_mvbench(tmp_path: Path) -> None:
    items, problems = load_mvbench(mvbench(tmp_path / "json"))
    by_task = {i.task: i for i in items}
    seq = by_task["Action Sequence"]
    assert (seq.qid, seq.answer, seq.start_s, seq.end_s, seq.options) == (
        "action_sequence/0",
        "B",
        2.0,
        6.0,
        ("sat", "ran", "ate"),
    )
    # Both layouts' folders: the original's whole videos, lmms-eval's clips already cut.
    assert seq.video_dirs == (VideoDir("star/Charades_v1_480"), VideoDir("star/Charades_segment", whole=True))
    shuffle = by_task["Object Shuffle"]
    assert (shuffle.answer, shuffle.start_s, shuffle.end_s, shuffle.video_dirs) == (
        "A",
        0.0,
        None,
        (VideoDir("perception/videos"),),
    )
    episodic = by_task["Episodic Reasoning"]
    assert (episodic.frames_fps, episodic.start_s, episodic.end_s) == (3.0, 1.0, 3.0)
    assert [(p.qid, p.task) for p in problems] == [("action_sequence/1", "Action Sequence")]
    # lmms-eval's mvbench_doc_to_text with the tasks' post-prompt.
    assert (
        seq.prompt
        == "Question:What happened after the box?\nOption:\n(A) sat\n(B) ran\n(C) ate\nOnly give the best option.\n"
    )
    # The root of either layout holds json/: it is read from there too.
    assert [i.qid for i in load_mvbench(tmp_path)[0]] == [i.qid for i in items]


def test_unknown_layouts_get_one_error_naming_the_accepted_ones(tmp_path: Path) -> None:
    ovo = ovobench(tmp_path / "ovo.json")
    sb = streamingbench(tmp_path / "sb.json")
    with pytest.raises(
        AnnotationError, match=r"not in a layout StreamingBench reads. It accepts: real-time .*sequential .*proactive"
    ):
        load_streamingbench(ovo)
    with pytest.raises(AnnotationError, match=r"not in a layout OVO-Bench reads. It accepts: ovo_bench_new.json"):
        load_ovobench(sb)
    with pytest.raises(AnnotationError, match=r"not in a layout Video-MME reads. It accepts: .*Parquet"):
        load_videomme(ovo)
    with pytest.raises(AnnotationError, match=r"not in a layout MVBench reads. It accepts: one task file"):
        load_mvbench(write_json(tmp_path / "mv" / "action_count.json", [{"video": "x.mp4", "question": "?"}]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnnotationError, match=r"no MVBench task files .* It accepts"):
        load_mvbench(tmp_path / "empty")


def test_unreadable_annotation_files(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="not found"):
        load_ovobench(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(AnnotationError, match="not JSON"):
        load_videomme(tmp_path / "bad.json")
    (tmp_path / "scalar.json").write_text("42")
    with pytest.raises(AnnotationError, match="list of entries"):
        load_streamingbench(tmp_path / "scalar.json")
    (tmp_path / "v.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(AnnotationError, match="not a readable Parquet file"):
        load_videomme(tmp_path / "v.parquet")
