#!/usr/bin/env bash
# Know before users do: the suite on the newest release of every direct dependency.
#
# Builds a throwaway venv with the newest release of each package requirements.in names (its ranges'
# caps lifted; a cap this machine's pip is set up with, such as its torch, still holds), prints every
# package whose version differs from the lock (requirements.txt), then runs the suite there (any
# arguments go to pytest, e.g. `scripts/check_newest.sh tests/test_qwen35.py`) and prints what failed.
# Not part of .ci/run: an upstream release must not block a landing. Needs what .ci/run installs with
# apt (ffmpeg, chromium, GStreamer's RTSP server). Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
python -m pip install -q --upgrade pip
mapfile -t names < <(sed -e 's/#.*//' requirements.in | grep -oE '^[A-Za-z0-9][A-Za-z0-9._-]*')
echo "installing the newest ${names[*]}"
python -m pip install -q --upgrade "${names[@]}" || { echo "error: the newest releases do not install together"; exit 2; }

echo "== packages that moved against the lock (locked -> newest) =="
python - <<'PY'
import re
from importlib.metadata import distributions

def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

from packaging.markers import Marker

locked = {}
for line in open("requirements.txt"):
    pin, _, marker = line.partition(";")
    if marker.strip() and not Marker(marker.strip()).evaluate():
        continue  # a package of another platform or Python
    name, version = pin.strip().split("==")
    locked[canonical(name)] = version
installed = {canonical(d.metadata["Name"]): d.version for d in distributions()}
direct = {canonical(m[0]) for m in (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.split("#")[0]) for line in open("requirements.in")) if m}
moved = 0
for name in sorted(set(locked) | set(installed)):
    old, new = locked.get(name, "-"), installed.get(name, "-")
    if old != new and name not in ("pip",):
        moved += 1
        print(f"{'direct ' if name in direct else '       '}{name}: {old} -> {new}")
print(f"{moved} moved" if moved else "nothing moved: the lock is the newest set")
PY

echo "== the suite on the newest releases =="
export HF_HUB_OFFLINE=1 HERMES_CACHE="$work/hermes-cache"
python -m pytest -q -p no:cacheprovider -rfE "$@" | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
echo "== what failed on the newest releases =="
grep -E '^(FAILED|ERROR) ' "$work/pytest.log" || echo "nothing"
exit "$status"
