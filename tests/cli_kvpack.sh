#!/bin/bash
# muser kvpack and muser run --prompt-cache end to end (docs/kvpack.md):
# a stored pack restores and continues exactly as a run that never stopped
# (greedy, same tokens); the prompt cache reuses the whole prompt on the
# second run and prints how much; verify and ls refuse a damaged pack, a
# foreign model and a key file of the wrong mode, naming what failed; gc
# evicts down to the quota. With --compress zstd the packs are zstd frames
# and continue the same way. A --draft run restored from the prompt cache
# (the assistant's context in the packs) is the uncached --draft run: same
# tokens, logits and speculative counts.
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

# zstd chunks: the same continuation, the pack says it is compressed
check "$M" kvpack save -m "$T/tiny.gguf" --store "$T/zs" --tokens "$TOK" --compress zstd:5 >"$T/zsave.txt"
ZID=$(cut -c1-64 "$T/zsave.txt")
check "$M" kvpack restore -m "$T/tiny.gguf" --store "$T/zs" "$ZID" -n 20 >"$T/zrestored.txt" 2>/dev/null
check cmp "$T/zrestored.txt" "$T/run.txt"
check "$M" kvpack ls --store "$T/zs" -m "$T/tiny.gguf" >"$T/zls.txt"
check grep -q "$ZID .* zstd: kv [0-9]* of [0-9]* bytes" "$T/zls.txt"
expect_fail "--compress expects none, zstd or zstd:LEVEL" "$M" kvpack save -m "$T/tiny.gguf" --store "$T/zs" --tokens 1 --compress zstd:20
expect_fail "--compress expects" "$M" run -m "$T/tiny.gguf" --tokens 1 --prompt-cache "$T/zs" --compress lz4

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
# a quota on the prompt cache: each run evicts least recently used packs, keeping its own
check "$M" run -m "$T/tiny.gguf" --tokens "$TOK,7" -n 1 --temp 0 --prompt-cache "$T/pc" --prompt-cache-max-size 1 >/dev/null 2>&1
check test "$(ls "$T/pc"/*.kvpack | wc -l)" -eq 1

# the DFlash assistant's context in packs: a --draft run (every step
# speculative, no timing gate) restored from the prompt cache - an exact hit,
# and a 512-token block restored with the rest fed through the assistant -
# draws the same tokens, from byte-identical logits, with the same rounds,
# proposals and acceptances as an uncached --draft run.
G="$MUSER_SOURCE_DIR/models/glimmer-tiny-q4_k_xl.gguf"
D="$MUSER_SOURCE_DIR/models/glimmer-tiny-dflash-q4_k_xl.gguf"
"$PY" -c "
base = 'In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. '
open('$T/p1.txt', 'w').write(base * 23 + 'And God said, Let there be light')
open('$T/p2.txt', 'w').write(base * 23 + 'And the evening and the morning were')"
SPEC=(-m "$G" --draft "$D" -n 40 --temp 0 --spec-always --json -t 2)
check "$M" run "${SPEC[@]}" -f "$T/p1.txt" --dump-logits "$T/d1.bin" >"$T/d1.json" 2>/dev/null
check "$M" run "${SPEC[@]}" -f "$T/p2.txt" --dump-logits "$T/d2.bin" >"$T/d2.json" 2>/dev/null
for i in a b; do
    check "$M" run "${SPEC[@]}" -f "$T/p1.txt" --prompt-cache "$T/pd" --dump-logits "$T/d1$i.bin" >"$T/d1$i.json" 2>/dev/null
    check cmp "$T/d1.bin" "$T/d1$i.bin"
done
check "$M" run "${SPEC[@]}" -f "$T/p2.txt" --prompt-cache "$T/pd" --dump-logits "$T/d2a.bin" >"$T/d2a.json" 2>/dev/null
check cmp "$T/d2.bin" "$T/d2a.bin"
check "$PY" -c "
import json
def get(n): return json.load(open('$T/' + n + '.json'))
def same(x, y):
    a, b = get(x), get(y)
    assert a['tokens'] == b['tokens'], (x, y)
    for k in ('rounds', 'round_tokens', 'drafted', 'accepted', 'plain_steps'):
        assert a['speculative'][k] == b['speculative'][k], (x, y, k, a['speculative'], b['speculative'])
    assert a['speculative']['accepted'] > 0 and a['speculative']['rounds'] > 2, a['speculative']
    return b['timings']
n1, n2 = len(get('d1')['prompt_tokens']), len(get('d2')['prompt_tokens'])
assert 640 < n1 < 768 and 640 < n2 < 768, (n1, n2)  # past the assistant's 640-row buffer: projected rows too
t = same('d1', 'd1a'); assert t['reused_tokens'] == 0, t
t = same('d1', 'd1b'); assert t['reused_tokens'] == n1 and t['prefill_tokens'] == 0, t
t = same('d2', 'd2a'); assert t['reused_tokens'] == 512 and t['prefill_tokens'] == n2 - 512, t"
# packs with and without an assistant have different names: a plain run finds none of them
check "$M" run -m "$G" --no-draft -f "$T/p1.txt" -n 40 --temp 0 --json --prompt-cache "$T/pd" >"$T/plain.json" 2>/dev/null
check "$PY" -c "
import json
a, b = json.load(open('$T/d1.json')), json.load(open('$T/plain.json'))
assert a['tokens'] == b['tokens'] and b['timings']['reused_tokens'] == 0, b['timings']"
check "$M" kvpack ls --store "$T/pd" -m "$G" >"$T/pdls.txt"
check grep -q "DFlash context" "$T/pdls.txt"

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
