#!/usr/bin/env bash
# test_bench_viz.sh — `attn bench --viz` (bench/bench_viz.c), the 100K-token picture's
#                     benchmark, at --quick's 4096 tokens: that it runs, checks its grid
#                     (and fails on a planted LSE error), reports its peak memory against
#                     the bound (and fails when the bound is below it), refuses bad options.
#
# Usage: bash tests/test_bench_viz.sh [path/to/attn]      (default build/attn)
# What it is not: the measurement itself (100000 tokens take minutes: docs/TEXTBOOK.md has
# the run) or a time limit (none: the machine is shared).

. "$(dirname "$0")/lib.sh"
suite bench_viz
attn_arg "${1:-}"
[ -x "$ATTN" ] || cannot_run "no executable $ATTN"
tmp_dir

"$ATTN" bench --viz --quick --threads 2 >"$T/out" 2>"$T/err"
rc=$?
out=$(cat "$T/out")
check "quick run: exit 0 ($rc; $(cat "$T/err"))" "$([ $rc = 0 ]; echo $?)"
check "quick run: 4096 tokens in 256 x 256 cells" "$(grep -qF "L = 4096 tokens, D = 64" <<<"$out" &&
    grep -qF "a 256 x 256 picture (blocks of 16 x 16, summed)" <<<"$out"; echo $?)"
check "quick run: the grid's check passed" "$(grep -qE 'max relative error [0-9.e+-]+ \(limit 1e-4\); 0 cells masked wrongly: ok$' <<<"$out"; echo $?)"
check "quick run: three timed runs, medians" "$(grep -qE 'forward \(for the LSE\) +median +[0-9.]+ s +\(min [0-9.]+, max [0-9.]+, 3 runs\)' <<<"$out" &&
    grep -qE 'attn_weights_grid \(sum\) +median +[0-9.]+ s' <<<"$out"; echo $?)"
# the peak: above the inputs (4 x 4096 x 64 floats = 4 MiB), within the bound
peak=$(grep -oE 'peak resident set [0-9.]+ MiB' <<<"$out" | grep -oE '[0-9.]+')
check "quick run: peak ${peak:-?} MiB, at least the inputs' 4 MiB, within 200" "$(awk -v p="${peak:-0}" 'BEGIN { exit !(p >= 4 && p <= 200) }' &&
    grep -qF "bound: peak <= 200 MiB: within" <<<"$out"; echo $?)"
check "quick run: the materialized matrix it avoids" "$(grep -qF "the materialized L x L float32 weights: 0.0671 GB" <<<"$out"; echo $?)"

# a planted error: the LSE moved by 1e-3 after the forward; rows then sum to e^-0.001
"$ATTN" bench --viz --quick --reps 1 --plant-error >"$T/out" 2>&1
rc=$?
check "planted LSE error: exit 1 ($rc)" "$([ $rc = 1 ]; echo $?)"
check "planted LSE error: check FAILED shown" "$(grep -qF "check FAILED" "$T/out"; echo $?)"
# a bound below the process's own size must be reported as exceeded
"$ATTN" bench --viz --quick --reps 1 --bound-mib 1 >"$T/out" 2>&1
rc=$?
check "a bound of 1 MiB: exit 1 ($rc)" "$([ $rc = 1 ]; echo $?)"
check "a bound of 1 MiB: EXCEEDED shown" "$(grep -qF "bound: peak <= 1 MiB: EXCEEDED" "$T/out"; echo $?)"
# a smaller, uneven case: 1000 tokens in 7 x 7 blocks
"$ATTN" bench --viz --tokens 1000 --pixels 7 --reps 1 >"$T/out" 2>&1
check "1000 tokens, 7 x 7 blocks: the check passes" "$([ $? = 0 ] && grep -qF "cells masked wrongly: ok" "$T/out"; echo $?)"

for args in "--tokens 0" "--pixels 0" "--reps 0" "--bound-mib x" "--bogus"; do
    # shellcheck disable=SC2086
    "$ATTN" bench --viz --quick $args >"$T/out" 2>"$T/err"
    rc=$?
    check "usage error $args: exit 2, one line on stderr ($rc)" "$([ $rc = 2 ] && [ "$(wc -l <"$T/err")" = 1 ] && [ ! -s "$T/out" ]; echo $?)"
done
"$ATTN" bench --viz --help >"$T/out"
check "--help" "$(grep -qF -- "--bound-mib" "$T/out"; echo $?)"

finish
