"""A policy added from outside: the toy `echo` (tests/toy_policy.py: one module, and one call to the
registry) runs in every front end: the stream command, the bench, eval, Compare in a live stream,
and the app's API. Each checks that the toy's question-time step ran and that its cost came out."""

from __future__ import annotations

import json

import pytest

from hermes.engine.methods import parse_policy, policy_names, register, unregister
from hermes.engine.session import StreamingSession
from hermes.memory.config import HermesConfig
from tests import toy_policy
from tests.toy_policy import METHOD, NAME

QUESTION = "What is happening?"


@pytest.fixture(scope="module", autouse=True)
def echo():
    register(METHOD)
    yield
    unregister(NAME)


def test_the_registry_takes_it_with_its_look_and_input_filters():
    assert NAME in policy_names() and f"{NAME}+dtd" in policy_names()
    spec = parse_policy(f"{NAME}+dtd")
    assert (spec.label, spec.colour, spec.base.name) == ("Echo + DTD", "#0891b2", NAME)
    with pytest.raises(ValueError, match="taken"):
        register(METHOD)


def test_stream_command(clips, capsys):
    from hermes.cli.main import main

    before = len(toy_policy.CALLS)
    args = ["stream", str(clips["short"]), "--model", "tiny", "--policy", NAME, "--json", "--chunk-frames", "2"]
    assert main([*args, "--fps", "1", "--budget", "300", "--max-new-tokens", "2", "--ask", "4:" + QUESTION]) == 0
    (answer,) = [e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e["event"] == "answer"]
    assert len(toy_policy.CALLS) == before + 1 and answer["retrieved_tokens"] == toy_policy.CALLS[-1] > 0
    assert 0 <= answer["retrieval_ms"] < answer["ttft_ms"]


def test_bench(llava_lm):
    from hermes.bench.run import BenchSettings, run_bench

    settings = BenchSettings(
        policies=("hermes", NAME),
        frames=(2, 4),
        config=HermesConfig(budget=300, chunk_frames=2),
        repeats=1,
        max_new_tokens=1,
        frame_size=64,
        questions=(QUESTION,),
    )
    point = run_bench(llava_lm, settings, progress=False).point(NAME, 4)
    assert point.status == "ok" and point.retrieval_ms and point.cache_bytes > 0


def test_eval(llava_lm, eval_videos, tmp_path):
    from hermes.eval.formats import BENCHES
    from hermes.eval.harness import EvalSettings, run_eval
    from tests.eval_helpers import CHUNK, FPS, records_of, videomme

    spec = BENCHES["videomme"]
    items, problems = spec.load(videomme(tmp_path / "vmme.json"))
    session = StreamingSession(llava_lm, HermesConfig(budget=300, chunk_frames=CHUNK, fps=FPS), policy=NAME)
    before = len(toy_policy.CALLS)
    out = tmp_path / "echo.jsonl"
    run_eval(llava_lm, spec, items, problems, session, eval_videos, out, EvalSettings(max_new_tokens=1), False)
    answered = [r for r in records_of(out) if r["status"] == "answered"]
    assert answered and len(toy_policy.CALLS) > before


def test_compare_and_the_api(llava_lm):
    from gradio_client import Client

    from tests.helpers import wait_for
    from tests.test_app import serve

    url, demo, registry = serve(llava_lm)
    client = Client(url, verbose=False)
    try:
        settings = ["hermes", 400, 2, 1.0, "lazy", True, ["hermes", NAME], 0.5]
        client.predict("Cockatoo, close-up (14 s)", "max", *settings, api_name="/start_sample")
        assert wait_for(lambda: client.predict(api_name="/metrics")["chunks"] >= 2)
        chat = client.predict(QUESTION, api_name="/ask")[0]
        assert sum("TTFT" in str(m["content"]) for m in chat) == 2  # both policies answered
        metrics = client.predict(api_name="/metrics")
        assert metrics["policies"] == ["hermes", NAME]
        (echoed,) = [a for a in metrics["answers"] if a["policy"] == NAME]
        assert echoed["retrieved_tokens"] > 0 and echoed["retrieval_ms"] is not None
        (other,) = [a for a in metrics["answers"] if a["policy"] == "hermes"]
        assert other["retrieved_tokens"] == 0 and other["retrieval_ms"] is None
    finally:
        client.close()
        demo.close()
        registry.shutdown()
