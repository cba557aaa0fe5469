# lib.sh — what the shell suites (tests/test_*.sh) share; each sources it first:
#     . "$(dirname "$0")/lib.sh"
#
#   suite NAME        the name of the closing line "NAME: N passed, N failed" (the line
#                     scripts/check.sh counts); the counters pass and fail start at 0
#   attn_arg [PATH]   ATTN = PATH (default build/attn), made absolute
#   cannot_run WHY    WHY (after the script's name), then the closing line with one
#                     failure; exits 1 (a missing executable or interpreter)
#   tmp_dir [cd]      T = a fresh temporary folder, removed when the suite exits; with
#                     cd, the suite works in it
#   ok [WHAT]         one more pass (printed as "ok - WHAT" when OK_VERBOSE=1)
#   bad WHAT          one more failure, printed as "FAIL: WHAT"
#   check WHAT STATUS ok when STATUS is 0, else bad WHAT
#   finish            the closing line; returns 0 when nothing failed
# What it is not: a test runner (each suite runs alone, scripts/check.sh runs them all).

set -u

suite() {
    SUITE=$1
    pass=0
    fail=0
}

attn_arg() {
    ATTN=${1:-build/attn}
    case $ATTN in /*) ;; *) ATTN=$PWD/$ATTN ;; esac
}

cannot_run() {
    echo "$(basename "$0"): $*"
    echo "$SUITE: 0 passed, 1 failed"
    exit 1
}

tmp_dir() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/$(basename "$0" .sh).XXXXXX") || exit 1
    trap 'rm -rf "$T"' EXIT
    if [ "${1:-}" = cd ]; then cd "$T" || exit 1; fi
}

ok() {
    [ "${OK_VERBOSE:-0}" != 1 ] || echo "ok - $*"
    pass=$((pass + 1))
}

bad() {
    echo "FAIL: $*"
    fail=$((fail + 1))
}

check() {
    if [ "$2" = 0 ]; then ok "$1"; else bad "$1"; fi
}

finish() {
    echo "$SUITE: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
