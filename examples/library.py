"""Use the HERMES memory in your own code: stream a video into a `HermesCache`, then answer with
plain `model.generate`.

    python examples/library.py --model tiny                     # offline, random weights
    python examples/library.py --model tiny-qwen35              # a hybrid Qwen3.5, offline
    python examples/library.py --model llava-hf/llava-onevision-qwen2-0.5b-ov-hf --video my.mp4
    python examples/library.py --model tiny --save-memory memory.hermes  # keep the memory in a file

The model and processor are loaded with `transformers` itself. HERMES Live's engine prefills each
chunk into the cache and compresses it to the budget; the question is then answered by
`model.generate` running on that same cache, which it leaves exactly as it was.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

# So that the example also runs from a checkout where `pip install .` was never run. Code of your
# own needs no such line once HERMES is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes import HermesCache, HermesConfig
from hermes.engine.persist import load_session, save_session
from hermes.engine.session import StreamingSession
from hermes.models.loading import resolve, wrap
from hermes.runtime import open_source, play

SAMPLE = Path(__file__).resolve().parent.parent / "assets" / "cockatoo.mp4"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="hub id, local folder, or 'tiny' / 'tiny-qwen' / 'tiny-qwen35'")
    parser.add_argument("--video", default=str(SAMPLE))
    parser.add_argument("--question", default="What is happening in the video?")
    parser.add_argument("--budget", type=int, default=512, help="video tokens each layer keeps")
    parser.add_argument("--save-memory", default=None, help="save the memory to this file, then load it back")
    args = parser.parse_args()

    # 1. Load with transformers (an alias such as 'tiny' resolves to a local folder first).
    path, random_weights = resolve(args.model)
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa")
    lm = wrap(model, processor)

    # 2. Stream the video chunk by chunk; the session's memory is a HermesCache.
    config = HermesConfig(budget=args.budget, chunk_frames=4, fps=lm.default_fps)
    session = StreamingSession(lm, config, policy="hermes")
    cache: HermesCache = session.memory
    #    The runtime opens the source (a file, a folder of frames or a URL) and feeds it in chunks.
    source = open_source(args.video, config.fps, config.chunk_frames)
    for _report in play(session, source.frames(0.0, config.fps, print), (), lambda _: None):
        pass
    # A hybrid model (Qwen3.5) has key-value layers only every fourth layer; the others hold a state.
    kept = cache.video_tokens_per_layer()[-1]
    print(f"{session.frames_seen} frames streamed; each key-value layer keeps {kept} video tokens")

    # 3. Answer with plain generate on the cache: only the question's tokens are new, at the
    #    positions the memory says come next. `scratch()` drops the question and answer after.
    question = lm.question_ids(args.question)
    n = question.shape[-1]
    with cache.scratch():
        out = model.generate(
            question,
            attention_mask=torch.ones(1, cache.get_seq_length() + n, dtype=torch.long),
            position_ids=cache.position_ids(n),
            cache=cache,
            max_new_tokens=32,
            do_sample=False,
        )
    print(f"Q: {args.question}\nA: {processor.tokenizer.decode(out[0, n:], skip_special_tokens=True)}")
    if random_weights:
        print("(random weights: the answer is noise; the memory it was read from is real)")

    # 4. Keep the memory: one file holds the cache and the stream's state. Loaded into the same
    #    model (in this process or another), the stream goes on, and answers, as this one would.
    if args.save_memory:
        size = save_session(session, args.save_memory)
        again = load_session(lm, args.save_memory)
        print(f"memory saved to {args.save_memory} ({size / 2**20:.1f} MiB); loaded back: {again.frames_seen} frames")
        print(f"A (from the file): {again.ask(args.question, max_new_tokens=32).text}")


if __name__ == "__main__":
    main()
