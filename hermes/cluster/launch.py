"""Bringing the cluster's actors up: one engine per `hermes_engine` slot (else per GPU) and the
directory, each a named, detached actor that Ray restarts (`max_restarts=-1`); and finding them.

`ensure_cluster` is idempotent (`get_if_exists`): every front end and `hermes cluster up` may call it,
and the first caller's configuration is the one the actors keep. Slots that join later get their
engines at the next call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hermes.cluster.directory import Directory
from hermes.cluster.engine import Engine

NAMESPACE = "hermes"
DIRECTORY = "hermes-directory"
ENGINE_PREFIX = "hermes-engine-"
SLOT = "hermes_engine"  # the custom resource a CPU node offers engines (`ray start --resources`)
HEAD = "node:__internal_head__"
# Calls an engine serves at once: the page's ticks and controls, and every answer streaming out.
ENGINE_CONCURRENCY = 64
REPORT_WAIT_S = 60.0


@dataclass(frozen=True)
class EngineConfig:
    """What every engine is made with (see `Engine`)."""

    state_dir: str
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_streams: int = 4
    lease_s: float = 60.0
    memory_cap_mb: float | None = None
    every_chunks: int = 8


class RayEngine(Engine):
    """An `Engine` as a Ray actor: it knows its node."""

    def __init__(self, name: str, **config: object) -> None:
        super().__init__(name, **config)
        self.node_id = ray.get_runtime_context().get_node_id()


class RayDirectory(Directory):
    """The `Directory` as a Ray actor."""


def connect(address: str, namespace: str = NAMESPACE, timeout_s: float = 5.0) -> None:
    """Join the cluster at `address` ('auto': the one this node belongs to) as a driver; ValueError
    for an address that is not host:port, ConnectionError when no head answers there."""
    if ray.is_initialized():
        return
    if address != "auto":
        # Ray itself retries an unreachable head for minutes, printing a warning every few seconds.
        host, _, port = address.split("://")[-1].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a Ray address is host:port or auto, not {address!r}")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as exc:
            raise ConnectionError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    except ConnectionError as exc:  # 'auto' on a node that is in no cluster
        raise ConnectionError(f"no Ray cluster to join at {address}: {exc}") from None


def engine_slots() -> list[dict]:
    """The actor options of each engine: one per `hermes_engine` slot of the cluster, else per GPU."""
    resources = ray.cluster_resources()
    if resources.get(SLOT, 0) >= 1:
        return [{"resources": {SLOT: 1}, "num_gpus": 0}] * int(resources[SLOT])
    if resources.get("GPU", 0) >= 1:
        return [{"num_gpus": 1}] * int(resources["GPU"])
    raise ValueError(
        f"this cluster has no engine slots: start its nodes with --resources='{{\"{SLOT}\": 1}}' or with GPUs"
    )


def head_node() -> str | None:
    """The head node's id: the directory is pinned there (the cluster stands or falls with it anyway;
    measured: a soft affinity let Ray place it on an engine's node)."""
    return next((n["NodeID"] for n in ray.nodes() if n["Alive"] and HEAD in n["Resources"]), None)


def ensure_cluster(config: EngineConfig, every_s: float = 1.0, max_misses: int = 3, verify: bool = False) -> list[str]:
    """Make the engines and the directory that do not exist yet, wait for every engine's model but
    those whose node is gone; the names of the cluster's engines. `every_s`, `max_misses`: the
    directory's health checks; `verify`: each move also reports the digest of the memory it loaded
    (a memory file's write, for tests and the bench)."""
    namespace = ray.get_runtime_context().namespace
    names = [f"{ENGINE_PREFIX}{i}" for i in range(len(engine_slots()))]
    common = {"lifetime": "detached", "get_if_exists": True, "max_restarts": -1, "num_cpus": 0}
    # The state folder is the one place engines share: an absolute path, the same on every node.
    fields = dataclasses.asdict(config) | {"state_dir": os.path.abspath(config.state_dir)}
    engines = [
        ray.remote(RayEngine)
        .options(name=name, max_concurrency=ENGINE_CONCURRENCY, **common, **slot)
        .remote(name, **fields)
        for name, slot in zip(names, engine_slots(), strict=True)
    ]
    head = head_node()
    placement = {} if head is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False)}
    directory = (
        ray.remote(RayDirectory)
        .options(name=DIRECTORY, max_concurrency=16, **common, **placement)
        .remote(names, namespace, every_s, max_misses, verify)
    )
    ray.get([directory.register.remote(name) for name in names])
    # The engines numbered past today's slots (a node is gone) are the cluster's too: one of them may
    # be the one that is up while a lower-numbered one waits for a node.
    handles = dict(zip(names, engines, strict=True))
    for name in ray.get(directory.status.remote())["engines"]:
        if name not in handles:
            handles[name] = ray.get_actor(name, namespace=namespace)
    names = list(handles)
    up = _loaded(directory, handles)
    deadline = time.monotonic() + REPORT_WAIT_S  # placement reads the engines' health reports
    while not all(ray.get(directory.status.remote())["engines"][name]["alive"] for name in up):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the directory heard from no engine in {REPORT_WAIT_S:.0f} s")
        time.sleep(every_s / 4)
    return names


def _loaded(directory: ray.actor.ActorHandle, engines: dict[str, ray.actor.ActorHandle]) -> list[str]:
    """The engines that answer once their model is loaded, waiting for each but those the directory
    knows to have died (an engine whose node is gone waits for a node to restart on: a front end
    starting meanwhile must not wait for it); ValueError when none answers."""
    pending = {e.facts.remote(): name for name, e in engines.items()}
    up = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
        for ref in ready:
            name = pending.pop(ref)
            with contextlib.suppress(RayActorError):  # died meanwhile: not up
                ray.get(ref)
                up.append(name)
        status = ray.get(directory.status.remote())["engines"]
        dead = [ref for ref, name in pending.items() if status[name]["node"] is not None and not status[name]["alive"]]
        for ref in dead:
            del pending[ref]
    if not up:
        raise ValueError("no engine of this cluster is up: every engine's node is gone")
    return up


def directory() -> ray.actor.ActorHandle:
    """The directory's actor; ValueError when the cluster has none (`hermes cluster up` makes it)."""
    return ray.get_actor(DIRECTORY, namespace=ray.get_runtime_context().namespace)


def engine(name: str) -> ray.actor.ActorHandle:
    """Engine `name`'s actor; ValueError when there is none."""
    return ray.get_actor(name, namespace=ray.get_runtime_context().namespace)


def tear_down(names: list[str]) -> None:
    """Kill the directory and the engines `names` for good (their detached actors outlive drivers)."""
    for name in [DIRECTORY, *names]:
        try:
            ray.kill(ray.get_actor(name, namespace=ray.get_runtime_context().namespace), no_restart=True)
        except ValueError:
            continue
