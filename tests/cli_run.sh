#!/bin/bash
# End-to-end CLI checks: synth, info, determinism of run, prefill chunking
# equivalence through --dump-logits, and clear failures with non-zero exits.
set -u
M="$MUSER_BIN"
T=$(mktemp -d /tmp/muser-cli-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! "$@"; then echo "FAILED: $*" >&2; fail=1; fi; }
expect_fail() { # expect_fail SUBSTRING cmd...
    local want="$1"; shift
    local out
    if out=$("$@" 2>&1); then echo "FAILED (exit 0): $*" >&2; fail=1; return; fi
    if ! grep -qF -- "$want" <<<"$out"; then echo "FAILED (message '$out' lacks '$want'): $*" >&2; fail=1; fi
}

check "$M" synth --preset tiny --type q4_k_xl --seed 42 -o "$T/tiny.gguf" --no-progress
check "$M" info -m "$T/tiny.gguf" --no-tensors >"$T/info.txt"
check grep -q "validation:  ok" "$T/info.txt"
check grep -q "lane:        q4_k_xl" "$T/info.txt"
check "$M" info -m "$T/tiny.gguf" --json >"$T/info.json"
check python3 -c "import json,sys; d=json.load(open('$T/info.json')); assert d['valid'] and d['geometry']['n_layer']==4 and len(d['sha256']['file'])==64"
sha=$(sha256sum "$T/tiny.gguf" | cut -d' ' -f1)
check grep -q "$sha" "$T/info.json"

TOK=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 64 >"$T/a.txt" 2>/dev/null
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 64 >"$T/b.txt" 2>/dev/null
check cmp "$T/a.txt" "$T/b.txt"
check test "$(wc -w <"$T/a.txt")" -eq 64
# prefill chunking must not change a single bit of the logits
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 8 --chunk 1 --dump-logits "$T/c1.bin" >/dev/null 2>&1
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 8 --chunk 7 --dump-logits "$T/c7.bin" >/dev/null 2>&1
check cmp "$T/c1.bin" "$T/c7.bin"
check test "$(stat -c %s "$T/c1.bin")" -eq $((8 * 512 * 4))

expect_fail "-m MODEL is required" "$M" run --tokens 1,2
expect_fail "outside the vocabulary" "$M" run -m "$T/tiny.gguf" --tokens 1,99999 -n 1
expect_fail "unknown option" "$M" run -m "$T/tiny.gguf" --bogus
expect_fail "No such file" "$M" run -m "$T/missing.gguf" --tokens 1
expect_fail "unknown command" "$M" frobnicate
expect_fail "expects an integer" "$M" run -m "$T/tiny.gguf" --tokens 1 -n abc
head -c 1000 "$T/tiny.gguf" >"$T/trunc.gguf"
expect_fail "trunc.gguf" "$M" run -m "$T/trunc.gguf" --tokens 1
check "$M" run --help >/dev/null
check "$M" synth --help >/dev/null
check "$M" quantize --help >/dev/null
check "$M" info --help >/dev/null
check "$M" quantize "$T/tiny.gguf" "$T/q8.gguf" Q8_0 --no-progress
check "$M" run -m "$T/q8.gguf" --tokens $TOK -n 4 >/dev/null 2>&1
exit $fail
