#!/usr/bin/env bash
# GPU numbers in one go: the 7B architectures and Qwen3.5-9B (hybrid) with random weights (speed
# does not depend on the weights), hermes and full, from 16 to 1,024 frames, one JSON file and one
# Markdown table each. Qwen3.5 needs a transformers with `qwen3_5` (5.24 has it).
# Needs only the repository, PyTorch, transformers and accelerate: the benchmark imports neither
# gradio nor plotly nor decord, and builds its models offline. About 8 minutes on one H200 for the
# two 7B models; Qwen3.5-9B has not been timed there yet.
#
#   bash scripts/gpu_bench.sh                      # writes runs/gpu/*.json and runs/gpu/*.md
#   MODELS=tiny FRAMES=4,8 REPEATS=1 bash scripts/gpu_bench.sh   # the same path on a CPU, in seconds
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu}
MODELS=${MODELS:-"llava-ov-7b-random qwen2.5-vl-7b-random qwen3.5-9b-random"}
FRAMES=${FRAMES:-16,64,256,512,1024}
REPEATS=${REPEATS:-3}
# The interpreter: $PYTHON (the tests pass their own), else python3 on the PATH.
PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

"$PYTHON" -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}, cuda: {torch.cuda.is_available()}')"
for model in $MODELS; do
  echo "== $model"
  "$PYTHON" -m hermes bench --model "$model" --policies hermes,full --frames "$FRAMES" --chunk-frames 16 \
    --repeats "$REPEATS" --json "$OUT/$model.json" --no-progress | tee "$OUT/$model.md"
done
echo "wrote $(ls "$OUT"/*.json | tr '\n' ' ')"
