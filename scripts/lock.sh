#!/usr/bin/env bash
# Refresh the lock: requirements.txt, every package the app and the tests install (direct and
# transitive), pinned, compiled from requirements.in by uv (docs/install.md says why uv). One set for
# Python 3.11 and newer on every platform, environment markers where a platform needs its own
# packages (CUDA's on Linux), one version of each package across them. The lock names no index: it
# installs from whatever index the user's pip is set up for. Run the suite on the new lock before
# committing it, and raise pyproject.toml's caps to match (tests/test_lock.py checks both files).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "uv==0.13.9"
"$tools/venv/bin/uv" pip compile -q requirements.in \
  --universal --python-version 3.11 --fork-strategy fewest --no-header --no-annotate -o requirements.txt "$@"
echo "requirements.txt: $(grep -c '==' requirements.txt) packages pinned"
