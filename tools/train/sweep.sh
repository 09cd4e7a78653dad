#!/usr/bin/env bash
# The shipped GPU run: two regularization settings, keep the one with the lower
# validation loss (f16 weights).  tools/train/sweep.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: sweep.sh OUT_DIR}
work=$(mktemp -d)
"$here/train.sh" "$work/a" --steps 1500 --minutes 3.9 --eval-every 50 --dropout 0.1
"$here/train.sh" "$work/b" --steps 1500 --minutes 3.9 --eval-every 50 --dropout 0.2
best=$(python3 - "$work" <<'PY'
import json, sys
runs = {r: json.load(open("%s/%s/index.json" % (sys.argv[1], r))) for r in "ab"}
for r, i in runs.items():
    print("run %s dropout %.1f: valid %.4f test %.4f best step %d" % (
        r, i["args"]["dropout"], i["valid_loss_f16"], i["test_loss_f16"], i["best_step"]), file=sys.stderr)
print(min(runs, key=lambda r: runs[r]["valid_loss_f16"]))
PY
)
echo "keeping run $best"
mkdir -p "$out"
cp "$work/$best"/weights.part* "$work/$best"/index.json "$work/$best"/golden.bin "$out/"
cp "$work/a/log.txt" "$out/log_a.txt"
cp "$work/b/log.txt" "$out/log_b.txt"
