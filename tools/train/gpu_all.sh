#!/usr/bin/env bash
# The whole GPU half of glimmer-tiny in one go (shipped settings):
#   tools/train/gpu_all.sh OUT_DIR            (about 11 minutes on one H200)
# needs build/tok from tools/train/prepare.sh (token files + chat data).
#  1. the target: 1,500 steps from scratch, 30% of batch rows chat conversations
#  2. the DFlash assistant on the target's greedy continuations
# Each result is packed as a tar cut into <= 15 MiB pieces (OUT_DIR/{target,draft}.tar.NN)
# as soon as it exists, so a later failure does not lose it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: gpu_all.sh OUT_DIR}
work=$(mktemp -d)
mkdir -p "$out"
pack() { tar -C "$work" -cf - "$1" | split -b 15M -d -a 2 - "$out/$1.tar."; }
export PYTHONUNBUFFERED=1
python3 "$root/tools/train/train.py" --data "$root/build/tok" --out "$work/target" \
    --steps 1500 --minutes "${TARGET_MINUTES:-3.2}" --eval-every 50 --dropout 0.2 --chat-frac 0.3
pack target
python3 "$root/tools/train/train_dflash.py" --target "$work/target" --data "$root/build/tok" \
    --out "$work/draft" --minutes "${DRAFT_MINUTES:-3.3}"
pack draft
ls -la "$out"
