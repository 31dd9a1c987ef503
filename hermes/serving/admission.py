"""Admission control: the exact memory a stream's caches need, and the memory the server may give.

Once a stream's budget is reached, every layer of its cache holds the text prefix plus a fixed
number of slots (|M| + 1 for hermes: the summary slot, or one extra video slot; |M| for fifo), so
its size is known before the stream starts:

    bytes = (prefix + slots) * VideoLM.kv_bytes_per_token + VideoLM.state_bytes

where a token takes, over all key-value layers, its key and value and in 16-bit caches its origin
key (`hermes.memory.cache.kv_bytes_per_token`: layers * tensors * kv_heads * head_dim * dtype
bytes, tensors = 3 in bf16 and fp16, 2 in fp32), and a hybrid model's linear-attention layers add
their states, whose size does not depend on the stream (0 for the other backbones),

summed over the stream's caches (two in compare mode). `simplestream` holds its last N frames
whatever the budget: at most N frames' blocks (`block_tokens_bound`; one block per frame pair
where the model merges them and the chunks have whole pairs). A retrieval policy (rekv) holds its window
and, while it answers, the frames it brings back: top_k frame blocks of at most the tokens a
block of the largest frames the decoder hands over takes (`block_tokens_bound`). Its host store is
counted apart, against the CPU's allowance (`host_bytes_for`, `host_memory_cap`). The `full`
policy has no budget: the app bounds it by the positions the model has left after the question
margin (what the engine can hold at all), reserves that much, and stops a full stream when its cache reaches the bound.

A model spread over several GPUs (a device map) keeps each layer's memory on its layer's device,
so a stream takes, on each device, its bytes times the share of layers there
(`cache_bytes_per_device`). All streams share that split, so every device stays within its own cap
exactly when the streams' total stays within the smallest of cap_d x layers / layers_d
(`memory_cap_for`): one number, counted per device.

No Gradio here; `hermes.serving.registry` applies these numbers to the streams of all viewers.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter

import numpy as np
import psutil
import torch

from hermes.engine.methods import PolicySpec
from hermes.memory.config import HermesConfig
from hermes.models.base import VideoLM
from hermes.runtime.settings import StreamSettings
from hermes.video.decoding import DEFAULT_MAX_SIDE

MB = 1024 * 1024
# CPU: at most this much of the cache memory by default, and never more than half the free RAM.
DEFAULT_CPU_CAP_MB = 4096
# GPU: keep this share of the card (at least GPU_MARGIN_MIN_MB) free for the activations of the
# one job in flight (a chunk's prefill, the vision tower) and for fragmentation.
GPU_MARGIN_FRACTION = 0.1
GPU_MARGIN_MIN_MB = 2048
CAP_ENV = "HERMES_MEMORY_CAP_MB"


class Busy(RuntimeError):
    """Admission control refused a new stream; the message says why and what to do."""


def prefix_len(lm: VideoLM) -> int:
    """Tokens of the fixed text prefix that every cache starts with."""
    return int(lm.prefix_ids().shape[-1])


def full_slot_limit(lm: VideoLM, config: HermesConfig) -> int:
    """Video slots per layer at which the app stops a `full` stream: the positions the model has
    after the prefix and the margin kept for the question (the engine could not go further)."""
    max_positions = config.max_positions or lm.max_positions
    return max(0, max_positions - config.position_margin - prefix_len(lm))


def block_tokens_bound(lm: VideoLM) -> int:
    """Tokens one frame block (a frame, or a frame pair where the model merges them) takes at most:
    square frames of the largest side the decoder hands over, chunk extras included. Measured once
    per model (it runs the processor on full-size frames)."""
    if lm not in _BLOCK_TOKENS:
        n = lm.frame_multiple
        frames = np.zeros((n, DEFAULT_MAX_SIDE, DEFAULT_MAX_SIDE, 3), dtype=np.uint8)
        _BLOCK_TOKENS[lm] = lm.chunk_inputs(frames, 1.0).num_tokens
    return _BLOCK_TOKENS[lm]


_BLOCK_TOKENS: weakref.WeakKeyDictionary[VideoLM, int] = weakref.WeakKeyDictionary()


def slots_per_layer(lm: VideoLM, config: HermesConfig, policy: PolicySpec) -> int:
    """Slots after the prefix that each layer holds once the memory is full, with the room for what
    a question brings in (ReKV's frames); a window counted in frames (simplestream) holds at most
    those frames' blocks, whatever the budget; a policy that never evicts, its bound."""
    built = policy.build(config)
    if built.capacity is None:
        return full_slot_limit(lm, config)
    block = block_tokens_bound(lm)
    # Merged pairs hold two frames each, unless a chunk of odd length pads its last pair.
    per_block = lm.frame_multiple if config.chunk_frames % lm.frame_multiple == 0 else 1
    return built.selection.slot_bound(block, per_block) + built.question.device_room(block)


def host_bytes_for(settings: StreamSettings) -> int:
    """Host memory a stream's policies may keep frames in (ReKV's store): each its cap."""
    config = settings.config()
    storing = sum(p.build(config).question.keeps_host_store for p in settings.policies)
    return storing * host_memory_cap(settings.host_cap_mb) if storing else 0


def policy_cache_bytes(lm: VideoLM, config: HermesConfig, policy: PolicySpec) -> int:
    """The bytes one memory of `policy` holds once its budget is reached (for `full`: at its bound)."""
    return (prefix_len(lm) + slots_per_layer(lm, config, policy)) * lm.kv_bytes_per_token + lm.state_bytes


def cache_bytes_for(lm: VideoLM, settings: StreamSettings) -> int:
    """The bytes a stream's caches hold once its budget is reached (for `full`: at its bound).

    Equals the memories' `cache_bytes()` summed over the stream's sessions from the chunk that
    reaches the budget on; a chunk's prefill briefly adds its own tokens on top (the margin of
    `default_memory_cap` covers that, since only one job runs at a time).
    """
    config = settings.config()
    for p in settings.policies:  # a backbone that cannot filter its inputs refuses before anything starts
        p.build(config).check(lm)
    return sum(policy_cache_bytes(lm, config, p) for p in settings.policies)


def cache_bytes_per_device(lm: VideoLM, settings: StreamSettings) -> dict[torch.device, int]:
    """`cache_bytes_for` split over the devices of the model's layers: every key-value layer holds
    the same number of tokens, so a device holds the keys and values times its share of those
    layers, and (a hybrid model) the states times its share of the linear-attention layers."""
    devices = lm.layer_devices()
    linear = set(lm.linear_layers)
    states = lm.state_bytes * len(settings.policies)
    kv_total = cache_bytes_for(lm, settings) - states
    kv = Counter(device for i, device in enumerate(devices) if i not in linear)
    held = Counter(device for i, device in enumerate(devices) if i in linear)
    return {
        device: kv_total * kv[device] // max(1, lm.kv_layers) + states * held[device] // max(1, len(linear))
        for device in dict.fromkeys(devices)
    }


def memory_cap_for(lm: VideoLM, cap_mb: float | None = None) -> int:
    """Bytes of cache memory admission control hands out for `lm`, in the units of `cache_bytes_for`.

    On one device, `default_memory_cap`. Over several, each device d gives its own cap_d, and a
    stream puts layers_d / layers of its bytes there: the streams fit every device as long as their
    total is at most min over d of cap_d x layers / layers_d, which is returned. An explicit cap
    (`cap_mb` or $HERMES_MEMORY_CAP_MB) is the total over all devices.
    """
    counts = Counter(lm.layer_devices())
    if len(counts) == 1 or cap_mb is not None or os.environ.get(CAP_ENV):
        return default_memory_cap(next(iter(counts)), cap_mb)
    layers = sum(counts.values())
    return min(default_memory_cap(device) * layers // n for device, n in counts.items())


def host_memory_cap(cap_mb: float | None = None) -> int:
    """Bytes of host memory a retrieval policy's store (rekv) may take: `cap_mb` if given, else
    what admission control gives the CPU: DEFAULT_CPU_CAP_MB, or half the available RAM if less."""
    if cap_mb is not None:
        return default_memory_cap(torch.device("cpu"), cap_mb)
    return cpu_memory_cap()


def cpu_memory_cap() -> int:
    """What admission control gives the CPU by default: DEFAULT_CPU_CAP_MB, or half the available
    RAM if that is less."""
    return min(DEFAULT_CPU_CAP_MB * MB, psutil.virtual_memory().available // 2)


def gpu_margin(total_bytes: int) -> int:
    """Bytes kept free on a GPU of `total_bytes` for the one job in flight's activations and for
    fragmentation: GPU_MARGIN_FRACTION of the card, at least GPU_MARGIN_MIN_MB."""
    return max(GPU_MARGIN_MIN_MB * MB, int(GPU_MARGIN_FRACTION * total_bytes))


def default_memory_cap(device: torch.device, cap_mb: float | None = None) -> int:
    """Bytes of cache memory that admission control hands out.

    `cap_mb`, else $HERMES_MEMORY_CAP_MB, if given. Otherwise, on a GPU: the memory free now (the
    model loaded) minus a margin for activations; on the CPU: DEFAULT_CPU_CAP_MB, or half the
    available RAM if that is less.
    """
    if cap_mb is None and os.environ.get(CAP_ENV):
        cap_mb = float(os.environ[CAP_ENV])
    if cap_mb is not None:
        if cap_mb <= 0:
            raise ValueError(f"the memory cap must be positive, got {cap_mb} MB")
        return int(cap_mb * MB)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return max(0, free - gpu_margin(total))
    return cpu_memory_cap()
