"""The GPU benchmark script runs where gradio, plotly and decord are not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_script_runs_without_the_app_packages(tmp_path: Path) -> None:
    # Stand-ins that fail to import, as on the GPU machine, which has none of these packages.
    blocked = tmp_path / "blocked"
    (blocked / "plotly").mkdir(parents=True)
    for name in ("gradio.py", "decord.py", "plotly/__init__.py"):
        (blocked / name).write_text(f"raise ImportError('{name} is not installed on this machine')\n")
    # And a `python` first on the PATH that is not this test's interpreter (a virtual environment
    # that was not activated): the script must run with the interpreter it is given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'not the test interpreter' >&2\nexit 3\n")
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(blocked),
        "OUT": str(out),
        "MODELS": "tiny",
        "FRAMES": "4",
        "REPEATS": "1",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_bench.sh")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "tiny.json").read_text())
    assert {p["policy"] for p in result["points"]} == {"hermes", "full"}
    table = (out / "tiny.md").read_text()
    assert "ingest frames/s" in table and "Headline ratios" in table
