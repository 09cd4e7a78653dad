#!/usr/bin/env bash
# Build the GGUF reader fuzzer (clang libFuzzer + ASan + UBSan) and run it.
# Usage: scripts/fuzz_gguf.sh [MINUTES]      (default 5)
# Env:   FUZZ_WORK   scratch dir (default /tmp/muser-fuzz-gguf): binary,
#                    corpus (kept between runs), artifacts (crashes)
#        FUZZ_JOBS   parallel fuzzing processes (default 1)
#        MUSER_SHARED  for the real tokenizer GGUF seeds (default ../shared)
# Seeds: tests/malformed/*.gguf, valid files from make_malformed_corpus.py
# --seeds, and $MUSER_SHARED/testdata/tokenizer/*.gguf.
# Any crash, leak, timeout or sanitizer report leaves its input in
# $FUZZ_WORK/artifacts and makes this script exit non-zero.
set -euo pipefail

MINUTES=${1:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${FUZZ_WORK:-/tmp/muser-fuzz-gguf}
JOBS=${FUZZ_JOBS:-1}
SHARED=${MUSER_SHARED:-$ROOT/../shared}
CC=${CC_FUZZ:-clang-14}

mkdir -p "$WORK/corpus" "$WORK/seeds" "$WORK/artifacts"
"$CC" -std=c17 -g -O1 -D_GNU_SOURCE -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$ROOT/src" -I"$ROOT/include" \
    "$ROOT/fuzz/fuzz_gguf.c" "$ROOT"/src/gguf/*.c "$ROOT/src/util/common.c" "$ROOT/src/quant/types.c" \
    -lcrypto -o "$WORK/fuzz_gguf"

rm -f "$WORK"/seeds/*
cp "$ROOT"/tests/malformed/*.gguf "$WORK/seeds/"
python3 "$ROOT/scripts/make_malformed_corpus.py" --seeds "$WORK/seeds"
if compgen -G "$SHARED/testdata/tokenizer/*.gguf" > /dev/null; then
    cp "$SHARED"/testdata/tokenizer/*.gguf "$WORK/seeds/"
else
    echo "note: no real tokenizer GGUFs under $SHARED/testdata/tokenizer" >&2
fi

echo "fuzzing for $MINUTES minute(s), $JOBS job(s); work dir $WORK"
# max_len bounds mutation cost (the 0.7-2.3 MB tokenizer seeds are cut to
# their first 64 KiB); malloc_limit_mb catches allocations not bounded by the
# input size (the reader should stay within a small multiple of it).
ARGS=(-max_total_time=$((MINUTES * 60)) -max_len=65536 -timeout=10
      -rss_limit_mb=2048 -malloc_limit_mb=64 -print_final_stats=1
      -dict="$ROOT/fuzz/gguf.dict" -artifact_prefix="$WORK/artifacts/")
if [ "$JOBS" -gt 1 ]; then
    ARGS+=(-jobs="$JOBS" -workers="$JOBS")
fi
cd "$WORK"
status=0
"$WORK/fuzz_gguf" "${ARGS[@]}" "$WORK/corpus" "$WORK/seeds" || status=$?
found=$(find "$WORK/artifacts" -type f | wc -l)
echo "fuzz exit status $status; $found artifact(s) in $WORK/artifacts; corpus $(ls "$WORK/corpus" | wc -l) inputs"
[ "$status" -eq 0 ] && [ "$found" -eq 0 ]
