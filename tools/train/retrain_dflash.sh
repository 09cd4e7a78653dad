#!/usr/bin/env bash
# Retrain the DFlash assistant against the shipped target on one CUDA GPU
# (docs/glimmer-tiny.md "Retraining the assistant"):
#   tools/train/retrain_dflash.sh OUT_DIR [train_dflash.py options]
# needs build/muser (cmake build; MUSER= another binary), PYTHON (default
# python3) with numpy and PyTorch with CUDA, and build/tok
# (tools/train/prepare.sh; copy it along to a GPU machine without the network).
# The target is models/glimmer-tiny-q4_k_xl.gguf's own weights (dequantized
# to F32 by `muser quantize`), so the training data are the greedy
# continuations of the model that is served. By default training starts from
# the shipped assistant (--init); pass --init "" to start from random weights.
# Writes OUT_DIR/draft.tar.NN (the run, <= 15 MiB pieces; unpack with
# `cat draft.tar.* | tar -xf -`), OUT_DIR/glimmer-tiny-dflash-q4_k_xl.gguf
# (exported as tools/train/export.sh exports, quantized as shipped) and
# OUT_DIR/accept.txt: tools/train/accept.py's engine-side acceptance of the
# shipped and the new assistant on the same held-out prompts (ACCEPT_BACKEND,
# default cpu; every backend gives the same tokens; ACCEPT=0 / ACCEPT_SHIPPED=0 below).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: retrain_dflash.sh OUT_DIR [train_dflash.py options]}
shift
muser=${MUSER:-$root/build/muser}
py=${PYTHON:-python3}   # with PyTorch and numpy
work=$(mktemp -d)
mkdir -p "$out"
"$muser" quantize "$root/models/glimmer-tiny-q4_k_xl.gguf" "$work/target-f32.gguf" f32 --no-progress
"$muser" quantize "$root/models/glimmer-tiny-dflash-q4_k_xl.gguf" "$work/draft-f32.gguf" f32 --no-progress
init=(--init "$work/draft-f32.gguf")
for a in "$@"; do [ "$a" = "--init" ] && init=(); done   # the caller's --init wins
export PYTHONUNBUFFERED=1
"$py" "$root/tools/train/train_dflash.py" --target "$work/target-f32.gguf" --data "$root/build/tok" \
    --out "$work/draft" "${init[@]}" "$@"
tar -C "$work" -cf - draft | split -b 15M -d -a 2 - "$out/draft.tar."
"$py" "$root/tools/train/export_dflash.py" "$work/draft" "$root/build/tok/tokenizer.json" \
    "$work/draft-f16.gguf" --type f16
"$muser" quantize "$work/draft-f16.gguf" "$out/glimmer-tiny-dflash-q4_k_xl.gguf" q4_k_xl --no-progress
# ACCEPT=0: no measurement (accept.py runs anywhere later: the cpu backend gives the GPU's
# tokens); ACCEPT_SHIPPED=0: the new assistant only (the shipped one's figures are in
# docs/glimmer-tiny.md)
drafts=("$root/models/glimmer-tiny-dflash-q4_k_xl.gguf" "$out/glimmer-tiny-dflash-q4_k_xl.gguf")
[ "${ACCEPT_SHIPPED:-1}" = 0 ] && drafts=("$out/glimmer-tiny-dflash-q4_k_xl.gguf")
[ "${ACCEPT:-1}" = 0 ] && drafts=()
for d in "${drafts[@]}"; do
    "$py" "$root/tools/train/accept.py" --muser "$muser" --draft "$d" --backend "${ACCEPT_BACKEND:-cpu}" \
        -t 1 -j "${ACCEPT_JOBS:-$(nproc)}" ${ACCEPT_ARGS:-} | tee -a "$out/accept.txt"
done
ls -la "$out"
