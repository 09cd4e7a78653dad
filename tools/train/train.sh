#!/usr/bin/env bash
# GPU half of the glimmer-tiny pipeline (run on a machine with a CUDA GPU and
# PyTorch >= 2.1, from the repository root, after tools/train/prepare.sh):
#   tools/train/train.sh OUT_DIR [extra train.py args]
# Defaults are the shipped run: 8 layers, batch 64 x 1024 tokens, AdamW 2e-3,
# dropout 0.1, best-validation checkpoint.  OUT_DIR gets index.json,
# weights.partNN, golden.bin and log.txt (then: tools/train/export.sh OUT_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: train.sh OUT_DIR [train.py args]}
shift
PYTHONUNBUFFERED=1 python3 "$root/tools/train/train.py" --data "$root/build/tok" --out "$out" "$@"
