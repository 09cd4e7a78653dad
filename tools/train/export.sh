#!/usr/bin/env bash
# Export a training run to GGUF, quantize, and check against the golden logits.
#   tools/train/export.sh RUN_DIR        (RUN_DIR from train.sh)
# Writes build/glimmer/glimmer-tiny-{f32,f16}.gguf, models/glimmer-tiny-q4_k_xl.gguf
# and tests/data/golden/glimmer-tiny.golden; needs build/muser (cmake build).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
run=${1:?usage: export.sh RUN_DIR}
py=/usr/bin/python3
out=$root/build/glimmer
mkdir -p "$out" "$root/models" "$root/tests/data/golden"
tok=$root/build/tok/tokenizer.json
$py "$root/tools/train/export_gguf.py" "$run" "$tok" "$out/glimmer-tiny-f32.gguf" --type f32
$py "$root/tools/train/export_gguf.py" "$run" "$tok" "$out/glimmer-tiny-f16.gguf" --type f16
install -m 644 "$run/golden.bin" "$root/tests/data/golden/glimmer-tiny.golden"
"$root/build/muser" quantize "$out/glimmer-tiny-f32.gguf" "$root/models/glimmer-tiny-q4_k_xl.gguf" q4_k_xl --no-progress
for m in f32 f16; do
    echo "== golden check: $m"
    $py "$root/tools/train/compare_golden.py" "$root/tests/data/golden/glimmer-tiny.golden" \
        "$out/glimmer-tiny-$m.gguf" --muser "$root/build/muser" --all-rows || true
done
echo "== golden deviation: q4_k_xl (informative)"
$py "$root/tools/train/compare_golden.py" "$root/tests/data/golden/glimmer-tiny.golden" \
    "$root/models/glimmer-tiny-q4_k_xl.gguf" --muser "$root/build/muser" --tol 1 || true
