"""A stream that survives its process: a session's whole state in one memory file, and a session
made again from it that goes on as if it had never stopped.

Beside the memory itself (`hermes.memory.persist`: the cache, a hybrid model's states, ReKV's host
store) the file keeps what the session needs to take the next chunk and the next question exactly
as the uninterrupted stream would: the stream time, the frames and chunks seen, the last question
and answer (they prefix the guidance prompt), the kept answers, the standing questions with their
alert state, an input filter's last frame, the policy and its constants, and the identity of the
model the memory belongs to (docs/design.md, "The memory file").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

import torch

from hermes.engine.answering import MAX_QUESTION_CHARS, AnswerUpdate
from hermes.engine.methods import PolicyError, parse_policy
from hermes.engine.policy import Policy
from hermes.engine.session import StreamingSession
from hermes.engine.watch import MAX_STANDING, WatchCost
from hermes.memory.config import HermesConfig
from hermes.memory.persist import (
    MemoryFile,
    MemoryFileError,
    check_cache,
    check_fits,
    field,
    pack_cache,
    read_memory,
    unpack_cache,
    write_memory,
)
from hermes.models.base import VideoLM

# Keys of a transformers config that say how it was loaded (its dtype, its folder), not what the model is.
LOAD_KEYS = ("dtype", "torch_dtype", "transformers_version")
SAMPLES = 64  # values of each weight tensor in the weights' fingerprint


def _model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict without what depends on how the model was loaded, sub-configs included."""
    return {
        str(k): _model_config(v) if isinstance(v, Mapping) else v
        for k, v in config.items()
        if k not in LOAD_KEYS and not str(k).startswith("_")
    }


@torch.no_grad()
def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's name, shape and `SAMPLES` of its values, evenly spread: two
    checkpoints of one architecture differ there, and it reads kilobytes, not gigabytes."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(f"{name}|{tuple(p.shape)}|".encode())
        if p.device.type == "meta" or p.numel() == 0:  # offloaded to disk by accelerate: its shape only
            continue
        flat = p.detach().reshape(-1)
        at = torch.linspace(0, flat.numel() - 1, min(SAMPLES, flat.numel()), device=flat.device).long()
        h.update(flat[at].float().cpu().numpy().tobytes())
    return h.hexdigest()


def model_identity(lm: VideoLM) -> dict[str, Any]:
    """What a memory belongs to: the architecture, the checkpoint's name and revision, and hashes of
    its config and weights, and the dtype the memory was computed in."""
    config = json.dumps(_model_config(lm.model.config.to_dict()), sort_keys=True, default=str)
    return {
        "arch": lm.arch,
        "source": lm.source,
        "revision": getattr(lm.model.config, "_commit_hash", None),
        "random_weights": lm.random_weights,
        "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
        "weights_sha256": weights_fingerprint(lm.model),
        "dtype": lm.dtype_name,
    }


def check_model(memory: MemoryFile, lm: VideoLM) -> None:
    """MemoryFileError, with the reason, when the file's memory was not made by `lm` in its dtype."""
    saved = field(memory.header, "model", dict)
    now = model_identity(lm)
    name = f"{saved.get('source')!r} ({saved.get('arch')})"
    if saved.get("arch") != now["arch"]:
        raise MemoryFileError(f"this memory belongs to {name}, not to a {now['arch']} model like {lm.source!r}")
    if saved.get("config_sha256") != now["config_sha256"]:
        raise MemoryFileError(f"this memory belongs to {name}, a model of another size or config than {lm.source!r}")
    if saved.get("dtype") != now["dtype"]:
        raise MemoryFileError(
            f"this memory was saved in {saved.get('dtype')} and {lm.source!r} runs in {now['dtype']}: load the "
            f"model in {saved.get('dtype')} (--dtype {saved.get('dtype')})"
        )
    if saved.get("weights_sha256") != now["weights_sha256"]:
        raise MemoryFileError(f"this memory belongs to {name}, whose weights differ from those of {lm.source!r}")
    check_fits(memory, lm.rope_spec(), lm.dtype)


def policy_spec(policy: Policy) -> dict[str, Any]:
    """The policy's name and every constant of its parts, as `parse_policy` takes them back."""
    spec = policy.name  # a PolicySpec
    params = {}
    parts = ((spec.method.name, policy.scorer), *((f.name, policy.input_filter) for f in spec.filters))
    for prefix, part in parts:
        if part is not None:
            params |= {f"{prefix}.{f.name}": getattr(part, f.name) for f in fields(part)}
    return {"name": str(spec), "params": params}


def _session_state(session: StreamingSession) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """What a session keeps beside its memory, as JSON data and tensors."""
    standing = session.standing
    state = {
        "policy": policy_spec(session.policy),
        "frames_seen": session.frames_seen,
        "stream_time_s": session.stream_time_s,
        "chunks_seen": session.chunks_seen,
        "last_turn": session.reader.last_turn,
        "answers": [asdict(a) for a in session.reader.answers],
        "standing": {
            "above": standing.alert_state(),
            "threshold": standing.threshold,
            "answer_tokens": standing.answer_tokens,
        },
        "watch_cost": asdict(session.watch_cost),
    }
    tensors = {}
    last = session.input_filter.last_frame
    if last is not None:
        tensors = {"filter.patches": last[0], "filter.features": last[1]}
    return state, tensors


def save_session(session: StreamingSession, path: str | os.PathLike[str]) -> int:
    """Write the session's memory and state to `path` (atomically: the previous file stays whole
    until the new one is); the bytes written. Scratch tokens of a reader are never saved."""
    memory = pack_cache(session.memory)
    state, tensors = _session_state(session)
    memory.header |= {"model": model_identity(session.lm), "session": state}
    memory.tensors |= tensors
    part = session.question.pack()  # what the policy's question-time step keeps (ReKV's host store)
    if part is not None:
        memory.header |= part.header
        memory.tensors |= part.tensors
    return write_memory(path, memory)


def read_session(path: str | os.PathLike[str]) -> MemoryFile:
    """Read and check a session's memory file (MemoryFileError if it is damaged or not one)."""
    memory = read_memory(path)
    for key in ("model", "session"):
        field(memory.header, key, dict)
    return memory


def _check_choice(state: Mapping[str, Any], config: HermesConfig, policy: str | None, asked: HermesConfig | None):
    """MemoryFileError when the caller asks for another policy or other memory constants than the file's."""
    name = field(field(state, "policy", dict), "name", str)
    if policy is not None:
        try:
            wanted = str(parse_policy(policy))
        except PolicyError as exc:
            raise MemoryFileError(str(exc)) from None
        if wanted != name:
            raise MemoryFileError(f"this memory was kept by policy {name!r}, not {wanted!r}: it goes on with {name}")
    if asked is not None:
        changed = [f.name for f in fields(HermesConfig) if getattr(asked, f.name) != getattr(config, f.name)]
        if changed:
            saved = ", ".join(f"{k} {getattr(config, k)}" for k in changed)
            raise MemoryFileError(f"this memory was kept with {saved}; it cannot go on with other values")


def _restore_state(session: StreamingSession, memory: MemoryFile, state: Mapping[str, Any]) -> None:
    """The file's session state into a session made for it (nothing here can fail on a checked file)."""
    progress, reader = session.progress, session.reader
    progress.frames_seen, progress.chunks_seen = state["frames_seen"], state["chunks_seen"]
    progress.stream_time_s = float(state["stream_time_s"])
    turn = state.get("last_turn")
    reader.last_turn = None if turn is None else (str(turn[0]), str(turn[1]))
    reader.answers = [
        AnswerUpdate(**{**a, "top_logprobs": [(str(t), float(v)) for t, v in a["top_logprobs"]]})
        for a in state.get("answers", [])
    ]
    standing = state["standing"]
    session.standing.set_threshold(standing["threshold"])
    session.standing.answer_tokens = standing["answer_tokens"]
    session.standing.set_alert_state(standing["above"])
    session.watch_cost = WatchCost(**state.get("watch_cost", {}))
    if "filter.patches" in memory.tensors:  # a policy with an input filter
        session.input_filter.last_frame = (memory.tensors["filter.patches"], memory.tensors["filter.features"])


def _check_state(state: Mapping[str, Any]) -> None:
    """MemoryFileError when the session part of the header is malformed."""
    for key in ("frames_seen", "chunks_seen"):
        field(state, key)
    field(state, "stream_time_s", (int, float))
    standing = field(state, "standing", dict)
    above = field(standing, "above", dict)
    field(standing, "answer_tokens")
    threshold = field(standing, "threshold", float)
    turn = state.get("last_turn")
    valid = turn is None or (isinstance(turn, list) and len(turn) == 2 and all(isinstance(t, str) for t in turn))
    if not valid:
        raise MemoryFileError("the memory file's header is damaged: its last question and answer are malformed")
    valid = all(isinstance(q, str) and isinstance(v, bool) for q, v in above.items())
    if not valid or len(above) > MAX_STANDING or not 0 < threshold < 1:
        raise MemoryFileError("the memory file's header is damaged: its standing questions are malformed")
    try:
        [AnswerUpdate(**a) for a in state.get("answers", [])]
        WatchCost(**state.get("watch_cost", {}))
    except TypeError:
        raise MemoryFileError("the memory file's header is damaged: its answers are malformed") from None


def load_session(
    lm: VideoLM,
    path: str | os.PathLike[str],
    *,
    policy: str | None = None,
    config: HermesConfig | None = None,
    max_question_chars: int = MAX_QUESTION_CHARS,
    host_cap_bytes: int | None = None,
) -> StreamingSession:
    """A new session holding the stream saved at `path`, which goes on exactly where it stopped.

    MemoryFileError, and nothing made, when the file is damaged, truncated or not a memory, when it
    belongs to another model or dtype than `lm`, or when `policy` or `config` (if given) differ
    from the policy and constants the memory was kept with.
    """
    memory = read_session(path)
    check_model(memory, lm)
    state = memory.header["session"]
    _, saved_config, _, _ = check_cache(memory)
    _check_choice(state, saved_config, policy, config)
    _check_state(state)
    cache = unpack_cache(memory, lm.layer_devices())
    spec = state["policy"]
    try:
        session = StreamingSession(
            lm,
            cache.config,
            policy=spec["name"],
            params=field(spec, "params", dict),
            max_question_chars=max_question_chars,
            host_cap_bytes=host_cap_bytes,
        )
    except (PolicyError, ValueError) as exc:
        raise MemoryFileError(f"the memory's policy cannot be used here: {exc}") from None
    session.reset(cache)
    session.question.unpack(memory)  # what the question-time step kept (ReKV's host store)
    _restore_state(session, memory, state)
    return session


def resume_time(session: StreamingSession) -> float:
    """Where a video goes on for a session: halfway to the next sample after the memory's last frame
    (the sample grid is anchored at 0, so the same frames follow as in an uninterrupted stream)."""
    return 0.0 if session.frames_seen == 0 else session.stream_time_s + 0.5 / session.config.fps


def file_summary(memory: MemoryFile) -> str:
    """One line about a memory file: model, policy, budget, frames and stream time."""
    model, state = memory.header["model"], memory.header["session"]
    budget = memory.header["cache"]["config"]["budget"]
    return (
        f"{model.get('source')} ({model.get('dtype')}), policy {state['policy']['name']} at budget {budget:,}: "
        f"{state['frames_seen']:,} frames, {state['stream_time_s']:.1f} s of video"
    )


__all__ = [
    "MemoryFileError",
    "check_model",
    "file_summary",
    "load_session",
    "model_identity",
    "read_session",
    "resume_time",
    "save_session",
]
