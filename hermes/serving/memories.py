"""The model thread's side of a live stream: its memories, one `StreamingSession` per policy.

Every method here runs on the one model thread (hermes.serving.worker), as a job a `LiveStream`
(hermes.serving.live) submitted, so the sessions are never locked. The memories are built for one
generation of the stream (a reset starts the next), take its chunks, hold the standing questions
as each session checks them, stop a `full` cache at the bound admission control reserved for it,
and answer questions through the shared answer batch. What a job produces goes back to the stream
through the narrow `StreamSide`: a new view to publish, alerts, or a reason to halt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from hermes.engine.chunk import Chunk
from hermes.engine.methods import PolicySpec
from hermes.engine.metrics import memory_reading
from hermes.engine.persist import save_session
from hermes.engine.session import QuestionError, StreamBound, StreamingSession
from hermes.memory.snapshot import MemorySnapshot
from hermes.models.base import VideoLM
from hermes.runtime.settings import StreamSettings
from hermes.serving.admission import full_slot_limit, host_memory_cap, policy_cache_bytes
from hermes.serving.answers import AnswerEvent, AnswerRequest, AnswerTicket
from hermes.serving.checkpoints import Checkpointer
from hermes.serving.state import Lifecycle, StreamState
from hermes.serving.view import FrameTokens, LiveView, StreamStatus


class StreamSide(Protocol):
    """What the model thread's jobs need of the stream they serve."""

    life: Lifecycle
    settings: StreamSettings

    def status(self) -> StreamStatus: ...

    def publish(self, generation: int, make: Callable[[LiveView], LiveView]) -> LiveView | None:
        """Publish `make(current view)` unless the stream moved past `generation`; the view or None."""

    def halt(self, generation: int, state: StreamState, message: str, *, error: bool) -> None:
        """Stop the stream's source by itself, saying why."""


class StreamMemories:
    """One stream's memories over the shared model; touched by the model thread only."""

    def __init__(self, lm: VideoLM, stream: StreamSide) -> None:
        self.lm = lm
        self.stream = stream
        self.sessions: dict[PolicySpec, StreamingSession] = {}
        self.generation = -1  # the stream generation the memories were built for
        self._full_limit: int | None = None  # slots per layer at which a full cache stops
        self._full: PolicySpec | None = None  # the policy of that full cache (one that never evicts)
        self._bound: str | None = None  # why a retrieval policy's memory takes no more chunks (rekv)
        self.keeper: Checkpointer | None = None  # saves the viewer's checkpoints, with a state folder

    # -- jobs --------------------------------------------------------------------------------
    def build(
        self,
        generation: int,
        settings: StreamSettings,
        watching: Callable[[], Sequence[str]],
        loaded: StreamingSession | None = None,
    ) -> None:
        """Fresh memories of `generation` for `settings`, watching the viewer's standing questions;
        or, given `loaded` (a memory loaded from a file, made for `settings`), that one."""
        life = self.stream.life
        if not life.current(generation):
            return
        config = settings.config()
        self.sessions = {}  # free the old memories before building the new ones
        host_cap = host_memory_cap(settings.host_cap_mb)  # read by retrieval policies (rekv) only
        if loaded is not None:
            self.sessions = {settings.policy: loaded}
        else:
            self.sessions = {
                p: StreamingSession(self.lm, config, policy=p, host_cap_bytes=host_cap) for p in settings.policies
            }
        for session in self.sessions.values():
            session.standing.set_threshold(settings.watch_threshold)
        self.set_watching(watching())
        # A full cache (a policy that never evicts) stops the stream at its bound.
        self._full = next((p for p, s in self.sessions.items() if s.policy.capacity is None), None)
        self._full_limit = full_slot_limit(self.lm, config) if self._full is not None else None
        self.generation = generation
        self._bound = None
        budget_bytes = {p: policy_cache_bytes(self.lm, config, p) for p in settings.policies}
        life.ready(generation)
        snapshots = self.snapshots()
        seen = loaded_view(loaded, snapshots) if loaded is not None else {}
        self.stream.publish(generation, lambda view: view.next(snapshots=snapshots, budget_bytes=budget_bytes, **seen))

    def ingest(self, generation: int, chunk: Chunk, landed: Callable[[Chunk], None] = lambda chunk: None) -> None:
        """Every memory takes `chunk`, unless it is of an older generation, the memories failed, or
        a full cache is at its bound; the view published after it carries the alerts that fired.
        `landed(chunk)` is told once the chunk is in memory (a network source measures its latency)."""
        life = self.stream.life
        if not life.current(generation) or life.memory_failed or not self.takes(generation):
            return
        try:
            reports = {p: s.ingest(chunk) for p, s in self.sessions.items()}
        except StreamBound as bound:  # a chunk longer than the last one passed rekv's bound after all
            self._stop_at_bound(generation, str(bound))
            return
        landed(chunk)
        wall_s = time.monotonic() - life.started
        reading = memory_reading(self.lm.device)
        snapshots = self.snapshots()
        self.stream.publish(
            generation,
            lambda view: view.with_chunk(chunk, reports, snapshots, self.lm.frame_multiple, wall_s, reading),
        )
        if self.at_full_limit():
            self.stream.halt(generation, StreamState.STOPPED, self.full_note(), error=False)
        # A policy's own bound (rekv's host cap) stops the stream before a chunk like the last one passes it.
        notes = [s.bound_note(s.last_chunk.tokens) for s in self.sessions.values() if s.last_chunk is not None]
        if any(notes):
            self._stop_at_bound(generation, next(n for n in notes if n))
        if self.keeper is not None:
            self.keeper.after_chunk(self.main())

    def answer(self, generation: int, ticket: AnswerTicket, max_new_tokens: int) -> AnswerRequest | None:
        """The question as a request to the answer batch; None (the reason on the ticket) when there
        is nothing to answer from."""
        life = self.stream.life
        try:
            if not life.current(generation):
                raise QuestionError("The stream was reset before this question's turn: ask again.")
            if life.memory_failed:
                raise QuestionError(f"{life.error} (No answers from a memory that failed mid-update.)")
            if not self.holds(generation) or not any(s.frames_seen for s in self.sessions.values()):
                raise QuestionError(self._no_video_message())
        except QuestionError as exc:
            ticket.fail(str(exc))
            ticket.close()
            return None

        def done(records: list[AnswerEvent]) -> None:
            self.stream.publish(generation, lambda view: view.with_answers(records))

        sessions = dict(self.sessions)
        return AnswerRequest.for_ticket(ticket, sessions, max_new_tokens, lambda: life.current(generation), done)

    def watch(self, generation: int, questions: Callable[[], Sequence[str]]) -> None:
        """Every memory of `generation` watches the viewer's standing questions as they are now (a
        reset since hands them over in its build)."""
        if self.holds(generation):
            self.set_watching(questions())

    def save(self, generation: int, path: str) -> int:
        """Write the stream's memory (its first policy's, in compare mode) to `path`; the bytes
        written. QuestionError when there is no video in it yet."""
        if not self.holds(generation) or not any(s.frames_seen for s in self.sessions.values()):
            raise QuestionError("No video in memory yet: stream something first, then save its memory.")
        return save_session(self.main(), path)

    def checkpoint(self, generation: int) -> None:
        """Save the memory to the viewer's checkpoint now (the source ended, or the tab closed)."""
        failed = self.stream.life.memory_failed  # a memory a failed job may have half-updated is not kept
        if self.keeper is not None and self.holds(generation) and self.sessions and not failed:
            self.keeper.save(self.main())

    def drop(self) -> None:
        """Free the memories (the stream was closed), checkpointed first when the viewer keeps them."""
        self.checkpoint(self.generation)
        self.sessions = {}
        self.generation = -1

    # -- reading -----------------------------------------------------------------------------
    def holds(self, generation: int) -> bool:
        """Whether these are the memories of stream generation `generation`."""
        return generation == self.generation

    def takes(self, generation: int) -> bool:
        """Whether a chunk of `generation` goes in: the memories are its, and not full."""
        return self.holds(generation) and not self.at_full_limit() and self._bound is None

    def main(self) -> StreamingSession:
        """The memory saved to files: the stream's policy's (in compare mode, the first one's)."""
        return next(iter(self.sessions.values()))

    def snapshots(self) -> dict[PolicySpec, MemorySnapshot]:
        return {p: s.snapshot() for p, s in self.sessions.items()}

    def set_watching(self, questions: Sequence[str]) -> None:
        """Every memory watches exactly `questions` (already checked by the viewer's list)."""
        for session in self.sessions.values():
            session.standing.set_questions(questions)

    def _no_video_message(self) -> str:
        """Why a question finds nothing to answer from yet."""
        status = self.stream.status()
        if status.state.runs or status.queued_chunks:
            s = self.stream.settings
            return (
                f"The first chunk has not reached the model yet (it holds {s.chunk_frames} frames at {s.fps:g} fps, "
                f"about {s.chunk_frames / s.fps:.0f} s of video): ask again in a moment."
            )
        return "No video yet: start the sample clip, upload a video or turn on the webcam, then ask."

    def at_full_limit(self) -> bool:
        """Whether a full cache cannot take another chunk like the last one."""
        session = self.sessions.get(self._full) if self._full is not None else None
        if session is None or self._full_limit is None or session.last_chunk is None:
            return False
        return session.memory.slots + session.last_chunk.tokens > self._full_limit

    def _stop_at_bound(self, generation: int, note: str) -> None:
        """Take no more chunks, and stop the stream saying why (as a full cache at its bound)."""
        self._bound = note
        self.stream.halt(generation, StreamState.STOPPED, f"{note} Questions still work.", error=False)

    def full_note(self) -> str:
        """Why a full stream stopped at its bound, for the viewer."""
        mb = self.sessions[self._full].memory.cache_bytes() / 2**20
        return (
            f"The full cache reached its bound ({self._full_limit:,} video tokens per layer, {mb:.1f} MB: the "
            "positions the model has left), so the stream stopped here. Questions still work; pick hermes or "
            "fifo, whose memory stays fixed, to stream further."
        )


def loaded_view(session: StreamingSession, snapshots: dict[PolicySpec, MemorySnapshot]) -> dict:
    """What the view shows of a memory loaded from a file before its next chunk: frames and time
    seen, frames kept, and the frames' tokens for the retained-token map (a frame's tokens where a
    layer keeps the most of one, since the file keeps no record of the chunks)."""
    snapshot = next(iter(snapshots.values()))
    kept = [layer.frames[layer.frames >= 0] for layer in snapshot.layers]
    per_frame = max((int(np.bincount(frames).max()) for frames in kept if frames.size), default=0)
    return {
        "frames_seen": session.frames_seen,
        "stream_time_s": session.stream_time_s,
        "frame_tokens": FrameTokens().extended(session.frames_seen, float(per_frame)) if per_frame else FrameTokens(),
        "frames_in_memory": {p: s.frames_in_memory() for p, s in snapshots.items()},
    }
