"""`python -m hermes build-tiny`: write a tiny random-weight checkpoint of a supported architecture."""

from __future__ import annotations

import argparse


def add_build_tiny_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("build-tiny", help="write a tiny random-weight checkpoint of a supported architecture")
    from hermes.models.tiny import SUPPORTED_ARCHS

    p.add_argument("--arch", choices=SUPPORTED_ARCHS, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_build_tiny)
    return p


def cmd_build_tiny(args: argparse.Namespace) -> int:
    from hermes.models.tiny import build_tiny

    out = build_tiny(args.arch, args.out, num_layers=args.layers, seed=args.seed)
    print(f"wrote a random-weight {args.arch} checkpoint with {args.layers} layers to {out}")
    return 0
