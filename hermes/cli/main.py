"""Command line: python -m hermes {stream, ask, build-tiny, bench, eval, toyworld, cluster}."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hermes.cli.bench import add_bench_parser
from hermes.cli.build_tiny import add_build_tiny_parser
from hermes.cli.cluster import add_cluster_parser
from hermes.cli.eval import add_eval_parser
from hermes.cli.memory import add_ask_parser
from hermes.cli.stream import add_stream_parser
from hermes.cli.toyworld import add_toyworld_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hermes", description="HERMES Live: streaming video memory")
    sub = parser.add_subparsers(dest="command", required=True)
    add_stream_parser(sub)
    add_ask_parser(sub)
    add_build_tiny_parser(sub)
    add_bench_parser(sub)
    add_eval_parser(sub)
    add_toyworld_parser(sub)
    add_cluster_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; user errors print one clear line and exit with status 2."""
    from hermes.engine.session import QuestionError
    from hermes.models.loading import ModelLoadError
    from hermes.video.decoding import VideoError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (VideoError, ModelLoadError, QuestionError, ValueError) as exc:
        if args.command == "stream" and args.json:
            print(json.dumps({"event": "error", "message": str(exc)}), flush=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
