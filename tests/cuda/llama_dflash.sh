#!/usr/bin/env bash
# llama.cpp's DFlash speculative decoding (--spec-type draft-dflash) beside
# its plain decoding, on our shipped pair: target models/glimmer-tiny-q4_k_xl.gguf,
# assistant models/glimmer-tiny-dflash-q4_k_xl.gguf. The comparator for
# `muser speculate` on the GPU machine (no network there: only curl, python3).
#
#   LLAMA_SERVER  llama-server built with -DGGML_CUDA=ON from upstream 34af94cd9
#                 or later (default /tmp/llama-build/bin/llama-server; if that is
#                 missing, a carried .llama-build/llama-server.xz is unpacked)
#   OUT           where the server logs and raw responses go (default /tmp/out)
#   PORT          first port to listen on (default 18473; one per configuration)
#   N_PREDICT     tokens per request (default 128)
#
# One server per configuration (plain, then draft-dflash with at most 7 and 15
# draft tokens; the assistant's block is 16, so 15 is llama.cpp's ceiling),
# because the draft model and the draft length are fixed when the server starts.
# Per configuration and prompt: one warm-up request, then 3 timed ones; greedy
# (temperature 0, top_k 1), ignore_eos so every request makes N_PREDICT tokens,
# cache_prompt false so each request pays its own prefill (which is outside the
# decode timing anyway). Prints one line per (config, prompt):
#   median predicted tokens/s (the server's timings.predicted_per_second, which
#   counts decode steps after the first token over the decode time, drafting
#   included), predicted_n, draft tokens drafted/accepted (timings.draft_n,
#   timings.draft_n_accepted, absent when nothing was drafted), whether the text
#   equals plain decoding's (greedy: it should), and the text's first 60 chars;
# then per prompt the ratio draft/plain of the median tokens/s.
# A failing step prints "FAIL ..." and the script goes on with the next one;
# the exit status is 1 when anything failed.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=$SRC/models/glimmer-tiny-q4_k_xl.gguf
DRAFT=$SRC/models/glimmer-tiny-dflash-q4_k_xl.gguf
OUT=${OUT:-/tmp/out}
PORT=${PORT:-18473}
N_PREDICT=${N_PREDICT:-128}
N_RUNS=3
PROMPTS=("And it came to pass, when the king" "The history of the")
fail=0
say() { printf '%s\n' "$*"; }

mkdir -p "$OUT" || { say "FAIL cannot create OUT=$OUT"; exit 1; }
RES=$OUT/llama_dflash.tsv   # config, prompt index, median tok/s (for the ratios)
: >"$RES"
rm -f "$OUT"/plain_p*.txt   # plain decoding's texts of an earlier run must not be compared against

LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama-build/bin/llama-server}
if [ ! -x "$LLAMA_SERVER" ] && [ -s "$SRC/.llama-build/llama-server.xz" ]; then
    # built on the development machine (stripped, xz -9) so the GPU machine need not build it
    say "unpacking $SRC/.llama-build/llama-server.xz (no binary at $LLAMA_SERVER)"
    xz -dc "$SRC/.llama-build/llama-server.xz" >/tmp/llama-server-carried && chmod +x /tmp/llama-server-carried &&
        LLAMA_SERVER=/tmp/llama-server-carried
fi
[ -x "$LLAMA_SERVER" ] || { say "FAIL no llama-server at $LLAMA_SERVER"; exit 1; }
for f in "$TARGET" "$DRAFT"; do [ -s "$f" ] || { say "FAIL missing model $f"; exit 1; }; done
command -v curl >/dev/null || { say "FAIL curl not found"; exit 1; }
command -v python3 >/dev/null || { say "FAIL python3 not found"; exit 1; }

# the binary links libcudart.so.13 and libcublas.so.13 dynamically: make the
# toolkit's copies findable where the loader does not already know them
# (never the stubs directory, whose libcuda.so is not a working driver)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
export LD_LIBRARY_PATH
if ldd "$LLAMA_SERVER" 2>/dev/null | grep -q "not found"; then
    say "WARN unresolved shared libraries:"; ldd "$LLAMA_SERVER" | grep "not found"
fi
say "llama-server: $LLAMA_SERVER"
timeout 30 "$LLAMA_SERVER" --version 2>&1 | grep -iE "version|built" | head -2
nvidia-smi -L 2>/dev/null | head -1

SPID=""
stop_server() {
    if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
        kill "$SPID" 2>/dev/null
        # give it 10 s to release the GPU, then force it
        for _ in $(seq 1 20); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$SPID" 2>/dev/null
        wait "$SPID" 2>/dev/null
    fi
    SPID=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

# start_server NAME PORT EXTRA_ARGS...: returns 0 once /health answers 200
start_server() {
    local name=$1 port=$2; shift 2
    local log=$OUT/llama-server-$name.log
    # -np 1: one slot (the server's default is 4 slots sharing a unified cache);
    # -c 1024: both models' trained context; -ngl/-ngld 99: everything on the GPU
    "$LLAMA_SERVER" -m "$TARGET" -ngl 99 -fa on -c 1024 -np 1 \
        --host 127.0.0.1 --port "$port" "$@" >"$log" 2>&1 &
    SPID=$!
    # loading takes seconds on this model: give it up to 90 s
    local code deadline=$((SECONDS + 90))
    while [ $SECONDS -lt $deadline ]; do
        if ! kill -0 "$SPID" 2>/dev/null; then
            say "FAIL $name: llama-server exited during start-up; last lines of $log:"
            tail -15 "$log" | sed 's/^/    /'
            SPID=""
            return 1
        fi
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")
        [ "$code" = 200 ] && return 0
        sleep 0.5
    done
    say "FAIL $name: /health not ready after 90 s; last lines of $log:"
    tail -15 "$log" | sed 's/^/    /'
    stop_server
    return 1
}

# the JSON of one request; the prompt is passed through the environment
# so no shell quoting can mangle it
request_body() {
    P="$1" NP="$N_PREDICT" python3 -c '
import json, os
print(json.dumps({"prompt": os.environ["P"], "n_predict": int(os.environ["NP"]),
                  "temperature": 0.0, "top_k": 1, "seed": 0,
                  "ignore_eos": True, "cache_prompt": False, "stream": False}))'
}

# summarize NAME PROMPT_INDEX FILES...: prints the line, records the median
summarize() {
    local name=$1 pi=$2; shift 2
    python3 - "$name" "$pi" "$OUT" "$RES" "$@" <<'EOF'
import json, os, statistics, sys
name, pi, out, res, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
runs = []
for f in files:
    try:
        with open(f) as fh:
            j = json.load(fh)
        t = j["timings"]
        runs.append((float(t["predicted_per_second"]), int(t.get("predicted_n", 0)),
                     t.get("draft_n"), t.get("draft_n_accepted"), j.get("content", "")))
    except Exception as e:
        print(f"FAIL {name} p{pi}: bad response {f}: {e!r}")
        sys.exit(1)
tps = statistics.median(r[0] for r in runs)
mid = sorted(runs, key=lambda r: r[0])[len(runs) // 2]   # the median run's counts
text = mid[4]
# greedy text of plain decoding, saved by its own summary, to compare against
ref_path = os.path.join(out, f"plain_p{pi}.txt")
if name == "plain":
    with open(ref_path, "w") as fh:
        fh.write(text)
    same = "-"
elif os.path.exists(ref_path):
    same = "yes" if open(ref_path).read() == text else "NO"
else:
    same = "?"
if name != "plain" and mid[2] is None:
    drafted = "none (no draft_n in timings: speculation not active?)"
else:
    drafted = "-" if mid[2] is None else f"{mid[2]}/{mid[3]}"
if name != "plain" and mid[2]:
    drafted += f" ({100.0 * mid[3] / mid[2]:.0f}% accepted)"
allt = " ".join(f"{r[0]:.1f}" for r in runs)
print(f"{name:<9} p{pi}  {tps:9.1f} tok/s (runs {allt})  n={mid[1]}  drafted/accepted={drafted}"
      f"  same-as-plain={same}  text={text[:60]!r}")
with open(res, "a") as fh:
    fh.write(f"{name}\t{pi}\t{tps}\n")
EOF
}

run_config() {
    local name=$1 port=$2; shift 2
    say "== $name (${*:-no draft})"
    start_server "$name" "$port" "$@" || { fail=1; return; }
    if [ "$name" != plain ] && ! grep -q "draft-dflash" "$OUT/llama-server-$name.log"; then
        say "WARN $name: the server log never mentions draft-dflash"
    fi
    local pi=0 p k body f files ok
    for p in "${PROMPTS[@]}"; do
        body=$(request_body "$p")
        files=(); ok=1
        for k in warm $(seq 1 $N_RUNS); do
            f=$OUT/$name-p$pi-$k.json
            if ! curl -sS --fail-with-body --max-time 60 -H 'Content-Type: application/json' \
                    -d "$body" -o "$f" "http://127.0.0.1:$port/completion"; then
                say "FAIL $name p$pi request $k: $(head -c 300 "$f" 2>/dev/null)"
                ok=0; break
            fi
            [ "$k" = warm ] || files+=("$f")
        done
        if [ $ok = 1 ]; then summarize "$name" "$pi" "${files[@]}" || fail=1; else fail=1; fi
        pi=$((pi + 1))
    done
    stop_server
}

for i in "${!PROMPTS[@]}"; do say "prompt p$i: ${PROMPTS[$i]}"; done
# flags: common/arg.cpp of llama.cpp 34af94cd9 (-md, --spec-type, --spec-draft-n-max/-n-min, -ngld)
run_config plain   "$PORT"
run_config dflash7  $((PORT + 1)) -md "$DRAFT" -ngld 99 --spec-type draft-dflash --spec-draft-n-max 7  --spec-draft-n-min 0
run_config dflash15 $((PORT + 2)) -md "$DRAFT" -ngld 99 --spec-type draft-dflash --spec-draft-n-max 15 --spec-draft-n-min 0

say "== ratio draft/plain (median tokens/s)"
python3 - "$RES" "${#PROMPTS[@]}" <<'EOF' || fail=1
import sys
res, n = sys.argv[1], int(sys.argv[2])
m = {}
for line in open(res):
    name, pi, tps = line.split("\t")
    m[(name, int(pi))] = float(tps)
for pi in range(n):
    plain = m.get(("plain", pi))
    for name in ("dflash7", "dflash15"):
        d = m.get((name, pi))
        if plain and d:
            print(f"p{pi}  {name}/plain = {d / plain:.3f}  ({d:.1f} / {plain:.1f} tok/s)")
        else:
            print(f"p{pi}  {name}/plain = n/a (missing result)")
EOF
[ $fail = 0 ] && say "llama_dflash: done" || say "llama_dflash: done, with failures (see above)"
exit $fail
