"""The directory: which engine holds each viewer's stream, where a new stream goes, and moving the
streams of an engine that died or is drained.

It runs as one named, detached Ray actor (hermes.cluster.launch). A new stream goes to the live,
undrained engine with the most free memory (fewest streams on a tie), by the engines' last health
reports less what was placed since; the front end tries the next one if that engine's admission
refuses. Every `every_s` seconds each engine is asked for its health: an engine whose actor died,
that misses `max_misses` checks in a row (it is then killed, so that it cannot go on writing the
checkpoints of streams that moved), or that comes back as a new incarnation (a restarted actor,
holding nothing) has its streams moved to the others from their last checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections import Counter

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from hermes.cluster.records import EngineHealth, Failed, MoveResult, StreamFacts, StreamRecord

log = logging.getLogger(__name__)
ADOPT_TIMEOUT_S = 300.0
MOVES_KEPT = 100


class Directory:
    """Viewer key -> engine name, the engines' health, and moves (see the module's docstring)."""

    def __init__(
        self, engines: list[str], namespace: str, every_s: float = 1.0, max_misses: int = 3, verify: bool = False
    ) -> None:
        self.namespace = namespace
        self.every_s, self.max_misses, self.verify = every_s, max_misses, verify
        self.owner: dict[str, str] = {}  # viewer key -> engine
        self.health: dict[str, EngineHealth | None] = dict.fromkeys(engines)
        self.misses: dict[str, int] = dict.fromkeys(engines, 0)
        self.dead: set[str] = set()
        self.draining: set[str] = set()
        self.moves: list[MoveResult] = []
        self._pending: dict[str, ray.ObjectRef] = {}  # a health check not answered yet
        self._handles: dict[str, ray.actor.ActorHandle] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="hermes-directory", daemon=True).start()

    def register(self, name: str) -> None:
        """Watch engine `name` too (an engine started after the directory)."""
        with self._lock:
            self.health.setdefault(name, None)
            self.misses.setdefault(name, 0)

    def lookup(self, key: str) -> str | None:
        """The engine holding viewer `key`'s stream, or None."""
        with self._lock:
            return self.owner.get(key)

    def assign(self, key: str, away_from: tuple[str, ...] = ()) -> str | None:
        """The engine of viewer `key`: its own, or (a new stream, or away from the engines named, which
        refused it) the one with the most free memory; None when no engine is left."""
        with self._lock:
            owner = self.owner.get(key)
            if owner is not None and owner not in away_from and owner not in self.dead:
                return owner
            ranked = self.ranked(exclude=set(away_from))
            if not ranked:
                return None
            self.owner[key] = ranked[0]
            return ranked[0]

    def ranked(self, exclude: set[str] = frozenset()) -> list[str]:
        """Live, undrained engines that reported, most free memory first (fewest streams on a tie):
        their last report's free memory less what the streams placed there since may take."""
        owned = Counter(self.owner.values())

        def free(name: str) -> tuple[float, int]:
            h = self.health[name]
            unreported = sum(1 for k, e in self.owner.items() if e == name and k not in h.streams)
            per_stream = (h.cap_bytes - h.free_bytes) / len(h.streams) if h.streams else 0
            return h.free_bytes - unreported * per_stream, -owned[name]

        names = [n for n, h in self.health.items() if h is not None and n not in self.dead | self.draining | exclude]
        return sorted(names, key=free, reverse=True)

    def forget(self, key: str) -> None:
        """Viewer `key`'s stream was closed."""
        with self._lock:
            self.owner.pop(key, None)

    def status(self) -> dict:
        """The engines (alive, draining, free memory, streams) and the last moves, as plain data."""
        with self._lock:
            engines = {
                name: {
                    "alive": name not in self.dead and h is not None,
                    "draining": name in self.draining,
                    "node": None if h is None else h.node_id,
                    "free_bytes": None if h is None else h.free_bytes,
                    "cap_bytes": None if h is None else h.cap_bytes,
                    "max_streams": None if h is None else h.max_streams,
                    "streams": sorted(k for k, e in self.owner.items() if e == name),
                }
                for name, h in self.health.items()
            }
            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
            return {"engines": engines, "moves": list(self.moves), "node": node}

    def stop(self) -> None:
        self._stop.set()

    def engine(self, name: str) -> ray.actor.ActorHandle:
        """Engine `name`'s actor (ValueError when there is none by that name)."""
        if name not in self._handles:
            self._handles[name] = ray.get_actor(name, namespace=self.namespace)
        return self._handles[name]

    # -- health and moves ----------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:  # the watch must outlive any one round
                log.exception("a round of health checks failed")

    def check(self) -> None:
        """One round of health checks; the streams of engines found dead are moved."""
        with self._lock:
            names = list(self.health)
        for name in names:
            if name not in self._pending:
                try:
                    self._pending[name] = self.engine(name).health.remote()
                except ValueError:  # not created yet, or gone for good
                    self._miss(name)
        if refs := list(self._pending.values()):
            ray.wait(refs, num_returns=len(refs), timeout=self.every_s)
        for name, ref in list(self._pending.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                self._miss(name)
                continue
            del self._pending[name]
            try:
                self._report(name, ray.get(ref))
            except RayActorError:
                self._died(name)

    def _miss(self, name: str) -> None:
        self.misses[name] = self.misses.get(name, 0) + 1
        if self.misses[name] >= self.max_misses and name not in self.dead:
            # Fenced: a stalled engine must not go on writing the checkpoints of streams that move.
            with contextlib.suppress(ValueError):
                ray.kill(self.engine(name), no_restart=False)
            self._pending.pop(name, None)
            self._died(name)

    def _report(self, name: str, health: EngineHealth) -> None:
        with self._lock:
            before = self.health.get(name)
            self.misses[name] = 0
            # A restarted actor (a new incarnation) holds none of the streams it had: they move.
            lost = before is not None and before.incarnation != health.incarnation and name not in self.dead
            if lost:
                self.dead.add(name)
            for key in health.streams:
                self.owner.setdefault(key, name)  # a directory restarted learns where streams are
        if lost:
            self._move_all(name, before)
        with self._lock:
            self.dead.discard(name)
            self.health[name] = health

    def _died(self, name: str) -> None:
        with self._lock:
            if name in self.dead:
                return
            self.dead.add(name)
            last = self.health.get(name)
        log.warning("engine %s is gone: moving its streams", name)
        self._move_all(name, last)

    def _move_all(self, name: str, last: EngineHealth | None) -> None:
        """Move every stream of engine `name` (as its last report `last` described them) elsewhere."""
        with self._lock:
            keys = [k for k, e in self.owner.items() if e == name]
        for key in keys:
            facts = last.streams.get(key) if last is not None else None
            self.move(key, name, facts or StreamFacts(None, "unknown", 0.0, 0))

    def move(self, key: str, from_engine: str, facts: StreamFacts) -> MoveResult | None:
        """Move viewer `key`'s stream from `from_engine` to the best other engine that admits it."""
        if facts.record is None:  # no source was started: its memory alone moves
            facts = dataclasses.replace(facts, record=StreamRecord(key, "memory"))
        tried = {from_engine}
        while (target := self.assign(key, tuple(tried))) is not None:
            try:
                out = ray.get(
                    self.engine(target).adopt.remote(facts, from_engine, self.verify), timeout=ADOPT_TIMEOUT_S
                )
            except (RayActorError, GetTimeoutError) as exc:
                out = Failed.of(RuntimeError(str(exc)))
            if not isinstance(out, Failed):
                with self._lock:
                    self.moves = [*self.moves, out][-MOVES_KEPT:]
                return out
            log.warning("engine %s did not take a stream: %s", target, out.message)
            tried.add(target)
        with self._lock:
            self.owner.pop(key, None)
        log.warning("no engine could take a stream of %s", from_engine)
        return None

    def drain(self, name: str) -> list[MoveResult]:
        """Move every stream of engine `name` away (after each is checkpointed there); no new stream
        goes there until `undrain`."""
        with self._lock:
            self.draining.add(name)
            keys = [k for k, e in self.owner.items() if e == name]
        moved = []
        for key in keys:
            facts = ray.get(self.engine(name).drain.remote(key), timeout=ADOPT_TIMEOUT_S)
            if facts is not None and (out := self.move(key, name, facts)) is not None:
                moved.append(out)
        return moved

    def undrain(self, name: str) -> None:
        with self._lock:
            self.draining.discard(name)
