"""Many viewers, one model: N questions at once against N sessions, batched against one at a time.

Each of N sessions streams its own synthetic frames past the same budget (so every memory has the
same length, as in the app under load), then N questions are asked at the same moment, N = 1, 2,
4 and 8 by default. Two ways to answer them, in the same run, repeated:

- one at a time: `StreamingSession.ask_stream` for each question in turn (what the model thread
  did before batching): the k-th viewer's first token waits for k - 1 whole answers;
- batched: `hermes.engine.batch.BatchDecoder`, all N in one forward pass per token.

For each N it prints the first-token latency from the moment all N are asked (p50 and max over
every question of every repeat), the time until the last answer is done and the answer tokens
per second, then the ratios. It checks that both ways give the same answers (greedy decoding).

    python scripts/load_bench.py                       # tiny model, budget 4096, 64-token answers
    python scripts/load_bench.py --model llava-ov-7b-random --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes.bench import device_label, load_bench_model, synthetic_chunk
from hermes.engine.batch import BatchDecoder
from hermes.engine.metrics import now_ms
from hermes.engine.session import MAX_NEW_TOKENS, StreamingSession
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.models.loading import set_threads

QUESTIONS = [
    "What is happening in the video?",
    "What colour is the largest object?",
    "Who is in the scene?",
    "What happened just before this?",
    "Where is the camera pointing?",
    "How many people are there?",
    "What is the person holding?",
    "Describe the background.",
]
TARGET = 2.0  # p50 first token with 8 at once, against one question alone


@dataclass
class Run:
    """N questions answered one way: per question, the first token and the end, in ms from the ask."""

    mode: str
    first_ms: list[float] = field(default_factory=list)
    done_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    texts: list[str] = field(default_factory=list)

    @property
    def wall_ms(self) -> float:
        return max(self.done_ms)


def one_at_a_time(sessions: list[StreamingSession], questions: list[str], max_new_tokens: int) -> Run:
    """Each question in turn with `ask_stream`, as the model thread answered before batching."""
    run = Run("one at a time")
    device = sessions[0].lm.device
    t0 = now_ms(device)
    for session, question in zip(sessions, questions, strict=True):
        first = None
        for update in session.ask_stream(question, max_new_tokens):
            if first is None:
                first = now_ms(device) - t0
            if update.done:
                run.done_ms.append(now_ms(device) - t0)
                run.tokens += update.tokens
                run.texts.append(update.text)
        run.first_ms.append(first)
    return run


def batched(lm: VideoLM, sessions: list[StreamingSession], questions: list[str], max_new_tokens: int) -> Run:
    """All questions in one batch, one forward pass per token."""
    run = Run("batched")
    decoder = BatchDecoder(lm)
    device = lm.device
    t0 = now_ms(device)
    rows = [decoder.add(s, q, max_new_tokens, tag=i) for i, (s, q) in enumerate(zip(sessions, questions, strict=True))]
    first: dict[int, float] = {}
    done: dict[int, tuple[float, int, str]] = {}
    while len(decoder):
        for row, update in decoder.step():
            now = now_ms(device) - t0
            first.setdefault(row.tag, now)
            if update.done:
                done[row.tag] = (now, update.tokens, update.text)
    for row in rows:
        end, tokens, text = done[row.tag]
        run.first_ms.append(first[row.tag])
        run.done_ms.append(end)
        run.tokens += tokens
        run.texts.append(text)
    return run


def stream_sessions(lm: VideoLM, n: int, config: HermesConfig, chunks: int, frame_size: int) -> list[StreamingSession]:
    """`n` sessions, each streaming `chunks` chunks of its own random frames."""
    sessions = []
    for i in range(n):
        rng = np.random.default_rng(1000 + i)
        session = StreamingSession(lm, config)
        for c in range(chunks):
            n_frames = config.chunk_frames
            session.ingest(synthetic_chunk(rng, c * n_frames, n_frames, frame_size, config.fps, c))
        sessions.append(session)
    return sessions


def summarise(runs: list[Run]) -> dict:
    """p50 and max of the first-token latency over every question of every repeat; tokens per second."""
    first = [ms for run in runs for ms in run.first_ms]
    tokens = sum(run.tokens for run in runs)
    wall = sum(run.wall_ms for run in runs)
    return {
        "first_token_p50_ms": statistics.median(first),
        "first_token_max_ms": max(first),
        "all_done_p50_ms": statistics.median(run.wall_ms for run in runs),
        "tokens_per_s": tokens / wall * 1000.0 if wall else 0.0,
    }


def measure(
    lm: VideoLM, sessions: list[StreamingSession], counts: list[int], max_new_tokens: int, repeats: int
) -> list[dict]:
    """Both ways for each N, alternating which goes first in each repeat."""
    rows = []
    for n in counts:
        chosen, questions = sessions[:n], [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
        runs: dict[str, list[Run]] = {"one at a time": [], "batched": []}
        same = True
        for r in range(repeats):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {}
            for batch in order:
                if batch:
                    run = batched(lm, chosen, questions, max_new_tokens)
                else:
                    run = one_at_a_time(chosen, questions, max_new_tokens)
                runs[run.mode].append(run)
                got[run.mode] = run.texts
            same = same and got["batched"] == got["one at a time"]
        rows.append({"n": n, "same_answers": same, **{mode: summarise(r) for mode, r in runs.items()}})
    return rows


def render(rows: list[dict]) -> str:
    """The table and the ratios, in Markdown."""
    lines = [
        "| N at once | one at a time: first token p50 / max | batched: first token p50 / max "
        "| all answers done, one at a time / batched | tokens/s, one at a time / batched | same answers |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        one, bat = row["one at a time"], row["batched"]
        lines.append(
            f"| {row['n']} | {one['first_token_p50_ms']:,.0f} / {one['first_token_max_ms']:,.0f} ms "
            f"| {bat['first_token_p50_ms']:,.0f} / {bat['first_token_max_ms']:,.0f} ms "
            f"| {one['all_done_p50_ms']:,.0f} / {bat['all_done_p50_ms']:,.0f} ms "
            f"| {one['tokens_per_s']:,.0f} / {bat['tokens_per_s']:,.0f} "
            f"| {'yes' if row['same_answers'] else 'NO'} |"
        )
    lines += ["", "Ratios (this run):"]
    for row in rows:
        one, bat = row["one at a time"], row["batched"]
        lines.append(
            f"- N = {row['n']}: first token p50, one at a time / batched = "
            f"{one['first_token_p50_ms'] / bat['first_token_p50_ms']:.2f}x; tokens/s, batched / one at a time = "
            f"{bat['tokens_per_s'] / one['tokens_per_s']:.2f}x"
        )
    alone = rows[0]["one at a time"]["first_token_p50_ms"] if rows[0]["n"] == 1 else None
    last = rows[-1]
    if alone:
        ratio = last["batched"]["first_token_p50_ms"] / alone
        verdict = "met" if ratio <= TARGET else "missed"
        lines.append(
            f"- p50 first token with {last['n']} at once (batched) / one question alone: "
            f"{last['batched']['first_token_p50_ms']:,.1f} ms / {alone:,.1f} ms = {ratio:.2f} "
            f"(target <= {TARGET:g}: {verdict})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny', 'tiny-qwen', a checkpoint or a random 7B architecture")
    p.add_argument("--sessions", default="1,2,4,8", help="numbers of questions at once (default: %(default)s)")
    p.add_argument("--budget", type=int, default=4096, help="video tokens per layer, |M| (default: %(default)s)")
    p.add_argument("--chunk-frames", type=int, default=16, help="frames per chunk (default: %(default)s)")
    p.add_argument("--chunks", type=int, default=2, help="chunks each session streams (default: %(default)s)")
    p.add_argument("--frame-size", type=int, default=384, help="square frame side in pixels (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens per answer (the app's)")
    p.add_argument("--repeats", type=int, default=3, help="times each N is measured each way (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (default 0: torch's own, as the app)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: the GPU if there is one)")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    args = p.parse_args(argv)
    try:
        counts = sorted({int(v) for v in args.sessions.split(",") if v.strip()})
    except ValueError:
        p.error(f"--sessions wants comma-separated whole numbers, for example 1,2,4,8; got {args.sessions!r}")
    if not counts or counts[0] < 1 or args.repeats < 1 or args.chunks < 1 or args.max_new_tokens < 1:
        p.error("--sessions, --repeats, --chunks and --max-new-tokens must be at least 1")

    lm = load_bench_model(args.model, args.device)
    set_threads(args.threads)
    config = HermesConfig(budget=args.budget, chunk_frames=args.chunk_frames, fps=lm.default_fps)
    started = time.monotonic()
    sessions = stream_sessions(lm, counts[-1], config, args.chunks, args.frame_size)
    lengths = sorted({s.memory.get_seq_length() for s in sessions})
    one_at_a_time(sessions[:1], QUESTIONS[:1], 4)  # warm up both paths before measuring
    batched(lm, sessions[:1], QUESTIONS[:1], 4)
    rows = measure(lm, sessions, counts, args.max_new_tokens, args.repeats)

    print(
        f"Model: {args.model} ({lm.arch}, {lm.num_layers} layers, {str(lm.dtype).removeprefix('torch.')}); "
        f"device: {device_label(lm.device)}."
    )
    print(
        f"{counts[-1]} sessions, each {args.chunks} chunks of {args.chunk_frames} frames at {args.frame_size} px "
        f"past a budget of {args.budget:,} tokens per layer (cache lengths: {', '.join(map(str, lengths))}); "
        f"{args.max_new_tokens}-token answers, greedy; {args.repeats} repeats per N, latencies from the moment "
        f"all N are asked; {time.monotonic() - started:.0f} s in all."
    )
    print()
    print(render(rows))
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"} | {"cache_lengths": lengths}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0 if all(row["same_answers"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
