#!/bin/bash
# `muser run` on the request loop of src/gen: a full context is a stop
# ("context", exit 0, the text kept), --chat drops its oldest turns instead
# of ending, user text of any bytes is taken everywhere, each reply ends its
# line on stdout, and a context past the trained one draws a warning. Uses
# the shipped default model (a 1,024-token context).
set -u
source "$(dirname "$0")/lib_cli.sh" gen
unset MUSER_MODEL MUSER_DRAFT

# a full context ends the reply with what it produced: prompt + fed tokens
# fill the context, and the last token (drawn, never fed) comes on top
check "$M" run -p "And it came to pass" -n 1100 --ignore-eos --temp 0 --json >"$T/ctx.json" 2>"$T/ctx.err"
check $PY - "$T/ctx.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["stop"] == "context", d["stop"]
assert len(d["prompt_tokens"]) + len(d["tokens"]) == 1024 + 1, (len(d["prompt_tokens"]), len(d["tokens"]))
assert len(d["text"]) > 1000 and d["timings"]["decode_tokens"] == len(d["tokens"]) - 1, d["timings"]
PYEOF
check "$M" run -p "And it came to pass" -n 1100 --ignore-eos --temp 0 --no-draft >"$T/ctx.txt" 2>"$T/ctx2.err"
check grep -q "context full" "$T/ctx2.err"
check $PY -c "
import json
t = open('$T/ctx.txt', encoding='utf-8').read(); d = json.load(open('$T/ctx.json'))
assert t == d['text'] + '\n', (len(t), len(d['text']))"

# --chat: a full context drops the oldest turns (the system message stays) and goes on
printf 'Tell me a long story about the sea.\nAnd then?\nMore please.\nAnd more?\n/exit\n' >"$T/chat.in"
check "$M" run --chat -c 128 -n 100 --temp 0 --system "Be brief." <"$T/chat.in" >"$T/chat.out" 2>"$T/chat.err"
check grep -qE "context full: dropped the [0-9]+ oldest turns?" "$T/chat.err"
check test "$(grep -c 'prefill:' "$T/chat.err")" -eq 4
check test "$(wc -l <"$T/chat.out")" -eq 4
# a message that does not fit even alone is refused with advice; the session goes on
LONG=$($PY -c "print('word ' * 40)")
printf '%s\nHi\n/exit\n' "$LONG" | "$M" run --chat -c 40 -n 4 --temp 0 --no-draft >"$T/long.out" 2>"$T/long.err"
check test $? -eq 0
check grep -q "the context holds 40: shorten it" "$T/long.err"
check test "$(grep -c 'prefill:' "$T/long.err")" -eq 1

# invalid UTF-8 from the user becomes U+FFFD in the messages, in chat lines and --system alike
printf 'caf\xe9 \xff\n/exit\n' | "$M" run --chat -n 4 --temp 0 --system $'\xff' >"$T/u.out" 2>"$T/u.err"
check test $? -eq 0
check test "$(grep -c 'prefill:' "$T/u.err")" -eq 1
if grep -q "invalid JSON" "$T/u.err"; then echo "FAILED: chat refused invalid UTF-8" >&2; fail=1; fi
check "$M" run -p $'caf\xe9' --system $'\xff' -n 4 --temp 0 --json >"$T/u.json" 2>/dev/null
check "$M" run -p $'caf\xe9 \xff' -n 4 --temp 0 --json >"$T/u2.json" 2>/dev/null

# -p output ends its line on stdout (a pipe gets whole lines)
check "$M" run -p "And God said" -n 4 --temp 0 >"$T/nl.out" 2>/dev/null
check test "$(tail -c 1 "$T/nl.out" | od -An -c | tr -d ' ')" = '\n'

# a context past the model's trained one is allowed, with a warning
check "$M" run -p x -n 1 -c 32768 --temp 0 --no-draft >/dev/null 2>"$T/big.err"
check grep -q "warning: a context of 32768 tokens exceeds the 1024 the model was trained on" "$T/big.err"
"$M" run -p x -n 1 --temp 0 --no-draft >/dev/null 2>"$T/small.err"
if grep -q warning "$T/small.err"; then echo "FAILED: a warning without cause" >&2; fail=1; fi

exit $fail
