"""Annotation files in each benchmark's own layouts, for the evaluation tests (the clips they point at
are the `eval_videos` fixture of conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

FPS = 1.0  # whole seconds, so that the frames before a question time are easy to count
CHUNK = 4
SB_OPTIONS = ["A. a red frame", "B. a blue frame", "C. nothing", "D. a cat"]


def write_json(path: Path, data: object, lines: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if lines:
        path.write_text("\n".join(json.dumps(r) for r in data) + "\n")
    else:
        path.write_text(json.dumps(data))
    return path


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def frames_folder(folder: Path, n: int, size: tuple[int, int] = (48, 32)) -> Path:
    """`n` frames 00001.jpg ... whose red channel is 10 * their index, so each can be recognised."""
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        image = np.zeros((size[1], size[0], 3), dtype=np.uint8)
        image[..., 0] = 10 * k
        Image.fromarray(image).save(folder / f"{k + 1:05d}.png")
    return folder


def streamingbench(path: Path) -> Path:
    """questions_real.json's layout: three questions on one video (one malformed), a missing and a
    broken video, and an entry without questions."""
    opts = SB_OPTIONS
    return write_json(
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


def streamingbench_omni(path: Path) -> Path:
    """questions_omni.json's layout: omni-source and contextual tasks; options without letters and
    a list of six (as some released entries have), of which the prompt shows four."""
    return write_json(
        path,
        [
            {"video_path": "videos/long.mp4", "questions": [
                {"task_type": "Emotion Recognition", "question": "How does she feel?", "time_stamp": "00:00:03",
                 "answer": "C", "options": ["happy", "sad", "angry", "calm"]},
                {"task_type": "Anomaly Context Understanding", "question": "What is odd?", "time_stamp": "00:00:06",
                 "answer": "B", "options": ["A. a", "B. b", "C. c", "D. d", "E. .", "F. Translated"]},
                {"task_type": "Source Discrimination", "question": "Who speaks?", "time_stamp": "00:00:04",
                 "answer": "A", "options": ["A. he", "B. she"]},
            ]},
        ],
    )  # fmt: skip


def streamingbench_sqa(path: Path) -> Path:
    """questions_sqa.json's layout: a list of lists, one per video, asked in order."""

    def entry(t: str, question: str, answer: str) -> dict:
        return {"time": "[0:00:00 - 0:01:00]", "video_path": "videos/long.mp4", "video_categories": "sport",
                "questions": [{"task_type": "Sequential Question Answering", "question": question, "time_stamp": t,
                               "answer": answer, "options": ["Ma Lin.", "Xu xin.", "4.", "7."]}]}  # fmt: skip

    return write_json(
        path,
        [
            [entry("00:00:02", "Who serves?", "A"), entry("00:00:05", "How many points has he now?", "D")],
            [{"video_path": "Ego4D/clips/ego.mp4", "questions": [{"task_type": "Sequential Question Answering"}]}],
        ],
    )


def streamingbench_proactive(path: Path) -> Path:
    """questions_proactive.json's layout: an output expected at a time, polled from time_stamp."""
    return write_json(
        path,
        [
            {"time": "[0:00:00 - 0:00:30]", "video_path": "videos/long.mp4", "video_categories": "basketball",
             "questions": [{"task_type": "Proactive Output", "question": 'When the screen turns red, output "red".',
                            "time_stamp": "00:00:02", "ground_truth_time_stamp": "00:00:05",
                            "ground_truth_output": "red", "required_ability": "working memory"}]},
            {"video_path": "videos/long.mp4", "questions": [
                {"task_type": "Proactive Output", "question": "Too late", "time_stamp": "00:00:09",
                 "ground_truth_time_stamp": "00:00:03", "ground_truth_output": "x"}]},
        ],
    )  # fmt: skip


def ovobench(path: Path) -> Path:
    return write_json(
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


VIDEOMME_ROWS = [
    {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Astronomy", "url": "u",
     "videoID": "vmme001", "question_id": "001-1", "task_type": "Counting Problem", "question": "How many?",
     "options": ["A. one", "B. two", "C. three", "D. four"], "answer": "B"},
    {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Astronomy", "url": "u",
     "videoID": "vmme001", "question_id": "001-2", "task_type": "Action Reasoning", "question": "Why?",
     "options": ["A. one", "B. two", "C. three", "D. four"], "answer": "D"},
    {"video_id": "002", "duration": "long", "domain": "Knowledge", "sub_category": "Astronomy", "url": "u",
     "videoID": "vmme404", "question_id": "002-1", "task_type": "Action Reasoning", "question": "Gone?",
     "options": ["A. one", "B. two", "C. three", "D. four"], "answer": "A"},
    {"video_id": "003", "duration": "long", "domain": "Knowledge", "sub_category": "Astronomy", "url": "u",
     "videoID": "vmme001", "question_id": "003-1", "task_type": "Action Reasoning", "question": "Letter?",
     "options": ["A. one", "B. two", "C. three", "D. four"], "answer": "E"},
]  # fmt: skip


def videomme(path: Path) -> Path:
    """JSON lines; `videomme_parquet` writes the same rows as the released Parquet file."""
    return write_json(path, VIDEOMME_ROWS, lines=True)


def videomme_parquet(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(VIDEOMME_ROWS), path)
    return path


def mvbench(folder: Path) -> Path:
    """json/<task>.json files: a bounded task (start, end), an unbounded one, and Episodic
    Reasoning, whose clip is a folder of frames in the original layout."""
    write_json(
        folder / "action_sequence.json",
        [
            {"video": "ch1.mp4", "question": "What happened after the box?", "candidates": ["sat", "ran", "ate"],
             "answer": "ran", "start": 2.0, "end": 6.0},
            {"video": "ch1.mp4", "question": "Not a candidate", "candidates": ["a", "b"], "answer": "c"},
        ],
    )  # fmt: skip
    write_json(
        folder / "object_shuffle.json",
        [{"video": "ch1.mp4", "question": "Where is the ball?", "candidates": ["left", "right"], "answer": "left"}],
    )
    write_json(
        folder / "episodic_reasoning.json",
        [{"video": "s01e01_clip", "question": "Who came in?", "candidates": ["Ross", "Joey"], "answer": "Joey",
          "start": 1.0, "end": 3.0}],
    )  # fmt: skip
    return folder


def sharded(path: Path) -> Path:
    """Five videos (one missing), questions at times, and a malformed entry: shards of 2 get 3 + 2."""
    opts = ["A. a red frame", "B. a blue frame", "C. nothing", "D. a cat"]

    def q(at: str, answer: str) -> dict:
        return {"task_type": "Object Perception", "question": f"What at {at}?", "time_stamp": at, "answer": answer,
                "options": opts}  # fmt: skip

    return write_json(
        path,
        [
            {"video_path": "videos/long.mp4", "questions": [q("00:00:03", "A"), q("00:00:01", "B")]},
            {"video_path": "Ego4D/clips/ego.mp4", "questions": [q("00:00:02", "C")]},
            {"video_path": "videos/missing.mp4", "questions": [q("00:00:02", "A")]},
            {"video_path": "vmme001.mp4", "questions": [q("00:00:03", "B"), q("soon", "A")]},
            {"video_path": "star/Charades_v1_480/ch1.mp4", "questions": [q("00:00:01", "C")]},
        ],
    )


WRITERS = {"streamingbench": streamingbench, "ovobench": ovobench, "videomme": videomme}


def annotations(bench: str, tmp: Path) -> Path:
    if bench == "mvbench":
        return mvbench(tmp / "mvbench_json")
    return WRITERS[bench](tmp / f"{bench}.json")
