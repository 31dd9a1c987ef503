"""MVBench's task files and its two video layouts, read into questions with lmms-eval's prompt.

Annotations: one JSON per task, [{video, question, candidates, answer (the candidate's text),
start?, end?}], as released in MVBench's `json/` folder (the same files in both layouts). The
videos sit in a folder per task under the video root, named differently in the two layouts:

- the original release (OpenGVLab's MVBench loader): `star/Charades_v1_480`, ..., whole source
  videos cut at `start`-`end` for the tasks that have bounds, and `tvqa/frames_fps3_hq/<clip>/`, a
  folder of frames (00001.jpg, ...) at 3 fps, for Episodic Reasoning;
- lmms-eval's (`lmms_eval/tasks/mvbench/utils.py`, DATA_LIST): `star/Charades_segment`,
  `tvqa/video_fps3_hq_segment`, ..., where those clips are already cut, so they stream whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.eval.items import (
    LETTERS,
    AnnotationError,
    EntryError,
    Item,
    Problem,
    VideoDir,
    check_layout,
    collect,
    load_data,
    parse_time,
    raw_options,
    records,
    text_field,
)
from hermes.eval.prompts import mvbench_prompt


@dataclass(frozen=True)
class MVBenchTask:
    """A task's name, its folders in the original and in lmms-eval's layout, whether its questions
    are bounded by start and end (the original loader's flag), and its frames' rate when the
    original keeps it as frame folders."""

    name: str
    original: str
    lmms: str
    bounded: bool = False
    frames_fps: float | None = None

    def video_dirs(self) -> tuple[VideoDir, ...]:
        if self.lmms == self.original:
            return (VideoDir(self.original),)
        return VideoDir(self.original), VideoDir(self.lmms, whole=True)


_CLEVRER, _PERCEPTION, _STAR = "clevrer/video_validation", "perception/videos", "star/Charades_v1_480"
MVBENCH_TASKS: dict[str, MVBenchTask] = {
    "action_sequence": MVBenchTask("Action Sequence", _STAR, "star/Charades_segment", bounded=True),
    "action_prediction": MVBenchTask("Action Prediction", _STAR, "star/Charades_segment", bounded=True),
    "action_antonym": MVBenchTask("Action Antonym", "ssv2_video", "ssv2_video_mp4"),
    "fine_grained_action": MVBenchTask(
        "Fine-grained Action", "Moments_in_Time_Raw/videos", "Moments_in_Time_Raw/videos"
    ),
    "unexpected_action": MVBenchTask("Unexpected Action", "FunQA_test/test", "FunQA_test/test"),
    "object_existence": MVBenchTask("Object Existence", _CLEVRER, _CLEVRER),
    "object_interaction": MVBenchTask("Object Interaction", _STAR, "star/Charades_segment", bounded=True),
    "object_shuffle": MVBenchTask("Object Shuffle", _PERCEPTION, _PERCEPTION),
    "moving_direction": MVBenchTask("Moving Direction", _CLEVRER, _CLEVRER),
    "action_localization": MVBenchTask("Action Localization", "sta/sta_video", "sta/sta_video_segment", bounded=True),
    "scene_transition": MVBenchTask("Scene Transition", "scene_qa/video", "scene_qa/video"),
    "action_count": MVBenchTask("Action Count", _PERCEPTION, _PERCEPTION),
    "moving_count": MVBenchTask("Moving Count", _CLEVRER, _CLEVRER),
    "moving_attribute": MVBenchTask("Moving Attribute", _CLEVRER, _CLEVRER),
    "state_change": MVBenchTask("State Change", _PERCEPTION, _PERCEPTION),
    "fine_grained_pose": MVBenchTask("Fine-grained Pose", "nturgbd", "nturgbd_convert"),
    "character_order": MVBenchTask("Character Order", _PERCEPTION, _PERCEPTION),
    "egocentric_navigation": MVBenchTask("Egocentric Navigation", "vlnqa", "vlnqa"),
    "episodic_reasoning": MVBenchTask(
        "Episodic Reasoning", "tvqa/frames_fps3_hq", "tvqa/video_fps3_hq_segment", bounded=True, frames_fps=3.0
    ),
    "counterfactual_inference": MVBenchTask("Counterfactual Inference", _CLEVRER, _CLEVRER),
}
LAYOUTS = (
    "one task file [{video, question, candidates, answer, start?, end?}] (MVBench's json/<task>.json), a folder "
    "of them, or a folder holding json/"
)


def task_files(path: Path) -> list[Path]:
    """The task files of an annotation path: a file, a folder of them, or a folder with json/."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.json"))
    if not files and (path / "json").is_dir():
        files = sorted((path / "json").glob("*.json"))
    if not files:
        raise AnnotationError(f"no MVBench task files (*.json) in {path}. It accepts: {LAYOUTS}")
    return files


def _bound(entry: dict, key: str) -> float | None:
    return parse_time(entry[key]) if entry.get(key) is not None else None


def load_mvbench(path: str | Path) -> tuple[list[Item], list[Problem]]:
    """MVBench: one task per JSON file; answers given as the candidate's text."""
    items: list[Item] = []
    problems: list[Problem] = []
    for file in task_files(Path(path)):
        # A file that is not one of the twenty tasks keeps its own name, and its bounds when it has them.
        task = MVBENCH_TASKS.get(file.stem, MVBenchTask(file.stem, "", "", bounded=True))
        entries = records(load_data(file), file)
        check_layout(entries, file, ("candidates",), "MVBench", LAYOUTS)

        def parse(index: int, entry: Any, task: MVBenchTask = task, stem: str = file.stem) -> list[Item]:
            candidates = raw_options(entry, "candidates")
            answer = entry.get("answer")
            if answer not in candidates:  # lmms-eval finds the answer's letter by `candidate == answer`
                raise EntryError(f"answer {answer!r} is not one of the candidates")
            start_s = _bound(entry, "start") if task.bounded else None
            end_s = _bound(entry, "end") if task.bounded else None
            if start_s is not None and end_s is not None and end_s <= start_s:
                raise EntryError(f"end {entry['end']!r} is not after start {entry['start']!r}")
            question = text_field(entry, "question")
            return [
                Item(
                    qid=f"{stem}/{index}",
                    task=task.name,
                    video=text_field(entry, "video"),
                    question=question,
                    options=tuple(candidates),
                    answer=LETTERS[candidates.index(answer)],
                    prompt=mvbench_prompt(entry["question"], candidates),
                    rule="mvbench",
                    start_s=start_s or 0.0,
                    end_s=end_s,
                    video_dirs=task.video_dirs() if task.original else (),
                    frames_fps=task.frames_fps,
                )
            ]

        found, bad = collect(entries, parse, lambda i, e, stem=file.stem: f"{stem}/{i}")
        items += found
        problems += [Problem(p.qid, task.name, p.reason) for p in bad]
    return items, problems
