"""The fresh process of the resume test (tests/test_persist.py): load saved streams, go on, ask.

Run as `python -m tests.persist_child CASES.json`: for each case it loads the memory file into a
new session, ingests the chunks that follow, asks the question and writes what came out (the
answer's text and top log-probabilities, the first answer token's log-probabilities, and the
memory after those chunks, as a memory file) for the test to compare with the uninterrupted stream.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from hermes.engine.chunk import Chunk

FRAMES = 2  # per chunk: small, and even for the Qwen backbones
QUESTION = "What happened first?"


def chunk(index: int, size: int = 32) -> Chunk:
    """Chunk `index` of a stream of random `size` x `size` frames, one frame a second."""
    pixels = np.random.default_rng(index).integers(0, 256, (FRAMES, size, size, 3), dtype=np.uint8)
    ids = np.arange(index * FRAMES, (index + 1) * FRAMES)
    return Chunk(pixels, ids.astype(float), ids, ids, chunk_index=index)


def go_on(session, start: int, stop: int, out: str) -> None:
    """Ingest chunks start..stop-1, ask, and write the answer and the memory to `out` (a prefix)."""
    from hermes.engine.persist import save_session

    for i in range(start, stop):
        session.ingest(chunk(i))
    answer = session.ask(QUESTION, max_new_tokens=4)
    logp = session.first_token_logprobs(QUESTION)
    torch.save({"text": answer.text, "top": answer.top_logprobs, "logp": logp}, f"{out}.answer.pt")
    save_session(session, f"{out}.memory")


def main(path: str) -> None:
    from hermes.engine.persist import load_session
    from hermes.models.loading import load_video_lm

    spec = json.loads(Path(path).read_text())
    torch.set_num_threads(spec["threads"])
    models = {}
    for case in spec["cases"]:
        if case["model"] not in models:
            models[case["model"]] = load_video_lm(case["model"], dtype="fp32")
        lm = models[case["model"]]
        session = load_session(lm, case["file"])
        go_on(session, case["start"], case["stop"], case["out"])


if __name__ == "__main__":
    main(sys.argv[1])
