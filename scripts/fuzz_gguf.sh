#!/usr/bin/env bash
# Fuzz the GGUF reader (fuzz/fuzz_gguf.c: clang libFuzzer + ASan + UBSan).
# Usage: scripts/fuzz_gguf.sh [MINUTES]          build, then fuzz (default 5 min)
#        scripts/fuzz_gguf.sh --smoke BIN WORK   short fixed run of a built BIN
#                                               (the ctest fuzz_gguf_smoke)
# Env:   FUZZ_BUILD  CMake build dir for the fuzzer (default build-fuzz,
#                    configured with clang and MUSER_FUZZ=ON)
#        CC_FUZZ     the clang to configure it with (default clang)
#        FUZZ_WORK   scratch dir (default /tmp/muser-fuzz-gguf): corpus (kept
#                    between runs), seeds, artifacts (crashes)
#        FUZZ_JOBS   parallel fuzzing processes (default 1)
#        FUZZ_RUNS   inputs the smoke run executes (default 1000000; it
#                    stops after 60 s regardless, on a slow machine)
#        MUSER_SHARED  for the real tokenizer GGUF seeds (default ../shared)
# Seeds: tests/malformed/*.gguf, valid files from make_malformed_corpus.py
# --seeds, and $MUSER_SHARED/testdata/tokenizer/*.gguf (the smoke run uses
# tests/malformed only, so it needs nothing outside the repository).
# Any crash, leak, timeout or sanitizer report leaves its input in
# WORK/artifacts and makes this script exit non-zero.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

# max_len bounds mutation cost (the 0.7-2.3 MB tokenizer seeds are cut to
# their first 64 KiB); malloc_limit_mb catches allocations not bounded by the
# input size (the reader should stay within a small multiple of it).
common_args() {
    ARGS=(-max_len=65536 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64
          -print_final_stats=1 -dict="$ROOT/fuzz/gguf.dict"
          -artifact_prefix="$1/artifacts/")
}

# Run the fuzzer; fail if it failed or left any artifact.
run_fuzzer() { # BIN WORK ARGS...
    local bin=$1 work=$2
    shift 2
    local status=0
    (cd "$work" && "$bin" "$@") || status=$?
    local found
    found=$(find "$work/artifacts" -type f | wc -l)
    echo "fuzz exit status $status; $found artifact(s) in $work/artifacts; corpus $(find "$work/corpus" -type f | wc -l) inputs"
    [ "$status" -eq 0 ] && [ "$found" -eq 0 ]
}

if [ "${1:-}" = "--smoke" ]; then
    [ $# -eq 3 ] || { echo "usage: $0 --smoke FUZZ_BINARY WORK_DIR" >&2; exit 2; }
    BIN=$2
    WORK=$3
    [ -x "$BIN" ] || { echo "fuzz smoke: no fuzzer binary at $BIN" >&2; exit 1; }
    # A fresh corpus each time, so every run does the same work (fixed seed).
    rm -rf "$WORK"
    mkdir -p "$WORK/corpus" "$WORK/artifacts"
    common_args "$WORK"
    run_fuzzer "$BIN" "$WORK" "${ARGS[@]}" -seed=1 -runs="${FUZZ_RUNS:-1000000}" -max_total_time=60 \
        "$WORK/corpus" "$ROOT/tests/malformed"
    exit
fi

MINUTES=${1:-5}
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
WORK=${FUZZ_WORK:-/tmp/muser-fuzz-gguf}
JOBS=${FUZZ_JOBS:-1}
SHARED=${MUSER_SHARED:-$ROOT/../shared}

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSER_FUZZ=ON > /dev/null
cmake --build "$BUILD" --target fuzz_gguf -j "$(nproc)"
BIN="$BUILD/fuzz_gguf"

mkdir -p "$WORK/corpus" "$WORK/seeds" "$WORK/artifacts"
rm -f "$WORK"/seeds/*
cp "$ROOT"/tests/malformed/*.gguf "$WORK/seeds/"
python3 "$ROOT/scripts/make_malformed_corpus.py" --seeds "$WORK/seeds"
if compgen -G "$SHARED/testdata/tokenizer/*.gguf" > /dev/null; then
    cp "$SHARED"/testdata/tokenizer/*.gguf "$WORK/seeds/"
else
    echo "note: no real tokenizer GGUFs under $SHARED/testdata/tokenizer" >&2
fi

echo "fuzzing for $MINUTES minute(s), $JOBS job(s); work dir $WORK"
common_args "$WORK"
ARGS+=(-max_total_time=$((MINUTES * 60)))
if [ "$JOBS" -gt 1 ]; then
    ARGS+=(-jobs="$JOBS" -workers="$JOBS")
fi
run_fuzzer "$BIN" "$WORK" "${ARGS[@]}" "$WORK/corpus" "$WORK/seeds"
