"""Size of a memory file (`stream --save-memory`, `HermesCache.save`) per model and budget.

A full memory at the real shapes of each model (from the configs in hermes/models/random7b.py):
the text prefix, the summary slot and `budget` video slots in every key-value layer, and a hybrid
model's linear-attention states, filled with random keys and values and written by the real save
path. The size depends on the shapes only, not on what the keys hold, so no model is loaded. The
file is then read back and checked like any other. A stream's own state (stream time, standing
questions, last answers, the model's identity) adds a few kilobytes on top.

    python scripts/memory_file_size.py [--budgets 1024 4096 10240]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096, 10240])
    args = parser.parse_args()
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
