"""A Python environment with lmms-eval for the plugin's test, kept apart from the project's.

lmms-eval (an optional extra of the project) pulls in a long list of packages, so the test never
installs it into the environment that runs the suite. Instead it builds, once, a virtual
environment under the checkout's `.cache/` that sees this environment's packages through a .pth
file, and installs lmms-eval there with the packages the model runs on pinned to the versions
installed here (torch, transformers, ...): they are used from here, never replaced. Everything
else lmms-eval needs lands in that environment only. A stamp records what it was built for; a
changed interpreter or version rebuilds it.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

LMMS_EVAL = "lmms-eval==0.7.3"
# lmms-eval 0.7.3 patches filelock through its private `_api` module, which filelock 4 no longer has.
EXTRA = ("filelock<4",)
# What the model runs on: lmms-eval must use these exactly as installed here.
CORE = (
    "torch",
    "torchvision",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "huggingface_hub",
    "numpy",
    "pillow",
    "decord",
)
INSTALL_TIMEOUT_S = 1800


def installed(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The versions of those of `names` that are installed here (a package may come under another
    distribution's name, as decord under decord2)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def lmms_python(cache: Path) -> Path:
    """The Python of an environment with lmms-eval, built under `cache` on first need."""
    venv = cache / f"lmms-eval-{LMMS_EVAL.split('==')[1]}"
    python = venv / "bin" / "python"
    want = {"python": sys.executable, "site": site.getsitepackages(), "core": installed(CORE), "extra": list(EXTRA)}
    stamp = venv / "hermes-stamp.json"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lmms-eval.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions never build it at once
        if stamp.is_file() and json.loads(stamp.read_text()) == want:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(purelib, "hermes-parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        constraints = venv / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in want["core"].items()))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                LMMS_EVAL,
                *EXTRA,
                "-c",
                str(constraints),
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # exactly this environment's packages
        )
        if done.returncode != 0:
            raise RuntimeError(f"installing {LMMS_EVAL} into {venv} failed:\n{done.stderr[-3000:]}")
        stamp.write_text(json.dumps(want))
    return python
