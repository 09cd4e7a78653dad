#!/bin/bash
# `muser bench serve` runs end to end on the shipped model without
# llama-server: it starts `muser serve` itself on loopback, puts two short
# levels of streaming load on it and writes JSON with every figure; bad
# options are refused before anything starts. A few seconds.
set -u
source "$(dirname "$0")/lib_cli.sh" bench-serve

expect_fail "not a loopback address" "$M" bench serve --host 8.8.8.8 --requests 1
expect_fail "--duration or --requests" "$M" bench serve --duration 2 --requests 2
expect_fail "raise -c" "$M" bench serve --max-tokens 2000 -c 1024
expect_fail "not an executable" "$M" bench serve --llama-server /nonexistent/llama-server
expect_fail "unknown option" "$M" bench serve --bogus

check "$M" bench serve --concurrency 1,2 --requests 4 --max-tokens 8 -r 2 -c 256 -t 2 --sampling-threads 2 --json "$T/b.json" >"$T/out" 2>"$T/err"
cat "$T/out"
check grep -q "^muser  *2 " "$T/out"
check grep -q "^muser engine, 2 streams (its /metrics, medians): .* ms a step" "$T/out"
check $PY - "$T/b.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["muser_bench_serve"] == 1 and d["max_tokens"] == 8 and d["requests"] == 4 and d["llama_server"] is None, d
assert d["sampling_threads"] == 2, d
rs = d["results"]
assert [(r["server"], r["concurrency"]) for r in rs] == [("muser", 1), ("muser", 2)], rs
for r in rs:
    assert r["errors"] == 0 and r["requests_ok"] == 8, r  # 4 requests x 2 reps
    m = r["metrics"]
    for k in ("requests_per_s", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        s = m[k]
        # gaps can be 0: two chunks read in one recv() on a busy machine
        assert len(s["samples"]) == 2 and s["cv"] >= 0 and s["min"] <= s["median"] <= s["max"], (k, s)
        assert s["median"] > 0 if not k.startswith("itl") else s["median"] >= 0, (k, s)
    # 8 tokens a request: the aggregate rate is 8 times the request rate
    for rq, tk in zip(m["requests_per_s"]["samples"], m["tokens_per_s"]["samples"]):
        assert abs(tk - 8 * rq) < 1e-3 * tk, (rq, tk)
    for a, b in zip(m["ttft_p50_ms"]["samples"], m["ttft_p99_ms"]["samples"]): assert a <= b + 1e-9, (a, b)
    for a, b in zip(m["itl_p50_ms"]["samples"], m["itl_p99_ms"]["samples"]): assert a <= b + 1e-9, (a, b)
    # the server's own counters over each repetition: 8 tokens per request, one or more a step
    for k in ("engine_step_ms", "engine_take_ms", "engine_tokens_per_step"):
        assert len(m[k]["samples"]) == 2 and m[k]["min"] > 0, (k, m[k])
    assert all(1 <= t <= r["concurrency"] for t in m["engine_tokens_per_step"]["samples"]), m
EOF
exit $fail
