#!/bin/bash
# `muser run` sampling options: --help defaults, refusals with their
# messages, seeded replay, grammar / JSON Schema output that parses, --json
# logprobs, logit bias, ignore-eos under a grammar, grammar restart per chat
# reply, bench --grammar. Uses the shipped default model (real text) and a
# synthetic one.
set -u
source "$(dirname "$0")/lib_cli.sh" sampling
G="$MUSER_SOURCE_DIR/models/glimmer-tiny-q4_k_xl.gguf"
DATA="$MUSER_SOURCE_DIR/tests/data"

# --help: every option with llama.cpp's default
"$M" run --help >"$T/help.txt"
for want in "--samplers NAMES" "(default penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)" \
    "--sampling-seq LETTERS             chain order as letters (default edskypmxt)" \
    "-s, --seed N" "(default -1)" "--temp, --temperature N" "(default 0.8)" "--top-k N" "(default 40)" \
    "--top-p N" "(default 0.95)" "--min-p N" "(default 0.05)" "--typical, --typical-p N" \
    "--top-nsigma, --top-n-sigma N" "--xtc-probability N" "--xtc-threshold N" "(default 0.1)" \
    "--repeat-last-n N" "(default 64)" "--repeat-penalty N" "--presence-penalty N" "--frequency-penalty N" \
    "--dry-multiplier N" "--dry-base N" "(default 1.75)" "--dry-allowed-length N" "--dry-penalty-last-n N" \
    "--dry-sequence-breaker TEXT" "--dynatemp-range N" "--dynatemp-exp N" "--mirostat N" "--mirostat-lr N" \
    "--mirostat-ent N" "(default 5)" "--min-keep N" "-l, --logit-bias TOKEN(+|-)BIAS" "--grammar GBNF" \
    "--grammar-file FILE" "-j, --json-schema SCHEMA" "-jf, --json-schema-file FILE" "--n-probs, --logprobs N" \
    "--ignore-eos"; do
    grep -qF -- "$want" "$T/help.txt" || { echo "FAILED: --help lacks '$want'" >&2; fail=1; }
done

check "$M" synth --preset tiny --type q4_k_xl --seed 42 -o "$T/tiny.gguf" --no-progress
TOK=1,2,3,4,5,6,7,8,9,10

# refusals name the problem
expect_fail "unknown sampler name 'bogus'" "$M" run -m "$T/tiny.gguf" --tokens $TOK --samplers "top_k;bogus"
expect_fail "unknown sampler letter 'q' at 1" "$M" run -m "$T/tiny.gguf" --tokens $TOK --sampling-seq kq
expect_fail "--logit-bias expects TOKEN_ID(+|-)BIAS" "$M" run -m "$T/tiny.gguf" --tokens $TOK --logit-bias 12x3
expect_fail "logit_bias[0]: token 99999 is outside the vocabulary" "$M" run -m "$T/tiny.gguf" --tokens $TOK --logit-bias 99999+1
expect_fail "--mirostat expects an integer in [0, 2]" "$M" run -m "$T/tiny.gguf" --tokens $TOK --mirostat 3
expect_fail "--seed expects an integer" "$M" run -m "$T/tiny.gguf" --tokens $TOK -s 4294967296
expect_fail "--dry-base must be >= 1" "$M" run -m "$T/tiny.gguf" --tokens $TOK --dry-base 0.5
expect_fail "line 1, column 10: undefined rule 'foo'" "$M" run -m "$G" -p x --grammar 'root ::= foo'
expect_fail "unsupported keyword \"multipleOf\" at /multipleOf" "$M" run -m "$G" -p x -j '{"type":"integer","multipleOf":2}'
expect_fail "give one of --grammar" "$M" run -m "$G" -p x --grammar 'root ::= "a"' -j '{}'
expect_fail "missing.gbnf" "$M" run -m "$G" -p x --grammar-file "$T/missing.gbnf"

# seeded replay; another seed differs; a random seed replays through the seed --json reports
run_json() { "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 32 --ignore-eos --json "$@" 2>/dev/null; }
check run_json -s 123 >"$T/s1.json"
check run_json -s 123 >"$T/s2.json"
check run_json -s 124 >"$T/s3.json"
check run_json >"$T/r1.json"
SEED=$($PY -c "import json; print(json.load(open('$T/r1.json'))['seed'])")
check run_json -s "$SEED" >"$T/r2.json"
check $PY -c "
import json
l = lambda n: json.load(open('$T/' + n))
a, b, c, r1, r2 = l('s1.json'), l('s2.json'), l('s3.json'), l('r1.json'), l('r2.json')
assert a['seed'] == 123 and a['tokens'] == b['tokens'] and len(a['tokens']) == 32, (a, b)
assert a['tokens'] != c['tokens'], 'seeds 123 and 124 drew the same tokens'
assert r1['tokens'] == r2['tokens'] and r2['seed'] == r1['seed'], (r1, r2)
assert a['sampler_chain'] == 'logits -> logit-bias -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical -> top-p -> min-p -> ?xtc -> temp-ext -> dist ', a['sampler_chain']
"
# letters and names give the same chain
check run_json -s 123 --sampling-seq edskypmxt >"$T/s4.json"
check $PY -c "import json; assert json.load(open('$T/s1.json'))['tokens'] == json.load(open('$T/s4.json'))['tokens']"

# logit bias: banning the greedy first token changes it
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 1 --temp 0 --json >"$T/g.json" 2>/dev/null
FIRST=$($PY -c "import json; print(json.load(open('$T/g.json'))['tokens'][0])")
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 1 --temp 0 --logit-bias "$FIRST-inf" --json >"$T/gb.json" 2>/dev/null
check $PY -c "import json; t = json.load(open('$T/gb.json'))['tokens'][0]; assert t != $FIRST, t"

# --json logprobs with --n-probs 3
check "$M" run -m "$G" -p "And it came to pass" -n 12 -s 5 --n-probs 3 --json >"$T/lp.json" 2>/dev/null
check $PY -c "
import json, math
d = json.load(open('$T/lp.json'))
assert len(d['logprobs']) == len(d['tokens']) > 0
for tok, e in zip(d['tokens'], d['logprobs']):
    assert e['id'] == tok and e['logprob'] <= 0 and isinstance(e['text'], str) and isinstance(e['bytes'], list)
    top = e['top_logprobs']
    assert len(top) == 3 and all(t['logprob'] <= 0 for t in top)
    assert top[0]['logprob'] >= top[1]['logprob'] >= top[2]['logprob'], top
    assert e['logprob'] <= top[0]['logprob']
    for t in top:
        if t['id'] == tok: assert t['logprob'] == e['logprob']
    assert sum(math.exp(t['logprob']) for t in top) <= 1.0 + 1e-6
"

# json.gbnf: the output on stdout is JSON (the prompt of test_sampling_json.c)
PROMPT="{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}"
for s in 1 2 3; do
    check "$M" run -m "$G" -p "$PROMPT" -n 983 -s $s --grammar-file "$DATA/grammars/json.gbnf" >"$T/j$s.txt" 2>/dev/null
    check $PY -c "import json; v = json.loads(open('$T/j$s.txt').read()); assert isinstance(v, dict)"
done
# a JSON Schema through the chat template
check "$M" run -m "$G" --system "Answer in JSON." -p "Describe a person." -n 256 -s 7 \
    -jf "$DATA/json_schema/gen_person.json" --json >"$T/person.json" 2>/dev/null
check $PY -c "
import json
d = json.load(open('$T/person.json'))
v = json.loads(d['text'])
assert d['stop'] == 'eog' and isinstance(v['name'], str) and 1 <= len(v['name']) <= 24, d
assert isinstance(v['age'], int) and 0 <= v['age'] <= 120 and set(v) <= {'name', 'age', 'city', 'member'}, v
"
# a finished grammar under --ignore-eos stops as "grammar"
check "$M" run -m "$G" -p x -n 50 --grammar 'root ::= "ab"' --ignore-eos --json >"$T/ab.json" 2>/dev/null
check $PY -c "import json; d = json.load(open('$T/ab.json')); assert d['text'] == 'ab' and d['stop'] == 'grammar', d"
# --verbose prints the chain
check "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 2 -v >/dev/null 2>"$T/v.err"
check grep -q "sampler chain: logits -> ?penalties" "$T/v.err"
# --chat restarts the grammar for every reply; each reply ends its line on stdout
printf 'Hi\nHello again\n/exit\n' | "$M" run -m "$G" --chat -n 20 -s 3 --grammar 'root ::= "ab"' >"$T/chat.out" 2>"$T/chat.err"
check test $? -eq 0
check test "$(cat "$T/chat.out")" = "$(printf 'ab\nab')"
check test "$(wc -l <"$T/chat.out")" -eq 2
# muser bench --grammar: the synthetic and the model vocabulary, JSON report
check "$M" bench --grammar -m "$G" -r 3 -q --json "$T/gb.json" >"$T/gb.txt"
check grep -q "in-string" "$T/gb.txt"
check $PY -c "
import json
d = json.load(open('$T/gb.json'))
assert d['reps'] == 3 and [v['n_vocab'] for v in d['vocabs']] == [202048, 8192], d
for v in d['vocabs']:
    assert [s['state'] for s in v['states']] == ['start', 'in-string', 'after-key']
    for s in v['states']:
        assert 0 < s['ms']['min'] <= s['ms']['median'] <= s['ms']['max'] and s['allowed'] > 0, s
"
exit $fail
