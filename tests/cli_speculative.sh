#!/bin/bash
# Speculative decoding in `muser run`: with no -m the shipped assistant is
# used; every output (greedy, sampled, penalties, JSON Schema, logprobs,
# dumped logits, a two-turn chat) equals --no-draft's byte for byte, with the
# adaptive gate and with --spec-always at every verify length, as token
# trees (the default) and as chains; option and file refusals name the
# problem; `muser speculate` still reports exact.
set -u
source "$(dirname "$0")/lib_cli.sh" speculative
G="$MUSER_SOURCE_DIR/models/glimmer-tiny-q4_k_xl.gguf"
D="$MUSER_SOURCE_DIR/models/glimmer-tiny-dflash-q4_k_xl.gguf"
unset MUSER_MODEL MUSER_DRAFT
P="And God said, Let there be light: and there was light."

"$M" run --help | grep -qF -- "--spec-always" || { echo "FAILED: --help lacks --spec-always" >&2; fail=1; }

same() { # label, then the run options; compares --no-draft with the default and --spec-always runs
    local label="$1"; shift
    "$M" run "$@" --json --no-draft >"$T/$label.plain.json" 2>/dev/null || { echo "FAILED: $label (plain)" >&2; fail=1; return; }
    "$M" run "$@" --json >"$T/$label.gate.json" 2>/dev/null || { echo "FAILED: $label (gate)" >&2; fail=1; return; }
    for vl in 3 7 15; do
        "$M" run "$@" --json --spec-always --verify-len $vl >"$T/$label.vl$vl.json" 2>/dev/null ||
            { echo "FAILED: $label (verify length $vl)" >&2; fail=1; return; }
        "$M" run "$@" --json --spec-always --spec-chain --verify-len $vl >"$T/$label.cvl$vl.json" 2>/dev/null ||
            { echo "FAILED: $label (chain, verify length $vl)" >&2; fail=1; return; }
    done
    check $PY - "$T/$label" <<'EOF'
import json, sys
base = sys.argv[1]
plain = json.load(open(base + ".plain.json"))
assert "speculative" not in plain
for kind in ("gate", "vl3", "vl7", "vl15", "cvl3", "cvl7", "cvl15"):
    spec = json.load(open(base + "." + kind + ".json"))
    s = spec["speculative"]
    assert s["draft"] == "glimmer-tiny-dflash", s
    for key in ("tokens", "text", "seed", "stop") + (("logprobs",) if "logprobs" in plain else ()):
        assert spec[key] == plain[key], (kind, key, spec[key], plain[key])
    if kind == "gate":
        assert s["verify_len"] == 15 and s["tree"] is True, s   # the default shape
    else:
        assert s["rounds"] > 0 and s["gate_closures"] == 0, (kind, s)
        assert s["verify_len"] == int(kind.lstrip("cvl")), s
        assert s["tree"] is (kind[0] != "c"), (kind, s)
    assert 0 <= s["accepted"] <= s["drafted"], s
EOF
}

same greedy -p "$P" -n 48 --temp 0 -s 1
same sampled -p "$P" -n 48 --temp 0.8 -s 11
same hot -p "$P" -n 48 --temp 1.5 -s 3 --repeat-penalty 1.3 --top-k 0
same schema -p "$P" -n 64 -s 5 -j '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
same logprobs -p "$P" -n 24 -s 9 --n-probs 3
same chat --system "You are terse." -p "What is a hacker?" -n 40 -s 2

# with -m, only an explicit --draft speculates
check "$M" run -m "$G" -p "$P" -n 8 --temp 0 --json >"$T/m.json" 2>/dev/null
check $PY -c "import json; assert 'speculative' not in json.load(open('$T/m.json'))"
check "$M" run -m "$G" --draft "$D" -p "$P" -n 8 --temp 0 --json >"$T/md.json" 2>/dev/null
check $PY -c "import json; assert 'speculative' in json.load(open('$T/md.json'))"

# dumped logits: the same rows, bit for bit
check "$M" run -p "$P" -n 40 --temp 0 --no-draft --dump-logits "$T/plain.f32" >/dev/null 2>&1
check "$M" run -p "$P" -n 40 --temp 0 --spec-always --dump-logits "$T/spec.f32" >/dev/null 2>&1
check cmp "$T/plain.f32" "$T/spec.f32"
check test "$(stat -c %s "$T/plain.f32")" -eq $((40 * 8192 * 4))

# a two-turn chat: the second turn reuses the KV (and the assistant's context)
printf 'Who made the earth?\nAnd the sea?\n/exit\n' >"$T/chat.in"
check "$M" run --chat -n 32 -s 4 --no-draft <"$T/chat.in" >"$T/chat.plain" 2>/dev/null
check "$M" run --chat -n 32 -s 4 --spec-always <"$T/chat.in" >"$T/chat.spec" 2>/dev/null
check cmp "$T/chat.plain" "$T/chat.spec"
check test -s "$T/chat.plain"

# refusals
expect_fail "--verify-len must be 3, 7 or 15, got 5" "$M" run -p x --verify-len 5
expect_fail "--draft and --no-draft exclude each other" "$M" run -p x --draft "$D" --no-draft
expect_fail "$T/missing.gguf" "$M" run -p x --draft "$T/missing.gguf"
expect_fail "general.architecture" "$M" run -p x --draft "$G"
MUSER_DRAFT="$T/missing.gguf" expect_fail "missing.gguf" "$M" run -p x -n 1

# muser bench --draft: plain vs speculative greedy generation in one run
check "$M" bench -p 0 -n 24 -r 2 --warmup 0 --no-membw -q --draft "$D" --verify-len 3 --spec-chain --json "$T/bs.json" >"$T/bs.txt"
check grep -q "identical output" "$T/bs.txt"
check $PY -c "
import json
s = json.load(open('$T/bs.json'))['speculative']
assert s['exact'] is True and s['verify_len'] == 3 and s['tree'] is False and s['tokens'] == 24, s
assert len(s['plain']['samples']) == 2 and len(s['spec']['samples']) == 2 and s['speedup'] > 0, s
"
expect_fail "$T/missing.gguf" "$M" bench -p 0 -n 8 -r 1 --no-membw -q --draft "$T/missing.gguf"
# a set of prompts (--spec-prompts: text or ids lines): one speed over all of them
printf 'And it came to pass\n\nids:%s\n' "$(head -1 "$MUSER_SOURCE_DIR/tools/train/heldout-64.txt" | cut -d: -f2 | cut -d, -f1-20)" >"$T/prompts.txt"
check "$M" bench -p 0 -n 16 -r 1 --warmup 0 --no-membw -q --draft "$D" --spec-prompts "$T/prompts.txt" --json "$T/bp.json" >"$T/bp.txt"
check grep -q "2 prompts" "$T/bp.txt"
check $PY -c "import json; s = json.load(open('$T/bp.json'))['speculative']; assert s['prompts'] == 2 and s['exact'] is True, s"
printf 'ids:1,2,99999\n' >"$T/badp.txt"
expect_fail "speculation prompt 1: token id 99999 (position 2) is outside the vocabulary" "$M" bench -p 0 -n 8 -r 1 --no-membw -q --draft "$D" --spec-prompts "$T/badp.txt"
printf 'hello\n\nids:1,x\n' >"$T/badp2.txt"
expect_fail "--spec-prompts line 3 expects comma-separated non-negative integers, bad at 'x'" "$M" bench -p 0 -n 8 -r 1 --no-membw -q --draft "$D" --spec-prompts "$T/badp2.txt"
printf '\n\n' >"$T/nop.txt"
expect_fail "no prompt in it" "$M" bench -p 0 -n 8 -r 1 --no-membw -q --draft "$D" --spec-prompts "$T/nop.txt"

# muser speculate: exact greedy with statistics
check "$M" speculate -p "$P" -n 32 --json >"$T/sp.json" 2>/dev/null
check $PY -c "import json; r = json.load(open('$T/sp.json')); assert r['exact'] is True and r['verify_steps'] > 0 and r['verify_len'] == 15 and r['tree'] is True, r"
# on a named backend: the same tokens from ref (the reference numerics)
check "$M" speculate --backend ref -p "$P" -n 32 --json >"$T/sp_ref.json" 2>/dev/null
check $PY -c "import json; a, b = (json.load(open(f)) for f in ('$T/sp.json', '$T/sp_ref.json')); assert a['ids'] == b['ids'] and b['exact'] is True, b"
# a chain of the same 15 proposals: the same tokens, at least as many verify steps as the tree here
check "$M" speculate --verify-len 15 --spec-chain -p "$P" -n 32 --json >"$T/sp15.json" 2>/dev/null
check "$M" speculate --verify-len 15 --tree -p "$P" -n 32 --json >"$T/sp_tree.json" 2>/dev/null
check $PY -c "import json; a, b = (json.load(open(f)) for f in ('$T/sp.json', '$T/sp_tree.json')); assert a['ids'] == b['ids'] and b['exact'] is True and b['tree'] is True, b"
check $PY -c "import json; a, b = (json.load(open(f)) for f in ('$T/sp15.json', '$T/sp_tree.json')); print('chain', a['verify_steps'], 'tree', b['verify_steps']); assert b['verify_steps'] <= a['verify_steps'], (a, b)"
expect_fail "unknown backend 'gpu'" "$M" speculate --backend gpu -p "$P" -n 4

exit $fail
