#!/usr/bin/env bash
# CPU half of the glimmer-tiny pipeline: corpus -> tokenizer -> token files -> chat data.
#   tools/train/prepare.sh        (writes build/corpus and build/tok)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=/usr/bin/python3          # Debian python: has python3-regex and python3-numpy
"$root/tools/corpus/build_corpus.sh" "$root/build/corpus"
mkdir -p "$root/build/tok"
$py "$root/tools/train/bpe.py" train "$root/build/corpus" "$root/build/tok/tokenizer.json" --vocab 8192
$py "$root/tools/train/bpe.py" encode-corpus "$root/build/tok/tokenizer.json" "$root/build/corpus" "$root/build/tok"
$py "$root/tools/train/golden_tokens.py" "$root/build/tok/tokenizer.json" "$root/build/tok"
$py "$root/tools/train/chat_data.py" "$root/build/corpus" "$root/build/tok/tokenizer.json" "$root/build/tok"
