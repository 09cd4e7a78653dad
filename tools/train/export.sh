#!/usr/bin/env bash
# Export a training run to GGUF, quantize, and check against the golden logits.
#   tools/train/export.sh TARGET_RUN_DIR [DRAFT_RUN_DIR]
# (the run directories that train.sh / train_dflash.py, or gpu_all.sh's tars, hold)
# Writes build/glimmer/glimmer-tiny-{f32,f16}.gguf, models/glimmer-tiny-q4_k_xl.gguf,
# tests/data/golden/glimmer-tiny.golden and, with a draft run,
# build/glimmer/glimmer-tiny-dflash-f16.gguf and models/glimmer-tiny-dflash-q4_k_xl.gguf;
# needs build/muser (cmake build).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
run=${1:?usage: export.sh TARGET_RUN_DIR [DRAFT_RUN_DIR]}
draft=${2:-}
py=/usr/bin/python3
out=$root/build/glimmer
mkdir -p "$out" "$root/models" "$root/tests/data/golden"
tok=$root/build/tok/tokenizer.json
$py "$root/tools/train/export_gguf.py" "$run" "$tok" "$out/glimmer-tiny-f32.gguf" --type f32
$py "$root/tools/train/export_gguf.py" "$run" "$tok" "$out/glimmer-tiny-f16.gguf" --type f16
install -m 644 "$run/golden.bin" "$root/tests/data/golden/glimmer-tiny.golden"
"$root/build/muser" quantize "$out/glimmer-tiny-f32.gguf" "$root/models/glimmer-tiny-q4_k_xl.gguf" q4_k_xl --no-progress
if [ -n "$draft" ]; then
    $py "$root/tools/train/export_dflash.py" "$draft" "$tok" "$out/glimmer-tiny-dflash-f16.gguf" --type f16
    "$root/build/muser" quantize "$out/glimmer-tiny-dflash-f16.gguf" \
        "$root/models/glimmer-tiny-dflash-q4_k_xl.gguf" q4_k_xl --no-progress
fi
for m in f32 f16; do
    echo "== golden check: $m"
    $py "$root/tools/train/compare_golden.py" "$root/tests/data/golden/glimmer-tiny.golden" \
        "$out/glimmer-tiny-$m.gguf" --muser "$root/build/muser" --all-rows || true
done
echo "== golden deviation: q4_k_xl (informative)"
$py "$root/tools/train/compare_golden.py" "$root/tests/data/golden/glimmer-tiny.golden" \
    "$root/models/glimmer-tiny-q4_k_xl.gguf" --muser "$root/build/muser" --tol 1 || true
