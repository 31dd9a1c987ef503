"""The second toy world: several objects at once, long clips, questions in many wordings, its model."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from hermes.engine.guidance import GLOBAL_PROMPT, LOCAL_PROMPT
from hermes.toyworld import bench
from hermes.toyworld.data import Packer, Stream
from hermes.toyworld.data2 import covered_cells, frame_label2, sample_stream2
from hermes.toyworld.files import read_events, write_clip
from hermes.toyworld.heldout2 import HeldOutSpec2, build2
from hermes.toyworld.model import tokens_per_frame
from hermes.toyworld.questions import RECALL, SIDES, Question
from hermes.toyworld.questions2 import (
    EXTRA_WORDINGS,
    HELDOUT_WORDINGS,
    TRAIN_WORDINGS,
    WHERE,
    WIDE,
    WORDINGS,
    recall,
    story,
)
from hermes.toyworld.train2 import FrameProbe2, ModelSpec2, TrainSpec2
from hermes.toyworld.world import COLOURS, WorldError
from hermes.toyworld.world2 import LANES, SHAPES2, Clip2, lane_of, make_clip2


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toy2():
    from hermes.models.loading import load_video_lm

    return load_video_lm("toy2", dtype="fp32")


def _sentences(templates: tuple[str, ...]) -> set[str]:
    """Every question the templates make."""
    return {
        t.format(shape=shape, colour=colour, where=where)
        for t in templates
        for shape in SHAPES2
        for colour in COLOURS
        for where in WHERE.values()
    }


def _words(text: str) -> set[str]:
    for mark in "?.,:":
        text = text.replace(mark, f" {mark} ")
    return set(text.lower().split())


# -- the world --------------------------------------------------------------------------------------


def test_clips_hold_several_objects_in_their_own_lanes():
    clips = [make_clip2(seed) for seed in range(20)]
    assert make_clip2(3) == make_clip2(3) and make_clip2(3) != make_clip2(4)
    assert all(c.frames == 64 for c in clips)
    counts = Counter(len(c.on_screen(t)) for c in clips for t in range(c.frames))
    assert max(counts) == 3 and counts[2] + counts[3] > counts[1]  # mostly two or three at once
    for c in clips:
        assert len({v.shape for v in c.visits}) == len(c.visits)  # "the ring" names one object
        for t in range(c.frames):
            lanes = [lane_of(v) for v in c.on_screen(t)]
            assert len(lanes) == len(set(lanes))
    still = [v.start == v.end for c in clips for v in c.visits]
    assert 0.3 < np.mean(still) < 0.7  # static stretches: about half the objects stand still


def test_each_object_stands_whole_in_one_cell_of_the_token_grid():
    # A token then shows one object or none: what it shows is its own, not pieces of two or three.
    side = 112
    for seed in range(10):
        clip = make_clip2(seed)
        empty = clip.render(-1.0).astype(int)
        for t in range(0, clip.frames, 3):
            on = clip.on_screen(t)
            cells = [covered_cells(*v.centre_at(t), v.size) for v in on]
            assert all(c and c & (c - 1) == 0 for c in cells), (seed, t)  # one cell each
            assert len(set(cells)) == len(cells)
            changed = np.abs(clip.render(t, side).astype(int) - empty).sum(-1) > 60
            drawn = {1 << (r // 28 * 4 + c // 28) for r, c in zip(*np.nonzero(changed), strict=True)}
            assert drawn == set(cells), (seed, t)  # nothing drawn outside the objects' cells
    assert make_clip2(0).visits[0].centre_at(5.0)[0] in (0.125, 0.375, 0.625, 0.875)


def test_a_frame_is_sixteen_tokens_and_each_lane_draws_its_object():
    assert tokens_per_frame(ModelSpec2.image_side, ModelSpec2.patch) == 16
    clip = make_clip2(5)
    t = next(t for t in range(clip.frames) if len(clip.on_screen(t)) >= 2)
    frame, empty = clip.render(t).astype(int), clip.render(-1.0).astype(int)
    changed = np.abs(frame - empty).sum(-1) > 60
    for lane, y in LANES.items():
        row = changed[int(y * frame.shape[0])]
        assert row.any() == (clip.in_lane(t, lane) is not None), lane
    labels = frame_label2(clip, t)
    assert len(labels) == 12 and sum(x > 0 for x in labels[0:9:3]) == len(clip.on_screen(t))
    assert [labels[9 + i] > 0 for i in range(3)] == [clip.in_lane(t, lane) is not None for lane in LANES]


def test_an_object_covers_the_cells_its_box_overlaps():
    def cells(*rc):
        return sum(1 << (r * 4 + c) for r, c in rc)

    # A box between cells, in the middle of the frame at a fifth of its height, spans two rows and
    # two columns ...
    assert covered_cells(0.5, 0.2, 0.22) == cells((0, 1), (0, 2), (1, 1), (1, 2))
    # ... at the left edge one column: it overlaps the second by a sliver, under the margin.
    assert covered_cells(0.16, 0.8, 0.22) == cells((2, 0), (3, 0))
    assert covered_cells(0.2, 0.5, 0.22) == cells((1, 0), (1, 1), (2, 0), (2, 1))
    # An object of the world stands in the middle of one cell.
    assert covered_cells(0.375, LANES["middle"], 0.2) == cells((1, 1))


def test_a_clip_file_round_trips_and_a_shared_lane_is_refused(tmp_path):
    clip = make_clip2(6)
    path = write_clip(clip, tmp_path / "clip.mp4")
    assert read_events(path) == clip and isinstance(read_events(path), Clip2)
    data = clip.to_dict()
    first, other = data["visits"][0], next(v for v in data["visits"][1:] if v["enter"] < data["visits"][0]["leave"])
    other["start"], other["end"] = list(first["start"]), list(first["end"])
    with pytest.raises(WorldError, match="share the"):
        Clip2.from_dict(data)


# -- the questions ----------------------------------------------------------------------------------


def test_held_out_wordings_are_new_sentences_of_trained_words():
    for task, wordings in HELDOUT_WORDINGS.items():
        assert wordings and not set(wordings) & set(TRAIN_WORDINGS[task]), task
    trained = set().union(*(_words(t) for ts in TRAIN_WORDINGS.values() for t in ts))
    firsts = {t.split()[0] for ts in TRAIN_WORDINGS.values() for t in ts}
    for template in (t for ts in HELDOUT_WORDINGS.values() for t in ts):
        assert _words(template) <= trained, template  # no word the model never trained on
        assert template.split()[0] in firsts, template
    assert GLOBAL_PROMPT in TRAIN_WORDINGS["REC"] and LOCAL_PROMPT in TRAIN_WORDINGS["NOW"]


def test_extra_wordings_are_trained_words_never_held_out_and_join_the_training_ones():
    trained = set().union(*(_words(t) for ts in TRAIN_WORDINGS.values() for t in ts))
    assert set(EXTRA_WORDINGS) == set(TRAIN_WORDINGS)
    for task, extra in EXTRA_WORDINGS.items():
        assert not set(extra) & (set(TRAIN_WORDINGS[task]) | set(HELDOUT_WORDINGS.get(task, ()))), task
        assert all(_words(t) <= trained for t in extra), task  # the tokenizer's words stay the stages'
        assert WORDINGS[WIDE][task] == (*TRAIN_WORDINGS[task], *extra)
    stream = sample_stream2(5, 12, 8, wording=WIDE)
    wide = _sentences(tuple(t for ts in WORDINGS[WIDE].values() for t in ts))
    assert stream.questions and all(q.wording == WIDE for q in stream.questions)
    assert all(q.text in wide for q in stream.questions)


def test_recall_answers_with_the_events_so_far():
    clip = make_clip2(7)
    first = clip.visits[0]
    assert story(clip, first.enter + 1).split(" , ")[0] == f"{first.colour} {first.shape}"
    full = story(clip, clip.frames).split(" , ")
    assert len(full) == len(clip.visits) + sum(v.change is not None for v in clip.visits)
    lm_free = recall(clip, clip.frames, np.random.default_rng(0))
    assert lm_free.answer == story(clip, clip.frames) and lm_free.task == "REC"


def test_a_held_out_set_asks_in_both_wordings(tmp_path):
    root = build2(tmp_path / "set", HeldOutSpec2(seed0=9, clips=2))
    entries = json.loads((root / "toyworld.json").read_text())
    assert {e["wording"] for e in entries} == {"train", "heldout"}
    for e in entries:
        table = HELDOUT_WORDINGS if e["wording"] == "heldout" else TRAIN_WORDINGS
        task = "EPM-first" if e["task"] == "EPM" and "first" in e["question"] else e["task"]
        assert e["question"] in _sentences(table[task]), e
    held = bench.load_heldout(root)
    assert held.frames == 64 and {q.wording for q in held.questions} == {"train", "heldout"}


# -- the model --------------------------------------------------------------------------------------


def test_the_toy2_checkpoint_loads_offline_deep_enough_and_knows_its_words(toy2):
    from transformers import AutoModelForImageTextToText

    from hermes.toyworld.paths import MODEL2_DIR

    model = AutoModelForImageTextToText.from_pretrained(MODEL2_DIR, local_files_only=True)
    assert model.config.text_config.num_hidden_layers >= 8
    assert bench.tokens_per_frame(toy2) == 16
    unk = toy2.tokenizer.unk_token_id
    for prompt in (GLOBAL_PROMPT, LOCAL_PROMPT, "What is happening right now?"):
        assert unk not in toy2.tokenizer(prompt)["input_ids"], prompt


def test_the_page_suggests_each_toy_models_questions_and_says_where_they_look(toy2):
    """The Try chips of the served model are its card's questions, in its training wordings (any other
    wording is noise to a model that reads a few templates); a model without them gets general ones."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from hermes.models.loading import load_video_lm
    from hermes.toyworld.questions import TEMPLATES
    from hermes.toyworld.world import SHAPES
    from ui import build_app
    from ui.panels import GENERAL_QUESTIONS

    def chips(lm) -> list[str]:
        (tried,) = [c for c in build_app(lm).config["components"] if c["props"].get("label") == "Try"]
        return [sample[0] for sample in tried["props"]["samples"]]

    def layers_note(lm) -> list[str]:
        return [
            c["props"]["value"]
            for c in build_app(lm).config["components"]
            if c["props"].get("elem_id") == "model-layers"
        ]

    trained2 = _sentences(tuple(q for wordings in TRAIN_WORDINGS.values() for q in wordings))
    assert toy2.card.questions and set(toy2.card.questions) <= trained2
    assert chips(toy2) == list(toy2.card.questions)
    toy = load_video_lm("toy", dtype="fp32")
    trained = {t.format(shape=s, colour=c) for t in TEMPLATES.values() for s in SHAPES for c in COLOURS}
    assert toy.card.questions and set(toy.card.questions) <= trained
    assert chips(toy) == list(toy.card.questions)
    tiny = load_video_lm("tiny", dtype="fp32")
    assert chips(tiny) == list(GENERAL_QUESTIONS)
    # The attention panel says where the served model's questions look, from its card's measured lifts.
    assert len(toy2.card.layers["evidence (backward questions)"]) == 8
    (note,) = layers_note(toy2)
    assert "measured over 8 layers" in note and "evidence (backward questions): most in layer 4 (1.51x)" in note
    assert layers_note(tiny) == []


def test_a_many_word_answer_is_scored_on_every_word(toy2):
    stream = sample_stream2(11, 12, 0)
    stream = Stream(stream.clip, 4, [recall(stream.clip, 12, np.random.default_rng(0))])
    batch = Packer(toy2, frame_label2).pack([stream], None)
    ((question, rows),) = batch.sequences
    assert len(rows) == len(question.answer.split()) + 1 and not batch.answers  # its words and the end of turn


def test_a_one_word_description_is_scored_as_a_description(toy2):
    """An empty scene ("nothing") is a description one word long, not a question with options."""
    stream = sample_stream2(11, 4, 0)
    empty = Question(RECALL, "NOW", TRAIN_WORDINGS["NOW"][0], "nothing", 4, (3, 4))
    batch = Packer(toy2, frame_label2).pack([Stream(stream.clip, 4, [empty])], None)
    ((question, rows),) = batch.sequences
    assert question is empty and len(rows) == 2 and not batch.answers


def test_the_locating_probe_asks_each_token_for_its_row_and_column():
    """Fitted by its own loss on features that name their slot, the probe's position read-out learns
    the grid: token k of a 4 x 4 frame is in row k // 4 and column k % 4."""
    torch.manual_seed(0)
    probe = FrameProbe2(16, 16, locate=True)
    features = torch.eye(16).repeat(3, 1, 1)  # 3 frames, token k is the k-th unit vector
    labels = torch.tensor([frame_label2(make_clip2(5), t) for t in range(3)])
    opt = torch.optim.Adam(probe.parameters(), lr=0.1)
    for _ in range(200):
        opt.zero_grad()
        probe.loss(features, labels).backward()
        opt.step()
    row, col = probe.where(torch.eye(16)).split(4, dim=-1)
    assert row.argmax(-1).tolist() == [k // 4 for k in range(16)]
    assert col.argmax(-1).tolist() == [k % 4 for k in range(16)]
    without = FrameProbe2(16, 16, locate=False)
    without.heads = probe.heads
    with torch.no_grad():
        # The position loss is part of the probe's loss.
        assert float(probe.loss(features, labels)) > float(without.loss(features, labels))


def test_the_identifying_probe_asks_each_token_what_each_lane_shows_in_it():
    """Fitted by its own loss on features that tell the tokens apart, the probe's per-token read-out
    gives, for each lane, the object's shape and colour in a cell the object covers and none in a
    row the lane never reaches."""
    torch.manual_seed(0)
    clip, times = make_clip2(5), (10, 20, 30)
    probe = FrameProbe2(64, 16, identify=True, side=True)
    features = torch.randn(len(times), 16, 64)
    labels = torch.tensor([frame_label2(clip, t) for t in times])
    opt = torch.optim.Adam(probe.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        probe.loss(features, labels).backward()
        opt.step()
    with torch.no_grad():
        out = probe.what(features).reshape(len(times), 16, len(LANES), -1)
    shape, colour = out[..., : len(SHAPES2) + 1].argmax(-1), out[..., len(SHAPES2) + 1 :].argmax(-1)
    side = probe.which_side(features).reshape(len(times), 16, len(LANES), 3).argmax(-1)
    far = {"top": 3, "middle": 0, "bottom": 0}  # a row the lane's objects never reach
    seen = 0
    for i, t in enumerate(times):
        for j, lane in enumerate(LANES):
            v = clip.in_lane(t, lane)
            if v is None:
                assert (shape[i, :, j] == 0).all() and (side[i, :, j] == 0).all()
                continue
            cx, cy = v.centre_at(t)
            centre = int(cy * 4) * 4 + int(cx * 4)
            assert int(shape[i, centre, j]) == 1 + SHAPES2.index(v.shape), (t, lane)
            assert int(colour[i, centre, j]) == 1 + list(COLOURS).index(v.colour_at(t)), (t, lane)
            assert int(side[i, centre, j]) == 1 + SIDES.index(v.side_at(t)), (t, lane)
            assert (shape[i, far[lane] * 4 : far[lane] * 4 + 4, j] == 0).all()
            seen += 1
    assert seen >= 5


def test_validation_asks_its_clips_again_in_the_held_out_wordings():
    """Training's validation scores each task twice: in training words and, on the same clips, in the
    held-out wordings (which no training step draws)."""
    from hermes.toyworld.train import Stage
    from hermes.toyworld.train2 import Trainer2

    spec = TrainSpec2(pretrain_steps=0, stages=(Stage(1, (2, 3), 3),), batch=2, val_streams=2, val_frames=12)
    trainer = Trainer2(spec, log=lambda line: None)
    trained, new = trainer.val, trainer.val_new_words
    assert [s.clip for s in new] == [s.clip for s in trained]
    old = [q for s in trained for q in s.questions]
    asked = [q for s in new for q in s.questions]
    assert {q.wording for q in old} == {"train"} and {q.wording for q in asked} == {"heldout"}
    held_out = {
        t.format(where=w, shape=s, colour=c)
        for ts in HELDOUT_WORDINGS.values()
        for t in ts
        for w in WHERE.values()
        for s in SHAPES2
        for c in COLOURS
    }
    assert asked and all(q.text in held_out for q in asked)
    scores = trainer.validate()
    assert {k for k in scores if not k.endswith(" new words")} == {q.task for q in old}
    assert {k for k in scores if k.endswith(" new words")} == {f"{q.task} new words" for q in asked}
    assert all(0.0 <= v <= 1.0 for v in scores.values())


def test_the_polish_trains_the_language_model_alone_from_a_checkpoint_of_the_same_stages(tmp_path):
    """`--from`: a checkpoint of the recipe's stages (by its record's settings hash) is polished
    without training the stages again; the vision tower stays as it was; any other checkpoint is refused."""
    from dataclasses import replace

    from hermes.models.loading import load_video_lm
    from hermes.toyworld.recipe import RECORD
    from hermes.toyworld.train import Stage
    from hermes.toyworld.train2 import Polish, Trainer2

    tiny = ModelSpec2(layers=2, hidden=32, intermediate=64)
    spec = TrainSpec2(
        model=tiny,
        pretrain_steps=0,
        stages=(Stage(1, (2, 3), 3),),
        batch=2,
        val_streams=1,
        val_frames=8,
        polish=Polish(steps=2, frames=(4, 6), questions=3, batch=1, warmup=1),
    )
    stages = replace(spec, polish=None)
    start = tmp_path / "stages"
    curve = Trainer2(stages, log=lambda line: None).run(start)
    (start / RECORD).write_text(json.dumps({"settings_hash": stages.settings_hash(), "curve": curve}))

    polished = Trainer2(spec, log=lambda line: None)
    polished.run(tmp_path / "polished", start=start)
    old = load_video_lm(str(start), dtype="fp32").model.state_dict()
    new = load_video_lm(str(tmp_path / "polished"), dtype="fp32").model.state_dict()
    vision = [k for k in old if "vision_tower" in k or "multi_modal_projector" in k]
    language = [k for k in old if "language_model" in k]
    assert vision and all(torch.equal(old[k], new[k]) for k in vision)
    assert any(not torch.equal(old[k], new[k]) for k in language)
    assert [p["polish_step"] for p in polished.curve if "polish_step" in p] == [2]
    assert polished.curve[: len(curve)] == curve

    other = replace(spec, train_seed0=1)
    with pytest.raises(ValueError, match="not this recipe's stages"):
        Trainer2(other, log=lambda line: None).run(start=start)
    assert spec.settings_hash() != stages.settings_hash()


def test_the_committed_toy2_model_is_the_recipes_and_meets_its_record():
    """The committed checkpoint has the recipe's settings hash, and the packed pass over the held-out
    clips (what the full cache gives) agrees with the engine's scores the training run recorded."""
    from hermes.toyworld.paths import HELDOUT2_DIR, MODEL2_DIR
    from hermes.toyworld.recipe import RECORD, packed_scores

    record = json.loads((MODEL2_DIR / RECORD).read_text())
    assert record["settings_hash"] == TrainSpec2().settings_hash()
    scores = packed_scores(MODEL2_DIR, HELDOUT2_DIR)
    recorded = record["heldout"]["full"]
    assert recorded["real-time"][0] == pytest.approx(scores["real-time"], abs=0.01)
    assert recorded["backward"][0] == pytest.approx(scores["backward"], abs=0.01)


def test_toy2s_own_samples_are_rebuilt_as_committed_and_show_fifo_forgetting(toy2, tmp_path):
    """The app's v2 clips: `build_samples` remakes the committed first one (same clip, questions in
    training wordings, same answers), and on it the full cache and HERMES answer an early backward
    question right where FIFO does not, with every question about the present right."""
    from hermes.models.loading import SAMPLES_FILE, TOY2_SAMPLES
    from hermes.serving.samples import bundled_samples
    from hermes.toyworld.samples import build_samples

    committed = json.loads((TOY2_SAMPLES / SAMPLES_FILE).read_text())
    assert len(committed) == 3 and toy2.card.samples
    assert next(iter(bundled_samples(toy2).values())).path.parent == TOY2_SAMPLES
    (rebuilt,) = json.loads(
        (build_samples(tmp_path, toy2, toy2.card.stream, keep=1, world="v2") / SAMPLES_FILE).read_text()
    )
    assert rebuilt == committed[0]
    trained = _sentences(tuple(t for ts in TRAIN_WORDINGS.values() for t in ts))
    asked = rebuilt["questions"]
    assert all(q["text"] in trained for q in asked) and rebuilt["watch"]["text"] in trained
    assert any(
        q["kind"] == "backward"
        and q["answers"]["full"] == q["answers"]["hermes"] == q["answer"] != q["answers"]["fifo"]
        for q in asked
    )
    now = [q for q in asked if q["kind"] == "real-time"]
    assert now and all(q["answers"]["full"] == q["answer"] for q in now)


def test_the_bench_runs_on_the_second_world(toy2):
    from hermes.toyworld.paths import HELDOUT2_DIR

    held = bench.load_heldout(HELDOUT2_DIR)
    assert bench.stream_tokens(toy2, held) == 64 * 16 + 16
    results = bench.run(toy2, held, ["full", "fifo"], [260], videos=1)
    rows = results[("fifo", 260)].questions
    assert rows and all(len(r["newest_held"]) == 8 for r in rows)
    assert {w for w, _ in bench.wording_scores(rows)} == {"train", "heldout"}
    assert "held-out" in bench.render_wordings(results)
    assert {"OJR", "ATR", "STU", "EPM", "HLD"} <= set(bench.task_scores(rows))
    assert "| all | full |" in bench.render_tasks(results)


def test_task_scores_split_a_two_answer_task_by_its_answer():
    """A model that says yes to every "did you see" question is at 50% on the task, 100% and 0% on
    its answers; tasks come in the benchmark's order, each answer after its task."""

    def row(video: str, task: str, answer: str, pred: str) -> dict:
        return {"video": video, "task": task, "answer": answer, "correct": answer == pred}

    rows = [row(f"v{i}", "HLD", a, "yes") for i in range(4) for a in ("yes", "no")]
    rows += [row("v0", "ATR", "red", "red"), row("v1", "ATR", "blue", "red")]
    scores = bench.task_scores(rows)
    assert list(scores) == ["ATR", "HLD", "HLD no", "HLD yes"]
    assert [scores[k][0] for k in scores] == [0.5, 0.5, 0.0, 1.0]
    assert scores["HLD yes"][1:] == (1.0, 1.0)  # every clip agrees: a zero-width interval
    table = bench.render_tasks({("full", None): bench.Answers(questions=rows)})
    assert table.splitlines()[0] == "| budget | policy | ATR | HLD | HLD no | HLD yes |"
    assert table.splitlines()[2] == "| all | full | 50.0 (0-100) | 50.0 (50-50) | 0.0 (0-0) | 100.0 (100-100) |"
