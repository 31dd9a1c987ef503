"""The memory file on the command line: `stream --save-memory/--save-every/--load-memory`, and
`python -m hermes ask FILE QUESTION`, which answers from a saved memory without any video."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from hermes.cli.options import DTYPE_ENV, local_model_help
from hermes.memory.config import HermesConfig

# The memory options a resumed stream takes from its file when they are left at these defaults.
MEMORY_DEFAULTS = {"budget": HermesConfig.budget, "chunk_frames": HermesConfig.chunk_frames, "fps": None}


def add_memory_file_options(p: argparse.ArgumentParser) -> None:
    """--save-memory, --save-every and --load-memory, for `stream`."""
    p.add_argument(
        "--save-memory",
        metavar="FILE",
        default=None,
        help="save the stream's memory to FILE at the end (and every --save-every minutes); written atomically",
    )
    p.add_argument(
        "--save-every", type=float, default=None, metavar="MINUTES", help="also save the memory every MINUTES"
    )
    p.add_argument(
        "--load-memory",
        metavar="FILE",
        default=None,
        help="go on from a saved memory: the video resumes after the memory's stream time, with its model, policy "
        "and settings (options left at their defaults take the file's values)",
    )


def check_memory_file_options(args: argparse.Namespace):
    """Refuse bad --save-memory, --save-every and --load-memory before the model loads; the loaded
    file (hermes.memory.persist.MemoryFile), or None."""
    from hermes.engine.persist import read_session

    if args.save_every is not None and (args.save_memory is None or not args.save_every > 0):
        raise ValueError("--save-every wants a positive number of minutes, and --save-memory FILE to save to")
    if args.save_memory is not None:
        folder = Path(args.save_memory).expanduser().resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ValueError(f"--save-memory {args.save_memory}: the folder {folder} does not exist or is not writable")
    if args.load_memory is None:
        return None
    if args.param:
        raise ValueError(
            "--param does not apply to --load-memory: the memory goes on with the constants it was kept with"
        )
    return read_session(args.load_memory)


def model_for(args: argparse.Namespace, memory) -> None:
    """Take the model and dtype from a loaded memory file where the command line leaves them open
    ($HERMES_DTYPE, when set, still goes before the file's dtype, as for every command)."""
    model = memory.header["model"]
    if args.model is None:
        args.model = model.get("source")
    if args.dtype is None:
        args.dtype = os.environ.get(DTYPE_ENV) or model.get("dtype")


def resumed_session(args: argparse.Namespace, memory, lm, host_cap: int | None):
    """The session saved in `memory` (checked against `lm` and the options given), for `stream`."""
    from hermes.engine.persist import load_session
    from hermes.serving.admission import block_tokens_bound

    saved = memory.header["cache"]["config"]
    given = {k: getattr(args, k) for k, default in MEMORY_DEFAULTS.items() if getattr(args, k) != default}
    if args.reindex not in (None, "lazy"):
        given["reindex"] = args.reindex
    config = HermesConfig(**{**saved, "smoothing": tuple(saved["smoothing"]), **given}) if given else None
    from hermes.engine.methods import DEFAULT_POLICY

    policy = None if args.policy == DEFAULT_POLICY else args.policy  # the file's, unless another was asked for
    # The frames `stream` decodes are the app's: a memory asks for no more storage than a stream of them needs.
    block = block_tokens_bound(lm)
    return load_session(lm, args.load_memory, policy=policy, config=config, host_cap_bytes=host_cap, block_tokens=block)


def start_time(session) -> float:
    """Where the video resumes (hermes.engine.persist.resume_time)."""
    from hermes.engine.persist import resume_time

    return resume_time(session)


class Checkpoints:
    """Saves a session's memory to one file, every `every_s` seconds between chunks and at the end."""

    def __init__(self, session, path: str | None, every_s: float | None) -> None:
        self.session = session
        self.path = path
        self.every_s = every_s
        self.last = time.monotonic()

    def tick(self) -> None:
        """After a chunk: save if the interval has passed."""
        if self.path is not None and self.every_s is not None and time.monotonic() - self.last >= self.every_s:
            self.save()

    def save(self) -> None:
        from hermes.engine.persist import save_session

        if self.path is not None:
            size = save_session(self.session, self.path)
            self.last = time.monotonic()
            print(
                f"memory saved to {self.path} ({size / 2**20:,.2f} MiB, {self.session.frames_seen:,} frames)",
                file=sys.stderr,
            )


def add_ask_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("ask", help="answer questions from a saved memory file (no video needed)")
    p.add_argument("memory", help="a memory file written by `stream --save-memory` or the library")
    p.add_argument("question", nargs="+", help="one or more questions, answered in turn")
    p.add_argument("--model", default=None, help=f"{local_model_help()} (default: the model the memory was saved with)")
    from hermes.models.loading import DTYPE_CHOICES

    p.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default=None, help="precision (default: the one the memory was saved in)"
    )
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", action="store_true", help="one JSON object per answer")
    p.set_defaults(func=cmd_ask)
    return p


def cmd_ask(args: argparse.Namespace) -> int:
    from hermes.engine.persist import file_summary, load_session, read_session
    from hermes.engine.session import validate_question
    from hermes.models.loading import load_video_lm
    from hermes.serving.admission import block_tokens_bound

    questions = [validate_question(q) for q in args.question]
    memory = read_session(args.memory)  # a bad file fails before the model loads
    model_for(args, memory)
    lm = load_video_lm(args.model, device=args.device, dtype=args.dtype)
    session = load_session(lm, args.memory, block_tokens=block_tokens_bound(lm))  # checked against the model first
    if not args.json:
        print(f"memory: {file_summary(memory)}", file=sys.stderr)
        if lm.random_weights:
            print("note: random weights: answers are noise, the memory dynamics are real", file=sys.stderr)
    for question in questions:
        answer = session.ask(question, args.max_new_tokens)
        if args.json:
            record = {"question": question, "text": answer.text, "at_s": answer.at_s, "ttft_ms": answer.ttft_ms}
            print(json.dumps(record | {"frames_seen": answer.frames_seen, "tokens": answer.tokens}), flush=True)
        else:
            print(f"Q: {question}\nA: {answer.text}\n   (TTFT {answer.ttft_ms:.1f} ms, at {answer.at_s:.1f} s)")
    return 0
