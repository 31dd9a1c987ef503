"""`python -m hermes cluster {up, status, drain, undrain}`: the engines and directory of a Ray cluster
(docs/deployment.md). ray is imported only when one of these runs."""

from __future__ import annotations

import argparse
import json
import os
import sys

from hermes.cli.options import DTYPE_ENV

MB = 2**20


def add_cluster_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("cluster", help="streams across a Ray cluster: start engines, list them, drain one")
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="the cluster's head (host:port; default: $RAY_ADDRESS, else auto: the cluster of this node)",
    )
    verbs = p.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="make the engines (one per hermes_engine slot, else per GPU) and the directory")
    up.add_argument("--state-dir", required=True, help="a folder every node shares (checkpoints and uploads)")
    up.add_argument("--model", default=None, help="hub id, local folder or alias (default: the device's default)")
    up.add_argument("--device", default=None)
    up.add_argument("--dtype", default=os.environ.get(DTYPE_ENV))
    up.add_argument("--max-sessions", type=int, default=4, help="streams each engine runs at once")
    up.add_argument("--lease-s", type=float, default=60.0)
    up.add_argument("--memory-cap-mb", type=float, default=None)
    up.add_argument("--checkpoint-every", type=int, default=8, metavar="CHUNKS")
    status = verbs.add_parser("status", help="the engines, their streams and free memory, and the last moves")
    status.add_argument("--json", action="store_true", help="print plain JSON")
    for verb, what in (("drain", "move an engine's streams away, and place none there"), ("undrain", "place again")):
        v = verbs.add_parser(verb, help=what)
        v.add_argument("engine", help="the engine's name, as `status` lists it")
    p.set_defaults(func=cmd_cluster)
    return p


def cmd_cluster(args: argparse.Namespace) -> int:
    import ray

    from hermes.cluster import EngineConfig, connect, directory, ensure_cluster, short_id

    try:
        connect(args.address)
    except (ConnectionError, ValueError) as exc:
        print(f"hermes cluster: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.verb == "up":
            config = EngineConfig(
                args.state_dir, args.model, args.device, args.dtype, args.max_sessions, args.lease_s,
                args.memory_cap_mb, args.checkpoint_every,
            )  # fmt: skip
            for name in ensure_cluster(config):
                print(f"engine {name} ready")
            return 0
        d = directory()
        if args.verb == "drain":
            for move in ray.get(d.drain.remote(args.engine)):
                print(f"stream {short_id(move.key)} moved to {move.to_engine} in {move.took_s:.1f} s")
            return 0
        if args.verb == "undrain":
            ray.get(d.undrain.remote(args.engine))
            return 0
        print_status(ray.get(d.status.remote()), args.json)
        return 0
    finally:
        ray.shutdown()


def print_status(status: dict, as_json: bool) -> None:
    """The directory's status: one line per engine and per stream (named by `short_id`, never by key)."""
    from hermes.cluster import short_id

    engines = {
        name: e | {"streams": [short_id(k) for k in e["streams"]]} for name, e in sorted(status["engines"].items())
    }
    moves = [
        {"stream": short_id(m.key), "from": m.from_engine, "to": m.to_engine, "lost_s": m.lost_s}
        for m in status["moves"]
    ]
    if as_json:
        print(json.dumps({"engines": engines, "moves": moves}, indent=2))
        return
    for name, e in engines.items():
        state = "draining" if e["draining"] else "alive" if e["alive"] else "gone"
        free = "?" if e["free_bytes"] is None else f"{e['free_bytes'] / MB:,.0f} of {e['cap_bytes'] / MB:,.0f} MB free"
        print(f"{name}  {state}  {free}  {len(e['streams'])} stream(s): {', '.join(e['streams']) or '-'}")
    for m in moves:
        print(f"moved {m['stream']}: {m['from']} -> {m['to']}, {m['lost_s']:.0f} s of video lost")
