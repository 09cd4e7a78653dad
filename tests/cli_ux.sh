#!/bin/bash
# First-use defects of the CLI: out-of-range sampling values refused by flag
# name, non-regular model files refused instead of hanging, `muser info` on a
# DFlash assistant, tokenize/detokenize defaulting to the shipped model, one
# "muser CMD:" prefix per error, and file errors that give the reason.
set -u
source "$(dirname "$0")/lib_cli.sh" ux
G="$MUSER_SOURCE_DIR/models/glimmer-tiny-q4_k_xl.gguf"
A="$MUSER_SOURCE_DIR/models/glimmer-tiny-dflash-q4_k_xl.gguf"

check "$M" synth --preset tiny --type q4_k_xl --seed 42 -o "$T/tiny.gguf" --no-progress
TOK=1,2,3,4,5,6,7,8,9,10
run1() { "$M" run -m "$T/tiny.gguf" --tokens $TOK -n 2 "$@"; }

# 1. sampling values outside their meaningful range are refused by flag name
expect_fail "--top-p must be in [0, 1], got '2'" run1 --top-p 2
expect_fail "--top-p must be in [0, 1], got '-0.1'" run1 --top-p -0.1
expect_fail "--min-p must be in [0, 1], got '1.5'" run1 --min-p 1.5
expect_fail "--typical must be in [0, 1], got '3'" run1 --typical 3
expect_fail "--typical-p must be in [0, 1], got '-1'" run1 --typical-p -1
expect_fail "--xtc-probability must be in [0, 1], got '1.01'" run1 --xtc-probability 1.01
expect_fail "--xtc-threshold must be in [0, 1], got '-0.5'" run1 --xtc-threshold -0.5
expect_fail "--temp must be >= 0, got '-1'" run1 --temp -1
expect_fail "--temperature must be >= 0, got '-0.5'" run1 --temperature -0.5
expect_fail "--repeat-penalty must be > 0, got '0'" run1 --repeat-penalty 0
expect_fail "--repeat-penalty must be > 0, got '-1.1'" run1 --repeat-penalty -1.1
expect_fail "--dry-multiplier must be >= 0, got '-1'" run1 --dry-multiplier -1
expect_fail "--dry-base must be >= 1, got '0.5'" run1 --dry-base 0.5
expect_fail "--dynatemp-range must be >= 0, got '-2'" run1 --dynatemp-range -2
expect_fail "--dynatemp-exp must be >= 0, got '-1'" run1 --dynatemp-exp -1
expect_fail "--mirostat-lr must be >= 0, got '-0.1'" run1 --mirostat-lr -0.1
expect_fail "--mirostat-ent must be >= 0, got '-5'" run1 --mirostat-ent -5
expect_fail "--mirostat expects an integer in [0, 2], got '3'" run1 --mirostat 3
expect_fail "--repeat-last-n expects an integer in [-1," run1 --repeat-last-n -2
expect_fail "--dry-penalty-last-n expects an integer in [-1," run1 --dry-penalty-last-n -2
expect_fail "--min-keep expects an integer in [0," run1 --min-keep -1
expect_fail "--top-p expects a finite number, got 'nan'" run1 --top-p nan
# ... while every value llama.cpp gives a meaning to is still accepted
check run1 --temp 0 --top-p 0 --min-p 1 --typical 0 --xtc-probability 1 --xtc-threshold 1 >/dev/null 2>&1
check run1 --top-p 1 --min-p 0 --typical 1 --xtc-probability 0 --xtc-threshold 0 >/dev/null 2>&1
check run1 --top-k 0 --top-k -5 --top-nsigma -1 --repeat-last-n -1 --dry-penalty-last-n -1 >/dev/null 2>&1
check run1 --presence-penalty -1.5 --frequency-penalty -2 --repeat-penalty 0.5 --dry-base 1 >/dev/null 2>&1
check run1 --mirostat 2 --mirostat-lr 0 --mirostat-ent 0 --dynatemp-range 0 --dynatemp-exp 0 >/dev/null 2>&1

# 2. a FIFO, a directory, /dev/null: refused at once, by every command that opens a model
mkfifo "$T/fifo.gguf"
mkdir "$T/dir.gguf"
nonreg() { # WANT KIND CMD...: fails within 20 s (a FIFO used to block forever) saying WANT
    local want="$1"; shift
    expect_fail "$want: is not a regular file ($1)" timeout 20 "${@:2}"
}
for cmd in "info -m" "run --tokens 1 -m" "tokenize hi -m" "detokenize 1 -m" "perplexity -f $T/fifo.gguf -m"; do
    # shellcheck disable=SC2086
    nonreg "$T/fifo.gguf" "a FIFO" "$M" $cmd "$T/fifo.gguf"
done
nonreg "$T/dir.gguf" "a directory" "$M" info -m "$T/dir.gguf"
nonreg /dev/null "a character device" "$M" info -m /dev/null
nonreg "$T/fifo.gguf" "a FIFO" "$M" quantize "$T/fifo.gguf" "$T/q.gguf" Q8_0
nonreg "$T/dir.gguf" "a directory" "$M" run --tokens 1 -m "$T/dir.gguf"
nonreg "$T/fifo.gguf" "a FIFO" "$M" run --tokens 1 -m "$T/tiny.gguf" --draft "$T/fifo.gguf"

# 3. muser info describes a DFlash assistant as one, exit 0, text and --json
check "$M" info -m "$A" >"$T/ainfo.txt"
for want in "assistant:   glimmer-tiny-dflash" "architecture: dflash (a DFlash assistant" \
    "target layers: 1, 2, 4, 5, 7 (one-based)" "drafting:    block size 16, window 256 after a 64-row sink, mask token 8190" \
    "validation:  ok" "  total           58 tensors" "  fc.weight"; do
    grep -qF -- "$want" "$T/ainfo.txt" || { echo "FAILED: info on the assistant lacks '$want'" >&2; fail=1; }
done
grep -q REFUSED "$T/ainfo.txt" && { echo "FAILED: info refuses the assistant" >&2; fail=1; }
check "$M" info -m "$A" --json >"$T/ainfo.json"
check "$M" info -m "$G" --json --no-tensors >"$T/ginfo.json"
check $PY -c "
import json
d = json.load(open('$T/ainfo.json')); g = json.load(open('$T/ginfo.json'))
assert d['valid'] and d['kind'] == 'assistant' and d['architecture'] == 'dflash', d
a = d['assistant']
assert a['target_layers'] == [1, 2, 4, 5, 7] and a['block_size'] == 16 and a['sliding_window'] == 256, a
assert a['mask_token'] == 8190 and a['sink'] == 64 and not a['window_defaulted'], a
assert d['geometry']['n_layer'] == 5 and d['geometry']['n_vocab'] == 8192, d['geometry']
assert len(d['tensors']) == d['n_tensors'] == 58 and sum(t['tensors'] for t in d['types']) == 58
# the identity the assistant is checked against is the shipped target's tokenizer hash
assert d['sha256']['target_tokenizer'] == g['sha256']['tokenizer'], (d['sha256'], g['sha256'])
assert g['kind'] == 'model' and g['valid']
"
# an assistant that fails its own validation is still refused (exit 3), as an assistant
$PY - "$A" "$T/bad-assistant.gguf" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
i = b.find(b'dflash.block_size')
assert i > 0
i += len(b'dflash.block_size')
assert int.from_bytes(b[i:i + 4], 'little') == 4  # uint32
b[i + 4:i + 8] = (1).to_bytes(4, 'little')        # block size 1: out of range
open(sys.argv[2], 'wb').write(b)
EOF
"$M" info -m "$T/bad-assistant.gguf" --no-tensors >"$T/bad.txt" 2>&1
check test $? -eq 3
check grep -qF "architecture: dflash (a DFlash assistant)" "$T/bad.txt"
check grep -qF "REFUSED: $T/bad-assistant.gguf: dflash.block_size 1 is out of range" "$T/bad.txt"

# 4. tokenize / detokenize default to $MUSER_MODEL, else the shipped model, like run
check env -u MUSER_MODEL "$M" tokenize "Hello world" --ids --no-bos >"$T/d1.txt"
check "$M" tokenize -m "$G" "Hello world" --ids --no-bos >"$T/d2.txt"
check cmp "$T/d1.txt" "$T/d2.txt"
check test "$(env -u MUSER_MODEL "$M" detokenize "$(cat "$T/d1.txt")")" = "Hello world"
check env MUSER_MODEL="$T/tiny.gguf" "$M" tokenize "Hello world" --ids --no-bos >"$T/d3.txt"
check "$M" tokenize -m "$T/tiny.gguf" "Hello world" --ids --no-bos >"$T/d4.txt"
check cmp "$T/d3.txt" "$T/d4.txt"
check test "$(env MUSER_MODEL="$T/tiny.gguf" "$M" detokenize "$(cat "$T/d4.txt")")" = "Hello world"
expect_fail "usage: muser tokenize [-m MODEL] TEXT" "$M" tokenize
expect_fail "usage: muser detokenize [-m MODEL] 1,2,3" "$M" detokenize

# 5. one "muser CMD:" prefix per error
once() { # CMD WANT ARGS...: `muser ARGS` fails, says WANT, and names CMD once
    local cmd="$1" want="$2"; shift 2
    local out
    if out=$("$M" "$@" 2>&1); then echo "FAILED (exit 0): muser $*" >&2; fail=1; return; fi
    grep -qF -- "muser $cmd: $want" <<<"$out" || { echo "FAILED (message '$out' lacks 'muser $cmd: $want'): muser $*" >&2; fail=1; }
    ! grep -qF -- "$cmd: $cmd:" <<<"$out" || { echo "FAILED (prefix doubled in '$out'): muser $*" >&2; fail=1; }
}
once synth "unknown preset 'bogus'" synth --preset bogus --type q4_k_xl -o "$T/x.gguf"
once synth "n_layer = 3 is not a multiple" synth --preset tiny --type q4_k_xl --layers 3 -o "$T/x.gguf"
once synth "unknown weight type 'Q2_K'" synth --preset tiny --type Q2_K -o "$T/x.gguf"
once quantize "unknown weight type 'BOGUS'" quantize "$T/tiny.gguf" "$T/q.gguf" BOGUS
once detokenize "token 0 has id 99999" detokenize -m "$T/tiny.gguf" 99999
once tokenize "$T/missing.gguf: cannot open: No such file or directory" tokenize -m "$T/missing.gguf" hi
once info "$T/missing.gguf: cannot open: No such file or directory" info -m "$T/missing.gguf"
once perplexity "$T/missing.gguf: cannot open: No such file or directory" perplexity -m "$T/missing.gguf" -f "$T/x"

# 6. file errors give the reason
once chat-template "cannot open $T/missing.json: No such file or directory" \
    chat-template -m "$T/tiny.gguf" --messages "$T/missing.json"
once chat-template "reading $T/dir.gguf failed: Is a directory" chat-template -m "$T/tiny.gguf" --messages "$T/dir.gguf"
once perplexity "cannot open $T/missing.txt: No such file or directory" perplexity -m "$T/tiny.gguf" -f "$T/missing.txt"
once run "cannot open $T/missing.gbnf: No such file or directory" run -m "$T/tiny.gguf" --tokens 1 --grammar-file "$T/missing.gbnf"
once quantize "$T/nodir/q.gguf.tmp." quantize "$T/tiny.gguf" "$T/nodir/q.gguf" Q8_0 --no-progress
expect_fail ": cannot create: No such file or directory" "$M" quantize "$T/tiny.gguf" "$T/nodir/q.gguf" Q8_0 --no-progress
once synth "$T/nodir/x.gguf.tmp." synth --preset tiny --type q4_k_xl -o "$T/nodir/x.gguf" --no-progress
expect_fail ": cannot create: No such file or directory" "$M" synth --preset tiny --type q4_k_xl -o "$T/nodir/x.gguf" --no-progress
once bench "cannot write $T/nodir/g.json: No such file or directory" bench --grammar --reps 1 --json "$T/nodir/g.json" -q
# a write that fails only when the buffer is flushed (full disk) still says why
if [ -w /dev/full ]; then
    once bench "writing /dev/full failed: No space left on device" bench --grammar --reps 1 --json /dev/full -q
fi
exit $fail
