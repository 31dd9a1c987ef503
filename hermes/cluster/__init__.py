"""Streams across a Ray cluster (docs/deployment.md): engines, each a Ray actor that loads the model
once and owns many streams with hermes.serving's registry unchanged inside; a directory that maps
each viewer's key to its engine, places new streams and moves the streams of an engine that dies
from their checkpoints in the shared state folder; and the front end's registry, whose streams the
page steers as it steers a `LiveStream`.

Only `app.py --ray` and `python -m hermes cluster` import this package: without them nothing
imports ray.
"""

from hermes.cluster.engine import Engine
from hermes.cluster.front import RemoteRegistry, RemoteStream
from hermes.cluster.launch import EngineConfig, connect, directory, engine, ensure_cluster, tear_down
from hermes.cluster.records import (
    MoveResult,
    StreamRecord,
    browser_secret,
    checkpoint_key,
    memory_digest,
    short_id,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "MoveResult",
    "RemoteRegistry",
    "RemoteStream",
    "StreamRecord",
    "browser_secret",
    "checkpoint_key",
    "connect",
    "directory",
    "engine",
    "ensure_cluster",
    "memory_digest",
    "short_id",
    "tear_down",
]
