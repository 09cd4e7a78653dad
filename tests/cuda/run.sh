#!/usr/bin/env bash
# Build and check the CUDA backend on a machine with a GPU (docs/cuda.md):
#  1. configure + build (Release, MUSER_CUDA=ON) into $BUILD
#  2. tests/cuda/test_cuda_backend: every op against ref, bit for bit
#  3. the same under compute-sanitizer (memcheck), when it runs here
#  4. whole model: `muser run --dump-logits` of --backend cuda equals
#     --backend ref byte for byte on the synthetic tiny model of every
#     weight type, for prefill chunks 512, 7 and 1
#  5. tests/test_engine.c with MUSER_TEST_CUDA=1: 8 sequences under random
#     batch schedules on cuda against solo cpu runs, every weight type
#  (before 5: glimmer-tiny greedy and DFlash against ref and cpu, and the
#  greedy chain against one-by-one feeding, with tests/test_gen.c on cuda)
# SKIP_SANITIZER=1 skips step 3, SKIP_ENGINE=1 step 5; PREBUILT=1 skips step 1
# and takes the binaries already in $BUILD; KBENCH=1 adds the
# prefill kernel benchmarks after step 2 (test_cuda_backend --bench-gemm,
# --bench-attn, --bench-attn-dec: old against new kernels, outputs compared bit for bit; not
# when MUSER_CUDA_GEMM is set, which would change what they time).
# Prints one summary line per step; exits non-zero on any failure.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$SRC/build-cuda}
JOBS=${JOBS:-$(nproc)}
fail=0
say() { printf '%s\n' "$*"; }

if [ -n "${PREBUILT:-}" ]; then
    # binaries built on another machine (nvcc, sm_90; e.g. the development machine, to spare
    # device time), carried in $BUILD: muser, test_cuda_backend, test_gen (and test_engine)
    say "== prebuilt binaries in $BUILD"
    bins="muser test_cuda_backend test_gen"
    [ -n "${SKIP_ENGINE:-}" ] || bins="$bins test_engine"
    for b in $bins; do
        [ -x "$BUILD/$b" ] || { say "FAIL prebuilt: no executable $BUILD/$b"; exit 1; }
    done
    "$BUILD/muser" --version 2>&1 | head -1
else
    say "== configure + build ($BUILD)"
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMUSER_CUDA=ON >"$BUILD.configure.log" 2>&1 ||
        { cat "$BUILD.configure.log"; say "FAIL configure"; exit 1; }
    cmake --build "$BUILD" -j "$JOBS" --target muser test_cuda_backend test_engine test_gen >"$BUILD.build.log" 2>&1 ||
        { tail -50 "$BUILD.build.log"; say "FAIL build"; exit 1; }
fi
nvidia-smi -L 2>/dev/null | head -2

say "== op test"
if "$BUILD/test_cuda_backend"; then say "PASS op test"; else say "FAIL op test"; fail=1; fi

if [ -n "${KBENCH:-}" ] && [ -z "${MUSER_CUDA_GEMM:-}" ]; then
    say "== kernel benchmarks (old against new prefill kernels, full-model shapes)"
    "$BUILD/test_cuda_backend" --bench-gemm || { say "FAIL gemm benchmark"; fail=1; }
    "$BUILD/test_cuda_backend" --bench-attn || { say "FAIL attention benchmark"; fail=1; }
    "$BUILD/test_cuda_backend" --bench-attn-dec || { say "FAIL decode attention benchmark"; fail=1; }
fi

say "== op test under compute-sanitizer"
if [ -n "${SKIP_SANITIZER:-}" ]; then
    say "SKIP compute-sanitizer: SKIP_SANITIZER set"
elif command -v compute-sanitizer >/dev/null; then
    if compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/test_cuda_backend" >"$BUILD.sanitizer.log" 2>&1; then
        tail -3 "$BUILD.sanitizer.log"; say "PASS compute-sanitizer memcheck"
    else
        tail -30 "$BUILD.sanitizer.log"; say "FAIL (or unsupported here) compute-sanitizer memcheck"; fail=1
    fi
else
    say "SKIP compute-sanitizer: not installed"
fi

say "== whole model: cuda logits == ref logits"
M="$BUILD/muser"
T=$(mktemp -d)
TOK=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30
for type in F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K q4_k_xl nvfp4 nvfp4_ggml; do
    if ! "$M" synth --preset tiny --type "$type" --seed 7 -o "$T/m.gguf" --no-progress >/dev/null 2>"$T/err"; then
        say "FAIL synth $type: $(cat "$T/err")"; fail=1; continue
    fi
    "$M" run -m "$T/m.gguf" --backend ref --tokens $TOK -n 12 --temp 0 --dump-logits "$T/ref.bin" >/dev/null 2>"$T/err" ||
        { say "FAIL ref run $type: $(tail -2 "$T/err")"; fail=1; continue; }
    for chunk in 512 7 1; do
        if ! "$M" run -m "$T/m.gguf" --backend cuda --chunk $chunk --tokens $TOK -n 12 --temp 0 \
            --dump-logits "$T/cu.bin" >/dev/null 2>"$T/err"; then
            say "FAIL cuda run $type chunk $chunk: $(tail -3 "$T/err")"; fail=1; continue
        fi
        if cmp -s "$T/ref.bin" "$T/cu.bin"; then
            say "PASS $type chunk $chunk: $(stat -c %s "$T/cu.bin") logit bytes identical"
        else
            say "FAIL $type chunk $chunk: logits differ ($(cmp "$T/ref.bin" "$T/cu.bin" | head -1))"; fail=1
        fi
    done
done
# k_gemm_wg / k_gemm_wg6 (wgmma) forced onto every Q4_K / Q5_K / Q6_K
# product of a 300-token prefill (MUSER_CUDA_GEMM_KERNEL=4; the default
# gives them only big grids)
LTOK=$(seq -s, 1 300)
for type in Q4_K Q5_K Q6_K q4_k_xl; do
    "$M" synth --preset tiny --type "$type" --seed 7 -o "$T/m.gguf" --no-progress >/dev/null 2>&1
    "$M" run -m "$T/m.gguf" --backend ref --tokens $LTOK -n 4 --temp 0 --dump-logits "$T/ref.bin" >/dev/null 2>&1
    for chunk in 512 130; do
        if MUSER_CUDA_GEMM_KERNEL=4 "$M" run -m "$T/m.gguf" --backend cuda --chunk $chunk --tokens $LTOK -n 4 --temp 0 \
            --dump-logits "$T/cu.bin" >/dev/null 2>"$T/err" && cmp -s "$T/ref.bin" "$T/cu.bin"; then
            say "PASS $type, 300 tokens, chunk $chunk, k_gemm_wg forced: logits identical"
        else
            say "FAIL $type, 300 tokens, chunk $chunk, k_gemm_wg forced: $(tail -2 "$T/err")"; fail=1
        fi
    done
done
# decode graphs (docs/cuda.md "Graphs"): on (flat, programmatic edges, one
# argument upload; then one per op),
# off, as chained segments, flat without programmatic edges, k_mmv3
# everywhere, and a replay that fails at ops 0, 5 and 300 (its way out
# launches the ops before directly)
"$M" synth --preset tiny --type q4_k_xl --seed 7 -o "$T/m.gguf" --no-progress >/dev/null 2>&1
"$M" run -m "$T/m.gguf" --backend ref --tokens $TOK -n 40 --temp 0 --dump-logits "$T/ref.bin" >/dev/null 2>&1
for env in MUSER_CUDA_GRAPH=1 MUSER_CUDA_ONE_UPLOAD=0 MUSER_CUDA_ONE_UPLOAD=1 MUSER_CUDA_GRAPH=0 MUSER_CUDA_PDL=0 MUSER_CUDA_PDL=2 MUSER_CUDA_PDL_BIG=64 MUSER_CUDA_MMV=7 MUSER_CUDA_MMV=17 MUSER_CUDA_MMV=18 MUSER_CUDA_MMT=1 MUSER_CUDA_GRAPH_BAIL_AT=0 MUSER_CUDA_GRAPH_BAIL_AT=5 MUSER_CUDA_GRAPH_BAIL_AT=300; do
    if env $env MUSER_CUDA_GRAPH_STATS=1 "$M" run -m "$T/m.gguf" --backend cuda --tokens $TOK -n 40 --temp 0 \
        --dump-logits "$T/cu.bin" >/dev/null 2>"$T/err" && cmp -s "$T/ref.bin" "$T/cu.bin"; then
        say "PASS q4_k_xl with $env: logits identical ($(grep -o '[0-9]* captured.*' "$T/err"))"
    else
        say "FAIL q4_k_xl with $env: $(tail -2 "$T/err")"; fail=1
    fi
done
# glimmer-tiny (512-wide rows: the row kernels' CTA path) plain decoding
# against ref; then the DFlash assistant on the GPU: speculative greedy
# output and every drawn row's logits equal to plain decoding, and to the
# cpu backend's
TM="$SRC/models/glimmer-tiny-q4_k_xl.gguf" D="$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf"
P="And it came to pass, when the king"
ok=1
"$M" run -m "$TM" --backend cuda -p "$P" -n 96 --temp 0 --dump-logits "$T/plain.bin" >"$T/plain.txt" 2>"$T/err" || ok=0
"$M" run -m "$TM" --backend ref -p "$P" -n 96 --temp 0 --dump-logits "$T/plain_ref.bin" >/dev/null 2>>"$T/err" || ok=0
if [ $ok = 1 ] && cmp -s "$T/plain.bin" "$T/plain_ref.bin"; then
    say "PASS glimmer-tiny on cuda: logits of 96 greedy tokens identical to ref"
else
    say "FAIL glimmer-tiny on cuda against ref: $(tail -3 "$T/err")"; fail=1
fi
for be in cuda cpu; do
    "$M" run -m "$TM" --draft "$D" --spec-always --spec-chain --verify-len 7 --backend $be -p "$P" -n 96 --temp 0 --json \
        --dump-logits "$T/spec_$be.bin" >"$T/spec_$be.json" 2>>"$T/err" || ok=0
done
# the assistant's drafts are the same bits on every backend, so the rounds' statistics are too
stats() { grep -o '"\(drafted\|accepted\|rounds\)":[0-9]*' "$1" | tr '\n' ' '; }
if [ $ok = 1 ] && cmp -s "$T/plain.bin" "$T/spec_cuda.bin" && cmp -s "$T/spec_cpu.bin" "$T/spec_cuda.bin" &&
    [ -n "$(stats "$T/spec_cuda.json")" ] && [ "$(stats "$T/spec_cuda.json")" = "$(stats "$T/spec_cpu.json")" ]; then
    say "PASS DFlash on cuda: logits of 96 drawn tokens identical to plain cuda and to speculative cpu, the same rounds ($(stats "$T/spec_cuda.json"))"
else
    say "FAIL DFlash on cuda: $(tail -3 "$T/err")"; fail=1
fi
# greedy rounds whose rows stay on the GPU (speculate.c spec_round_picks:
# proposals in token registers, the verification's rows picked there; with
# --tree the tree built there too, tree_reg) against the same rounds
# through the host (MUSER_SPEC_PICKS=0) and plain greedy (muser
# speculate's own check), at verify lengths 3, 7 and 15, two prompts (the
# second with the fed rows projected behind the verification, MUSER_SPEC_FED_PROJ=1)
for shape in chain tree; do
    opt=--spec-chain && [ $shape = tree ] && opt=--tree
    ok=1 msg=""
    for pr in "$P" "The history of the"; do
        fp=0 && [ "$pr" != "$P" ] && fp=1
        for vl in 3 7 15; do
            for pk in 1 0; do
                MUSER_SPEC_FED_PROJ=$fp MUSER_SPEC_PICKS=$pk "$M" speculate -m "$TM" --draft "$D" --backend cuda -p "$pr" -n 96 --verify-len $vl \
                    $opt --json >"$T/picks_${vl}_$pk.json" 2>>"$T/err" || ok=0
                grep -q '"exact": true' "$T/picks_${vl}_$pk.json" || ok=0
            done
            a=$(grep -o '"ids": \[[^]]*\]' "$T/picks_${vl}_1.json") b=$(grep -o '"ids": \[[^]]*\]' "$T/picks_${vl}_0.json")
            [ -n "$a" ] && [ "$a" = "$b" ] || ok=0
            grep -q '"picked_rounds": [1-9]' "$T/picks_${vl}_1.json" || ok=0
            grep -q '"picked_rounds": 0' "$T/picks_${vl}_0.json" || ok=0
            msg="$msg VL $vl: $(grep -o '"\(verify_steps\|picked_rounds\)": [0-9]*' "$T/picks_${vl}_1.json" | tr '\n' ' ')"
        done
    done
    if [ $ok = 1 ]; then
        say "PASS speculative $shape rounds on the GPU's picks: the tokens of the host's rounds and of plain greedy ($msg)"
    else
        say "FAIL speculative $shape rounds on the GPU's picks: $(tail -3 "$T/err")$msg"; fail=1
    fi
done
# token trees (docs/speculative.md "Token trees"): the same rows drawn from
# trees of 15 and 7 proposals, sampled (seeded) too, on cuda against plain
# cuda and against the cpu backend's trees
for vl in 15 7; do
    for smp in "--temp 0" "--temp 0.8 --seed 7"; do
        ok=1
        "$M" run -m "$TM" --backend cuda -p "$P" -n 96 $smp --dump-logits "$T/tp.bin" >/dev/null 2>"$T/err" || ok=0
        for be in cuda cpu; do
            "$M" run -m "$TM" --draft "$D" --spec-always --spec-tree --verify-len $vl --backend $be -p "$P" -n 96 $smp \
                --json --dump-logits "$T/tree_$be.bin" >"$T/tree_$be.json" 2>>"$T/err" || ok=0
        done
        if [ $ok = 1 ] && cmp -s "$T/tp.bin" "$T/tree_cuda.bin" && cmp -s "$T/tree_cpu.bin" "$T/tree_cuda.bin" &&
            [ "$(stats "$T/tree_cuda.json")" = "$(stats "$T/tree_cpu.json")" ]; then
            say "PASS token trees on cuda (VL $vl, $smp): logits of 96 drawn tokens identical to plain cuda and to cpu trees, the same rounds ($(stats "$T/tree_cuda.json"))"
        else
            say "FAIL token trees on cuda (VL $vl, $smp): $(tail -3 "$T/err")"; fail=1
        fi
    done
done
# the greedy chain (tokens picked on the GPU, the host forwards ahead;
# docs/cuda.md "The greedy chain"): 600 tokens across three 256-key blocks
# (new graphs on the way) equal to feeding them one by one, also with every
# 5th row handed back undecided, and with every replay left at op 40 (the
# graph's way out from the second argument part); the same two with the
# argument ring in four parts (MUSER_CUDA_RING_PARTS=4: three forwards
# ahead, left from parts 1-3); then tests/test_gen.c, whose chain cases
# run on cuda here (backend auto)
ok=1
MUSER_CUDA_GRAPH_STATS=1 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 --ignore-eos >"$T/chain.txt" \
    2>"$T/err0" || ok=0
cat "$T/err0" >"$T/err"
ahead=$(grep -o '[0-9]* forwards began' "$T/err0" | cut -d' ' -f1)
[ "${ahead:-0}" -ge 500 ] || ok=0 # the chain ran (forwards ahead of the host)
MUSER_CHAIN=0 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 --ignore-eos >"$T/plain600.txt" 2>>"$T/err" || ok=0
MUSER_CHAIN_UNDECIDED=5 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 --ignore-eos >"$T/chain5.txt" \
    2>>"$T/err" || ok=0
MUSER_CUDA_GRAPH_BAIL_AT=40 MUSER_CUDA_GRAPH_STATS=1 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 \
    --ignore-eos >"$T/chainb.txt" 2>>"$T/err" || ok=0
MUSER_CUDA_RING_PARTS=4 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 --ignore-eos >"$T/chain4.txt" \
    2>>"$T/err" || ok=0
MUSER_CUDA_RING_PARTS=4 MUSER_CUDA_GRAPH_BAIL_AT=40 "$M" run -m "$TM" --backend cuda -p "$P" -n 600 --temp 0 \
    --ignore-eos >"$T/chain4b.txt" 2>>"$T/err" || ok=0
if [ $ok = 1 ] && cmp -s "$T/chain.txt" "$T/plain600.txt" && cmp -s "$T/chain.txt" "$T/chain5.txt" &&
    cmp -s "$T/chain.txt" "$T/chainb.txt" && cmp -s "$T/chain.txt" "$T/chain4.txt" &&
    cmp -s "$T/chain.txt" "$T/chain4b.txt" &&
    MUSER_SOURCE_DIR="$SRC" "$BUILD/test_gen" >"$T/gen.log" 2>&1; then
    say "PASS greedy chain on cuda ($ahead forwards began before the one before ended): 600 tokens identical to one-by-one feeding (also with every 5th row undecided, with replays left at op 40, and both again on 4 ring parts: $(grep -o '[0-9]* forwards began.*' "$T/err" | tail -1)); test_gen"
else
    say "FAIL greedy chain on cuda: $(tail -3 "$T/err") $(tail -5 "$T/gen.log" 2>/dev/null)"; fail=1
fi
rm -rf "$T"

if [ -z "${SKIP_ENGINE:-}" ]; then
    say "== engine: batched sequences on cuda == solo cpu runs (tests/test_engine.c)"
    if MUSER_TEST_CUDA=1 MUSER_SOURCE_DIR="$SRC" MUSER_BIN="$M" "$BUILD/test_engine" >"$BUILD.engine.log" 2>&1; then
        tail -2 "$BUILD.engine.log"; say "PASS engine batch test on cuda"
    else
        tail -20 "$BUILD.engine.log"; say "FAIL engine batch test on cuda"; fail=1
    fi
fi
if [ $fail = 0 ]; then say "ALL CUDA CHECKS PASSED"; else say "SOME CUDA CHECKS FAILED"; fi
exit $fail
