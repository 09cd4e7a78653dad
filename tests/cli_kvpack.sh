#!/bin/bash
# muser kvpack and muser run --prompt-cache end to end (docs/kvpack.md):
# a stored pack restores and continues exactly as a run that never stopped
# (greedy, same tokens); the prompt cache reuses the whole prompt on the
# second run and prints how much; verify and ls refuse a damaged pack, a
# foreign model and a key file of the wrong mode, naming what failed; gc
# evicts down to the quota.
set -u
source "$(dirname "$0")/lib_cli.sh" kvpack

check "$M" synth --preset tiny --type q4_k_xl --seed 42 -o "$T/tiny.gguf" --no-progress
check "$M" synth --preset tiny --type q4_k_xl --seed 43 -o "$T/other.gguf" --no-progress
TOK=$(seq -s, 1 300)   # past the tiny model's 64-row window
S="$T/store"

check "$M" kvpack save -m "$T/tiny.gguf" --store "$S" --tokens "$TOK" >"$T/save.txt"
ID=$(cut -c1-64 "$T/save.txt")
check grep -q " 300 tokens" "$T/save.txt"
check test "$(stat -c %a "$S/kvpack.key")" = 600
# restore and continue greedily = one uninterrupted greedy run
check "$M" kvpack restore -m "$T/tiny.gguf" --store "$S" "$ID" -n 20 >"$T/restored.txt" 2>/dev/null
check "$M" run -m "$T/tiny.gguf" --tokens "$TOK" -n 20 --temp 0 >"$T/run.txt" 2>/dev/null
check cmp "$T/restored.txt" "$T/run.txt"
check test "$(stat -c %s "$T/run.txt")" -gt 5

# prompt cache: cold, then an exact hit that prefills nothing
check "$M" run -m "$T/tiny.gguf" --tokens "$TOK" -n 8 --temp 0 --prompt-cache "$T/pc" --json >"$T/c1.json" 2>"$T/c1.err"
check "$M" run -m "$T/tiny.gguf" --tokens "$TOK" -n 8 --temp 0 --prompt-cache "$T/pc" --json >"$T/c2.json" 2>"$T/c2.err"
check "$PY" -c "
import json
a, b = json.load(open('$T/c1.json')), json.load(open('$T/c2.json'))
assert a['tokens'] == b['tokens'], (a, b)
assert a['timings']['reused_tokens'] == 0 and b['timings']['reused_tokens'] == 300, (a['timings'], b['timings'])
assert b['timings']['prefill_tokens'] == 0"
check "$M" run -m "$T/tiny.gguf" --tokens "$TOK" -n 4 --temp 0 --prompt-cache "$T/pc" >/dev/null 2>"$T/c3.err"
check grep -q "prompt cache: reused 300 of 300 prompt tokens" "$T/c3.err"
expect_fail "does not combine" "$M" run -m "$T/tiny.gguf" --tokens 1,2 --prompt-cache "$T/pc" --draft "$T/tiny.gguf"

check "$M" kvpack ls --store "$S" -m "$T/tiny.gguf" >"$T/ls.txt"
check grep -q "$ID  *300 tokens" "$T/ls.txt"
check "$M" kvpack verify -m "$T/tiny.gguf" "$S/$ID.kvpack" >/dev/null
expect_fail "identity mismatch: model_sha256" "$M" kvpack verify -m "$T/other.gguf" "$S/$ID.kvpack"
cp "$S/$ID.kvpack" "$S/bad.kvpack"
printf '\x55' | dd of="$S/bad.kvpack" bs=1 seek=5000 conv=notrunc status=none
expect_fail "SHA-256 mismatch" "$M" kvpack verify "$S/bad.kvpack"
head -c 1000 "$S/$ID.kvpack" >"$S/short.kvpack"
expect_fail "truncated" "$M" kvpack verify "$S/short.kvpack"
rm -f "$S/bad.kvpack" "$S/short.kvpack"
chmod 644 "$S/kvpack.key"
expect_fail "mode 0644" "$M" kvpack verify "$S/$ID.kvpack"
chmod 600 "$S/kvpack.key"
expect_fail "--store DIR" "$M" kvpack gc --max-size 1

check "$M" kvpack save -m "$T/tiny.gguf" --store "$S" --tokens 5,6,7 >/dev/null
check "$M" kvpack gc --store "$S" --max-size 0 >"$T/gc.txt"
check grep -q "removed 2" "$T/gc.txt"
exit $fail
