"""The evaluation harness: streaming up to each question's time (or through a proactive task's
polls), both scores of each answer, skips that are counted, named and never fatal, resuming an
interrupted run, and sharded runs."""

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
from hermes.eval.finder import VideoFinder
from hermes.eval.formats import BENCHES
from hermes.eval.harness import EvalSettings, letter_token_ids, run_eval, score_options
from hermes.eval.items import ForwardItem, Item, ProactiveItem, VideoDir
from hermes.eval.proactive import poll_times
from hermes.eval.scorers import credited, ovo_correct, proactive_correct, text_score
from hermes.eval.summary import official_scores, read_results
from hermes.memory.config import HermesConfig
from hermes.video.chunking import Chunker
from hermes.video.frames_folder import iter_video
from tests.corpus import DAMAGED_TO_THE_END
from tests.eval_helpers import (
    CHUNK,
    FPS,
    annotations,
    mvbench,
    ovobench,
    records_of,
    sharded,
    streamingbench,
    streamingbench_proactive,
    videomme,
    write_json,
)


@pytest.fixture
def session(llava_lm) -> StreamingSession:
    return StreamingSession(llava_lm, HermesConfig(budget=600, chunk_frames=CHUNK, fps=FPS), policy="hermes")


# -- scoring ----------------------------------------------------------------------------------------


def test_letter_ids_and_scores(llava_lm) -> None:
    ids = letter_token_ids(llava_lm, 4)
    # The tiny tokenizer is byte-level: "A" is byte 65, and " A" is two tokens, so it is not a letter id.
    assert ids == [[65], [66], [67], [68]]
    logp = torch.full((300,), -10.0)
    logp[66], logp[68] = -1.0, -0.5
    assert score_options(logp, [[65], [66, 67], [68]]) == {"A": -10.0, "B": -1.0, "C": -0.5}


def _item(video: str, dirs: tuple[VideoDir, ...] = (), frames_fps: float | None = None) -> Item:
    return Item("q", "t", video, "?", ("a", "b"), "A", video_dirs=dirs, frames_fps=frames_fps)


def test_video_finder(eval_videos: Path, lmms_layout_videos: Path, tmp_path: Path) -> None:
    finder = VideoFinder(eval_videos, (".mp4",))
    assert finder.find(_item("./videos/long.mp4"))[0] == eval_videos / "videos" / "long.mp4"
    assert finder.find(_item("vmme001"))[0] == eval_videos / "vmme001.mp4"  # extension added
    assert finder.find(_item("elsewhere/ego.mp4"))[0] == eval_videos / "Ego4D/clips/ego.mp4"  # by file name
    path, why = finder.find(_item("nothing.mp4"))
    assert path is None and "video not found" in why
    # MVBench: the original layout's folder, or lmms-eval's, whose clips are already cut.
    star = (VideoDir("star/Charades_v1_480"), VideoDir("star/Charades_segment", whole=True))
    path = finder.find(_item("ch1.mp4", star))[0]
    assert path == eval_videos / "star/Charades_v1_480/ch1.mp4" and not finder.whole(_item("ch1.mp4", star), path)
    lmms = VideoFinder(lmms_layout_videos / "mvbench_video", (".mp4", ".webm"))
    path = lmms.find(_item("ch1.webm", star))[0]  # another suffix: lmms-eval converted some videos to mp4
    assert path == lmms_layout_videos / "mvbench_video/star/Charades_segment/ch1.mp4"
    assert lmms.whole(_item("ch1.mp4", star), path)
    # A folder is a video where the benchmark keeps frame folders, and only there.
    tvqa = (VideoDir("tvqa/frames_fps3_hq"),)
    assert finder.find(_item("s01e01_clip", tvqa, 3.0))[0] == eval_videos / "tvqa/frames_fps3_hq/s01e01_clip"
    assert finder.find(_item("s01e01_clip", (), 3.0))[0] == eval_videos / "tvqa/frames_fps3_hq/s01e01_clip"
    assert "is a folder" in finder.find(_item("s01e01_clip", tvqa))[1]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.mp4").write_bytes(b"")
    (tmp_path / "b" / "x.mp4").write_bytes(b"")
    assert "ambiguous" in VideoFinder(tmp_path).find(_item("x.mp4"))[1]


# -- end to end ---------------------------------------------------------------------------------------


def _frames_until(item: Item, path: Path, whole: bool = False) -> int:
    """Frames a question has seen: streamed from its clip's start (the whole file when it is the
    clip already) up to its time."""
    start, end = (0.0, None) if whole else (item.start_s, item.end_s)
    frames = iter_video(path, FPS, folder_fps=item.frames_fps, start=start, end=end)
    return sum(1 for f in frames if item.at_s is None or f.t <= item.at_s)


def _check_text(item: Item, record: dict) -> None:
    """A multiple-choice record's text fields: the answer read by the rule."""
    read = text_score(item.rule, record["text"], item.answer, len(item.options))
    assert (record["text_pred"], record["text_correct"], record["text_counted"]) == (
        read.pred,
        read.correct,
        read.counted,
    )


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_eval_end_to_end(bench: str, llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    spec = BENCHES[bench]
    items, problems = spec.load(annotations(bench, tmp_path))
    out = tmp_path / "results.jsonl"
    settings = EvalSettings(max_new_tokens=3)
    summary = run_eval(llava_lm, spec, items, problems, session, eval_videos, out, settings, False)
    records = {r["qid"]: r for r in records_of(out)}
    answered = [r for r in records.values() if r["status"] == "answered"]
    assert answered, records
    finder = VideoFinder(eval_videos, spec.extensions)
    for item in items:
        record = records[item.qid]
        if record["status"] != "answered":
            continue
        # Streamed exactly up to the question's time (or the clip's end), from the clip's start.
        assert record["frames_seen"] == _frames_until(item, finder.find(item)[0])
        if isinstance(item, ForwardItem):
            _check_forward(item, record)
            continue
        scores = record["option_logprobs"]
        assert sorted(scores) == list("ABCD"[: len(item.options)])
        assert record["pred"] == max(scores, key=scores.get)
        assert record["correct"] == (record["pred"] == item.answer)
        assert isinstance(record["text"], str) and record["ttft_ms"] > 0
        _check_text(item, record)
    skipped = [r for r in records.values() if r["status"] == "skipped"]
    assert summary["skipped"] == len(skipped) == len(records) - len(answered)
    assert summary["overall"]["answered"] == len(answered)
    assert summary["overall"]["correct"] == sum(r["correct"] for r in answered)
    counted = [r for r in answered if r["text_counted"]]
    assert summary["overall"]["text_scored"] == len(counted)
    assert summary["overall"]["text_correct"] == sum(r["text_correct"] for r in counted)
    assert sum(summary["skipped_by_reason"].values()) == len(skipped)
    assert summary["not_run"] == 0
    expected_skips = {
        "streamingbench": {"malformed entry": 2, "video not found": 1, "Cannot read video": 1},
        "ovobench": {"malformed entry": 3},
        "videomme": {"malformed entry": 1, "video not found": 1},
        "mvbench": {"malformed entry": 1},
    }[bench]
    assert summary["skipped_by_reason"] == expected_skips
    # Every question that could not be used is named, with its reason.
    assert sorted((u["qid"], u["reason"]) for u in summary["unusable"]) == sorted(
        (r["qid"], r["reason"]) for r in skipped
    )


def test_a_damaged_video_answers_what_came_before_the_damage(llava_lm, session, corpus, tmp_path: Path) -> None:
    opts = ["A. one", "B. two", "C. three", "D. four"]
    questions = [
        {"task_type": "Counting Problem", "question": q, "time_stamp": t, "answer": "A", "options": opts}
        for q, t in [("Before?", "00:00:03"), ("After?", "00:00:06")]
    ]
    path = write_json(tmp_path / "damaged.json", [{"video_path": DAMAGED_TO_THE_END.name, "questions": questions}])
    spec = BENCHES["streamingbench"]
    items, _ = spec.load(path)
    out = tmp_path / "results.jsonl"
    videos = corpus[DAMAGED_TO_THE_END.name].parent
    summary = run_eval(llava_lm, spec, items, [], session, videos, out, EvalSettings(max_new_tokens=0), False)
    before, after = records_of(out)
    assert before["status"] == "answered" and before["frames_seen"] == 4  # frames at 0 to 3 s
    assert after["status"] == "skipped" and "is damaged after 0:04" in after["reason"]
    assert summary["skipped_by_reason"] == {"video damaged": 1}


def _check_forward(item: ForwardItem, record: dict) -> None:
    """A forward test point's record: the prediction and its score as OVO-Bench reads them."""
    assert record["group"] == "forward" and record["answer"] == item.answer and record["ttft_ms"] > 0
    assert record["text_correct"] == ovo_correct(item.task, record["text"], item.answer) and record["text_counted"]
    if item.task == "REC":  # a count: the digits of the generated answer
        assert record["p_yes"] is None and record["pred"] == credited("REC", record["text"], item.answer)
        assert record["correct"] == ovo_correct("REC", record["text"], item.answer)
    else:  # yes/no: from p(yes), with the model's answer words
        assert 0.0 <= record["p_yes"] <= 1.0
        assert record["pred"] == ("Yes" if record["p_yes"] > 0.5 else "No")
        assert record["correct"] == (record["pred"] == item.answer)
        assert record["text_pred"] == credited(item.task, record["text"], item.answer)


def test_ovobench_forward_scores_every_test_point(llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    spec = BENCHES["ovobench"]
    items, problems = spec.load(ovobench(tmp_path / "ovo.json"))
    out = tmp_path / "ovo.jsonl"
    settings = EvalSettings(max_new_tokens=3)
    summary = run_eval(llava_lm, spec, items, problems, session, eval_videos, out, settings, False)
    records = {r["qid"]: r for r in records_of(out)}
    forward = [i for i in items if isinstance(i, ForwardItem)]
    assert len(forward) == 9
    finder = VideoFinder(eval_videos, spec.extensions)
    for item in forward:  # every test point asked, at its own time
        record = records[item.qid]
        assert record["status"] == "answered", record
        assert record["frames_seen"] == _frames_until(item, finder.find(item)[0])
        _check_forward(item, record)
    # The summary: per task as OVO-Bench scores it, and its group averages and overall score.
    by_task: dict[str, list[bool]] = {}
    for item in forward:
        by_task.setdefault(item.task, []).append(records[item.qid]["text_correct"])
    for task, correct in by_task.items():
        assert summary["tasks"][task]["text_scored"] == len(correct)
        assert summary["tasks"][task]["text_accuracy"] == pytest.approx(sum(correct) / len(correct))
    scores = official_scores("ovobench", summary)["text"]
    assert scores["forward"] == pytest.approx(100 * np.mean([np.mean(c) for c in by_task.values()]))
    assert scores["backward"] == 100 * summary["tasks"]["EPM"]["text_accuracy"]
    assert scores["real-time"] == 100 * summary["tasks"]["OCR"]["text_accuracy"]
    assert scores["overall"] == pytest.approx(np.mean([scores["backward"], scores["real-time"], scores["forward"]]))


def _streamed(lm, config, video: Path, until_s: float, start_s: float = 0.0) -> StreamingSession:
    """A fresh session that has seen `video` from `start_s` up to `until_s` only."""
    fresh = StreamingSession(lm, config, policy="hermes")
    chunker = Chunker(CHUNK)
    for frame in iter_video(video, FPS, start=start_s):
        if frame.t > until_s:
            break
        chunk = chunker.push(frame)
        if chunk is not None:
            fresh.ingest(chunk)
    fresh.ingest(chunker.flush())
    return fresh


def test_forward_p_yes_matches_a_fresh_stream(llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    """A forward test point's p(yes) is that of a session that saw the video up to its time only."""
    spec = BENCHES["ovobench"]
    items, _ = spec.load(ovobench(tmp_path / "ovo.json"))
    item = next(i for i in items if i.qid == "11/1")  # SSR at 5 s
    out = tmp_path / "one.jsonl"
    run_eval(llava_lm, spec, [item], [], session, eval_videos, out, EvalSettings(max_new_tokens=0), False)
    record = records_of(out)[0]

    fresh = _streamed(llava_lm, session.config, eval_videos / "videos" / "long.mp4", 5.0)
    expected = AnswerWords.for_lm(llava_lm).p_yes(fresh.first_token_logprobs(item.prompt))
    assert record["p_yes"] == pytest.approx(expected, abs=1e-5)
    assert record["frames_seen"] == 6 and record["text"] == "" and record["text_pred"] is None
    assert not record["text_counted"]


def test_scores_match_a_fresh_stream(llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    """The recorded letter log-probabilities are those of a session that saw frames 0..5 s only,
    asked StreamingBench's prompt."""
    spec = BENCHES["streamingbench"]
    items, _ = spec.load(streamingbench(tmp_path / "sb.json"))
    item = next(i for i in items if i.at_s == 5.0)
    out = tmp_path / "one.jsonl"
    run_eval(llava_lm, spec, [item], [], session, eval_videos, out, EvalSettings(max_new_tokens=0), False)
    record = records_of(out)[0]

    fresh = _streamed(llava_lm, session.config, eval_videos / "videos" / "long.mp4", 5.0)
    logp = fresh.first_token_logprobs(item.prompt)
    expected = [float(logp[ord(letter)]) for letter in "ABCD"]
    assert np.allclose([record["option_logprobs"][k] for k in "ABCD"], expected, atol=1e-4)
    assert record["frames_seen"] == 6 and record["text"] == "" and record["ttft_ms"] is None


def test_proactive_polls_every_second_from_its_start(llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    """A proactive task streams from its time_stamp (2 s) and is polled at 3, 4, ... 9 s (the
    reference, 5 s, plus 4) until each reading has fired; both are scored as count.py does."""
    spec = BENCHES["streamingbench"]
    items, problems = spec.load(streamingbench_proactive(tmp_path / "p.json"))
    (item,) = items
    assert isinstance(item, ProactiveItem) and poll_times(item) == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    out = tmp_path / "p.jsonl"
    summary = run_eval(llava_lm, spec, items, problems, session, eval_videos, out, EvalSettings(2), False)
    record = read_results(out)[item.qid]
    polls = record["polls"]
    assert [p["t"] for p in polls] == poll_times(item)[: len(polls)]
    said_yes = [p["t"] for p in polls if p["reply"] is not None and "yes" in p["reply"].strip().lower()]
    assert record["text_pred"] == (said_yes[0] if said_yes else 9.0)
    likely = [p["t"] for p in polls if p["p_yes"] > 0.5]
    assert record["pred"] == (likely[0] if likely else 9.0)
    assert polls[-1]["t"] == max(record["text_pred"], record["pred"])  # no poll once both have fired
    assert (record["on_time"], record["text_correct"]) == proactive_correct(
        record["text_pred"], 5.0, record["text"], "red"
    )
    right = proactive_correct(record["pred"], 5.0, record["pred_text"], "red")
    assert (record["pred_on_time"], record["correct"]) == right
    assert record["frames_seen"] == polls[-1]["t"] - 2.0 + 1  # frames at 2, 3, ... s
    # The first poll reads the memory of 2..3 s, as a fresh stream of that clip does.
    fresh = _streamed(llava_lm, session.config, eval_videos / "videos" / "long.mp4", 3.0, start_s=2.0)
    assert polls[0]["p_yes"] == pytest.approx(
        AnswerWords.for_lm(llava_lm).p_yes(fresh.first_token_logprobs(item.prompt))
    )
    assert summary["tasks"]["Proactive Output"]["on_time_accuracy"] == float(record["on_time"])
    assert summary["skipped_by_reason"] == {"malformed entry": 1}


def test_mvbench_streams_each_layout_as_it_is_cut(
    llava_lm, session, eval_videos: Path, lmms_layout_videos: Path, tmp_path: Path
) -> None:
    """The original layout streams the bounded clips from start to end (and a frame folder at its
    3 fps); lmms-eval's holds them cut already, and they stream whole."""
    spec = BENCHES["mvbench"]
    items, problems = spec.load(mvbench(tmp_path / "json"))
    frames = {}
    for name, root in (("original", eval_videos), ("lmms-eval", lmms_layout_videos / "mvbench_video")):
        out = tmp_path / f"{name}.jsonl"
        run_eval(llava_lm, spec, items, problems, session, root, out, EvalSettings(0), False)
        records = read_results(out)
        frames[name] = {q: records[q].get("frames_seen") for q in ("action_sequence/0", "episodic_reasoning/0")}
    assert frames == {
        "original": {"action_sequence/0": 4, "episodic_reasoning/0": 2},  # 2-6 s of 8 s; 1-3 s of the frames
        "lmms-eval": {"action_sequence/0": 3, "episodic_reasoning/0": 3},  # the 3 s segments, whole
    }


def test_resume_appends_only_what_is_missing(llava_lm, session, eval_videos: Path, tmp_path: Path) -> None:
    spec = BENCHES["videomme"]
    items, problems = spec.load(videomme(tmp_path / "v.jsonl"))
    out = tmp_path / "r.jsonl"
    first = run_eval(llava_lm, spec, items, problems, session, eval_videos, out, EvalSettings(0, limit=1), False)
    assert first["overall"]["answered"] == 1 and first["questions"] == 2  # one question plus the malformed entry
    lines = out.read_text().splitlines()
    # A run killed mid-write leaves half a line; resuming drops it and appends whole lines only.
    with out.open("a") as f:
        f.write('{"qid": "001-2", "stat')
    summary = run_eval(llava_lm, spec, items, problems, session, eval_videos, out, EvalSettings(0), False)
    after = out.read_text().splitlines()
    assert after[: len(lines)] == lines
    new = [json.loads(line) for line in after[len(lines) :]]
    assert "001-1" not in {r["qid"] for r in new}  # answered before: not asked again
    assert {r["qid"] for r in new if r["status"] == "answered"} == {"001-2"}
    assert summary["overall"]["answered"] == 2 and summary["skipped"] == 2 and summary["not_run"] == 0
    assert set(read_results(out)) == {"001-1", "001-2", "002-1", "003-1"}


def test_eval_cli(llava_lm, eval_videos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    ann = ovobench(tmp_path / "ovo.json")
    out = tmp_path / "ovo.jsonl"
    argv = ["eval", "--bench", "ovobench", "--annotations", str(ann), "--videos", str(eval_videos), "--out", str(out)]
    args = parser.parse_args([*argv, "--model", "tiny", "--fps", "1", "--budget", "600", "--no-progress"])
    assert args.reindex is None and args.policy == "hermes"
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "OVO-Bench" in table and "lazy re-indexing" in table
    assert "| task | answered | text scored | text correct | text accuracy % | log-prob correct |" in table
    assert "| EPM | 1 | 1 |" in table and "| REC | 3 | 3 |" in table and "| *forward* | 9 | 9 |" in table
    assert "| **overall** | 11 | 11 |" in table
    assert "Skipped 3 of 14 questions (malformed entry: 3):\n- 10 (STU): malformed entry: gt 5" in table
    summary = json.loads((tmp_path / "ovo.summary.json").read_text())
    assert summary["settings"]["reindex"] == "lazy" and summary["skipped"] == 3
    assert set(summary["official"]) == {"text", "log-prob"}
    assert set(summary["official"]["text"]) == {"backward", "real-time", "forward", "overall"}
    assert "Score of OVO-Bench, the mean of the task accuracies per group, then of the groups" in table
    assert f"  text: backward {summary['official']['text']['backward']:.2f}" in table
    videomme_args = parser.parse_args(
        ["eval", "--bench", "videomme", "--annotations", str(ann), "--videos", str(eval_videos), "--limit", "0"]
    )
    with pytest.raises(ValueError, match="--limit"):
        videomme_args.func(videomme_args)
    # Another benchmark's file: one error line naming the layouts, before any model loads.
    from hermes.cli.main import main

    assert main(["eval", "--bench", "videomme", "--annotations", str(ann), "--videos", str(eval_videos)]) == 2
    assert capsys.readouterr().err.startswith("error: ovo.json is not in a layout Video-MME reads. It accepts: [{")
    threads_args = parser.parse_args([*argv, "--threads", "-1"])
    with pytest.raises(ValueError, match="--threads"):  # it used to be ignored
        threads_args.func(threads_args)


def test_qwen_streams_pairs_and_long_prompts_are_skipped(qwen_lm, eval_videos: Path, tmp_path: Path) -> None:
    """Qwen2.5-VL pads odd chunks to frame pairs: the frames seen still count real frames only.
    A prompt past the engine's length limit is skipped and counted, not fatal."""
    opts = ["A. yes", "B. no", "C. maybe", "D. never"]

    def q(question: str, at: str, answer: str) -> dict:
        return {"task_type": "T", "question": question, "time_stamp": at, "answer": answer, "options": opts}

    questions = [q("Now?", "00:00:04", "A"), q("x" * 2000, "00:00:06", "B"), q("Later?", "00:00:07", "B")]
    ann = write_json(tmp_path / "sb.json", [{"video_path": "videos/long.mp4", "questions": questions}])
    spec = BENCHES["streamingbench"]
    items, problems = spec.load(ann)
    session = StreamingSession(qwen_lm, HermesConfig(budget=200, chunk_frames=3, fps=FPS))
    out = tmp_path / "q.jsonl"
    summary = run_eval(qwen_lm, spec, items, problems, session, eval_videos, out, EvalSettings(0), False)
    records = {r["qid"]: r for r in records_of(out)}
    assert records["0.0"]["frames_seen"] == 5 and records["0.2"]["frames_seen"] == 8  # t = 0..4 s, then 0..7 s
    assert records["0.1"]["status"] == "skipped" and "characters long" in records["0.1"]["reason"]
    assert summary["skipped_by_reason"] == {"question too long": 1}
    assert summary["overall"]["answered"] == 2 and summary["overall"]["text_accuracy"] is None


# -- sharded across processes -----------------------------------------------------------------------


def _without_timings(records: dict[str, dict]) -> dict[str, dict]:
    return {q: {k: v for k, v in r.items() if k != "ttft_ms"} for q, r in records.items()}


def test_shards_merge_into_the_single_process_results_and_resume_alone(
    qwen_lm, eval_videos: Path, tmp_path: Path
) -> None:
    """In one process, shard by shard: each streams only its videos into its own part, the one that
    completes the set merges; a part cut short resumes on its own, and the merge is the same again."""
    from hermes.eval.shard import Shard, part_path

    spec = BENCHES["streamingbench"]
    items, problems = spec.load(sharded(tmp_path / "sb.json"))
    config = HermesConfig(budget=100, chunk_frames=2, fps=FPS)
    settings = EvalSettings(max_new_tokens=0)

    def run(out: Path, shard: Shard | None = None) -> dict | None:
        session = StreamingSession(qwen_lm, config)
        return run_eval(qwen_lm, spec, items, problems, session, eval_videos, out, settings, False, shard=shard)

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


def test_eval_sharded_by_a_launcher_equals_one_process(eval_videos: Path, tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 2 -m hermes eval ...`: two CPU processes, each with its share of the
    videos and its own results file, give exactly the predictions and the summary of one process."""
    import subprocess
    import sys

    from hermes.cli.main import main

    ann = sharded(tmp_path / "sb.json")
    common = [
        "--bench",
        "streamingbench",
        "--annotations",
        str(ann),
        "--videos",
        str(eval_videos),
        "--model",
        "tiny-qwen",
    ]
    common += ["--fps", "1", "--chunk-frames", "2", "--budget", "100", "--max-new-tokens", "2", "--no-progress"]
    # One thread each, as torchrun gives its processes: the same sums in the same order. --dtype is
    # left at auto: the processes read one kept verdict on bf16, so they compute in one precision.
    common += ["--threads", "1"]
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
