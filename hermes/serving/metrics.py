"""What a stream's numbers look like to the API (/metrics) and the UI's details panel: plain data,
policy names as plain strings, from the view the model thread published."""

from __future__ import annotations

import dataclasses
from typing import Any

from hermes.engine.methods import PolicySpec
from hermes.engine.metrics import MemoryReading
from hermes.models.base import VideoLM
from hermes.serving.view import LiveView, StreamStatus


def metrics_of(
    view: LiveView, status: StreamStatus, reading: MemoryReading, lm: VideoLM, reserved_bytes: int, watching: list[str]
) -> dict:
    """Plain-data numbers of a stream for the API and the UI's details panel: the stream, its
    memories side by side, the latest answers and the standing questions (`watching`)."""
    return plain(_numbers(view, status, reading, lm, reserved_bytes) | watch_metrics(view, watching))


def _numbers(view: LiveView, status: StreamStatus, reading: MemoryReading, lm: VideoLM, reserved_bytes: int) -> dict:
    last = view.history[-1] if view.history else None
    return {
        "model": lm.source,
        "random_weights": lm.random_weights,
        "state": status.state,
        "source": status.source,
        "duration_s": status.duration_s,  # the file's total length (None for a webcam)
        "speed": status.speed,
        "error": status.error,
        "note": status.note,
        "reserved_bytes": reserved_bytes,
        "settings": dataclasses.asdict(view.settings),
        "frames_read": status.frames_read,
        "frames_seen": view.frames_seen,
        "stream_time_s": view.stream_time_s,
        "chunks": view.chunks,
        "queued_chunks": status.queued_chunks,
        "dropped_frames": status.dropped_frames,
        "skipped_frames": status.skipped_frames,  # of the file, that could not be decoded
        # A network stream: its link, what the model skipped to stay live, glass-to-memory latency.
        "network": None if status.network is None else dataclasses.asdict(status.network),
        "policies": list(view.snapshots),  # the memories side by side; the per-policy numbers below
        "frames_in_memory": dict(view.frames_in_memory),
        "cache_bytes": {p: s.cache_bytes for p, s in view.snapshots.items()},
        # What a question-time step holds in host memory (rekv's store of every frame), where it holds any.
        "host_bytes": {} if last is None else {p: n for p, n in last.per_policy("host_bytes").items() if n},
        "video_tokens_per_layer": {
            p: [int((layer.stream_ids >= 0).sum()) for layer in s.layers] for p, s in view.snapshots.items()
        },
        # The decoder layer of each entry above; a hybrid model's other layers hold a constant state.
        "kv_layers": {p: s.layer_names() for p, s in view.snapshots.items()},
        "state_layers": {p: s.state_layers for p, s in view.snapshots.items()},
        "state_bytes": {p: s.state_bytes for p, s in view.snapshots.items()},
        "last_chunk": None
        if last is None
        else {"prefill_ms": last.per_policy("prefill_ms"), "compress_ms": last.per_policy("compress_ms")},
        "rss_bytes": reading.rss_bytes,
        "gpu_allocated_bytes": reading.gpu_allocated_bytes,
        "answers": [a.to_dict() for a in view.answers[-20:]],
    }


def watch_metrics(view: LiveView, watching: list[str]) -> dict:
    """The standing questions for the API: per question and policy its last p(yes), checks and
    firings, and the latest alerts (without their frames)."""
    rows = []
    for question in watching:
        for policy in view.snapshots:
            points = [p for p in view.watch_history if p.check.question == question and p.policy == policy]
            last = points[-1] if points else None
            rows.append(
                {
                    "question": question,
                    "policy": policy,
                    "checks": len(points),
                    "fired": sum(p.check.fired for p in points),
                    "p_yes": None if last is None else last.check.p_yes,
                    "at_s": None if last is None else last.check.at_s,
                    "check_ms": None if last is None else last.check.check_ms,
                    "prefill_ms": None if last is None else last.prefill_ms,
                }
            )
    return {
        "watching": list(watching),
        "watch_threshold": view.settings.watch_threshold,
        "standing": rows,
        "alerts": [
            {
                "policy": a.policy,
                "question": a.check.question,
                "at_s": a.check.at_s,
                "frames_seen": a.answer.frames_seen,
                "p_yes": a.check.p_yes,
                "text": a.answer.text,
                "ttft_ms": a.answer.ttft_ms,
            }
            for a in view.alerts[-20:]
        ],
    }


def plain(data: Any) -> Any:
    """`data` (dicts, lists and tuples of numbers, strings and policies) as plain JSON data: a policy
    (`PolicySpec`) as its name and strings as `str`, wherever they are keys too."""
    if isinstance(data, dict):
        return {plain(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    return str(data) if isinstance(data, str | PolicySpec) else data
