"""HERMES Live: `python app.py` serves the Gradio app.

The model comes from --model, else $HERMES_MODEL, else the device's default (on a GPU the
LLaVA-OneVision 0.5B checkpoint, on a CPU Qwen3.5-0.8B, which keeps up with 1 frame/s on 2 cores), in
--dtype (else $HERMES_DTYPE, else auto), on --device or spread over the GPUs by --device-map (else
$HERMES_DEVICE_MAP). If it cannot be loaded (offline, say), the app starts anyway on a random-weight
model of the default's architecture ("tiny-24" on a GPU, "tiny-qwen35-24" on a CPU) and says so on
the page. Host and port follow --host/--port, else
GRADIO_SERVER_NAME/GRADIO_SERVER_PORT, else Gradio's defaults (127.0.0.1:7860). With --state-dir
(else $HERMES_STATE_DIR) each viewer's memory is checkpointed there and offered back after a restart.
With --ray ADDRESS (or auto) the page is a front end of a Ray cluster (docs/deployment.md): every
stream lives on one of the cluster's engines, made from these options if the cluster has none yet,
checkpointed to --state-dir (a folder every node shares). Without --ray nothing imports ray.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from hermes.serving import AUTO_DTYPE_HELP

    p = argparse.ArgumentParser(prog="app.py", description="HERMES Live: chat with a video while it plays.")
    p.add_argument(
        "--model",
        default=None,
        help="hub id, local folder or alias (default: $HERMES_MODEL, else LLaVA-OV 0.5B on a GPU and "
        "Qwen3.5-0.8B on a CPU)",
    )
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument(
        "--dtype",
        default=os.environ.get("HERMES_DTYPE", "auto"),
        help=f"auto, bf16, fp16 or fp32; {AUTO_DTYPE_HELP} (default: $HERMES_DTYPE, else auto)",
    )
    p.add_argument(
        "--device-map",
        default=os.environ.get("HERMES_DEVICE_MAP"),
        help="auto (or balanced, balanced_low_0, sequential): spread a model larger than one GPU over all visible "
        "GPUs, and the CPU when they are full (default: $HERMES_DEVICE_MAP, else the whole model on --device)",
    )
    p.add_argument("--host", default=None, help="address to serve on (default: $GRADIO_SERVER_NAME or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--max-sessions", type=int, default=4, help="streams that may run at once (more are told to wait)")
    p.add_argument(
        "--lease-s",
        type=float,
        default=60.0,
        help="seconds without a sign of a stream's viewer (page heartbeat, request, /metrics or /keepalive) after "
        "which the stream is stopped and its slot and memory freed (default: 60)",
    )
    p.add_argument(
        "--memory-cap-mb",
        type=float,
        default=None,
        help="cache memory that streams may reserve in all (default: $HERMES_MEMORY_CAP_MB, else the free GPU "
        "memory less a margin, or on the CPU 4096 MB or half the free RAM if less)",
    )
    p.add_argument(
        "--state-dir",
        default=os.environ.get("HERMES_STATE_DIR"),
        help="keep each viewer's memory in this folder, checkpointed every --checkpoint-every chunks, and offer it "
        "back to the same browser after a restart (default: $HERMES_STATE_DIR, else no checkpoints)",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=None, metavar="CHUNKS", help="chunks between checkpoints (default: 8)"
    )
    p.add_argument(
        "--checkpoint-days",
        type=float,
        default=None,
        help="checkpoints not written for this many days are deleted (default: 7)",
    )
    p.add_argument(
        "--state-max-mb",
        type=float,
        default=None,
        help="the state folder's size cap: past it the oldest checkpoints are deleted (default: 2048)",
    )
    p.add_argument(
        "--allow-urls",
        nargs="?",
        const="",
        default=None,
        metavar="HOSTS",
        help="let viewers open network streams (RTSP, RTMP, SRT, HLS, MJPEG, MP4 over HTTP): from any public "
        "address, or with HOSTS (comma-separated host names and networks, e.g. cam.local,10.0.0.0/8) only from "
        "those; loopback and private addresses only when named (default: no URLs)",
    )
    add_cluster_option(p)
    return p.parse_args(argv)


def add_cluster_option(p: argparse.ArgumentParser) -> None:
    """--ray: the page as a front end of a Ray cluster."""
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="serve the streams of a Ray cluster's engines (host:port of its head, or auto); needs --state-dir on "
        "a folder every node shares (default: one process, no Ray)",
    )


def cluster_front(args: argparse.Namespace):
    """Join the Ray cluster at `args.ray`, make its engines and directory if it has none (from these
    options), and return the front end's registry of the cluster's streams."""
    from hermes.cluster import EngineConfig, RemoteRegistry, connect, ensure_cluster

    connect(args.ray)
    config = EngineConfig(
        args.state_dir, args.model, args.device, args.dtype, args.max_sessions, args.lease_s,
        args.memory_cap_mb, args.checkpoint_every or 8,
    )  # fmt: skip
    ensure_cluster(config)
    return RemoteRegistry()


def checkpoint_options(args: argparse.Namespace) -> dict:
    """The checkpoint options given, as `CheckpointStore` takes them (those left out keep its defaults)."""
    given = {
        "every_chunks": args.checkpoint_every,
        "max_age_s": None if args.checkpoint_days is None else args.checkpoint_days * 86400,
        "max_bytes": None if args.state_max_mb is None else int(args.state_max_mb * 2**20),
    }
    return {k: v for k, v in given.items() if v is not None}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Imported here, so that --help answers before torch and gradio load.
    from hermes.serving import CheckpointStore, UrlPolicy, load_model_or_fallback, requested_model
    from ui import build_app, launch_options

    if args.ray is not None:
        return serve_cluster(args)
    checkpoints = None
    if args.state_dir is not None:
        try:
            checkpoints = CheckpointStore(args.state_dir, **checkpoint_options(args))
        except ValueError as exc:  # an unwritable folder, a bad number: one line, as argparse does
            print(f"app.py: error: {exc}", file=sys.stderr)
            return 2
    name = requested_model(args.model, args.device)
    try:
        urls = UrlPolicy.parse(args.allow_urls)
        lm, load_error = load_model_or_fallback(name, args.device, args.dtype, args.device_map)
    except ValueError as exc:  # a bad --dtype, --device-map (or their variables) or --allow-urls: say which
        print(f"app.py: error: {exc}", file=sys.stderr)
        return 2
    cap_mb = args.memory_cap_mb
    demo = build_app(
        lm,
        load_error=load_error,
        max_streams=args.max_sessions,
        memory_cap_bytes=None if cap_mb is None else int(cap_mb * 2**20),
        checkpoints=checkpoints,
        lease_s=args.lease_s,
        urls=urls,
    )
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())
    return 0


def serve_cluster(args: argparse.Namespace) -> int:
    """`main` with --ray: the same page, every stream on the cluster's engines (which checkpoint it),
    found by the key the viewer's browser keeps, whichever front end serves the page."""
    from hermes.cluster import browser_secret
    from hermes.serving import UrlPolicy
    from ui import build_app, launch_options

    if args.state_dir is None:
        print("app.py: error: --ray needs --state-dir, a folder every node of the cluster shares", file=sys.stderr)
        return 2
    try:
        urls = UrlPolicy.parse(args.allow_urls)
    except ValueError as exc:
        print(f"app.py: error: {exc}", file=sys.stderr)
        return 2
    try:
        registry = cluster_front(args)
    except (ConnectionError, ValueError) as exc:  # no head at --ray, a malformed address: one line
        print(f"app.py: error: --ray: {exc}", file=sys.stderr)
        return 2
    secret = browser_secret(args.state_dir)
    demo = build_app(registry.lm, registry=registry, load_error=registry.load_error, urls=urls, browser_secret=secret)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())
    return 0


if __name__ == "__main__":
    sys.exit(main())
