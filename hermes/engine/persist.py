"""A stream that survives its process: a session's whole state in one memory file, and a session
made again from it that goes on as if it had never stopped.

Beside the memory itself (`hermes.memory.persist`: the cache, a hybrid model's states, ReKV's host
store) the file keeps what the session needs to take the next chunk and the next question exactly
as the uninterrupted stream would: the stream time, the frames and chunks seen, the last question
and answer (they prefix the guidance prompt), the kept answers, the standing questions with their
alert state, an input filter's last frame, the policy and its constants, and the identity of the
model the memory belongs to (docs/design.md, "The memory file").

Loading checks the file against the model before anything of it is loaded, on its header and the
tensors' declared shapes: the model's identity, the shape of its memory (layers and their kinds,
heads, channels, states), constants within its positions, the session's counts and times in range,
and no layer asking for more storage than a stream of its policy and budget grows to
(`storage_bound`). A file that fails is refused in one line (`MemoryFileError`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

import torch

from hermes.engine.answering import ANSWERS_KEPT, MAX_QUESTION_CHARS, AnswerUpdate
from hermes.engine.methods import PolicyError, make_policy, parse_policy
from hermes.engine.policy import Policy
from hermes.engine.session import QUESTION_MARGIN, StreamingSession
from hermes.engine.watch import MAX_STANDING, WatchCost
from hermes.memory.cache import CHUNK_SLACK
from hermes.memory.config import HermesConfig
from hermes.memory.persist import (
    MAX_COUNT,
    CacheShape,
    MemoryFile,
    MemoryFileError,
    bounded,
    check_allocated,
    check_cache,
    check_fields,
    check_fits,
    check_layout,
    field,
    pack_cache,
    read_memory,
    storage_bytes,
    unpack_cache,
    write_memory,
)
from hermes.models.base import VideoLM

# Keys of a transformers config that say how it was loaded (its dtype, its folder), not what the model is.
LOAD_KEYS = ("dtype", "torch_dtype", "transformers_version")
SAMPLES = 64  # values of each weight tensor in the weights' fingerprint
MAX_STREAM_S = 1e9  # seconds of video a memory may say it has seen: about 30 years, past any stream


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


def _check_identity(memory: MemoryFile, lm: VideoLM) -> None:
    """MemoryFileError, with the reason, when the file's model identity is not `lm`'s in its dtype."""
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


def model_shape(lm: VideoLM) -> CacheShape:
    """The shape of `lm`'s memory, as a memory file's cache must have it to be `lm`'s."""
    heads = lm.text_config.num_key_value_heads
    return CacheShape(lm.num_layers, tuple(lm.linear_layers), heads, lm.head_dim, lm.state_shapes)


def check_model(memory: MemoryFile, lm: VideoLM) -> None:
    """MemoryFileError, with the reason, when the file's memory was not made by `lm` in its dtype:
    another model's identity, another shape of memory (layers and their kinds, heads, channels,
    states: a file edited to pass the identity), or constants past `lm`'s positions. The header
    and the declared shapes will do (a file read so, before its tensors are loaded)."""
    _check_identity(memory, lm)
    check_layout(memory, model_shape(lm))
    config = check_cache(memory)[1]
    positions = config.max_positions or lm.max_positions
    if not 1 <= positions <= lm.max_positions:
        raise MemoryFileError(f"this memory uses {positions:,} positions; {lm.source!r} has {lm.max_positions:,}")
    if max(config.budget, config.chunk_frames) > positions:  # a slot, and a frame, takes a position at least
        raise MemoryFileError(
            f"this memory's budget ({config.budget:,}) or chunk ({config.chunk_frames:,} frames) does not fit in "
            f"the {positions:,} positions it has"
        )


def storage_bound(
    lm: VideoLM, policy: Policy, config: HermesConfig, prefix_len: int, slots: int, block_tokens: int | None = None
) -> int:
    """The most tokens a key-value layer's storage grows to in a stream of `lm` kept by `policy`
    (built for `config`), whose layers hold `slots` slots after a prefix of `prefix_len` tokens,
    when a frame block (a frame, or a frame pair where the model merges them) takes at most
    `block_tokens` tokens (None: frames of any size, so a chunk as many tokens as the memory has
    positions, which the engine holds any chunk to).

    A stream sizes its storage once (`HermesCache.reserve`): the prefix, the slots its policy holds
    once full (a policy that never evicts: those it holds now), one chunk's tokens with the
    question margin, what a question brings in (ReKV's frames) and the slack; an answer longer than
    the margin grows it by half again (`HermesLayer.reserve`). Twice that is the bound.
    """
    positions = config.max_positions or lm.max_positions
    if block_tokens is None:
        block = chunk = positions
    else:
        block, chunk = block_tokens, -(-config.chunk_frames // lm.frame_multiple) * block_tokens
    per_block = lm.frame_multiple if config.chunk_frames % lm.frame_multiple == 0 else 1
    room = policy.question.device_room(block)
    held = slots if policy.capacity is None else policy.selection.slot_bound(block, per_block) + room
    return 2 * (prefix_len + max(held, slots) + chunk + QUESTION_MARGIN + room + CHUNK_SLACK)


def _saved_policy(state: Mapping[str, Any], config: HermesConfig) -> Policy:
    """The policy the session state names, with its constants, built for `config`."""
    spec = field(state, "policy", dict)
    try:
        return make_policy(field(spec, "name", str), config, field(spec, "params", dict))
    except (PolicyError, ValueError, TypeError) as exc:
        raise MemoryFileError(f"the memory's policy cannot be used here: {exc}") from None


def check_storage(memory: MemoryFile, lm: VideoLM, block_tokens: int | None = None) -> int:
    """MemoryFileError when a layer of a session's memory file asks for more storage than a stream
    of its policy and budget on `lm` grows to (`storage_bound`); else the bytes its cache takes once
    loaded. The header and the declared shapes will do: nothing is allocated."""
    header, config, _, _ = check_cache(memory)
    policy = _saved_policy(field(memory.header, "session", dict), config)
    slots = memory.tensors["kv.0.stream_ids"].numel()
    check_allocated(memory, storage_bound(lm, policy, config, header["layers"][0]["prefix_len"], slots, block_tokens))
    return storage_bytes(memory)


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


def read_session(
    path: str | os.PathLike[str], lm: VideoLM | None = None, block_tokens: int | None = None
) -> MemoryFile:
    """Read and check a session's memory file: MemoryFileError if it is damaged or not one, or its
    session's state is malformed or out of range; given `lm`, also when it is not `lm`'s memory
    (`check_model`) or asks for more storage than its policy and budget need (`check_storage`, with
    `block_tokens`). All of it before any tensor of the file is loaded."""

    def check(memory: MemoryFile) -> None:
        for key in ("model", "session"):
            field(memory.header, key, dict)
        _check_state(memory.header["session"])
        if lm is not None:
            check_model(memory, lm)
            check_storage(memory, lm, block_tokens)

    return read_memory(path, check)


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
    """MemoryFileError when the session part of the header is malformed or out of range: counts
    whole and from 0 (chunks no more than frames), the stream time finite and from 0, the standing
    questions as many and as long as a session takes, the kept answers and costs of their kinds."""
    frames = bounded(state, "frames_seen", 0, MAX_COUNT)
    bounded(state, "chunks_seen", 0, frames)  # a chunk holds a frame at least
    bounded(state, "stream_time_s", 0, MAX_STREAM_S, float)
    standing = field(state, "standing", dict)
    above = field(standing, "above", dict)
    bounded(standing, "answer_tokens", 0, MAX_COUNT)
    threshold = field(standing, "threshold", float)
    turn = state.get("last_turn")
    valid = turn is None or (isinstance(turn, list) and len(turn) == 2 and all(isinstance(t, str) for t in turn))
    if not valid:
        raise MemoryFileError("the memory file's header is damaged: its last question and answer are malformed")
    valid = all(isinstance(q, str) and len(q) <= MAX_QUESTION_CHARS and isinstance(v, bool) for q, v in above.items())
    if not valid or len(above) > MAX_STANDING or not 0 < threshold < 1:
        raise MemoryFileError("the memory file's header is damaged: its standing questions are malformed")
    answers = state.get("answers", [])
    if not isinstance(answers, list) or len(answers) > ANSWERS_KEPT:
        raise MemoryFileError("the memory file's header is damaged: its answers are malformed")
    for answer in answers:
        check_fields(AnswerUpdate, answer, "answers")
    check_fields(WatchCost, state.get("watch_cost", {}), "standing checks' costs")
    try:
        [AnswerUpdate(**a) for a in answers]
    except TypeError:  # a field left out
        raise MemoryFileError("the memory file's header is damaged: its answers are malformed") from None


def load_session(
    lm: VideoLM,
    path: str | os.PathLike[str],
    *,
    policy: str | None = None,
    config: HermesConfig | None = None,
    max_question_chars: int = MAX_QUESTION_CHARS,
    host_cap_bytes: int | None = None,
    block_tokens: int | None = None,
) -> StreamingSession:
    """A new session holding the stream saved at `path`, which goes on exactly where it stopped.

    MemoryFileError, and nothing made, when the file is damaged, truncated or not a memory, when it
    belongs to another model or dtype than `lm` or is shaped otherwise than `lm`'s memory, when its
    state is out of range or it asks for more storage than its policy and budget need (frame blocks
    of at most `block_tokens` tokens: `storage_bound`), when `policy` or `config` (if given) differ
    from the policy and constants the memory was kept with, or when its cache does not fit in memory.
    """
    memory = read_session(path, lm, block_tokens)
    check_fits(memory, lm.rope_spec(), lm.dtype)  # the rotary frequencies' values, now loaded
    state = memory.header["session"]
    _, saved_config, _, _ = check_cache(memory)
    _check_choice(state, saved_config, policy, config)
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
    "check_storage",
    "file_summary",
    "load_session",
    "model_identity",
    "model_shape",
    "read_session",
    "resume_time",
    "save_session",
    "storage_bound",
]
