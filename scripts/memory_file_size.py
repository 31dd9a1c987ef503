"""Size of a memory file (`stream --save-memory`, `save_cache`) per model and budget.

A full memory at the real shapes of each model (from the configs in hermes/models/random7b.py):
the text prefix, the summary slot and `budget` video slots in every key-value layer, and a hybrid
model's linear-attention states, filled with random keys and values and written by the real save
path. The size depends on the shapes only, not on what the keys hold, so no model is loaded. The
file is then read back and checked like any other. A stream's own state (stream time, standing
questions, last answers, the model's identity) adds a few kilobytes on top.

    python scripts/memory_file_size.py [--budgets 1024 4096 10240]

With --tiny, a real stream instead: each tiny random-weight model (hermes/models/tiny.py, built
offline through the real loading path) streams random frames until its memory holds the budget,
the session is saved by the app's path (`save_session`: memory, session state and model identity),
and one more chunk shows that the file has stopped growing.

    python scripts/memory_file_size.py --tiny [--budgets 128 512 2048]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from hermes.engine.chunk import Chunk
from hermes.memory.cache import ChunkMeta, HermesCache
from hermes.memory.config import HermesConfig
from hermes.memory.persist import read_memory, save_cache
from hermes.memory.rope import RopeSpec
from hermes.models.random7b import QWEN2_05B_TEXT, QWEN2_7B_TEXT, QWEN25_VL_7B_TEXT, QWEN35_08B_TEXT

PREFIX = 20  # tokens of the system prompt and the start of the user turn (about this many)
MODELS = {
    "LLaVA-OV-0.5B": QWEN2_05B_TEXT,
    "LLaVA-OV-7B": QWEN2_7B_TEXT,
    "Qwen2.5-VL-7B": QWEN25_VL_7B_TEXT,
    "Qwen3.5-0.8B": QWEN35_08B_TEXT,
}


def shapes(text: dict) -> tuple[int, list[int], int, int, tuple[int, ...] | None]:
    """(layers, linear-attention layers, kv heads, head dim, M-RoPE sections) of a text config."""
    layers = text["num_hidden_layers"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    interval = text.get("full_attention_interval")
    linear = [] if interval is None else [i for i in range(layers) if (i + 1) % interval]
    section = text["rope_parameters"].get("mrope_section")
    return layers, linear, text["num_key_value_heads"], head_dim, None if section is None else tuple(section)


def full_memory(text: dict, budget: int, dtype: torch.dtype) -> HermesCache:
    """A memory of `text`'s shapes holding the prefix, the summary slot and `budget` video slots."""
    layers, linear, heads, head_dim, section = shapes(text)
    rotary = int(head_dim * text["rope_parameters"].get("partial_rotary_factor", 1.0))
    rope = RopeSpec.from_config(
        rotary, 1e6, section, interleaved=bool(text["rope_parameters"].get("mrope_interleaved"))
    )
    cache = HermesCache(layers, rope, HermesConfig(budget=budget), capacity=budget + 1, linear=linear)
    _write(cache, PREFIX, dtype, heads, head_dim)
    _fill_states(cache, text, dtype)
    cache.commit_prefix()
    n = budget + 1  # the summary slot, or one more video slot, and the budget
    _write(cache, n, dtype, heads, head_dim)
    at = torch.arange(PREFIX, PREFIX + n)
    cache.commit(ChunkMeta(frames=torch.arange(n) // 196, positions=at.expand(rope.axes, n)))
    return cache


def _write(cache: HermesCache, n: int, dtype: torch.dtype, heads: int, head_dim: int) -> None:
    """`n` random tokens into every key-value layer, as the model writes them."""
    for layer in cache.kv_layers:
        layer.update(torch.randn(1, heads, n, head_dim).to(dtype), torch.randn(1, heads, n, head_dim).to(dtype))


def _fill_states(cache: HermesCache, text: dict, dtype: torch.dtype) -> None:
    """Linear-attention states of a hybrid model's shapes: the convolution's last inputs (model dtype)
    and the recurrent state (fp32, as the model keeps it)."""
    if not cache.state_layers:
        return
    keys, values = text["linear_num_key_heads"], text["linear_num_value_heads"]
    k_dim, v_dim = text["linear_key_head_dim"], text["linear_value_head_dim"]
    conv = torch.randn(1, 2 * keys * k_dim + values * v_dim, text["linear_conv_kernel_dim"]).to(dtype)
    recurrent = torch.randn(1, values, k_dim, v_dim)
    for state in cache.state_layers:
        state.lazy_initialization(conv_states=conv, recurrent_states=recurrent, conv_kernel_size=conv.shape[-1])


TINY = ("tiny", "tiny-qwen", "tiny-qwen3", "tiny-qwen35")
CHUNK_FRAMES = 4


def _chunk(index: int, side: int) -> Chunk:
    """Chunk `index` of a stream of random `side` x `side` frames, one a second."""
    pixels = np.random.default_rng(index).integers(0, 256, (CHUNK_FRAMES, side, side, 3), dtype=np.uint8)
    ids = np.arange(index * CHUNK_FRAMES, (index + 1) * CHUNK_FRAMES)
    return Chunk(pixels, ids.astype(float), ids, ids, chunk_index=index)


def tiny_sizes(budgets: list[int]) -> None:
    """Stream each tiny model until its memory holds each budget, save it, and print the sizes."""
    from hermes.engine.persist import save_session
    from hermes.engine.session import StreamingSession
    from hermes.models.loading import load_video_lm

    print("| model | layers (key-value + linear) | dtype | budget | chunks | file | file after one more chunk |")
    print("|---|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.hmem"
        for name, dtype in itertools.product(TINY, ("fp32", "bf16")):
            lm = load_video_lm(name, device="cpu", dtype=dtype)
            side = 224 if lm.frame_multiple > 1 else 64  # the tiny Qwen processors' least pixel volume
            layers = f"{lm.kv_layers} + {len(lm.linear_layers)}"
            for budget in budgets:
                session = StreamingSession(lm, HermesConfig(budget=budget, chunk_frames=CHUNK_FRAMES, fps=1.0))
                index = 0
                while session.memory.slots < budget:
                    session.ingest(_chunk(index, side))
                    index += 1
                full = save_session(session, path)
                session.ingest(_chunk(index, side))
                more = save_session(session, path)
                mib = [f"{b / 2**20:,.2f} MiB" for b in (full, more)]
                print(f"| {name} | {layers} | {dtype} | {budget:,} | {index} | " + " | ".join(mib) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=None)
    parser.add_argument("--tiny", action="store_true", help="stream the tiny models for real instead")
    args = parser.parse_args()
    if args.tiny:
        tiny_sizes(args.budgets or [128, 512, 2048])
        return
    args.budgets = args.budgets or [1024, 4096, 10240]
    columns = "keys, values (and origin keys in 16 bits) | bookkeeping of the slots | linear-attention states"
    print(f"| model | dtype | budget | file | {columns} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in MODELS.items():
            for dtype in (torch.bfloat16, torch.float32):
                for budget in args.budgets:
                    cache = full_memory(text, budget, dtype)
                    path = Path(tmp) / "memory"
                    size = save_cache(cache, path)
                    tensors = read_memory(path).tensors
                    kv = sum(t.nbytes for k, t in tensors.items() if k.endswith(("keys", "values")))
                    states = sum(t.nbytes for k, t in tensors.items() if k.startswith("state."))
                    books = sum(t.nbytes for t in tensors.values()) - kv - states
                    dt = "bf16" if dtype == torch.bfloat16 else "fp32"
                    mib = [f"{b / 2**20:,.1f} MiB" for b in (size, kv, books, states)]
                    print(f"| {name} | {dt} | {budget:,} | " + " | ".join(mib) + " |", flush=True)


if __name__ == "__main__":
    main()
