#!/usr/bin/env bash
# Retrain the DFlash assistant against the shipped target on one CUDA GPU
# (docs/glimmer-tiny.md "Retraining the assistant"):
#   tools/train/retrain_dflash.sh OUT_DIR [train_dflash.py options]
# needs build/muser (cmake build), build/tok (tools/train/prepare.sh; copy it
# along to a GPU machine without the network), PyTorch with CUDA.
# The target is models/glimmer-tiny-q4_k_xl.gguf's own weights (dequantized
# to F32 by `muser quantize`), so the training data are the greedy
# continuations of the model that is served. By default training starts from
# the shipped assistant (--init); pass --init "" to start from random weights.
# The run is packed as OUT_DIR/draft.tar.NN (<= 15 MiB pieces); unpack with
# `cat draft.tar.* | tar -xf -` and export with tools/train/export.sh's draft half:
#   python3 tools/train/export_dflash.py draft build/tok/tokenizer.json D-f16.gguf --type f16
#   build/muser quantize D-f16.gguf D-q4_k_xl.gguf q4_k_xl
# then measure it with tools/train/accept.py --draft D-q4_k_xl.gguf.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: retrain_dflash.sh OUT_DIR [train_dflash.py options]}
shift
work=$(mktemp -d)
mkdir -p "$out"
"$root/build/muser" quantize "$root/models/glimmer-tiny-q4_k_xl.gguf" "$work/target-f32.gguf" f32 --no-progress
"$root/build/muser" quantize "$root/models/glimmer-tiny-dflash-q4_k_xl.gguf" "$work/draft-f32.gguf" f32 --no-progress
init=(--init "$work/draft-f32.gguf")
for a in "$@"; do [ "$a" = "--init" ] && init=(); done   # the caller's --init wins
export PYTHONUNBUFFERED=1
python3 "$root/tools/train/train_dflash.py" --target "$work/target-f32.gguf" --data "$root/build/tok" \
    --out "$work/draft" "${init[@]}" "$@"
tar -C "$work" -cf - draft | split -b 15M -d -a 2 - "$out/draft.tar."
ls -la "$out"
