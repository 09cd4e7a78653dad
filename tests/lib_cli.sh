# Shared set-up of the tests/cli_*.sh end-to-end tests (sourced, not run):
#   source "$(dirname "$0")/lib_cli.sh" NAME
# gives M (the muser binary), PY (Debian python3), T (a temporary folder
# removed on exit), fail (0 until a check fails), and the helpers
#   check CMD...                  CMD must succeed
#   expect_fail SUBSTRING CMD...  CMD must fail and print SUBSTRING
M="$MUSER_BIN"
PY=/usr/bin/python3
T=$(mktemp -d "/tmp/muser-${1:-cli}-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! "$@"; then echo "FAILED: $*" >&2; fail=1; fi; }
expect_fail() {
    local want="$1"; shift
    local out
    if out=$("$@" 2>&1); then echo "FAILED (exit 0): $*" >&2; fail=1; return; fi
    if ! grep -qF -- "$want" <<<"$out"; then echo "FAILED (message '$out' lacks '$want'): $*" >&2; fail=1; fi
}
