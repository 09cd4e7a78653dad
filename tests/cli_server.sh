#!/bin/bash
# End-to-end tests of `muser serve` (tests/server/*.test.mjs, node:test with
# the official openai client and playwright-core driving Debian's chromium):
# starts the server on a free loopback port with the shipped default model
# and --parallel 4, waits for /health, runs every test file in turn against
# it (files that need other flags start their own servers), then checks the
# server exits 0 on SIGTERM. Installs tests/server/node_modules from
# package-lock.json when missing. Runs with MUSER_BIN from CTest (the
# Release and the ASan builds alike).
#   MUSER_SERVER_TESTS="openai batch"  runs only those test files
set -u
source "$(dirname "$0")/lib_cli.sh" server
D="$MUSER_SOURCE_DIR/tests/server"

for tool in node npm; do
    command -v $tool >/dev/null || { echo "FAILED: $tool missing (scripts/deps.sh installs nodejs and npm)" >&2; exit 1; }
done
if [ ! -d "$D/node_modules/openai" ] || [ ! -d "$D/node_modules/playwright-core" ] \
   || [ "$D/package-lock.json" -nt "$D/node_modules/.package-lock.json" ]; then
    # several ctest runs (Release, ASan) may get here at once: one installs
    exec 9>"$D/.npm-install.lock"
    flock 9
    if [ ! -d "$D/node_modules/openai" ] || [ ! -d "$D/node_modules/playwright-core" ] \
       || [ "$D/package-lock.json" -nt "$D/node_modules/.package-lock.json" ]; then
        (cd "$D" && npm ci --no-audit --no-fund --loglevel=error) || { echo "FAILED: npm ci in $D" >&2; exit 1; }
    fi
    flock -u 9
fi

PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
LOG="$T/server.log"
mkdir -p "$T/slots"
"$M" serve --host 127.0.0.1 --port "$PORT" --parallel 4 --slot-save-path "$T/slots" >"$LOG" 2>&1 &
SRV=$!
URL="http://127.0.0.1:$PORT"
up=0
for _ in $(seq 1 600); do
    if ! kill -0 $SRV 2>/dev/null; then break; fi
    if node -e 'fetch(process.argv[1]+"/health").then(r=>process.exit(r.status===200?0:1),()=>process.exit(1))' "$URL"; then up=1; break; fi
    sleep 0.1
done
if [ $up -ne 1 ]; then
    echo "FAILED: muser serve not healthy on $URL" >&2
    cat "$LOG" >&2
    kill -9 $SRV 2>/dev/null
    exit 1
fi

export MUSER_URL="$URL" MUSER_TEST_TMP="$T"
files="${MUSER_SERVER_TESTS:-openai llama batch malformed lifecycle page}"
for f in $files; do
    echo "== tests/server/$f.test.mjs"
    if ! (cd "$D" && node --test --test-reporter=spec "$f.test.mjs"); then
        echo "FAILED: tests/server/$f.test.mjs" >&2
        fail=1
    fi
    if ! kill -0 $SRV 2>/dev/null; then
        echo "FAILED: the server died during $f.test.mjs" >&2
        fail=1
        break
    fi
done

if kill -0 $SRV 2>/dev/null; then
    kill -TERM $SRV
    for _ in $(seq 1 300); do kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
    if kill -0 $SRV 2>/dev/null; then
        echo "FAILED: muser serve still running 30 s after SIGTERM" >&2
        kill -9 $SRV
        fail=1
    fi
fi
wait $SRV
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAILED: muser serve exited $rc after SIGTERM" >&2
    fail=1
fi
if [ $fail -ne 0 ]; then
    echo "---- server log (last 100 lines)" >&2
    tail -n 100 "$LOG" >&2
    for l in "$T"/server-*.log; do
        [ -f "$l" ] && { echo "---- $(basename "$l") (last 40 lines)" >&2; tail -n 40 "$l" >&2; }
    done
fi
exit $fail
