"""The lmms-eval plugin: lmms-eval's own evaluator runs the `hermes` model (found through
LMMS_EVAL_PLUGINS) on local tasks built from its Video-MME, MVBench and OVO-Bench configs, offline;
its answers equal `hermes eval`'s on the same questions, and lmms-eval's scorers agree with ours.

lmms-eval is installed once into an environment of its own under .cache/ (tests/lmms_env.py);
the suite's environment never gets it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hermes.engine.session import StreamingSession
from hermes.eval.formats import BENCHES
from hermes.eval.harness import EvalSettings, run_eval
from hermes.eval.lmms.answerer import StreamAnswerer, default_reindex, video_of
from hermes.eval.scorers import ovo_correct
from hermes.eval.summary import read_results
from hermes.memory.config import HermesConfig
from hermes.video.clips import make_clip
from tests.eval_helpers import VIDEOMME_ROWS, write_json
from tests.lmms_env import CORE, installed, lmms_python
from tests.test_eval_scoring import TABLE

REPO = Path(__file__).resolve().parents[1]
CONFIG = HermesConfig(budget=600, chunk_frames=4, fps=1.0, reindex="eager")
MODEL_ARGS = "pretrained=tiny,policy=hermes,budget=600,chunk_frames=4,fps=1"
MVBENCH_ROWS = [
    {"video": "ch1.mp4", "question": "What happened after the box?", "candidates": ["sat", "ran", "ate"],
     "answer": "ran", "start": 2.0, "end": 6.0},
    {"video": "ch1.mp4", "question": "And then?", "candidates": ["sat", "ran"], "answer": "sat", "start": 2.0,
     "end": 6.0},
]  # fmt: skip
OVO_FORWARD_ROWS = [
    {"id": 9, "task": "REC", "video": "videos/long.mp4", "activity": "wave a hand",
     "test_info": [{"realtime": 2, "count": 0}, {"realtime": 3, "count": 1}]},
    {"id": 12, "task": "CRR", "video": "videos/long.mp4", "question": "What colour is the flash?",
     "test_info": [{"realtime": 2, "type": 0}, {"realtime": 3, "type": 1}]},
]  # fmt: skip


def test_answerer_reads_the_memory_as_the_harness(llava_lm, lmms_layout_videos: Path, tmp_path: Path) -> None:
    """Without lmms-eval: a one-token continuation's log-probability is the harness's letter score,
    and a second request about the same video does not stream it again."""
    spec = BENCHES["videomme"]
    items, _ = spec.load(write_json(tmp_path / "v.jsonl", VIDEOMME_ROWS[:1], lines=True))
    out = tmp_path / "v.out.jsonl"
    session = StreamingSession(llava_lm, CONFIG)
    run_eval(llava_lm, spec, items, [], session, lmms_layout_videos / "videomme", out, EvalSettings(0), False)
    record = read_results(out)["001-1"]
    answerer = StreamAnswerer(llava_lm, CONFIG)
    video = str(lmms_layout_videos / "videomme" / "data" / "vmme001.mp4")
    logp, greedy = answerer.loglikelihood(video, items[0].prompt, "B")
    chunks = answerer.session.chunks_seen
    assert logp == pytest.approx(record["option_logprobs"]["B"], abs=1e-4)
    assert greedy == (int(answerer.session.first_token_logprobs(items[0].prompt).argmax()) == ord("B"))
    answerer.loglikelihood(video, items[0].prompt, "C")
    assert answerer.session.chunks_seen == chunks  # the same video does not stream again


def test_answerer_inputs() -> None:
    assert video_of(["clip.mp4"]) == "clip.mp4" and video_of("frames/") == "frames/"
    with pytest.raises(ValueError, match="one video per request"):
        video_of([Image.new("RGB", (4, 4)), Image.new("RGB", (4, 4))])
    assert [default_reindex(t) for t in ("ovo_forward", "videomme", "mvbench_action_sequence", "mmmu")] == [
        "lazy",
        "eager",
        "eager",
        "eager",
    ]


def _tasks(folder: Path, lmms_tasks: Path, data: dict[str, Path], chunks: Path) -> list[str]:
    """Local tasks that include lmms-eval's own configs and only read their documents from local files."""
    folder.mkdir()

    def task(name: str, include: str, path: Path, split: str, extra: str = "") -> None:
        (folder / f"{name}.yaml").write_text(
            f"include: {lmms_tasks / include}\ntask: {name}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    {split}: {path}\ntest_split: {split}\n{extra}"
        )

    task("videomme_hermes", "videomme/videomme.yaml", data["videomme"], "test")
    task("mvbench_hermes_action_sequence", "mvbench/mvbench_action_sequence.yaml", data["mvbench"], "train")
    # The chunked videos' folder, and short answers (the task asks 128 tokens) to keep the test quick.
    chunked = (
        f"lmms_eval_specific_kwargs:\n  default:\n    data_dir: {chunks}\n"
        "generation_kwargs:\n  max_new_tokens: 8\n  do_sample: false\n"
    )
    task("ovo_forward_hermes", "ovobench/ovo_forward.yaml", data["ovo"], "test", chunked)
    return ["videomme_hermes", "mvbench_hermes_action_sequence", "ovo_forward_hermes"]


def _text(sample: dict) -> str:
    """A generate_until sample's response, as lmms-eval logs it."""
    resp = sample["resps"][0]
    return resp[0] if isinstance(resp, list) else resp


def test_lmms_eval_runs_the_plugin_as_hermes_eval_does(llava_lm, lmms_layout_videos: Path, tmp_path: Path) -> None:
    python = lmms_python(REPO / ".cache")
    lmms_tasks = next((python.parent.parent / "lib").glob("python3*/site-packages/lmms_eval/tasks"))
    data = {
        "videomme": write_json(tmp_path / "videomme.jsonl", VIDEOMME_ROWS[:2], lines=True),
        "mvbench": write_json(tmp_path / "json" / "action_sequence.json", MVBENCH_ROWS),
        "ovo": write_json(tmp_path / "ovo_forward.jsonl", OVO_FORWARD_ROWS, lines=True),
    }
    chunks = tmp_path / "chunks"  # OVO-Bench's chunked videos: <id>_<test>.mp4, the video up to each test time
    for row in OVO_FORWARD_ROWS:
        for i, test in enumerate(row["test_info"]):
            make_clip(chunks / f"{row['id']}_{i}.mp4", test["realtime"] + 1.0, fps=4, size=(96, 64))
    tasks = _tasks(tmp_path / "tasks", lmms_tasks, data, chunks)
    video = str(lmms_layout_videos / "videomme" / "data" / "vmme001.mp4")
    context = BENCHES["videomme"].load(data["videomme"])[0][0].prompt
    config = {
        "loglikelihood": {"video": video, "context": context, "continuations": [" A", "B", " the answer"]},
        "tasks_dir": str(tmp_path / "tasks"),
        "tasks": tasks,
        # lmms-eval's process computes as this one: the same precision (its default, auto, is bf16 on
        # some processors) and as many threads (sums split over threads round differently).
        "model_args": f"{MODEL_ARGS},dtype={llava_lm.dtype_name},threads={torch.get_num_threads()}",
        "packages": list(installed([*CORE, "gradio"])),
        "table": [[row[0], row[1]] for row in TABLE],
    }
    config_path, report_path = write_json(tmp_path / "config.json", config), tmp_path / "report.json"
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "LMMS_EVAL_PLUGINS": "hermes.eval.lmms",
        "HF_HOME": str(lmms_layout_videos),  # where lmms-eval's tasks look for their videos
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    done = subprocess.run(
        [str(python), str(REPO / "tests" / "lmms_driver.py"), str(config_path), str(report_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    # lmms-eval ran on this environment's torch, transformers, ... (and left gradio alone).
    assert report["versions"] == installed(config["packages"]) and "torch" in report["versions"]

    # Video-MME and MVBench: the answers and scores of `hermes eval` on the same questions.
    runs = {
        "videomme_hermes": ("videomme", data["videomme"], "videomme", "videomme_perception_score"),
        "mvbench_hermes_action_sequence": ("mvbench", tmp_path / "json", "mvbench_video", "mvbench_accuracy"),
    }
    for task, (bench, source, folder, metric) in runs.items():
        spec = BENCHES[bench]
        videos = lmms_layout_videos / folder
        items, problems = spec.load(source)
        out = tmp_path / f"{bench}.out.jsonl"
        session = StreamingSession(llava_lm, CONFIG)
        summary = run_eval(llava_lm, spec, items, problems, session, videos, out, EvalSettings(), False)
        records = read_results(out)
        samples = {s["doc"]["question"]: s for s in report["samples"][task]}
        for item in items:
            sample = samples[item.question]
            assert sample["input"] == item.prompt  # lmms-eval's doc_to_text is the harness's prompt
            assert _text(sample) == records[item.qid]["text"], item.qid
        ours = summary["overall"]["text_accuracy"]
        assert report["results"][task][f"{metric},none"] == pytest.approx(100 * (ours or 0.0))

    # Loglikelihood requests: log p(continuation) after the whole video and the context.
    answerer = StreamAnswerer(llava_lm, CONFIG)
    expected = [answerer.loglikelihood(video, context, c) for c in config["loglikelihood"]["continuations"]]
    assert np.allclose([r[0] for r in report["loglikelihood"]], [e[0] for e in expected], atol=1e-4)
    assert [r[1] for r in report["loglikelihood"]] == [e[1] for e in expected]

    assert report["refusals"][0].startswith("unknown model_args for the hermes model: colour; it takes pretrained")
    assert report["refusals"][1].startswith("unknown policy 'nope'")

    # OVO-Bench's forward tasks: one round per test point, each on its chunk; lmms-eval's score is ours.
    accuracies = []
    for sample in report["samples"]["ovo_forward_hermes"]:
        doc, replies = sample["doc"], sample["resps"][0]
        replies = replies[0] if replies and isinstance(replies[0], list) else replies
        assert len(replies) == len(doc["test_info"])
        expected = [
            str(t["count"]) if doc["task"] == "REC" else ("Yes" if t["type"] else "No") for t in doc["test_info"]
        ]
        accuracies.append(np.mean([ovo_correct(doc["task"], r, e) for r, e in zip(replies, expected, strict=True)]))
    assert report["results"]["ovo_forward_hermes"]["forward_acc,none"] == pytest.approx(100 * np.mean(accuracies))

    # lmms-eval's own scorers read the table of crafted answers as ours do.
    verdicts = report["verdicts"]
    for row, vm, mv, ovo in zip(TABLE, verdicts["videomme"], verdicts["mvbench"], verdicts["ovobench"], strict=True):
        assert (vm[0] or None, vm[1]) == row[4], row[0]
        assert mv == ([False, False] if row[5] is None else [True, row[5][1]]), row[0]  # (counted, right)
        assert ovo == row[3][1], row[0]
