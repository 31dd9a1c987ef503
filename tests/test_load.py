"""Load: several viewers stream different clips and ask at the same moment, through gradio_client.

Each session uploads its own clip (a different length, so a different frame count), streams it at
2x, and all sessions ask their own question at once while their streams run. Every answer must
arrive without error, in its own session's chat only, and each session's metrics must show its own
frames. The questions are answered together in the model thread's batch (hermes.engine.batch), not
one after another. The timings are printed; the README's "Limits and behaviour" numbers come from:

    python -m pytest -q -s tests/test_load.py                           # 4 sessions
    HERMES_LOAD_SESSIONS=8 python -m pytest -q -s tests/test_load.py    # more
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from hermes.serving import StreamSettings
from hermes.video.clips import make_clip
from tests.helpers import wait_for
from tests.test_app import serve, text_of

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

ROOT = Path(__file__).resolve().parent.parent
SESSIONS = int(os.environ.get("HERMES_LOAD_SESSIONS", "4"))
# 1 frame a second in chunks of 2, budget below two chunks: every stream compresses as it goes.
SETTINGS = StreamSettings(budget=500, chunk_frames=2, fps=1.0)


@dataclass
class Result:
    session: int
    frames: int  # frames in the session's clip
    client_first_token_s: float  # question sent -> first answer text received, as the client sees it
    client_total_s: float  # question sent -> answer complete
    ttft_ms: float  # server: question start on the model thread -> first token
    tpot_ms: float  # server: time per answer token after the first
    wait_ms: float  # server: question queued -> its turn on the model thread
    frames_at_question: int


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("load")
    # Session i streams a clip of 4 + i seconds: 4 + i frames at 1 fps, its own count.
    return [make_clip(root / f"session{i}.mp4", 4.0 + i, fps=4, size=(160 + 32 * i, 120)) for i in range(SESSIONS)]


def run_session(url: str, i: int, clip: Path, ready: threading.Barrier) -> Result:
    client = Client(url, verbose=False)
    try:
        client.predict(handle_file(str(clip)), "2x", api_name="/start_file")
        assert wait_for(lambda: client.predict(api_name="/metrics")["frames_seen"] > 0, 60)
        question = f"Session {i}: what is on the screen?"
        ready.wait(60)  # everyone asks at the same moment, with their streams still running
        sent = time.monotonic()
        job = client.submit(question, api_name="/ask")
        first = None
        for chat, _ in job:
            if first is None and len(chat) > 1 and chat[-1]["role"] == "assistant":
                first = time.monotonic() - sent
        total = time.monotonic() - sent
        chat = job.outputs()[-1][0]
        assert [m["role"] for m in chat] == ["user", "assistant"]
        assert text_of(chat[0]) == question, "another session's question leaked into this chat"
        assert "TTFT" in text_of(chat[1]) and "⚠️" not in text_of(chat[1])

        frames = 4 + i
        metrics = wait_for(
            lambda: (m := client.predict(api_name="/metrics"))["state"] == "finished" and not m["queued_chunks"] and m,
            60,
        )
        assert metrics and metrics["frames_seen"] == frames and metrics["error"] is None
        [answer] = metrics["answers"]
        assert answer["question"] == question and answer["frames_seen"] <= frames
        server = [answer[k] for k in ("ttft_ms", "tpot_ms", "wait_ms", "frames_seen")]
        return Result(i, frames, first or total, total, *server)
    finally:
        client.close()


def test_concurrent_sessions_stream_and_ask_at_once(llava_lm, clips):
    url, demo, registry = serve(llava_lm, SETTINGS, max_streams=SESSIONS)
    try:
        ready = threading.Barrier(SESSIONS)
        start = time.monotonic()
        with ThreadPoolExecutor(SESSIONS) as pool:
            futures = [pool.submit(run_session, url, i, clip, ready) for i, clip in enumerate(clips)]
            results = [f.result(timeout=120) for f in futures]
        elapsed = time.monotonic() - start
        assert registry.worker.alive and registry.worker.errors == 0
        largest_batch = registry.worker.largest_batch
    finally:
        demo.close()
        registry.shutdown()

    assert sorted(r.frames for r in results) == [4 + i for i in range(SESSIONS)]
    # Asked at the same moment, the questions share the model thread's batch instead of queueing.
    assert largest_batch >= min(SESSIONS, 2), f"answered one at a time (largest batch {largest_batch})"
    print(f"\n{SESSIONS} sessions on {llava_lm.source} ({llava_lm.num_layers} layers), {os.cpu_count()} CPU(s):")
    print("session  frames  first token (client)  answer done (client)  TTFT (server)  wait (server)")
    for r in results:
        print(
            f"{r.session:>7}  {r.frames:>6}  {r.client_first_token_s * 1000:>17.0f} ms  "
            f"{r.client_total_s * 1000:>17.0f} ms  {r.ttft_ms:>10.1f} ms  {r.wait_ms:>10.1f} ms"
        )

    def p50_max(values: list[float]) -> str:
        return f"p50 {statistics.median(values):.0f} ms, max {max(values):.0f} ms"

    print(f"TTFT (server): {p50_max([r.ttft_ms for r in results])}")
    print(f"TPOT (server): {p50_max([r.tpot_ms for r in results])}")
    print(f"wait for the model thread: {p50_max([r.wait_ms for r in results])}")
    print(f"first token at the client: {p50_max([r.client_first_token_s * 1000 for r in results])}")
    print(f"answer complete at the client: {p50_max([r.client_total_s * 1000 for r in results])}")
    print(f"largest batch on the model thread: {largest_batch} questions")
    print(f"whole run: {elapsed:.1f} s")


def test_load_bench_prints_batched_against_one_at_a_time(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("load_bench", ROOT / "scripts" / "load_bench.py")
    load_bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "load_bench", load_bench)  # its dataclasses look their module up
    spec.loader.exec_module(load_bench)
    small = ["--budget", "100", "--chunk-frames", "2", "--frame-size", "64", "--max-new-tokens", "3"]
    out = tmp_path / "load.json"
    assert load_bench.main(["--sessions", "1,2", "--repeats", "1", "--threads", "0", "--json", str(out), *small]) == 0
    printed = capsys.readouterr().out
    assert "| N at once | one at a time: first token p50 / max | batched: first token p50 / max" in printed
    assert "- p50 first token with 2 at once (batched) / one question alone:" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [r["n"] for r in rows] == [1, 2] and all(r["same_answers"] for r in rows)
    assert all(r[mode]["tokens_per_s"] > 0 for r in rows for mode in ("batched", "one at a time"))
    with pytest.raises(SystemExit):
        load_bench.main(["--sessions", "two"])
