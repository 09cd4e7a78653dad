#!/bin/bash
# muser perplexity on a synthetic model: output format, JSON fields, refusals,
# invariance to batch size and backend, and an independent recomputation of
# the perplexity from `muser run --dump-logits` rows plus python arithmetic.
set -u
source "$(dirname "$0")/lib_cli.sh" ppl

check "$M" synth --preset tiny --type q4_k_xl --seed 42 -o "$T/tiny.gguf" --no-progress
# The synthetic vocabulary is small, so this text gives roughly one token per character.
printf '%s' "Old trees grow tall near the river, where a cat and a dog ran far into the woods. \
The mat sat still; the night was long and quiet, and nobody came back before the morning light." >"$T/text.txt"
"$M" tokenize -m "$T/tiny.gguf" "$(cat "$T/text.txt")" --ids --no-parse-special >"$T/ids.txt"
N_TOK=$(tr ',' '\n' <"$T/ids.txt" | grep -c .)
check test "$N_TOK" -ge 96
CHUNKS=$((N_TOK / 16))

# Plain output: running values [1]..[CHUNKS], final estimate, speed line.
check "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 >"$T/plain.txt" 2>"$T/plain.err"
check grep -qE "^(\[[0-9]+\][0-9]+\.[0-9]{4},){$CHUNKS}\$" "$T/plain.txt"
check grep -qE "^\[1\][0-9.]+,.*\[$CHUNKS\][0-9.]+,\$" "$T/plain.txt"
check grep -qE '^Final estimate: PPL = [0-9]+\.[0-9]{4} \+/- [0-9]+\.[0-9]{5}$' "$T/plain.txt"
check grep -qE 'tokens/s' "$T/plain.txt"

# JSON: consistent fields, and the same numbers as the plain output.
check "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 --json >"$T/a.json" 2>/dev/null
check $PY -c "
import json, math, re, sys
d = json.load(open('$T/a.json'))
n_tok, chunks = $N_TOK, $CHUNKS
assert math.isfinite(d['ppl']) and d['ppl'] > 1, d
assert d['n_ctx'] == 16 and d['chunks'] == chunks and d['tokens_total'] == n_tok, d
assert d['tokens_scored'] == chunks * (16 - 8 - 1) and d['tokens_evaluated'] == chunks * 16, d
assert abs(d['ppl'] - math.exp(d['nll_mean'])) <= 1e-12 * d['ppl'], d
assert len(d['chunk_ppl']) == chunks and d['chunk_ppl'][-1] == d['ppl'], d
assert d['ppl_err'] is not None and 0 < d['ppl_err'] < d['ppl'] and d['tokens_per_s'] > 0 and d['add_bos'], d
plain = open('$T/plain.txt').read()
final = re.search(r'PPL = ([0-9.]+)', plain).group(1)
assert final == '%.4f' % d['ppl'], (final, d['ppl'])
running = re.findall(r'\[\d+\]([0-9.]+),', plain)
assert running == ['%.4f' % v for v in d['chunk_ppl']], (running, d['chunk_ppl'])
"

# Batch size and backend must not change a bit of the result.
check "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 -b 3 --json >"$T/b3.json" 2>/dev/null
check "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 --backend ref -t 1 --json >"$T/ref.json" 2>/dev/null
check $PY -c "
import json
a, b, r = (json.load(open('$T/' + n)) for n in ('a.json', 'b3.json', 'ref.json'))
assert b['batch'] == 3 and a['ppl'] == b['ppl'] == r['ppl'] and a['chunk_ppl'] == b['chunk_ppl'] == r['chunk_ppl'], (a, b, r)
"

# Independent arithmetic: window w is fed with BOS in slot 0; the row at
# position j (8..14) comes from running the prefix 0..j alone and predicts
# token j+1 of the original text. muser guarantees a prefill row equals the
# row of the same prefix fed on its own, so the logits are the same bits.
check "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 --chunks 2 --json >"$T/c2.json" 2>/dev/null
check $PY -c "
import json, math, struct, subprocess
M, T = '$M', '$T'
ids = [int(x) for x in open(T + '/ids.txt').read().strip().split(',')]
bos, n_ctx, first = ids[0], 16, 8
nll, count, running = 0.0, 0, []
for w in range(2):
    window = ids[w * n_ctx:(w + 1) * n_ctx]
    fed = [bos] + window[1:]
    for j in range(first, n_ctx - 1):
        dump = T + '/row.bin'
        subprocess.run([M, 'run', '-m', T + '/tiny.gguf', '--tokens', ','.join(map(str, fed[:j + 1])),
                        '-n', '1', '--dump-logits', dump], check=True, capture_output=True)
        raw = open(dump, 'rb').read()
        row = struct.unpack('<%df' % (len(raw) // 4), raw)
        mx = max(row)
        lse = mx + math.log(sum(math.exp(v - mx) for v in row))
        nll += lse - row[window[j + 1]]
        count += 1
    running.append(math.exp(nll / count))
d = json.load(open(T + '/c2.json'))
assert d['chunks'] == 2 and d['tokens_scored'] == count == 14, d
for got, want in zip(d['chunk_ppl'], running):
    assert abs(got - want) <= 1e-6 * want, (d['chunk_ppl'], running)
assert abs(d['nll_mean'] - nll / count) <= 1e-6 * (nll / count), (d['nll_mean'], nll / count)
print('independent check: ppl %.6f (muser %.6f)' % (running[-1], d['ppl']))
"

# Refusals: too few tokens (default context is the model's 1024), bad options.
expect_fail "at least 128 tokens" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 64
expect_fail "at least 2048 tokens to evaluate perplexity with a context of 1024" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt"
expect_fail "tokenizes to only $N_TOK tokens" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 64
expect_fail "--chunks expects an integer" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 16 --chunks 0
expect_fail "-c expects an integer" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" -c 2
expect_fail "-f TEXT is required" "$M" perplexity -m "$T/tiny.gguf"
expect_fail "missing.txt" "$M" perplexity -m "$T/tiny.gguf" -f "$T/missing.txt"
expect_fail "unknown option" "$M" perplexity -m "$T/tiny.gguf" -f "$T/text.txt" --bogus
check "$M" perplexity --help >"$T/help.txt"
check grep -q "first = N_CTX/2" "$T/help.txt"
exit $fail
