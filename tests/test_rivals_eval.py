"""Several policies in one evaluation: each its own memory, each video decoded once, one table."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.cli.main import main
from hermes.engine.methods import PolicySpec
from hermes.engine.session import StreamingSession
from hermes.eval.formats import BENCHES
from hermes.eval.harness import EvalSettings, run_eval
from hermes.eval.policies import PolicyGroup, policy_out
from hermes.memory.config import HermesConfig
from tests.eval_helpers import CHUNK, FPS, records_of, videomme

SIMPLESTREAM = PolicySpec("simplestream")

POLICIES = ("hermes", "fifo", "streammem")


def _config() -> HermesConfig:
    return HermesConfig(budget=300, chunk_frames=CHUNK, fps=FPS, reindex="eager")


def test_each_policy_in_a_group_answers_as_it_would_alone(llava_lm, eval_videos: Path, tmp_path: Path, monkeypatch):
    spec = BENCHES["videomme"]
    items, problems = spec.load(videomme(tmp_path / "vmme.json"))
    settings = EvalSettings(max_new_tokens=2)
    decoded = []
    import hermes.eval.harness as harness

    real = harness.iter_video
    monkeypatch.setattr(harness, "iter_video", lambda *a, **k: decoded.append(a[0]) or real(*a, **k))
    group = PolicyGroup({p: StreamingSession(llava_lm, _config(), policy=p) for p in POLICIES})
    out = tmp_path / "group.jsonl"
    summaries = run_eval(llava_lm, spec, items, problems, group, eval_videos, out, settings, False)
    assert set(summaries) == set(POLICIES)
    videos = len({it.video for it in items if it.video})
    assert len(decoded) <= videos  # each video decoded once for all three policies
    alone = tmp_path / "alone.jsonl"
    decoded.clear()
    run_eval(
        llava_lm,
        spec,
        items,
        problems,
        StreamingSession(llava_lm, _config(), policy="fifo"),
        eval_videos,
        alone,
        settings,
        False,
    )
    by_qid = {r["qid"]: r for r in records_of(policy_out(out, "fifo"))}
    for record in records_of(alone):
        twin = by_qid[record["qid"]]
        assert twin["status"] == record["status"]
        if record["status"] == "answered":
            assert twin["option_logprobs"] == record["option_logprobs"] and twin["text"] == record["text"]
    # The policies' memories differ, so do their scores somewhere.
    scores = {p: [r.get("option_logprobs") for r in records_of(policy_out(out, p))] for p in POLICIES}
    assert scores["hermes"] != scores["fifo"] or scores["fifo"] != scores["streammem"]


def test_eval_cli_prints_one_table_with_a_column_per_policy(eval_videos: Path, tmp_path: Path, capsys):
    ann = videomme(tmp_path / "vmme.json")
    out = tmp_path / "r.jsonl"
    argv = ["eval", "--bench", "videomme", "--annotations", str(ann), "--videos", str(eval_videos), "--out", str(out)]
    argv += ["--model", "tiny", "--fps", "1", "--budget", "300", "--chunk-frames", "4", "--no-progress"]
    chosen = ["--policies", "hermes,fifo+dtd,sink,simplestream", "--param", "simplestream.frames=2"]
    assert main([*argv, *chosen, "--max-new-tokens", "1"]) == 0
    table = capsys.readouterr().out
    assert "| task | hermes | fifo+dtd | sink | simplestream |" in table and "**overall**" in table
    for p in ("hermes", "fifo+dtd", "sink", "simplestream"):
        assert policy_out(out, p).exists()
    assert main([*argv, "--policies", "hermes,lru"]) == 2
    assert "unknown policy 'lru'" in capsys.readouterr().err
    assert main([*argv, "--policies", "hermes,hermes"]) == 2
    assert "named twice" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--policy", "dtd"], ["--policy", "sink", "--param", "sink.sinks=-2"]])
def test_stream_and_bench_refuse_bad_policies_before_anything_starts(bad, capsys):
    assert main(["stream", "no-such-video.mp4", "--model", "no-such-model", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no-such" not in err  # the policy, before the video or the model
    bench = ["bench", "--model", "no-such-model", "--policies", f"hermes,{bad[1]}", *bad[2:]]
    assert main(bench) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no-such" not in err


def test_stream_settings_take_every_policy_and_two_or_three_compared():
    from hermes.engine.methods import PolicyError
    from hermes.serving import StreamSettings

    def names(settings: StreamSettings) -> tuple[str, ...]:
        return tuple(p.name for p in settings.policies)

    assert names(StreamSettings(compare=True)) == ("hermes", "fifo")  # the default pair
    chosen = StreamSettings(compare=True, compare_policies=["sink", "streammem", "hermes+dtd"])
    assert names(chosen) == ("sink", "streammem", "hermes+dtd")
    assert names(StreamSettings(policy="infinipot-v+dtd", compare_policies=[])) == ("infinipot-v+dtd",)
    for bad, words in [
        ({"policy": "dtd"}, "needs a method"),
        ({"compare": True, "compare_policies": ["hermes"]}, "2 to 3"),
        ({"compare": True, "compare_policies": ["hermes", "fifo", "sink", "streammem"]}, "2 to 3"),
        ({"compare": True, "compare_policies": ["hermes", "hermes"]}, "twice"),
        ({"compare": True, "compare_policies": ["lru", "fifo"]}, "unknown policy"),
    ]:
        with pytest.raises(PolicyError, match=words):
            StreamSettings(**bad)


def test_bench_table_against_hermes_from_made_up_points():
    from hermes.bench.report import rivals_table
    from hermes.bench.run import BenchResult, Point

    def point(policy: str, ttft: float, memory: int, prefill: float, compress: float, tokens: int, dropped: int):
        return Point(
            policy,
            64,
            ttft_ms=[ttft],
            prefill_ms=[prefill],
            compress_ms=[compress],
            tokens=[tokens],
            dropped=[dropped],
            ingested_frames=8,
            cache_bytes=1000,
            memory_bytes=memory,
        )

    meta = {"memory_kind": "peak RSS (VmHWM, since the policy started)"}
    result = BenchResult(
        meta,
        [
            point("hermes", 10.0, 2 * 2**20, 900.0, 100.0, 400, 0),  # 8 frames in 1 s
            point("streammem", 12.0, 2 * 2**20, 400.0, 100.0, 400, 0),  # 8 frames in 0.5 s
            point("hermes+dtd", 5.0, 2**20, 90.0, 10.0, 100, 300),  # 8 frames in 0.1 s, 75% dropped
            Point("full", 64, status="out of memory"),
        ],
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in rivals_table(result) if line.startswith("| ")}
    assert "| 12.0 | 1.20x | 2.00 | 1.00x | 0.00 | 1.00x | 16.00 | 2.00x | 100 (0.250) | 0 (0%) |" in rows["streammem"]
    assert "| 5.0 | 0.50x | 1.00 | 0.50x |" in rows["hermes+dtd"] and "| 80.00 | 10.00x |" in rows["hermes+dtd"]
    assert rows["hermes+dtd"].endswith("| 300 (75%) |")
    assert "out of memory" in rows["full"]
    assert rivals_table(BenchResult(meta, [point("fifo", 1, 1, 1, 1, 1, 0)])) == []  # no HERMES to compare with


def test_bench_holds_the_rivals_to_their_targets():
    """A budgeted rival's TTFT over HERMES's at 512 frames (<= 1.2), the share +dtd drops on a static
    clip (>= 0.5) and its ingest over the plain policy's (> 1), from made-up points."""
    from hermes.bench.report import headline
    from hermes.bench.run import BenchResult, Point

    def point(policy: str, ttft: float, seconds: float, tokens: int = 400, dropped: int = 0) -> Point:
        return Point(
            policy,
            512,
            ttft_ms=[ttft],
            prefill_ms=[1000 * seconds],
            compress_ms=[0.0],
            guidance_ms=[0.0],
            evicted=[0],
            tokens=[tokens],
            dropped=[dropped],
            ingested_frames=8,
        )

    points = [
        point("hermes", 10.0, 1.0),
        point("sink", 11.0, 0.5),
        point("streammem", 13.0, 1.0),
        point("hermes+dtd", 5.0, 0.25, tokens=100, dropped=300),
    ]
    for static in (True, False):
        meta = {"tokens_per_frame": 196.0, "budget": 4096, "chunk_frames": 4, "device_type": "cpu"}
        meta["static_frames"] = static
        lines = {h["name"]: h for h in headline(BenchResult(meta, points))}
        assert lines["sink TTFT / hermes TTFT at 512 frames"]["met"] is True  # 1.1x
        assert lines["streammem TTFT / hermes TTFT at 512 frames"]["met"] is False  # 1.3x
        ingest = lines["hermes+dtd ingest frames/s / hermes's"]
        assert ingest["value"] == pytest.approx(4.0) and ingest["met"] is True  # 8 frames in 0.25 s against 1 s
        (dropped,) = [h for name, h in lines.items() if name.startswith("hermes+dtd tokens dropped")]
        assert dropped["value"] == pytest.approx(0.75)
        assert dropped["met"] is (True if static else None)  # random frames are shown, not held to it


def test_simplestream_in_the_bench_admission_and_the_app(worker, llava_lm, clips):
    """SimpleStream beside HERMES through the bench (its bytes flat past its frames, whatever the
    budget), admission control (its bytes bounded by its frames' blocks) and a live compare stream."""
    import dataclasses

    from hermes.bench.run import BenchSettings, run_bench
    from hermes.serving import StreamSettings
    from hermes.serving.admission import cache_bytes_for
    from hermes.serving.live import LiveStream
    from tests.helpers import streamed

    config = HermesConfig(budget=2000, chunk_frames=2)
    settings = BenchSettings(
        policies=("hermes", "simplestream"), frames=(6, 10), config=config, repeats=1, max_new_tokens=1, frame_size=64
    )
    result = run_bench(llava_lm, settings, progress=False)
    six, ten = result.point("simplestream", 6), result.point("simplestream", 10)
    assert six.status == ten.status == "ok" and six.cache_bytes == ten.cache_bytes
    assert ten.cache_bytes < result.point("hermes", 10).cache_bytes  # 4 frames, where hermes keeps 2,000 tokens
    # Admission counts 4 frame blocks of the largest frames the decoder hands over: an upper bound.
    live = StreamSettings(policy="simplestream", budget=2000, chunk_frames=2, fps=1.0)
    assert (
        ten.cache_bytes
        <= cache_bytes_for(llava_lm, live)
        == cache_bytes_for(llava_lm, dataclasses.replace(live, budget=200))
    )
    # The app: compare mode, one memory each; the clip is 8 s at 1 fps, so SimpleStream holds frames 4 to 7.
    stream = LiveStream(worker, llava_lm, StreamSettings(budget=400, chunk_frames=2, fps=1.0), key="ss")
    try:
        compared = StreamSettings(budget=400, chunk_frames=2, fps=1.0, compare=True)
        streamed(
            stream, clips["short"], settings=dataclasses.replace(compared, compare_policies=("hermes", "simplestream"))
        )
        view = stream.view()
        assert {p.name for p in view.snapshots} == {"hermes", "simplestream"}
        assert {int(f) for layer in view.snapshots[SIMPLESTREAM].layers for f in layer.frames} == {
            4,
            5,
            6,
            7,
        }
        done = [e for e in stream.ask("What happened?", max_new_tokens=3).events() if e.done]
        assert sorted(e.policy.name for e in done) == ["hermes", "simplestream"] and all(e.error is None for e in done)
    finally:
        stream.close()
