"""The toy world: clips, files, questions, the toy model's tokenizer and training, and the benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes.engine.chunk import Chunk
from hermes.engine.session import StreamingSession
from hermes.engine.watch import AnswerWords
from hermes.memory.config import HermesConfig
from hermes.models.loading import wrap
from hermes.toyworld import bench
from hermes.toyworld.data import Packer, block_mask, like_h264, sample_stream
from hermes.toyworld.files import ToyWorldError, events_path, read_events, write_clip
from hermes.toyworld.heldout import HeldOutSpec, build
from hermes.toyworld.model import TOKENS_PER_FRAME, ModelSpec, build_model, save
from hermes.toyworld.questions import AGES, BACKWARD, backward, real_time, shown, standing
from hermes.toyworld.train import Stage, Trainer, TrainSpec, target_logits
from hermes.toyworld.world import SHAPES, WORLD_FPS, Clip, WorldSpec, check_clip, make_clip
from hermes.video.decoding import iter_frames

SMALL_MODEL = ModelSpec(layers=3, hidden=32, heads=2, kv_heads=1, intermediate=64, vision_hidden=16, vision_heads=1)


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread for each test (after conftest's fixture sets the session's count): the toy
    model's matrices are small, and on a shared 2-core machine a second thread only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    """An untrained toy model (small sizes), saved as any checkpoint."""
    model, processor = build_model(SMALL_MODEL, seed=0)
    return save(model, processor, tmp_path_factory.mktemp("toy") / "model")


@pytest.fixture(scope="module")
def toy_lm(toy_dir):
    """The untrained toy model, loaded through the real loading path."""
    from hermes.models.loading import load_video_lm

    return load_video_lm(str(toy_dir), dtype="fp32")


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory) -> Path:
    """Two held-out-style clips with their questions."""
    return build(tmp_path_factory.mktemp("toyset"), HeldOutSpec(seed0=5, clips=2))


# -- the world --------------------------------------------------------------------------------------


def test_a_seed_fixes_the_clip_and_its_events():
    a, b, c = make_clip(7), make_clip(7), make_clip(8)
    assert a == b and a != c
    assert np.array_equal(a.render_steps(), b.render_steps())
    check_clip(a)
    assert [e["t"] for e in a.events()] == sorted(e["t"] for e in a.events())
    assert len({v.shape for v in a.visits}) == len(a.visits)  # each shape at most once: "the square" is one object


def test_frames_show_what_the_events_say():
    clip = make_clip(3)
    for t in range(clip.frames):
        frame, v = clip.render(t), clip.visible(t)
        background = clip.render(-1.0)  # nothing on screen before the clip
        changed = np.abs(frame.astype(int) - background.astype(int)).sum(-1) > 60
        assert changed.any() == (v is not None), t
        if v is not None:
            xs = np.nonzero(changed)[1]
            cx = xs.mean() / frame.shape[1]
            assert abs(cx - v.centre_at(t)[0]) < 0.08  # the drawn object sits where the world says


def test_world_settings_are_checked():
    with pytest.raises(ValueError, match="cannot hold"):
        WorldSpec(frames=5, min_visits=3, min_stay=4)


# -- files ------------------------------------------------------------------------------------------


def test_a_clip_file_decodes_to_the_world_frames(tmp_path):
    clip = make_clip(11)
    path = write_clip(clip, tmp_path / "clip.mp4")
    assert read_events(path) == clip
    frames = list(iter_frames(path, WORLD_FPS))
    assert [f.t for f in frames] == pytest.approx(list(range(clip.frames)))
    decoded = np.stack([f.image for f in frames]).astype(int)
    # H.264 halves the colour resolution: the frames match the world drawn that way closely
    assert np.abs(decoded - like_h264(clip.render_steps())).mean() < 3.0


def test_a_broken_events_file_is_refused_with_its_reason(tmp_path):
    path = write_clip(make_clip(12), tmp_path / "clip.mp4")
    events = events_path(path)
    doc = json.loads(events.read_text())
    doc["events"][0]["colour"] = "purple"
    events.write_text(json.dumps(doc))
    with pytest.raises(ToyWorldError, match="do not follow from its clip"):
        read_events(path)
    events.write_text("{not json")
    with pytest.raises(ToyWorldError, match="not JSON"):
        read_events(path)
    events.unlink()
    with pytest.raises(ToyWorldError, match="no events file"):
        read_events(path)


def test_an_impossible_clip_description_is_refused():
    data = make_clip(13).to_dict()
    data["visits"][1]["shape"] = data["visits"][0]["shape"]
    with pytest.raises(ValueError, match="repeated shape"):
        Clip.from_dict(data)


# -- questions --------------------------------------------------------------------------------------


def test_backward_evidence_is_off_screen_when_asked():
    rng = np.random.default_rng(0)
    for seed in range(20):
        clip = make_clip(seed)
        for at in range(8, clip.frames + 1, 4):
            for q in backward(clip, at, rng):
                first, end = q.evidence
                assert end <= at - 1 and first < end  # the newest frame never holds the answer
                assert q.age in AGES
                if q.task == "HLD":
                    colour, shape = q.text.removeprefix("Did you see a ").rstrip("?").split()
                    assert (q.answer == "yes") == bool({t for t in shown(clip, colour, shape) if t < at})


def test_real_time_answers_read_the_newest_frame():
    rng = np.random.default_rng(0)
    clip = make_clip(21)
    for at in range(1, clip.frames + 1):
        v = clip.visible(at - 1)
        q = real_time(clip, "ATR", at, rng)
        assert (q is None) == (v is None)
        if q is not None:
            assert q.answer == v.colour_at(at - 1) and v.shape in q.text


def test_a_standing_question_is_true_exactly_while_shown():
    clip = make_clip(4)
    v = clip.visits[0]
    q = standing(clip, v.colour, v.shape)
    assert q.true_at == frozenset(t for t in range(v.enter, v.leave) if v.colour_at(t) == v.colour)
    assert q.onsets()[0] == v.enter


# -- the model --------------------------------------------------------------------------------------


def test_the_tokenizer_knows_the_world_and_the_chat_template(toy_lm):
    tok = toy_lm.tokenizer
    ids = toy_lm.question_ids("What colour was the square?")[0].tolist()
    assert tok.unk_token_id not in ids
    assert tok.convert_ids_to_tokens(ids)[:3] == ["\n", "What", "colour"]
    assert tok.unk_token_id in toy_lm.encode("Recall the story")[0].tolist()  # guidance words are unknown
    words = AnswerWords.for_lm(toy_lm)
    assert set(words.yes) == {tok.convert_tokens_to_ids(w) for w in ("yes", "Yes")}
    assert toy_lm.decode([tok.convert_tokens_to_ids("red")]) == "red"


def test_a_frame_is_four_tokens_and_a_chunk_ends_with_a_newline(toy_lm):
    frames = make_clip(1).render_steps(steps=4)
    inputs = toy_lm.chunk_inputs(frames, WORLD_FPS)
    assert inputs.num_tokens == 4 * TOKENS_PER_FRAME + 1
    assert bench.tokens_per_frame(toy_lm) == TOKENS_PER_FRAME


def test_every_policy_streams_the_toy_model(toy_lm):
    clip = make_clip(2)
    frames = clip.render_steps()
    for policy in bench.benchmark_policies():
        session = StreamingSession(toy_lm, HermesConfig(budget=24, chunk_frames=4, fps=WORLD_FPS), policy=policy)
        session.standing.add("Is there a red square?")
        for start in range(0, 16, 4):
            ids = np.arange(start, start + 4)
            report = session.ingest(Chunk(frames[start : start + 4], ids.astype(float), ids, ids))
        assert report.watches and 0.0 <= report.watches[0].p_yes <= 1.0
        assert max(session.memory.video_tokens_per_layer()) <= (24 + 1 if policy != "full" else 4 * 17)
        session.ask("What colour was the square?", 2)


# -- training ---------------------------------------------------------------------------------------


def test_one_pass_gives_each_question_what_the_full_cache_gives_it(toy_lm):
    """The packed pass (every question after the whole stream, under the block mask) equals asking
    the engine's full cache at each question's time."""
    stream = sample_stream(5, 12, 6)
    packer = Packer(toy_lm)
    batch = packer.pack([stream], None)
    with torch.no_grad():
        logits, _ = target_logits(toy_lm.model, batch)
    packed = torch.log_softmax(logits[batch.answer_targets].float(), -1)
    frames = like_h264(stream.clip.render_steps())
    for j, q in enumerate(stream.questions):
        session = StreamingSession(toy_lm, HermesConfig(chunk_frames=stream.chunk, fps=WORLD_FPS), policy="full")
        for start in range(0, q.at, stream.chunk):
            ids = np.arange(start, min(start + stream.chunk, q.at))
            session.ingest(Chunk(frames[ids], ids.astype(float), ids, ids))
        assert torch.allclose(session.first_token_logprobs(q.text), packed[j], atol=1e-4), q


def test_the_block_mask_hides_later_chunks_and_other_questions():
    group = torch.tensor([[-1, -1, -1, 0, 0, 1, 1]])
    limit = torch.tensor([[1, 2, 3, 2, 2, 3, 3]])
    mask = block_mask(group, limit)[0, 0]
    assert mask[3].tolist() == [True, True, False, True, False, False, False]
    assert mask[6].tolist() == [True, True, True, False, False, True, True]
    assert mask[2].tolist() == [True, True, True, False, False, False, False]


def test_a_short_training_run_lowers_the_loss():
    spec = TrainSpec(
        model=SMALL_MODEL,
        pretrain_steps=2,
        pretrain_frames=8,
        stages=(Stage(24, (2, 4), 4),),
        batch=4,
        lr=3e-3,
        warmup=4,
        val_streams=2,
        val_frames=4,
    )
    trainer = Trainer(spec, log=lambda line: None)
    first = np.mean([trainer.step(s) for s in range(4)])
    for s in range(4, 20):
        trainer.step(s)
    last = np.mean([trainer.step(s) for s in range(20, 24)])
    assert last < 0.8 * first


def test_training_is_deterministic():
    spec = TrainSpec(
        model=SMALL_MODEL,
        pretrain_steps=2,
        pretrain_frames=4,
        stages=(Stage(3, (2, 3), 3),),
        batch=2,
        val_streams=1,
        val_frames=2,
    )
    runs = []
    for _ in range(2):
        trainer = Trainer(spec, log=lambda line: None)
        runs.append([trainer.pretrain_step(s) for s in range(2)] + [trainer.step(s) for s in range(3)])
        runs[-1].append(float(sum(p.detach().double().sum() for p in trainer.model.parameters())))
    assert runs[0] == runs[1]


def test_the_settings_hash_follows_every_setting():
    base = TrainSpec()
    assert base.settings_hash() == TrainSpec().settings_hash()
    assert TrainSpec(train_seed0=1).settings_hash() != base.settings_hash()
    assert TrainSpec(model=ModelSpec(hidden=32)).settings_hash() != base.settings_hash()


# -- the benchmark ----------------------------------------------------------------------------------


def test_the_benchmark_lists_every_registered_policy():
    from hermes.engine.methods import policy_names

    names = bench.benchmark_policies()
    assert names[0] == "full" and "hermes+dtd" in names
    assert {n for n in policy_names() if "+" not in n} <= set(names)


def test_the_benchmark_scores_every_policy_on_a_small_set(toy_lm, tiny_set):
    held = bench.load_heldout(tiny_set)
    budgets = bench.default_budgets(toy_lm, held)
    assert budgets == [136 // 8, 136 // 4, 136 // 2]
    policies = bench.benchmark_policies()
    results = bench.run(toy_lm, held, policies, budgets[1:2])
    assert set(results) == {("full", None)} | {(p, budgets[1]) for p in policies if p != "full"}
    summaries = {key: bench.summarize(held, answers) for key, answers in results.items()}
    full, fifo = summaries[("full", None)], summaries[("fifo", budgets[1])]
    assert full["questions"]["backward"] == len([q for q in held.questions if q.kind == BACKWARD])
    assert fifo["cache_kib"] < full["cache_kib"]
    table = bench.render_table(held, summaries, 136)
    assert table.count("\n") == 2 + len(summaries) and "*chance*" in table


def test_bad_toy_world_input_gets_one_clear_error(toy_lm, tiny_set, tmp_path):
    import shutil

    broken = tmp_path / "set"
    shutil.copytree(tiny_set, broken)
    entries = json.loads((broken / "toyworld.json").read_text())
    entries[0]["kind"] = "sideways"
    (broken / "toyworld.json").write_text(json.dumps(entries))
    with pytest.raises(ToyWorldError, match="unknown question kind 'sideways'"):
        bench.load_heldout(broken)
    with pytest.raises(ValueError, match="too small for one frame"):
        bench.check_budgets(toy_lm, [34, TOKENS_PER_FRAME - 1])


@pytest.mark.parametrize("case", ["events", "kind", "budget"])
def test_the_cli_says_what_is_wrong_in_one_line(toy_dir, tiny_set, tmp_path, case):
    import shutil

    broken = tmp_path / "set"
    shutil.copytree(tiny_set, broken)
    args = ["--model", str(toy_dir), "--heldout", str(broken), "--clips", "1", "--no-progress"]
    args += ["--out", str(tmp_path / "r.json")]
    if case == "events":
        events_path(broken / "videos" / "toy_000.mp4").write_text("{}")
        expected = "not a toy-world events file"
    elif case == "kind":
        entries = json.loads((broken / "toyworld.json").read_text())
        entries[-1]["kind"] = "sideways"
        (broken / "toyworld.json").write_text(json.dumps(entries))
        expected = "unknown question kind"
    else:
        args += ["--budgets", "2"]
        expected = "too small for one frame"
    proc = subprocess.run(
        [sys.executable, "-m", "hermes", "toyworld", "bench", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_the_held_out_set_is_in_ovo_benchs_layout(tiny_set):
    from hermes.eval.formats import load_ovobench

    items, problems = load_ovobench(tiny_set / "toyworld.json")
    entries = json.loads((tiny_set / "toyworld.json").read_text())
    assert not problems
    forward = [e for e in entries if e["kind"] == "forward"]
    assert len(items) == len(entries) - len(forward) + sum(len(e["test_info"]) for e in forward)
    assert {e["video"] for e in entries} == {"videos/toy_000.mp4", "videos/toy_001.mp4"}


def test_toy_clips_use_every_shape_over_a_set():
    shapes = {v.shape for seed in range(10) for v in make_clip(seed).visits}
    assert shapes == set(SHAPES)


def test_the_toy_alias_loads_the_committed_model():
    from hermes.models.loading import TOY_MODEL_DIR, load_video_lm

    assert (TOY_MODEL_DIR / "config.json").is_file()
    lm = load_video_lm("toy")
    assert lm.arch == "llava_onevision" and not lm.random_weights
    assert wrap(lm.model, lm.processor).tokenizer.convert_tokens_to_ids("square") != lm.tokenizer.unk_token_id


def test_the_committed_toy_model_is_the_recipes_and_remembers():
    """The committed checkpoint was made with the settings the script records (their hash: config and
    data seeds), and with the full cache it answers the held-out clips, decoded from their files, at
    least 95% real-time and 90% backward (the packed pass: what the full cache gives, in seconds)."""
    from hermes.toyworld.paths import HELDOUT_DIR, MODEL_DIR
    from hermes.toyworld.recipe import RECORD, packed_scores

    record = json.loads((MODEL_DIR / RECORD).read_text())
    assert record["settings_hash"] == TrainSpec().settings_hash()
    held = bench.load_heldout(HELDOUT_DIR)
    assert [sum(q.kind == k for q in held.questions) for k in ("real-time", "backward")] == [360, 360]
    scores = packed_scores(MODEL_DIR, HELDOUT_DIR)
    assert scores["real-time"] >= 0.95 and scores["backward"] >= 0.90, scores
    recorded = record["heldout"]["full"]  # the engine's full cache, scored by the recorded run
    assert recorded["real-time"][0] == pytest.approx(scores["real-time"], abs=0.01)
    assert recorded["backward"][0] == pytest.approx(scores["backward"], abs=0.01)


@pytest.mark.timeout(900)  # 60 streams of the toy model: about 20 s on an idle machine
def test_fifo_forgets_early_evidence_that_full_keeps():
    """At a quarter of a stream, fifo answers early-evidence backward questions near chance and the
    full cache does not: the world is hard enough for the benchmark to tell memories apart."""
    from hermes.models.loading import load_video_lm
    from hermes.toyworld.paths import HELDOUT_DIR

    lm = load_video_lm("toy", dtype="fp32")
    held = bench.load_heldout(HELDOUT_DIR)
    quarter = bench.default_budgets(lm, held)[1]
    results = bench.run(lm, held, ["full", "fifo"], [quarter], videos=30)
    summaries = {key: bench.summarize(held, answers) for key, answers in results.items()}
    check = bench.forgetting_check(summaries, [quarter], bench.stream_tokens(lm, held), bench.chance(held))
    assert check is not None and check.met, check


def test_the_model_card_sets_the_apps_defaults_and_a_broken_one_is_refused(toy_dir, tmp_path):
    import shutil

    from hermes.models.card import CARD_FILE
    from hermes.models.loading import ModelLoadError, load_video_lm
    from hermes.serving import StreamRegistry

    lm = load_video_lm(str(toy_dir), dtype="fp32")
    assert lm.card.samples and lm.card.stream == {
        "fps": 1.0,
        "chunk_frames": 4,
        "budget": 34,
        "compare_policies": ["hermes", "fifo"],
    }
    registry = StreamRegistry(lm)
    try:
        s = registry.settings
        assert (s.budget, s.chunk_frames, s.fps, s.compare_policies) == (34, 4, 1.0, ("hermes", "fifo"))
    finally:
        registry.shutdown()
    broken = tmp_path / "model"
    shutil.copytree(toy_dir, broken)
    for bad in ("{not json", '{"questions": ["What?", 3]}', '{"questions": [" "]}'):
        (broken / CARD_FILE).write_text(bad)
        with pytest.raises(ModelLoadError, match=f"{CARD_FILE}: not a model card"):
            load_video_lm(str(broken), dtype="fp32")


def test_two_runs_compare_question_by_question_with_a_paired_interval(tmp_path):
    """`toyworld compare`: the difference pairs each question with itself across the two runs."""

    def answers(correct: list[bool]) -> list[dict]:
        return [
            {
                "policy": "hermes",
                "budget": 34,
                "qid": f"q{i}",
                "video": f"clip{i % 4}",
                "kind": BACKWARD,
                "age": "early",
                "correct": c,
            }
            for i, c in enumerate(correct)
        ]

    base = answers([True, False, False, True, False, False, True, False])
    other = answers([True, True, False, True, True, False, True, False])
    rows = {r["kind"]: r for r in bench.compare_runs(base, other)}
    assert set(rows) == {BACKWARD, "early"}
    row = rows[BACKWARD]
    assert (row["base"], row["other"], row["diff"], row["questions"]) == (37.5, 62.5, 25.0, 8)
    assert 0.0 <= row["low"] <= row["diff"] <= row["high"]  # every clip changed for the better or not at all
    assert bench.compare_runs(base, answers([])) == []  # nothing in common, nothing compared
    for name, doc in (("a.json", base), ("b.json", other)):
        (tmp_path / name).write_text(json.dumps({"settings": {"params": {}}, "answers": doc}))
    out = subprocess.run(
        [sys.executable, "-m", "hermes", "toyworld", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| hermes | 34 | backward | 8 | 37.5 | 62.5 | +25.0 (" in out


def test_the_shares_held_per_layer_count_the_newest_frame_and_the_evidence():
    from hermes.memory.cache import ChunkMeta, HermesCache
    from hermes.memory.rope import RopeSpec
    from hermes.toyworld.diagnostics import held_shares, render_held

    memory = HermesCache(3, RopeSpec(torch.ones(2)), HermesConfig(budget=100))
    frames = torch.tensor([0, 0, 1, 1, 2, 2])  # two tokens a frame
    for layer in range(3):
        memory.update(torch.zeros(1, 1, 6, 4), torch.zeros(1, 1, 6, 4), layer)
    memory.commit(ChunkMeta(frames=frames, positions=torch.arange(6)))
    # Layer 0 drops frame 1; layer 1 keeps half of frames 1 and 2; layer 2 keeps frame 0 only.
    keep = [torch.tensor([0, 1, 4, 5]), torch.tensor([2, 4]), torch.tensor([0, 1])]
    memory.evict(keep, [torch.zeros(k.numel()) for k in keep], [False] * 3)
    shares = held_shares(memory, newest=2, evidence=(0, 2), per_frame=2)
    assert shares == {
        "newest_held": [1.0, 0.5, 0.0],
        "evidence_held": [0.5, 0.25, 0.5],
        "evidence_frames": [0.5, 0.5, 0.5],
    }
    assert held_shares(memory, 2, None, 2)["evidence_held"] is None
    rows = [{"policy": "hermes", "budget": 4, "kind": "backward", **shares}]
    assert "| 4 | hermes | 100 / 50 / 0 | 50 / 25 / 50 | 50 / 50 / 50 |" in render_held(rows)


def test_the_layer_wise_analysis_reads_each_layers_attention_over_the_video(tmp_path):
    from hermes.models.loading import load_video_lm
    from hermes.toyworld.layers import _lift, layer_lifts, lifts_svg, render_lifts, summarize_lifts
    from hermes.toyworld.paths import HELDOUT_DIR

    # Half the attention on a third of the tokens: a lift of 1.5.
    assert _lift(torch.tensor([0.5, 0.25, 0.25]), torch.tensor([True, False, False])) == pytest.approx(1.5)
    lm = load_video_lm("toy", dtype="fp32")
    held = bench.load_heldout(HELDOUT_DIR)
    rows = layer_lifts(lm, held, videos=1)
    assert len(rows) == sum(q.video == held.videos[0] for q in held.questions)
    for r in rows:
        assert len(r["newest_lift"]) == lm.kv_layers and all(x >= 0 for x in r["newest_lift"])
        assert (r["evidence_lift"] is not None) == (r["kind"] == BACKWARD)
    summary = summarize_lifts(rows)
    assert all(len(v) == lm.kv_layers for v in summary.values())
    table = render_lifts(summary, ["sensory", "working", "working", "long-term"])
    assert table.count("\n") == 1 + lm.kv_layers and "| 3 | long-term |" in table
    assert lifts_svg(summary, "t").startswith("<svg") and "polyline" in lifts_svg(summary, "t")


def test_the_lifts_go_into_a_models_card_and_the_attention_panel_says_them(tmp_path):
    """`toyworld layers --card` writes the measured lifts into the model folder's card (the rest of it
    kept), and the served model's page says where its questions look, layer by layer."""
    import shutil

    from hermes.cli.main import main
    from hermes.models.card import ModelCard
    from hermes.toyworld.paths import HELDOUT_DIR, MODEL_DIR
    from ui.panels import attention_note

    folder = tmp_path / "toy"
    shutil.copytree(MODEL_DIR, folder)
    (folder / "hermes.json").write_text(json.dumps({"about": "a copy", "questions": ["What shape is on screen?"]}))
    argv = ["toyworld", "layers", "--model", str(folder), "--heldout", str(HELDOUT_DIR), "--clips", "1"]
    assert main([*argv, "--card", "--no-progress"]) == 0
    card = ModelCard.read(folder)
    assert card.about == "a copy" and card.questions == ("What shape is on screen?",)
    assert list(card.layers) == [
        "newest (real-time questions)",
        "newest (every question)",
        "evidence (backward questions)",
    ]
    assert all(len(v) == 4 for v in card.layers.values())
    note = attention_note({"newest": [1.0, 3.0, 2.0], "evidence": [0.9, 1.1, 1.6]})
    assert "newest: most in layer 1 (3.00x), least in layer 0 (1.00x)" in note and "over 3 layers" in note
    assert "evidence: most in layer 2 (1.60x)" in note and attention_note({}) == ""
