#!/usr/bin/env bash
# One call on the GPU machine (docs/cuda.md, docs/benchmarks.md "CUDA"):
# unpack the build dependencies the machine lacks (DEBS=dir of .deb files),
# then run.sh (build + every exactness check), then the device read
# bandwidth and `muser bench` of the full synthetic q4_k_xl model.
#   STAGES  subset of "check bench mmvbench kbench prof nsys pdl" (default "check
#           bench"; mmvbench: test_cuda_backend --bench-mmv and --bench-res (the
#           weight-streaming kernels, the residual step); mmtwide: the full model's
#           17-32-token prompts and 32-row chunks on k_mmt or the GEMM; kbench:
#           --bench-gemm, --bench-attn and --bench-attn-dec (prefill and
#           decode attention kernels); prof:
#           a per-kernel profile of a short run and of 1 / 4 / 8 sequences, MUSER_CUDA_PROF=1; nsys:
#           Nsight Systems kernel and API summaries, where nsys is installed;
#           pdl: glimmer-tiny and full-model decode under each of PDL_ENVS,
#           space-separated settings, a setting's variables joined by commas;
#           ncu: each kernel's duration alone (Nsight Compute); ncuk: one kernel
#           (NCU_KERNEL, default k_residual) with NCU_SECTIONS, launch NCU_SKIP + 1
#           (default 41) of a run of NCU_PROMPT prompt tokens (default 4: decode;
#           2048 and NCU_KERNEL=k_gemm_wg_tma for the prefill products), NCU_ARGS
#           passed to ncu (e.g. --metrics regex:...stalled... for stall reasons); trace:
#           each kernel's time inside the replayed graphs (CUPTI); kvpack:
#           `muser bench kvpack` on the synthetic small model; spec: `muser
#           speculate` statistics under each of SPEC_ENVS, a kernel profile, the host's phase times
#           and a kernel trace of the replayed rounds; specbench: speculative
#           `muser bench --draft` over tools/train/heldout-64.txt, on the two held-out prompts and
#           Genesis (trees of 15 with the next draft enqueued early or not, chains), sampled rounds;
#           specab: trees of 15 over the 64 prompts with the round's launch savings one by one off;
#           llamadflash: llama.cpp's draft-dflash beside its plain decoding on the same pair
#           (tests/cuda/llama_dflash.sh; carry .llama-build/llama-server.xz, or run llamabuild first);
#           ab: decode figures under each of AB_ENVS; prefillab: the full model's pp512 / pp2048
#           under each of AB_ENVS (default: k_gemm_wg6's 96 and 80 rows), alternating, then
#           pp2048 in chunks of each of CHUNKS rows (e.g. "1024 2048"); llama: llama.cpp's
#           llama-bench on the same model, LLAMA_BENCH, .llama-build/bin or a carried
#           .llama-build/llama-bench.xz; llamabuild: build llama-bench and llama-server from the carried
#           .llama-src/llama-src.tar.xz, for the llama stage; tma: k_gemm_wg_tma (MUSER_CUDA_GEMM_TMA=1)
#           checked (test_cuda_backend --new, plain and under compute-sanitizer, each under a time
#           limit) and timed against k_gemm_wg (--bench-gemm, pp512 / pp2048 alternating); retrain: the DFlash
#           assistant retrained on the GPU, tools/train/retrain_dflash.sh with RETRAIN_ARGS)
#   BENCH   "quick" (short runs), "full" (default) or "none" (only the stages)
#   PREBUILT a folder of the tree (e.g. devbin) holding muser.xz, test_cuda_backend.xz,
#           test_gen.xz (and test_engine.xz) from tests/cuda/pack.sh on a machine with nvcc:
#           nothing is built here (carry it with DEBS; a cold start already costs minutes)
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export BUILD=${BUILD:-/tmp/muser-build-cuda}
if [ -n "${PREBUILT:-}" ]; then
    BUILD=/tmp/muser-prebuilt && mkdir -p $BUILD
    for f in "$SRC/$PREBUILT"/*.xz; do
        b=$(basename "$f" .xz) && xz -dc "$f" >"$BUILD/$b" && chmod +x "$BUILD/$b" || { echo "FAIL unpack $f"; exit 1; }
    done
    export PREBUILT=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# cmake configure + build of targets into $BUILD, unless the binaries came prebuilt
build() {
    [ -n "${PREBUILT:-}" ] && return 0
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMUSER_CUDA=ON >/dev/null &&
        cmake --build "$BUILD" -j "$JOBS" --target "$@" >/dev/null
}
export JOBS=${JOBS:-$(nproc)}
STAGES=${STAGES:-check bench}
BENCH=${BENCH:-full}
if [ -n "${DEBS:-}" ]; then
    mkdir -p /tmp/sys
    for f in "$DEBS"/*.deb; do dpkg -x "$f" /tmp/sys; done
    export PKG_CONFIG_PATH=/tmp/sys/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/sys/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=/tmp/sys
    export LD_LIBRARY_PATH=/tmp/sys/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # libmicrohttpd.pc names gnutls (private); the runtime library is there, its .pc may not be
    pkg-config --exists gnutls 2>/dev/null ||
        printf 'Name: gnutls\nDescription: stub\nVersion: 3.8.0\nLibs:\nCflags:\n' \
            >/tmp/sys/usr/lib/x86_64-linux-gnu/pkgconfig/gnutls.pc
fi
rc=0
case " $STAGES " in *" llamabuild "*)
    # llama.cpp's llama-bench and llama-server built here (about 5 min at -j16) from the sources
    # carried in .llama-src/llama-src.tar.xz (upstream 34af94cd9: tar of CMakeLists.txt cmake ggml src
    # include common tools vendor scripts LICENSE: tools/ui needs scripts/ui-assets.cmake); the llama stage then
    # uses this llama-bench
    if [ ! -x /tmp/llama-build/bin/llama-bench ]; then
        rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && xz -dc "$SRC/.llama-src/llama-src.tar.xz" | tar -x -C /tmp/llama-src &&
            cmake -S /tmp/llama-src -B /tmp/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_APP=OFF \
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
                >/tmp/llama-configure.log 2>&1 &&
            cmake --build /tmp/llama-build -j "$JOBS" --target llama-bench llama-server >/tmp/llama-build.log 2>&1 ||
            { tail -20 /tmp/llama-configure.log /tmp/llama-build.log; echo "FAIL llama.cpp build"; }
    fi
    [ -x /tmp/llama-build/bin/llama-bench ] && export LLAMA_BENCH=/tmp/llama-build/bin/llama-bench ;;
esac
case " $STAGES " in *" check "*)
    bash "$SRC/tests/cuda/run.sh" || rc=1
    # the same checks with the int8 tensor-core kernel off (the weight-streaming kernel for every row count)
    if [ -z "${SKIP_GEMM0:-}" ]; then
        echo "== again with MUSER_CUDA_GEMM=0"
        MUSER_CUDA_GEMM=0 bash "$SRC/tests/cuda/run.sh" >/tmp/muser-gemm-check.log 2>&1 && GEMM_OK=1
        grep -v "^PASS .* chunk" /tmp/muser-gemm-check.log
    fi
    ;;
esac
case " $STAGES " in *" retrain "*)
    # the DFlash assistant retrained against the shipped target (tools/train/retrain_dflash.sh,
    # RETRAIN_ARGS: train_dflash.py options; needs build/tok carried): the quantized assistant,
    # the acceptance and the log land in $OUT/retrain; the run's checkpoint (draft.tar.*, 25 MB)
    # stays in /tmp/retrain, since a call brings back at most 8 files from $OUT
    build muser || exit 1
    mkdir -p "${OUT:-/tmp/out}/retrain"
    MUSER="$BUILD/muser" bash "$SRC/tools/train/retrain_dflash.sh" /tmp/retrain ${RETRAIN_ARGS:-} \
        >"${OUT:-/tmp/out}/retrain/retrain.log" 2>&1 || { echo "FAIL retrain"; rc=1; }
    grep -v '^step ' "${OUT:-/tmp/out}/retrain/retrain.log" | tail -20
    cp /tmp/retrain/glimmer-tiny-dflash-q4_k_xl.gguf /tmp/retrain/accept.txt "${OUT:-/tmp/out}/retrain/" 2>/dev/null
    ;;
esac
case " $STAGES " in *" bench "*)
    # always (incremental): a warm machine keeps $BUILD from an earlier call's tree
    build muser test_cuda_backend || exit 1
    M="$BUILD/muser"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
    F=/dev/shm/full.gguf
    [ -s $F ] || "$M" synth --preset full --type q4_k_xl -o $F --no-progress >/dev/null || exit 1
    ls -l $F
    # (not `tee /dev/stderr`: with stderr redirected to a file, tee reopens and truncates it)
    "$BUILD/test_cuda_backend" --membw 16 >/tmp/muser-membw.txt
    cat /tmp/muser-membw.txt
    BW=$(awk '{print $4}' /tmp/muser-membw.txt)
    case " $STAGES " in *" mmvbench "*)
        echo "== weight-streaming kernels on the full model's shapes"
        "$BUILD/test_cuda_backend" --bench-mmv
        "$BUILD/test_cuda_backend" --bench-res || rc=1 ;;
    esac
    case " $STAGES " in *" mmtwide "*)
        # products of 17-32 rows on k_mmt (MUSER_CUDA_MMT_MAX=32, the default) or on the GEMM (16):
        # short prompts and 32-row prefill chunks of the full model
        echo "== 17-32-row products: k_mmt (MUSER_CUDA_MMT_MAX=32) against the GEMM (16)"
        for mx in 32 16; do
            for pp in 17 24 32; do
                echo "MUSER_CUDA_MMT_MAX=$mx pp$pp: $(MUSER_CUDA_MMT_MAX=$mx "$M" bench -m $F --backend cuda --no-membw \
                    -p $pp -n 0 -r 5 -q 2>&1 | tail -1)"
            done
            echo "MUSER_CUDA_MMT_MAX=$mx pp512 --chunk 32: $(MUSER_CUDA_MMT_MAX=$mx "$M" bench -m $F --backend cuda \
                --no-membw -p 512 -n 0 -r 2 --chunk 32 -q 2>&1 | tail -1)"
        done ;;
    esac
    case " $STAGES " in *" kbench "*)
        echo "== prefill kernels, old against new, on the full model's shapes"
        "$BUILD/test_cuda_backend" --bench-gemm || rc=1
        "$BUILD/test_cuda_backend" --bench-attn || rc=1
        "$BUILD/test_cuda_backend" --bench-attn-dec || rc=1 ;;
    esac
    case " $STAGES " in *" tma "*)
        echo "== k_gemm_wg_tma (MUSER_CUDA_GEMM_TMA=1): its checks, then against k_gemm_wg"
        T=$BUILD/test_cuda_backend
        MUSER_CUDA_GEMM_TMA=1 timeout 120 "$T" --new >/tmp/tma-new.log 2>&1 ||
            { echo "FAIL k_gemm_wg_tma op test (exit $?: 124 is the time limit)"; rc=1; }
        grep -E "checks,|TMA|MISMATCH" /tmp/tma-new.log | head -20
        CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        MUSER_CUDA_GEMM_TMA=1 timeout 300 "$CS" --tool memcheck "$T" --new 2>&1 | grep -E "checks,|ERROR SUMMARY" | head
        for v in 0 1; do
            echo "-- MUSER_CUDA_GEMM_TMA=$v"
            MUSER_CUDA_GEMM_TMA=$v timeout 120 "$T" --bench-gemm 5 2>&1 | grep -E "rows (  512| 2048)|benchmark:" | cut -c1-170
        done
        for round in 1 2; do
            for v in 0 1; do
                echo "TMA=$v round $round: $(MUSER_CUDA_GEMM_TMA=$v timeout 120 "$M" bench -m $F --backend cuda --no-membw \
                    -p 512 -n 0 -r 2 -q 2>&1 | tail -1) | $(MUSER_CUDA_GEMM_TMA=$v timeout 120 "$M" bench -m $F \
                    --backend cuda --no-membw -p 2048 -n 0 -r 2 -q 2>&1 | tail -1)"
            done
        done ;;
    esac
    case " $STAGES " in *" prof "*)
        for pm in $F "$SRC/models/glimmer-tiny-q4_k_xl.gguf"; do
            echo "== profile: $pm, 16 prompt tokens, 64 decoded"
            MUSER_CUDA_PROF=1 "$M" run -m $pm --backend cuda --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 64 \
                --temp 0 --ignore-eos >/dev/null
        done
        # batched decode, kernel by kernel (graphs off; the process total: the plain tg16 and each
        # sequence's 32-token prompt included): which kernel a row count pays for
        for n in 1 4 8; do
            echo "== profile: full model, $n sequences decoding 16 tokens together"
            MUSER_CUDA_PROF=1 "$M" bench -m $F --backend cuda --no-membw -p 0 -n 16 -r 1 --parallel $n -q 2>&1 |
                grep -A40 'cuda profile'
        done ;;
    esac
    case " $STAGES " in *" ncu "*)
        echo "== Nsight Compute: each kernel's duration, run alone, full model, 4 prompt tokens + 3 decoded"
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        if [ -n "$NCU" ]; then
            "$NCU" --metrics gpu__time_duration.sum --print-summary per-kernel "$M" run -m $F --backend cuda \
                --tokens 1,2,3,4 -n 3 --temp 0 >/tmp/ncu.txt 2>&1
            grep -E "^  [^ ]|gpu__time_duration|Invocations" /tmp/ncu.txt | cut -c1-150 | head -120
        else
            echo "no ncu here"
        fi ;;
    esac
    case " $STAGES " in *" ncuk "*)
        # one kernel in depth: NCU_KERNEL (a regex of its name, default k_residual), launch
        # NCU_SKIP + 1 of it in the full model's run of an NCU_PROMPT-token prompt and 3 decode
        # steps, with Nsight Compute's sections NCU_SECTIONS and any NCU_ARGS (e.g. --metrics
        # regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio for the stall reasons)
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        if [ -n "$NCU" ]; then
            echo "== Nsight Compute: ${NCU_KERNEL:-k_residual} in depth, full model"
            secs=""
            for sct in ${NCU_SECTIONS:-SpeedOfLight WarpStateStats LaunchStats Occupancy MemoryWorkloadAnalysis}; do
                secs="$secs --section $sct"
            done
            timeout 120 "$NCU" --kernel-name "regex:${NCU_KERNEL:-k_residual}" --launch-skip "${NCU_SKIP:-40}" \
                --launch-count 1 $secs ${NCU_ARGS:-} "$M" run -m $F --backend cuda --tokens "$(seq -s, 1 "${NCU_PROMPT:-4}")" -n 3 \
                --temp 0 2>&1 |
                grep -v "^==PROF==\|^ *$\|----" | cut -c1-130 | head -150
        else
            echo "no ncu here"
        fi ;;
    esac
    case " $STAGES " in *" trace "*)
        # kernel timings inside the replayed graphs (CUPTI activity records, src/backend/cuda/cuda_trace.c):
        # 64 decoded tokens after a 4-token prompt; the CSV timelines go to $OUT when the device tool gives one
        for pm in $F "$SRC/models/glimmer-tiny-q4_k_xl.gguf"; do
            echo "== trace: $pm"
            csv=${OUT:-/tmp}/trace-$(basename "$pm" .gguf).csv
            MUSER_CUDA_TRACE=1 MUSER_CUDA_TRACE_CSV=$csv "$M" run -m "$pm" --backend cuda --tokens 1,2,3,4 -n 64 \
                --temp 0 --ignore-eos 2>&1 >/dev/null | grep -A40 "cuda trace" | head -45
        done ;;
    esac
    case " $STAGES " in *" kvpack "*)
        echo "== kvpack: time to first token cold against warm, synthetic small model, this backend (auto)"
        S=/dev/shm/small.gguf
        [ -s $S ] || "$M" synth --preset small --type q4_k_xl -o $S --no-progress >/dev/null || exit 1
        "$M" bench kvpack -m $S -d 2048,16384,65536 -r 3 ;;
    esac
    case " $STAGES " in *" nsys "*)
        NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
        if [ -n "$NSYS" ]; then
            "$NSYS" profile -o /tmp/muser-prof -f true -t cuda --cuda-graph-trace=node "$M" run -m $F --backend cuda \
                --tokens 1,2,3,4 -n 64 \
                --temp 0 >/dev/null 2>&1
            "$NSYS" stats -q --report cuda_gpu_kern_sum,cuda_api_sum /tmp/muser-prof.nsys-rep 2>&1 | cut -c1-160 | head -70
        else
            echo "no nsys here"
        fi ;;
    esac
    B="$M bench -m $F --backend cuda --membw-gbs $BW --no-paired-membw"
    TINY="$M bench -m $SRC/models/glimmer-tiny-q4_k_xl.gguf --backend cuda --no-membw"
    case " $STAGES " in *" spec "*)
        echo "== speculate (glimmer-tiny pair): rounds, draft and verify seconds under each of SPEC_ENVS"
        for v in ${SPEC_ENVS:-MUSER_CUDA_GRAPH=1 MUSER_CUDA_GRAPH=0}; do
            for p in "And it came to pass, when the king" "The history of the"; do
                echo "-- ${v//,/ } / $p"
                env ${v//,/ } MUSER_CUDA_GRAPH_STATS=1 "$M" speculate -p "$p" -n 128 --json 2>&1 |
                    grep -o '"verify_steps.*\|cuda graphs.*'
            done
        done
        echo "-- muser bench, plain against speculative"
        "$M" bench -m "$SRC/models/glimmer-tiny-q4_k_xl.gguf" --backend cuda --no-membw -p 0 -n 256 -r 3 \
            --draft "$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf" 2>&1 | tail -4
        echo "-- per-kernel profile (MUSER_CUDA_PROF=1, graphs off)"
        MUSER_CUDA_PROF=1 "$M" speculate -p "And it came to pass, when the king" -n 128 --json 2>&1 |
            sed 's/"ids": \[[^]]*\], "text": "[^"]*", //' | head -70
        echo "-- the host's time in each phase of a round (MUSER_SPEC_TIMES=1) and the kernels inside the"
        echo "   replayed graphs (MUSER_CUDA_TRACE=1; CSV in \$OUT/trace-spec.csv)"
        MUSER_SPEC_TIMES=1 MUSER_CUDA_TRACE=1 MUSER_CUDA_TRACE_CSV=${OUT:-/tmp}/trace-spec.csv "$M" speculate \
            -p "And it came to pass, when the king" -n 128 --json 2>&1 >/dev/null | grep -v '^muser: backend' | head -60 ;;
    esac
    case " $STAGES " in *" specbench "*)
        # speculative rounds of the tiny pair, greedy: `muser bench --draft` (a warm-up run, then
        # SPEC_REPS runs: medians, plain greedy timed beside each run) over 64 held-out prompts, on
        # the two held-out prompts and on its own Genesis prompt; then sampled rounds
        D="$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf"
        echo "== muser bench --draft over tools/train/heldout-64.txt (64 held-out prompts, one speed over all)"
        for sh in "--verify-len 15 --spec-tree" "--verify-len 7 --spec-chain" "--verify-len 15 --spec-chain"; do
            for pd in 1 0; do
                [ "$pd" = 0 ] && [ "$sh" != "--verify-len 15 --spec-tree" ] && continue
                echo "-- $sh, MUSER_SPEC_PREDRAFT=$pd"
                MUSER_SPEC_PREDRAFT=$pd $TINY -p 0 -n 128 -r ${SPEC_REPS:-3} -q --draft "$D" $sh \
                    --spec-prompts "$SRC/tools/train/heldout-64.txt" 2>&1 | tail -3
            done
        done
        echo "== muser bench --draft: the two held-out prompts and Genesis, trees of 15 (next draft early or not) / chains of 7"
        for p in "And it came to pass, when the king" "The history of the" ""; do
            for sh in "--verify-len 15 --spec-tree" "--verify-len 7 --spec-chain"; do
                for pd in 1 0; do
                    [ "$pd" = 0 ] && [ "$sh" != "--verify-len 15 --spec-tree" ] && continue
                    echo "-- ${p:-Genesis (bench default)} / $sh / MUSER_SPEC_PREDRAFT=$pd"
                    MUSER_SPEC_PREDRAFT=$pd $TINY -p 0 -n 128 -r ${SPEC_REPS:-5} -q --draft "$D" $sh ${p:+--spec-prompt "$p"} 2>&1 | tail -2
                done
            done
        done
        echo "-- sampled rounds (--temp 0.8, trees of 15, every step speculative): drawn on the host from the rows"
        echo "   the backend verified from its registers (MUSER_SPEC_HOST_PICKS=1) or through the host's round (0); plain"
        for rep in 1 2 3; do
            for hp in 1 0; do
                echo "host picks $hp: $(MUSER_SPEC_HOST_PICKS=$hp "$M" run -m "$SRC/models/glimmer-tiny-q4_k_xl.gguf" \
                    --draft "$D" --backend cuda -p "The history of the" -n 128 \
                    --temp 0.8 --seed 5 --ignore-eos --spec-always 2>&1 >/dev/null | grep -o 'decode: [^)]*)')"
            done
            echo "plain: $("$M" run -m "$SRC/models/glimmer-tiny-q4_k_xl.gguf" --backend cuda -p "The history of the" \
                -n 128 --temp 0.8 --seed 5 --ignore-eos 2>&1 >/dev/null | grep -o 'decode: [^)]*)')"
        done ;;
    esac
    case " $STAGES " in *" specab "*)
        # the round's launch and copy savings one by one (docs/cuda.md "Speculative decoding on the GPU"):
        # trees of 15 over the 64 held-out prompts with the defaults, the fed rows' projection on
        # (off by default), the argument ring in 4 parts, each saving off, all off
        D="$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf"
        echo "== specab: muser bench --draft over tools/train/heldout-64.txt, trees of 15"
        for envs in "" "MUSER_SPEC_FED_PROJ=1" "MUSER_CUDA_RING_PARTS=4" "MUSER_CUDA_FUSED_CAPTURE=0" "MUSER_CUDA_Q8_KEEP=0" "MUSER_CUDA_QK_HEADS=0" \
            "MUSER_CUDA_FUSED_CAPTURE=0 MUSER_CUDA_Q8_KEEP=0 MUSER_CUDA_QK_HEADS=0"; do
            echo "-- ${envs:-all on}"
            env $envs $TINY -p 0 -n 128 -r ${SPEC_REPS:-3} -q --draft "$D" --verify-len 15 --spec-tree \
                --spec-prompts "$SRC/tools/train/heldout-64.txt" 2>&1 | tail -3
        done ;;
    esac
    case " $STAGES " in *" llamadflash "*)
        echo "== llama.cpp draft-dflash on the tiny pair (tests/cuda/llama_dflash.sh)"
        OUT=/tmp/llama-dflash bash "$SRC/tests/cuda/llama_dflash.sh" || rc=1 ;;
    esac
    case " $STAGES " in *" ab "*)
        echo "== decode under each of AB_ENVS (glimmer-tiny tg256, full tg64, 1/4/8 sequences, speculative pair)"
        for v in ${AB_ENVS:-MUSER_CUDA_MMT=0 MUSER_CUDA_MMT=1}; do
            echo "-- ${v//,/ }"
            env ${v//,/ } $TINY -p 0 -n 256 -r 3 -q | tail -1
            env ${v//,/ } $B -p 0 -n 64 -r 3 -q | tail -1
            env ${v//,/ } $B -p 0 -n 32 -r 2 --parallel 1,4,8 -q | tail -3
            env ${v//,/ } $B -p 512 -n 0 -r 2 --chunk 16 -q | tail -1
            env ${v//,/ } $TINY -p 0 -n 256 -r 3 --draft "$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf" | tail -2
        done ;;
    esac
    case " $STAGES " in *" prefillab "*)
        # settings side by side, alternating, two rounds (a setting: VAR=VAL[,VAR=VAL...])
        echo "== prefill under each of AB_ENVS (full model pp512 / pp2048, alternating, two rounds)"
        for round in 1 2; do
            for v in ${AB_ENVS:-MUSER_CUDA_WG6_ROWS=96 MUSER_CUDA_WG6_ROWS=80}; do
                echo "${v//,/ } round $round: $(env ${v//,/ } timeout 120 $B -p 512 -n 0 -r 2 -q 2>&1 | tail -1) |$(
                    env ${v//,/ } timeout 120 $B -p 2048 -n 0 -r 2 -q 2>&1 | tail -1)"
            done
        done
        for c in ${CHUNKS:-}; do # pp2048 in chunks of c rows (the default's settings)
            echo "pp2048 --chunk $c: $(timeout 120 $B -p 2048 -n 0 -r 2 --chunk "$c" -q 2>&1 | tail -1)"
        done ;;
    esac
    case " $STAGES " in *" llama "*)
        # the comparator in the same call: llama.cpp >= 34af94cd9 built with -DGGML_CUDA=ON
        # -DCMAKE_CUDA_ARCHITECTURES=90 (target llama-bench), here or carried (LLAMA_BENCH)
        LB=${LLAMA_BENCH:-$SRC/.llama-build/bin/llama-bench}
        # or carried compressed (.llama-build/llama-bench.xz: built on the development machine with
        # -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF, about 20 MB)
        if [ -z "${LLAMA_BENCH:-}" ] && [ -s "$SRC/.llama-build/llama-bench.xz" ]; then
            xz -dc "$SRC/.llama-build/llama-bench.xz" >/tmp/llama-bench-carried && chmod +x /tmp/llama-bench-carried &&
                LB=/tmp/llama-bench-carried
            export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        fi
        if [ -x "$LB" ]; then
            echo "== llama.cpp llama-bench on the same model"
            "$LB" -m $F -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3
            "$LB" -m $F -ngl 99 -fa 1 -p 0 -n 64 -d 16384,65536 -r 2
        else
            echo "no llama-bench at $LB"
        fi ;;
    esac
    case " $STAGES " in *" pdl "*)
        echo "== decode: graph and kernel variants (PDL_ENVS)"
        for v in ${PDL_ENVS:-MUSER_CUDA_PDL=0 MUSER_CUDA_PDL=1 MUSER_CUDA_MMV=7}; do
            echo "-- ${v//,/ }"
            env ${v//,/ } $TINY -p 0 -n 256 -r 3 -q | tail -1
            env ${v//,/ } $B -p 0 -n 128 -r 3 -q | tail -1
        done ;;
    esac
    if [ "$BENCH" = none ]; then
        :
    elif [ "$BENCH" = quick ]; then
        for g in 1 0; do
            echo "== MUSER_CUDA_GRAPH=$g"
            MUSER_CUDA_GRAPH=$g $TINY -p 128 -n 256 -r 3 -q | tail -2
            MUSER_CUDA_GRAPH=$g $B -p 512 -n 64 -r 2 --warmup 1 -q | tail -2
        done
        $B -p 0 -n 32 -r 2 --parallel 1,4,8 -q | tail -3
        echo "== footprint: the full model with 4 slots of 131,072 tokens (muser serve)"
        "$M" serve -m $F --backend cuda -np 4 -c 131072 --port 18089 >/tmp/serve.out 2>&1 &
        SP=$!
        for i in $(seq 1 60); do curl -sf localhost:18089/health >/dev/null 2>&1 && break; sleep 1; done
        curl -s localhost:18089/v1/completions -H 'Content-Type: application/json' \
            -d '{"prompt":"And it came to pass","max_tokens":4}' | head -c 300; echo
        nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
        kill $SP; wait $SP 2>/dev/null
        grep -i "cuda\|slot\|kv" /tmp/serve.out | head -5
        echo "== speculative, glimmer-tiny pair"
        $TINY -p 0 -n 256 -r 3 --draft "$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf" | tail -4
    else
        echo "== glimmer-tiny"
        $TINY -p 128 -n 256 -r 3 -q
        echo "== full model"
        $B -p 512 -n 128 -r 5 -q
        $B -p 2048 -n 0 -r 3 -q
        MUSER_CUDA_GEMM_KERNEL=0 MUSER_CUDA_ATTN=0 $B -p 2048 -n 0 -r 2 -q | tail -1 | sed 's/$/   (previous prefill kernels)/'
        $B -p 0 -n 64 -r 3 --parallel 1,4,8 -q
        $B -p 0 -n 32 -r 2 -d 16384 -q | tail -1
        echo "== speculative, glimmer-tiny pair"
        $TINY -p 0 -n 256 -r 3 --draft "$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf" | tail -2
        if [ -n "${GEMM_OK:-}" ]; then
            echo "== MUSER_CUDA_GEMM=0 (no tensor-core kernel):"
            MUSER_CUDA_GEMM=0 $B -p 512 -n 0 -r 5 -q | tail -1
        fi
    fi
    ;;
esac
exit $rc
