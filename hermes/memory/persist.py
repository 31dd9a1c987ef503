"""The memory file: a `HermesCache` (and a retrieval policy's host store) in one file that another
process can load and go on from.

The file is a safetensors file (docs/design.md, "The memory file"). Its tensors are the memory's
keys and values and the bookkeeping of every slot; its metadata holds one entry, `hermes-memory`,
a JSON header: the format and its version, the cache's layout and constants, a SHA-256 of every
tensor, and what the caller adds (the engine adds the session's state and the model's identity).

Loading reads the whole file and checks its header and every tensor's shape and dtype as the
header declares them (on the meta device: nothing allocated) before any tensor is loaded: the
cache's layout, its constants (each of its kind, finite), its counts, and what the caller checks
besides (the model's shape, the storage its policy needs). Then it loads the tensors, checks their
checksum and the bookkeeping's values (positions within the memory's, frames, patches and stream
ids from their first), and only then builds new objects: a damaged, truncated, foreign or crafted
file raises `MemoryFileError` with the reason, in one line, and nothing is half-loaded. Writing
goes to a temporary file in the same folder, flushed to the disk, then renamed over the target: a
crash at any moment leaves the previous file or the new one, whole.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from hermes.memory.buffer import kv_bytes
from hermes.memory.cache import LOW_PRECISION, HermesCache, HermesLayer
from hermes.memory.config import HermesConfig
from hermes.memory.rivals.host_store import HostStore
from hermes.memory.rope import RopeSpec
from hermes.memory.state import StateLayer

FORMAT = "hermes-memory"
VERSION = 1
BLOCK = 1 << 20  # bytes per write call: a crash mid-file leaves a short temporary file, never the target
BOOKS = ("stream_ids", "frames", "patches", "positions", "origins", "scores")  # a slot's bookkeeping
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# The safetensors dtypes a memory file's tensors may have: the cache's, fp32, int64, and a caller's extras.
TENSOR_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
# The most a count or a number of the header may be: past it a JSON number is no longer exact, and
# no stream gets near it (2**53 tokens, frames or milliseconds).
MAX_COUNT = 2**53


class MemoryFileError(ValueError):
    """A file that cannot be loaded as a memory (or not into this model, policy or dtype), with the reason."""


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a cache dtype (bf16, fp16, fp32), as the options spell it."""
    return next((name for name, d in DTYPES.items() if d == dtype), str(dtype).removeprefix("torch."))


@dataclass
class MemoryFile:
    """A memory file's JSON header and its tensors by name."""

    header: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    def tensor(self, name: str, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor `name`, checked against `shape` and `dtype`; MemoryFileError if it is missing or differs."""
        t = self.tensors.get(name)
        if t is None:
            raise MemoryFileError(f"the memory file is damaged: tensor {name!r} is missing")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise MemoryFileError(
                f"the memory file is damaged: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}"
            )
        if dtype is not None and t.dtype != dtype:
            raise MemoryFileError(f"the memory file is damaged: {name} is {t.dtype}, expected {dtype}")
        return t


def field(header: Mapping[str, Any], key: str, kind: type | tuple[type, ...] = int) -> Any:
    """`header[key]` if it is of `kind`; MemoryFileError otherwise (a damaged or hand-edited header)."""
    value = header.get(key) if isinstance(header, Mapping) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MemoryFileError(f"the memory file's header is damaged: {key!r} is missing or malformed")
    return value


def bounded(header: Mapping[str, Any], key: str, low: float, high: float, kind: type = int) -> Any:
    """`header[key]` if it is a whole number (`kind` int) or a finite number (`kind` float) from
    `low` to `high`; MemoryFileError saying so otherwise (NaN, a negative count, 1e308 seconds)."""
    value = field(header, key, (int, float) if kind is float else int)
    if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        raise MemoryFileError(f"the memory file's header is damaged: {key!r} is {value!r}, outside {low:,} to {high:,}")
    return value


def _fits(kind: str, value: Any, default: Any) -> bool:
    """Whether `value` (JSON data) is of the kind a dataclass field annotated `kind` holds: a whole
    number for an int, a finite number for a float (both from 0 to MAX_COUNT), a list of such for a
    tuple (as long as the default), a list of (string, finite number) pairs, a bool, a string."""
    if value is None:
        return "None" in kind
    if kind.startswith("int"):
        return _finite(value) and isinstance(value, int) and 0 <= value <= MAX_COUNT
    if kind.startswith("float"):
        return _finite(value) and 0 <= value <= MAX_COUNT
    if kind.startswith("tuple"):
        return isinstance(value, list) and len(value) == len(default) and all(_fits("float", v, 0) for v in value)
    if kind.startswith("list[tuple[str"):  # log-probabilities: negative
        pairs = isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value)
        return pairs and all(isinstance(t, str) and _finite(v) and abs(v) <= MAX_COUNT for t, v in value)
    return isinstance(value, bool) if kind == "bool" else isinstance(value, str)


def _finite(value: Any) -> bool:
    """Whether `value` is a number (not a bool) and finite."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and (isinstance(value, int) or math.isfinite(value))  # an int of any size is finite


def check_fields(cls: type, values: Any, what: str) -> None:
    """MemoryFileError naming `what` unless `values` is a JSON object of fields of the dataclass
    `cls`, each of its field's kind (`_fits`): what the header says is what the code takes."""
    kinds = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(kinds)) if isinstance(values, dict) else None
    if unknown is None or unknown:
        raise MemoryFileError(f"the memory file's header is damaged: its {what} are malformed")
    for name, value in values.items():
        f = kinds[name]
        if not _fits(str(f.type), value, f.default):
            raise MemoryFileError(f"the memory file's header is damaged: its {what} hold {name} = {value!r}")


# -- the file ------------------------------------------------------------------------------------
def digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that a crash at any point leaves the old file or the new one, whole:
    a temporary file in the same folder, written, fsynced, renamed over `path`, the folder fsynced."""
    path = Path(path)
    folder = path.parent
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:BLOCK]) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself reaches the disk
    finally:
        os.close(dir_fd)


def write_memory(path: str | os.PathLike[str], memory: MemoryFile) -> int:
    """Write `memory` to `path` atomically, with the checksum of its tensors; the bytes written."""
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in memory.tensors.items()}
    header = {"format": FORMAT, "version": VERSION, **memory.header, "sha256": digest(tensors)}
    data = save_tensors(tensors, metadata={FORMAT: json.dumps(header)})
    atomic_write(path, data)
    return len(data)


def _header(data: bytes, name: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON header of a memory file's bytes and the tensors it declares (`_declared`);
    MemoryFileError for a file that is not one, or is cut short."""
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if n < 2 or data[8:9] != b"{":
        raise MemoryFileError(f"{name} is not a HERMES memory file (it is not a safetensors file at all)")
    if 8 + n > len(data):
        raise MemoryFileError(f"{name} is truncated: it ends inside its header ({len(data):,} bytes)")
    try:
        table = json.loads(data[8 : 8 + n])
        meta = table.get("__metadata__") or {}
        header = json.loads(meta[FORMAT]) if FORMAT in meta else None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):  # RecursionError: nested too deep
        raise MemoryFileError(f"{name} is not a HERMES memory file (its header cannot be read)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise MemoryFileError(f"{name} is a safetensors file but not a HERMES memory (model weights?)")
    declared, end = _declared(table, name)
    if 8 + n + end > len(data):
        raise MemoryFileError(f"{name} is truncated: {len(data):,} of its {8 + n + end:,} bytes are there")
    if header.get("version") != VERSION:
        raise MemoryFileError(
            f"{name} is a memory file of format version {header.get('version')!r}; this HERMES reads version {VERSION}"
        )
    return header, declared


def _declared(table: Mapping[str, Any], name: str) -> tuple[dict[str, torch.Tensor], int]:
    """Each tensor a safetensors table declares, as an empty tensor of its dtype and shape on the
    meta device (nothing allocated: the checks read shapes before any tensor is loaded), and where
    the tensors' data ends; MemoryFileError for an entry whose dtype, shape and size do not add up."""
    declared, end = {}, 0
    for key, spec in table.items():
        if key == "__metadata__":
            continue
        try:
            dtype = TENSOR_DTYPES[spec["dtype"]]
            shape, (begin, stop) = list(spec["shape"]), spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            dtype, shape, begin, stop = None, [], 0, -1
        # Whole, in int64, and as many bytes as the shape says: the data bounds the numbers.
        whole = all(isinstance(d, int) and 0 <= d < 2**63 for d in [*shape, begin, stop])
        if dtype is None or not whole or stop - begin != math.prod(shape) * dtype.itemsize:
            raise MemoryFileError(f"{name} is damaged: its header's entry for tensor {key!r} is malformed")
        declared[key] = torch.empty(shape, dtype=dtype, device="meta")
        end = max(end, stop)
    return declared, end


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed: its message (bytes, error codes, a C++ file) says
    nothing to a viewer, so the caller says it in a line of its own. Torch's CPU allocator raises a
    plain RuntimeError; torch.OutOfMemoryError is one too."""
    return isinstance(exc, MemoryError | torch.OutOfMemoryError) or "allocate" in str(exc)


def read_memory(path: str | os.PathLike[str], check: Callable[[MemoryFile], None] | None = None) -> MemoryFile:
    """Read and check a memory file: MemoryFileError for one that cannot be read, is not a memory,
    is truncated, whose cache does not add up (`check_cache`), or whose contents do not match their
    checksum or hold bookkeeping out of range (`check_values`).

    `check_cache` and then `check`, if given, see the file with its tensors declared only (on the
    meta device), before any tensor is loaded: what they refuse costs no more than reading the file.
    """
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MemoryFileError(f"cannot read the memory file {name}: {exc.strerror or exc}") from None
    header, declared = _header(data, name)
    planned = MemoryFile(header, declared)
    check_cache(planned)
    if check is not None:
        check(planned)
    try:
        tensors = load_tensors(data)
    except (SafetensorError, ValueError) as exc:
        raise MemoryFileError(f"{name} is damaged: {exc}") from None
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise MemoryFileError(f"{name} is damaged: {exc}") from None
        raise MemoryFileError(f"there is not enough memory to read {name} ({len(data):,} bytes)") from None
    if header.get("sha256") != digest(tensors):
        raise MemoryFileError(f"{name} is damaged: its contents do not match their checksum")
    memory = MemoryFile(header, tensors)
    check_values(memory)
    return memory


# -- the cache -----------------------------------------------------------------------------------
def pack_cache(cache: HermesCache) -> MemoryFile:
    """The tensors and header of a cache's memory: its committed tokens, never a reader's scratch ones."""
    tensors: dict[str, torch.Tensor] = {"rope.inv_freq": cache.rope.inv_freq}
    layers = []
    for i, layer in enumerate(cache.kv_layers):
        if not layer.is_initialized:
            raise ValueError("this memory holds nothing yet (not even the text prefix): there is nothing to save")
        p = layer.prefix_len
        tensors[f"kv.{i}.keys"], tensors[f"kv.{i}.values"] = layer.columns(layer.committed)
        if (origins := layer.origin_columns()) is not None:
            tensors[f"kv.{i}.origin_keys"] = origins
        tensors |= {f"kv.{i}.{book}": getattr(layer, book) for book in BOOKS}
        layers.append({"prefix_len": p, "summary_count": layer.summary_count, "allocated": layer.allocated})
    states = []
    for j, state in enumerate(cache.state_layers):
        saved, has_previous = state.committed()
        tensors |= {f"state.{j}.{name}": t for name, t in saved.items()}
        states.append({"names": sorted(saved), "has_previous": has_previous})
    header = {
        "num_layers": len(cache.layers),
        "linear": [i for i, layer in enumerate(cache.layers) if isinstance(layer, StateLayer)],
        "config": cache.config.to_dict(),
        "capacity": cache.capacity,
        "rope": {"mrope_section": cache.rope.mrope_section, "interleaved": cache.rope.interleaved},
        "dtype": dtype_name(cache.kv_layers[0].keys.dtype),
        "tokens_seen": cache.tokens_seen,
        "compactions": cache.compactions,
        "layers": layers,
        "states": states,
    }
    return MemoryFile({"cache": header}, tensors)


def _config(header: Mapping[str, Any]) -> HermesConfig:
    values = dict(field(header, "config", dict))
    check_fields(HermesConfig, values, "memory constants")  # HermesConfig checks ranges, not kinds (NaN passes)
    try:
        return HermesConfig(**{**values, "smoothing": tuple(values.get("smoothing", HermesConfig.smoothing))})
    except (TypeError, ValueError) as exc:
        raise MemoryFileError(f"the memory file's constants cannot be used: {exc}") from None


def _rope(memory: MemoryFile, header: Mapping[str, Any]) -> RopeSpec:
    spec = field(header, "rope", dict)
    section = spec.get("mrope_section")
    try:
        return RopeSpec(
            memory.tensor("rope.inv_freq", dtype=torch.float32),
            None if section is None else tuple(int(s) for s in section),
            bool(spec.get("interleaved", False)),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise MemoryFileError(f"the memory file's rotary frequencies cannot be used: {exc}") from None


def _check_layer(memory: MemoryFile, i: int, spec: Mapping[str, Any], axes: int, dtype: torch.dtype) -> int:
    """Check kv layer `i`'s tensors against each other and the header; its committed length."""
    slots = memory.tensor(f"kv.{i}.stream_ids", dtype=torch.long).numel()
    p = bounded(spec, "prefix_len", 0, MAX_COUNT)
    keys = memory.tensor(f"kv.{i}.keys", dtype=dtype)
    if keys.dim() != 4 or keys.shape[0] != 1 or keys.shape[2] != p + slots:
        raise MemoryFileError(f"the memory file is damaged: layer {i} holds {tuple(keys.shape)} keys for {p + slots}")
    memory.tensor(f"kv.{i}.values", keys.shape, dtype)
    if dtype in LOW_PRECISION:
        memory.tensor(f"kv.{i}.origin_keys", (*keys.shape[:2], slots, keys.shape[3]), dtype)
    for book in ("frames", "patches"):
        memory.tensor(f"kv.{i}.{book}", (slots,), torch.long)
    for book in ("positions", "origins"):
        memory.tensor(f"kv.{i}.{book}", (axes, slots), torch.long)
    memory.tensor(f"kv.{i}.scores", (slots,), torch.float32)
    bounded(spec, "summary_count", 0, MAX_COUNT)
    if bounded(spec, "allocated", 0, MAX_COUNT) < p + slots:
        raise MemoryFileError(f"the memory file's header is damaged: layer {i}'s sizes do not add up")
    return p + slots


def check_cache(memory: MemoryFile) -> tuple[dict[str, Any], HermesConfig, RopeSpec, torch.dtype]:
    """Check every part of a memory file's cache before anything is built from it: its header,
    constants, rotary frequencies, counts, and the shape and dtype of every tensor (a file whose
    tensors are only declared, on the meta device, will do)."""
    header = field(memory.header, "cache", dict)
    config, rope = _config(header), _rope(memory, header)
    dtype = DTYPES.get(field(header, "dtype", str))
    if dtype is None:
        raise MemoryFileError(f"the memory file's dtype {header['dtype']!r} is not one of {', '.join(DTYPES)}")
    linear, layers, states = field(header, "linear", list), field(header, "layers", list), field(header, "states", list)
    num_layers = bounded(header, "num_layers", 1, MAX_COUNT)
    if len(layers) + len(linear) != num_layers or len(states) != len(linear) or not layers:
        raise MemoryFileError("the memory file's header is damaged: its layers do not add up")
    within = all(isinstance(i, int) and 0 <= i < num_layers for i in linear)
    if not within or len(set(linear)) != len(linear):
        raise MemoryFileError("the memory file's header is damaged: its linear-attention layers are out of range")
    lengths = {_check_layer(memory, i, spec, rope.axes, dtype) for i, spec in enumerate(layers)}
    if len(lengths) != 1:
        raise MemoryFileError("the memory file is damaged: its layers differ in length")
    for j, spec in enumerate(states):
        names = field(spec, "names", list)
        if not set(names) <= {"conv", "recurrent"}:
            raise MemoryFileError(f"the memory file's header is damaged: state layer {j} names {names}")
        for name in names:
            memory.tensor(f"state.{j}.{name}")
    tokens = bounded(header, "tokens_seen", 0, MAX_COUNT)
    bounded(header, "compactions", 0, MAX_COUNT)
    if any(spec["summary_count"] > tokens for spec in layers):
        raise MemoryFileError("the memory file's header is damaged: a summary folds more tokens than were seen")
    if header.get("capacity") is not None:
        bounded(header, "capacity", 0, MAX_COUNT)
    return header, config, rope, dtype


def check_values(memory: MemoryFile) -> None:
    """MemoryFileError when a loaded memory's bookkeeping lies outside what a memory holds: rotary
    frequencies that are not finite, positions outside the memory's (0 to its `max_positions`),
    frames, patches or stream ids before the first (-1: the summary slot's), stream ids past the
    tokens seen. Tensor values, so this reads the loaded tensors."""
    header, config, rope, _ = check_cache(memory)
    if not bool(torch.isfinite(rope.inv_freq).all()):
        raise MemoryFileError("the memory file's rotary frequencies are not finite numbers")
    limit, tokens = config.max_positions, header["tokens_seen"]
    for i in range(len(header["layers"])):
        books = {book: memory.tensors[f"kv.{i}.{book}"] for book in BOOKS[:-1]}  # all but the scores
        if books["stream_ids"].numel() == 0:
            continue
        places = torch.cat([books["positions"], books["origins"]], dim=1)
        marks = torch.cat([books["stream_ids"], books["frames"], books["patches"]])
        wrong = int(places.min()) < 0 or (limit is not None and int(places.max()) >= limit)
        if wrong or int(marks.min()) < -1 or int(books["stream_ids"].max()) >= tokens:
            raise MemoryFileError(
                f"the memory file's bookkeeping is damaged: layer {i} holds positions, frames or stream ids "
                "out of range"
            )


@dataclass(frozen=True)
class CacheShape:
    """The shape of a model's memory: its decoder layers and which of them are linear attention,
    the key-value heads and channels of its attention layers, and the states of each linear one
    (by name: shape and dtype)."""

    num_layers: int
    linear: tuple[int, ...]
    kv_heads: int
    head_dim: int
    states: Mapping[str, tuple[tuple[int, ...], torch.dtype]]


def check_layout(memory: MemoryFile, shape: CacheShape) -> None:
    """MemoryFileError when a memory file's cache is not shaped as a model of `shape` keeps its
    memory: other layers or layer kinds, other heads or channels per head (its keys and values,
    ReKV's host store), other states. The declared tensors will do; nothing is allocated."""
    header = check_cache(memory)[0]
    layers, linear = header["num_layers"], sorted(header["linear"])
    if (layers, linear) != (shape.num_layers, sorted(shape.linear)):
        raise MemoryFileError(
            f"this memory has {layers} decoder layers, linear attention at {linear or 'none'}; the model "
            f"{shape.num_layers}, at {sorted(shape.linear) or 'none'}: it belongs to another model"
        )
    heads = [memory.tensors[f"kv.{i}.keys"].shape for i in range(len(header["layers"]))]
    store = memory.header.get(STORE)
    if isinstance(store, dict):
        heads += [t.shape for n, t in memory.tensors.items() if n.startswith(("store.keys.", "store.values."))]
    for dims in heads:
        if len(dims) != 4 or (dims[1], dims[3]) != (shape.kv_heads, shape.head_dim):
            raise MemoryFileError(
                f"this memory keeps keys and values shaped {tuple(dims)}, the model {shape.kv_heads} heads of "
                f"{shape.head_dim} channels: it belongs to another model"
            )
    for j, spec in enumerate(header["states"]):
        if set(spec["names"]) != set(shape.states):
            raise MemoryFileError(f"this memory's linear-attention layer {j} holds other states than the model's")
        for name, (dims, dtype) in shape.states.items():
            memory.tensor(f"state.{j}.{name}", dims, dtype)


def check_allocated(memory: MemoryFile, tokens: int) -> None:
    """MemoryFileError when a layer of the file's cache asks for storage of more than `tokens`
    tokens (the most its policy and budget need): checked on the header, before any is allocated."""
    for i, spec in enumerate(field(memory.header, "cache", dict)["layers"]):
        if spec["allocated"] > tokens:
            raise MemoryFileError(
                f"the memory file's header is damaged: layer {i} asks for room for {spec['allocated']:,} tokens, and "
                f"a memory of its policy and budget needs {tokens:,} at most"
            )


def storage_bytes(memory: MemoryFile) -> int:
    """Bytes a memory file's cache takes once loaded, from its header and declared shapes: every
    key-value layer's buffers as large as the saved ones (keys, values and, in 16 bits, origin
    keys), and the linear-attention states (once, as admission control counts a stream's)."""
    header = field(memory.header, "cache", dict)
    total = 0
    for i, spec in enumerate(header["layers"]):
        keys = memory.tensors[f"kv.{i}.keys"]
        buffers = 3 if f"kv.{i}.origin_keys" in memory.tensors else 2
        total += kv_bytes(spec["allocated"], keys.shape[1], keys.shape[3], keys.element_size(), buffers)
    states = (t for n, t in memory.tensors.items() if n.startswith("state."))
    return total + sum(t.numel() * t.element_size() for t in states)


def _fill_layer(layer: HermesLayer, memory: MemoryFile, i: int, spec: Mapping[str, Any], device: torch.device) -> None:
    """Layer `i` of the file into a new layer, its storage as large as the saved one's."""
    keys, values = memory.tensors[f"kv.{i}.keys"], memory.tensors[f"kv.{i}.values"]
    layer.restore_columns(keys, values, spec["allocated"], device)
    layer.prefix_len, layer.committed = spec["prefix_len"], keys.shape[2]
    if f"kv.{i}.origin_keys" in memory.tensors:
        layer.restore_origins(memory.tensors[f"kv.{i}.origin_keys"])
    for book in BOOKS:
        setattr(layer, book, memory.tensors[f"kv.{i}.{book}"].clone())
    layer.summary_count = spec["summary_count"]


def _fill_state(state: StateLayer, memory: MemoryFile, j: int, spec: Mapping[str, Any], device: torch.device) -> None:
    """Linear-attention layer `j` of the file into a new layer: working and committed states alike."""
    saved = {name: memory.tensors[f"state.{j}.{name}"].to(device) for name in spec["names"]}
    conv, recurrent = saved.get("conv"), saved.get("recurrent")
    kernel = None if conv is None else conv.shape[-1]
    state.lazy_initialization(conv_states=conv, recurrent_states=recurrent, conv_kernel_size=kernel)
    with torch.inference_mode(False):
        for name, t in state.states().items():
            t.copy_(saved[name])
    state.has_previous_state[0] = bool(spec["has_previous"])
    state.commit()


def unpack_cache(
    memory: MemoryFile, devices: torch.device | str | Sequence[torch.device | str] | None = None
) -> HermesCache:
    """A new HermesCache holding the file's memory, each decoder layer on its device of `devices` (one
    device for all, or one per decoder layer; default the CPU). Everything is checked first."""
    header, config, rope, _ = check_cache(memory)
    num_layers = header["num_layers"]
    if devices is None or isinstance(devices, (str, torch.device)):
        devices = [torch.device(devices or "cpu")] * num_layers
    if len(devices) != num_layers:
        raise MemoryFileError(f"the memory has {num_layers} decoder layers, the model {len(devices)}")
    cache = HermesCache(num_layers, rope, config, header.get("capacity"), linear=header["linear"])
    kv_devices = [torch.device(devices[i]) for i in cache.kv_layer_indices]
    state_devices = [torch.device(devices[i]) for i in sorted(header["linear"])]
    try:
        for i, (layer, spec) in enumerate(zip(cache.kv_layers, header["layers"], strict=True)):
            _fill_layer(layer, memory, i, spec, kv_devices[i])
        for j, (state, spec) in enumerate(zip(cache.state_layers, header["states"], strict=True)):
            _fill_state(state, memory, j, spec, state_devices[j])
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        raise MemoryFileError(
            f"there is not enough memory to load this memory: its cache takes {storage_bytes(memory) / 2**20:,.1f} MiB"
        ) from None
    cache.tokens_seen, cache.compactions = header["tokens_seen"], header["compactions"]
    return cache


def check_fits(memory: MemoryFile, rope: RopeSpec | None = None, dtype: torch.dtype | None = None) -> None:
    """MemoryFileError when the file's memory is not for a model with these rotary frequencies and this
    cache dtype."""
    header, _, saved_rope, saved_dtype = check_cache(memory)
    if dtype is not None and dtype != saved_dtype:
        raise MemoryFileError(
            f"this memory was saved in {header['dtype']} and the model runs in {dtype_name(dtype)}: "
            f"load the model in {header['dtype']} (--dtype {header['dtype']})"
        )
    if rope is not None and (
        (rope.mrope_section, rope.interleaved) != (saved_rope.mrope_section, saved_rope.interleaved)
        or not torch.equal(rope.inv_freq.float().cpu(), saved_rope.inv_freq)
    ):
        raise MemoryFileError("this memory belongs to a model with other rotary positions (another model)")


def save_cache(cache: HermesCache, path: str | os.PathLike[str], extra: Mapping[str, Any] | None = None) -> int:
    """Write `cache` to `path` atomically, `extra` (JSON data) beside it in the header; the bytes written."""
    memory = pack_cache(cache)
    memory.header |= {"extra": dict(extra or {})}
    return write_memory(path, memory)


def load_cache(
    path: str | os.PathLike[str],
    devices: torch.device | str | Sequence[torch.device | str] | None = None,
    rope: RopeSpec | None = None,
    dtype: torch.dtype | None = None,
) -> HermesCache:
    """The memory saved at `path` as a new HermesCache; MemoryFileError when the file is damaged or
    not a memory, or, given the model's `rope` and `dtype`, when it belongs to another model or dtype."""
    memory = read_memory(path)
    check_fits(memory, rope, dtype)
    return unpack_cache(memory, devices)


# -- a retrieval policy's host store ---------------------------------------------------------------
# The header keys a policy's question-time step may write: ReKV's host store.
STORE = "store"
QUESTION_PARTS = (STORE,)


def pack_store(store: HostStore) -> MemoryFile:
    """The tensors and header of a host store: per layer its keys, values and mean keys over all
    chunks side by side, with each chunk's token count to cut them apart again."""
    keys, values, positions, index = store.held()
    layers = len(index)
    tensors = {
        "store.block_chunk": store.block_chunk,
        "store.block_start": store.block_start,
        "store.block_length": store.block_length,
        "store.block_frame": store.block_frame,
    }
    if keys:
        tensors["store.positions"] = torch.cat(positions, dim=1)
        for layer in range(layers):
            tensors[f"store.keys.{layer}"] = torch.cat([chunk[layer] for chunk in keys], dim=-2)
            tensors[f"store.values.{layer}"] = torch.cat([chunk[layer] for chunk in values], dim=-2)
            tensors[f"store.index.{layer}"] = torch.cat(index[layer])
    header = {"layers": layers, "chunks": [p.shape[1] for p in positions], "next_position": store.next_position}
    return MemoryFile({STORE: header}, tensors)


def unpack_store(memory: MemoryFile, rope: RopeSpec) -> HostStore:
    """A new host store holding the file's; MemoryFileError when its parts do not fit together."""
    header = field(memory.header, STORE, dict)
    chunks, layers = field(header, "chunks", list), bounded(header, "layers", 0, MAX_COUNT)
    blocks = {k: memory.tensor(f"store.block_{k}", dtype=torch.long) for k in ("chunk", "start", "length", "frame")}
    n = blocks["chunk"].numel()
    valid = all(isinstance(c, int) and 0 <= c <= MAX_COUNT for c in chunks)
    valid = valid and all(b.shape == (n,) for b in blocks.values())
    if valid and n:  # each block within its chunk's tokens
        ends = blocks["start"] + blocks["length"]
        valid = int(torch.stack(list(blocks.values())).min()) >= 0 and int(blocks["chunk"].max()) < len(chunks)
        valid = valid and bool((ends <= torch.tensor(chunks)[blocks["chunk"].clamp(max=len(chunks) - 1)]).all())
    if not valid:
        raise MemoryFileError("the memory file is damaged: the host store's frame blocks do not add up")
    per_chunk = torch.bincount(blocks["chunk"], minlength=len(chunks)).tolist()
    store = HostStore(rope)
    if chunks:
        total = sum(chunks)
        positions = memory.tensor("store.positions", (rope.axes, total), torch.long)
        keys = [memory.tensor(f"store.keys.{layer}") for layer in range(layers)]
        if any(k.dim() != 4 or k.shape[2] != total for k in keys):
            raise MemoryFileError("the memory file is damaged: the host store's keys do not add up")
        values = [memory.tensor(f"store.values.{layer}", k.shape, k.dtype) for layer, k in enumerate(keys)]
        index = [memory.tensor(f"store.index.{layer}", (n, k.shape[1], k.shape[3])) for layer, k in enumerate(keys)]
        split_keys = [k.split(chunks, dim=-2) for k in keys]
        split_values = [v.split(chunks, dim=-2) for v in values]
        store.restore(
            [[split_keys[layer][c] for layer in range(layers)] for c in range(len(chunks))],
            [[split_values[layer][c] for layer in range(layers)] for c in range(len(chunks))],
            list(positions.split(chunks, dim=1)),
            [list(i.split(per_chunk)) for i in index],
        )
    store.block_chunk, store.block_start = blocks["chunk"], blocks["start"]
    store.block_length, store.block_frame = blocks["length"], blocks["frame"]
    store.next_position = bounded(header, "next_position", 0, MAX_COUNT)
    return store
