"""Load a video LLM by hub id, local folder or alias, with clear errors when it cannot be had."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
from transformers.utils import logging as hf_logging

from hermes.models.base import VideoLM
from hermes.models.card import ModelCard
from hermes.models.gemm import cpu_bf16_pays, cpu_has_bf16
from hermes.models.llava_onevision import LlavaOnevision
from hermes.models.qwen2_5_vl import Qwen25VL
from hermes.models.qwen3_5 import Qwen35, Qwen35Moe
from hermes.models.qwen3_vl import Qwen3VL

# The model served when none is named, by device (docs/performance.md says why): on a GPU the paper's
# LLaVA-OneVision checkpoint; on a CPU the fastest supported real checkpoint, about the app's 1 frame/s
# on 2 cores (0.77 to 1.22 by the processor and its load). LLaVA-OneVision-0.5B reads a quarter of that: its
# SigLIP-so400m alone costs about 0.6 TFLOP a frame, more than two cores multiply in two seconds.
DEFAULT_MODEL = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"
CPU_DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"
# The one table of backbones: model_type -> adapter, and each adapter names its transformers class.
ADAPTERS: dict[str, type[VideoLM]] = {cls.arch: cls for cls in (LlavaOnevision, Qwen25VL, Qwen3VL, Qwen35, Qwen35Moe)}
MODEL_CLASSES = ", ".join(cls.model_class for cls in ADAPTERS.values())
# Aliases for tiny random-weight models of the real architectures: (arch, decoder layers).
TINY_ALIASES: dict[str, tuple[str, int]] = {
    "tiny": ("llava_onevision", 4),
    "tiny-qwen": ("qwen2_5_vl", 4),
    "tiny-qwen3": ("qwen3_vl", 4),
    # Qwen3.5's real pattern (full attention every fourth layer): 12 layers give the 3 attention
    # layers that the three tiers need.
    "tiny-qwen35": ("qwen3_5", 12),
    # The app's offline fallbacks: the default checkpoints' 24 layers, so that the tier map looks real.
    "tiny-24": ("llava_onevision", 24),
    "tiny-qwen35-24": ("qwen3_5", 24),
}
# Models trained in this repository (docs/toyworld.md): alias -> checkpoint folder.
TOY_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "toyworld" / "model"
# The toy model's sample clips, beside it, listed in their folder's SAMPLES_FILE (the app offers them).
TOY_SAMPLES = TOY_MODEL_DIR.parent / "samples"
SAMPLES_FILE = "samples.json"
# The second toy world's model (several objects at once, 8 layers; docs/toyworld.md, world v2).
TOY2_MODEL_DIR = TOY_MODEL_DIR.parents[1] / "toyworld2" / "model"
TOY2_SAMPLES = TOY2_MODEL_DIR.parent / "samples"
TRAINED_ALIASES: dict[str, Path] = {"toy": TOY_MODEL_DIR, "toy2": TOY2_MODEL_DIR}
TRAINED_SAMPLES: dict[str, Path] = {"toy": TOY_SAMPLES, "toy2": TOY2_SAMPLES}  # alias -> its own sample clips
RANDOM_MARKER = "HERMES_RANDOM_WEIGHTS"


def tiny_names(quote: str = "") -> str:
    """The tiny aliases, for messages and help: `tiny, tiny-qwen, ... or tiny-24`, each in `quote`."""
    names = [f"{quote}{name}{quote}" for name in TINY_ALIASES]
    return ", ".join(names[:-1]) + " or " + names[-1]


DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_CHOICES = ("auto", *DTYPES)
AUTO_DTYPE_HELP = (
    "auto: bf16 on a GPU, and on a CPU where bf16 is native (AMX or AVX-512 BF16) and measured not clearly "
    "slower than fp32, else fp32"
)
# accelerate's strategies for spreading a model over the visible GPUs (and the CPU when it must).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# A decoder or vision layer's weights, by the module path transformers names them with.
_LAYER = re.compile(r"^(.*?(?:layers|blocks)\.\d+)\.")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


def pick_device(device: str | None = None) -> torch.device:
    """`device`, or the GPU when there is one, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def default_model(device: str | torch.device | None = None) -> str:
    """The model to serve on `device` (default: the GPU when there is one) when none is named."""
    return CPU_DEFAULT_MODEL if pick_device(device).type == "cpu" else DEFAULT_MODEL


def requested_model(name: str | None, device: str | torch.device | None = None) -> str:
    """The model a command serves: `name` (--model), else $HERMES_MODEL, else the device's default."""
    return name or os.environ.get("HERMES_MODEL") or default_model(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The torch dtype for `dtype` ('auto', 'bf16', 'fp16', 'fp32' or a torch dtype) on `device`.

    'auto': bf16 on CUDA (fp16 where the GPU lacks bf16); on a CPU, bf16 where it is native (AMX or
    AVX-512 BF16) and its matrix multiplies are not clearly slower than fp32's (`cpu_bf16_pays`,
    measured once), else fp32; fp32 on other devices. None keeps the loader's default: bf16 (or
    fp16) on CUDA, fp32 elsewhere.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is not None and dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype == "auto" and device.type == "cpu" and cpu_has_bf16() and cpu_bf16_pays():
        return torch.bfloat16
    return torch.float32


def _hub_reachable(timeout: float = 2.0) -> bool:
    # A quick probe, so that an offline machine fails in seconds instead of retrying downloads.
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve(name: str) -> tuple[str, bool]:
    """Local path or hub id for `name`, and whether it is a known random-weight model."""
    if name in TINY_ALIASES:
        from hermes.models.tiny import ensure_tiny

        arch, layers = TINY_ALIASES[name]
        return str(ensure_tiny(arch, num_layers=layers)), True
    if name in TRAINED_ALIASES:
        folder = TRAINED_ALIASES[name]
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"{name}: the trained toy model is not in {folder}; train it with `python -m hermes toyworld train`"
            )
        return str(folder), False
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name}: this folder has no config.json, so it is not a transformers checkpoint")
        return str(path), (path / RANDOM_MARKER).exists()
    return name, False


def download_command(source: str) -> str:
    """The command that downloads `source` with the installed huggingface_hub: `hf download` since
    0.34 (the `huggingface-cli` name is gone in 1.0), `huggingface-cli download` before."""
    import huggingface_hub

    major, minor = (int(part) for part in huggingface_hub.__version__.split(".")[:2])
    return f"{'hf' if (major, minor) >= (0, 34) else 'huggingface-cli'} download {source}"


def _load_config(source: str):
    try:
        return AutoConfig.from_pretrained(source, local_files_only=True), True
    except (OSError, ValueError):
        pass
    except StrictDataclassError as exc:  # a config that its own class's validators refuse
        raise ModelLoadError(f"Cannot load model {source!r}: its config is invalid: {exc.__cause__ or exc}") from exc
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
        raise ModelLoadError(
            f"Cannot load model {source!r}: it is not in the local Hugging Face cache and {why}. "
            f"Download it on a connected machine ({download_command(source)}), pass a local folder, "
            f"or use --model {tiny_names()} for a random-weight model of the same architecture."
        )
    try:
        return AutoConfig.from_pretrained(source), False
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot load model {source!r}: {exc}") from exc


def load_video_lm(
    name: str = DEFAULT_MODEL,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    offload_folder: str | Path | None = None,
) -> VideoLM:
    """Load a supported video LLM (LLaVA-OneVision, Qwen2.5-VL, Qwen3-VL or Qwen3.5) for streaming.

    `dtype`: 'auto', 'bf16', 'fp16', 'fp32' or a torch dtype (see `resolve_dtype`); None keeps
    the default (bf16 on a GPU, fp32 on a CPU). `device_map` ('auto', 'balanced', ... or an
    explicit map of module names to devices) spreads the model with accelerate over all visible
    GPUs, and the CPU when they are full; each layer's memory then stays on the device its layer
    runs on. A map that sends modules to "disk" needs `offload_folder`. Without a map, the model
    goes to `device` whole.
    """
    if not name or not name.strip():
        raise ModelLoadError(f"No model given: pass a hub id, a local folder, {tiny_names(chr(39))}.")
    if device_map is not None and device is not None:
        raise ValueError("give a device or a device map, not both: a device map places every layer itself")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise ValueError(f"device map {device_map!r} is not one of {', '.join(DEVICE_MAPS)}")
    if isinstance(dtype, str) and dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
    source, random_weights = resolve(name.strip())
    config, local = _load_config(source)
    arch = getattr(config, "model_type", None)
    if arch not in ADAPTERS:
        raise ModelLoadError(
            f"Model {name!r} is a {arch!r} model; HERMES Live supports {', '.join(ADAPTERS)} ({MODEL_CLASSES})."
        )
    # With a device map the layers land on the GPUs when there are any: pick the dtype for those.
    dev = pick_device(device if device_map is None else None)
    torch_dtype = resolve_dtype(dtype, dev)
    hf_logging.disable_progress_bar()  # per-shard bars are noise in a CLI transcript and in logs
    placement = {} if device_map is None else {"device_map": device_map}
    if offload_folder is not None:
        placement["offload_folder"] = str(offload_folder)
    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=local)
        model, info = AutoModelForImageTextToText.from_pretrained(
            source,
            local_files_only=local,
            dtype=torch_dtype,
            attn_implementation="sdpa",
            output_loading_info=True,
            **placement,
        )
        check_layers_loaded(info)
        if device_map is None:
            model = model.to(dev)
        card = ModelCard.read(source) if Path(source).is_dir() else ModelCard()
        # Nothing here trains a loaded model; and a parameter that asks for gradients makes torch's
        # module tracers (the bench's FLOP counter) hook the backward of every kernel it is passed to.
        model.requires_grad_(False)
        lm = wrap(model, processor, source=name, random_weights=random_weights)
    except (OSError, ValueError, ImportError) as exc:
        raise ModelLoadError(f"Cannot load model {name!r}: {exc}") from exc
    lm.card = card
    return lm


def check_layers_loaded(info: dict[str, Any]) -> None:
    """ValueError, in one line, when the checkpoint's layers are not the config's: weights of a layer
    that the config does not build, or a layer the config builds that has no weights (it would run on
    random initial values). `info` is `from_pretrained`'s loading info."""
    for kind, says in (
        ("unexpected_keys", "weights for layers its config does not build"),
        ("missing_keys", "no weights for layers its config builds"),
    ):
        layers = sorted({m.group(1) for key in info.get(kind, ()) if (m := _LAYER.search(key))})
        if layers:
            shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
            raise ValueError(
                f"its checkpoint has {says} ({shown}): the config's layer count disagrees with the weights"
            )


def wrap(model: Any, processor: Any, source: str = "", random_weights: bool = False) -> VideoLM:
    """The adapter for a model and processor loaded with `transformers`, by the model's type."""
    arch = getattr(model.config, "model_type", None)
    if arch not in ADAPTERS:
        raise ModelLoadError(
            f"{type(model).__name__} ({arch!r}) is not supported; HERMES Live supports {', '.join(ADAPTERS)} "
            f"({MODEL_CLASSES})"
        )
    return ADAPTERS[arch](
        model, processor, source=source or getattr(model, "name_or_path", ""), random_weights=random_weights
    )


def set_threads(threads: int = 0) -> None:
    """Torch's CPU threads: `threads`, or 0 for torch's own count (every core), as the app runs, so
    that what bench and eval measure is what a viewer of the app gets."""
    if threads > 0:
        torch.set_num_threads(threads)
