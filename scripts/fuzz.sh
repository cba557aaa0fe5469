#!/usr/bin/env bash
# fuzz.sh — runs the libFuzzer harnesses (fuzz/fuzz_*.c, built by `make fuzz-build`),
# each for a bounded time from its committed seed corpus, and prints per harness one line
# "<harness>: N passed, N failed (...)" in the suites' format, with its executions,
# coverage and features. A crash, leak, sanitizer report or broken rule is a failure; the
# input that caused it is kept as build-fuzz/artifacts/<harness>-crash-*. New inputs the
# fuzzer finds go to build-fuzz/corpus/<harness>/, not into the repository's corpus.
# Where the harnesses were not built (no clang, no libFuzzer runtime) each line says so,
# counted as skipped: 0 passed, 0 failed.
#
# Usage: bash scripts/fuzz.sh SECONDS [BUILD_DIR] [HARNESS...]   (default: build-fuzz, all)
set -u
cd "$(dirname "$0")/.."
secs=${1:-30}
build=${2:-build-fuzz}
shift $(($# > 2 ? 2 : $#))
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do harnesses+=("$(basename "$f" .c)"); done
fi
mkdir -p "$build/artifacts"
status=0
for h in "${harnesses[@]}"; do
    bin="$build/fuzz/$h"
    if [ ! -x "$bin" ]; then
        echo "$h: 0 passed, 0 failed (skipped: $bin not built; it needs clang with the" \
             "libFuzzer runtime, Debian's libclang-rt-14-dev: scripts/deps.sh)"
        continue
    fi
    work="$build/corpus/$h"
    mkdir -p "$work"
    log="$build/$h.log"
    # -close_fd_mask=2 for the argument parser: its usage messages are dropped; libFuzzer,
    # the sanitizers and the harness still report on a duplicate of stderr. The outer
    # timeout only guards against a hang libFuzzer's own -timeout (per input) misses.
    quiet=()
    [ "$h" != fuzz_cli_args ] || quiet=(-close_fd_mask=2)
    start=$(date +%s)
    timeout $((secs + 120)) "$bin" -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 \
        -print_final_stats=1 "${quiet[@]}" -artifact_prefix="$build/artifacts/$h-" \
        "$work" "fuzz/corpus/$h" >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        echo "$h: 1 passed, 0 failed (${runs:-?} runs in ${took} s, ${cov:-no coverage line})"
    else
        echo "$h: 0 passed, 1 failed (exit $rc after ${runs:-?} runs, ${took} s; log $log):"
        grep -E 'ERROR|SUMMARY|fuzz_[a-z_]+: |==[0-9]+==|Test unit written|runtime error' "$log" |
            head -n 20
        status=1
    fi
done
exit $status
