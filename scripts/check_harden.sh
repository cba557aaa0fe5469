# check_harden.sh — the hardening runs of the suite, sourced by scripts/check.sh after its
# other runs (it uses check.sh's run_suite, $jobs and $total_fail):
#   - ThreadSanitizer on tests/test_threads.c (8 threads, mixed calls), the library
#     built without the OpenMP runtime (OPENMP=-fopenmp-simd: libgomp is not
#     instrumented, its own synchronisation would be reported) and without a BLAS;
#     any report is a failure;
#   - valgrind memcheck on `attn run`, `attn demo` and test_api (build/), where valgrind
#     is installed; any error, or a definite leak, is a failure;
#   - the libFuzzer harnesses (fuzz/, built with clang into build-fuzz/), each for
#     ATTN_CHECK_FUZZ_TIME seconds (30 by default) from its seed corpus.
# Each part is skipped, with its reason printed, where its tool is missing (deps.sh
# installs them), and can be turned off: ATTN_CHECK_TSAN=0, ATTN_CHECK_VALGRIND=0,
# ATTN_CHECK_FUZZ=0. Not a script to run by itself.

# harden_skip NAME REASON: a line in the suites' format for a part that did not run
harden_skip() { echo "== $1: skipped ($2)"; }

if [ "${ATTN_CHECK_TSAN:-1}" != 0 ]; then
    tsan_probe=$(mktemp -d)
    echo 'int main(void) { return 0; }' >"$tsan_probe/p.c"
    if ${CC:-cc} -fsanitize=thread "$tsan_probe/p.c" -o "$tsan_probe/p" 2>/dev/null &&
        "$tsan_probe/p" 2>/dev/null; then
        if timed "build tsan" make -s -j"$jobs" BUILD=build-tsan OPT=-O1 OPENMP=-fopenmp-simd BLAS=none \
            SAN="-fsanitize=thread" build-tsan/tests/test_threads; then
            # a report sets the exit status (66), which run_suite counts as a failure
            run_suite "tsan test_threads" env TSAN_OPTIONS="halt_on_error=0 exitcode=66" \
                build-tsan/tests/test_threads
        else
            echo "ThreadSanitizer build failed: counted as 1 failure"
            total_fail=$((total_fail + 1))
        fi
    else
        harden_skip "tsan test_threads" "${CC:-cc} cannot build and run with -fsanitize=thread"
    fi
    rm -rf "$tsan_probe"
fi

# valgrind_suite NAME COMMAND...: the command under memcheck; its errors (definite leaks
# included) are the suite's failures, and its own failure is one more.
valgrind_suite() {
    local name=$1 out
    shift
    out=$(mktemp)
    valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        --show-leak-kinds=definite "$@" >"$out" 2>&1
    local rc=$? errors
    # with --quiet there is no ERROR SUMMARY: each error's first line, each definite leak
    errors=$(grep -cE '^==[0-9]+== ([A-Z]|[0-9,]+ bytes in [0-9,]+ blocks are definitely)' "$out")
    if [ "$rc" -eq 0 ]; then
        echo "$name: 1 passed, 0 failed (0 valgrind errors)"
    else
        tail -n 40 "$out"
        echo "$name: 0 passed, $((errors > 0 ? errors : 1)) failed (exit $rc, $errors valgrind errors)"
    fi
    rm -f "$out"
}

if [ "${ATTN_CHECK_VALGRIND:-1}" != 0 ]; then
    if command -v valgrind >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
        vg_dir=$(mktemp -d)
        # Q [1, 2, 9, 8], K and V [1, 1, 20, 8] float32, written with the struct module
        python3 - "$vg_dir" <<'EOF'
import struct, sys
def npy(path, shape):
    n = 1
    for s in shape: n *= s
    h = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (tuple(shape),)
    h += ' ' * (63 - (10 + len(h)) % 64) + '\n'
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h.encode())
        f.write(struct.pack('<%df' % n, *[((i * 37) % 19 - 9) / 8 for i in range(n)]))
d = sys.argv[1]
npy(d + '/q.npy', [1, 2, 9, 8]); npy(d + '/k.npy', [1, 1, 20, 8]); npy(d + '/v.npy', [1, 1, 20, 8])
EOF
        run_suite "valgrind attn run" valgrind_suite "valgrind-attn-run" build/attn run \
            --q "$vg_dir/q.npy" --k "$vg_dir/k.npy" --v "$vg_dir/v.npy" --out "$vg_dir/o.npy" \
            --lse "$vg_dir/l.npy" --weights "$vg_dir/w.npy" --causal --threads 2
        run_suite "valgrind attn demo" valgrind_suite "valgrind-attn-demo" build/attn demo
        run_suite "valgrind test_api" valgrind_suite "valgrind-test_api" build/tests/test_api
        rm -rf "$vg_dir"
    else
        harden_skip "valgrind" "no valgrind or python3 (scripts/deps.sh installs valgrind)"
    fi
fi

if [ "${ATTN_CHECK_FUZZ:-1}" != 0 ]; then
    fuzz_probe=$(mktemp -d)
    printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
        'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }' >"$fuzz_probe/p.c"
    if command -v clang >/dev/null 2>&1 &&
        clang -fsanitize=fuzzer,address "$fuzz_probe/p.c" -o "$fuzz_probe/p" 2>/dev/null; then
        if timed "build fuzz" make -s -j"$jobs" fuzz-build >/dev/null; then
            for f in fuzz/fuzz_*.c; do
                h=$(basename "$f" .c)
                run_suite "fuzz $h" bash scripts/fuzz.sh "${ATTN_CHECK_FUZZ_TIME:-10}" build-fuzz "$h"
            done
        else
            echo "fuzz build failed: counted as 1 failure"
            total_fail=$((total_fail + 1))
        fi
    else
        for f in fuzz/fuzz_*.c; do
            harden_skip "fuzz $(basename "$f" .c)" "no clang with the libFuzzer runtime (scripts/deps.sh installs libclang-rt-14-dev)"
        done
    fi
    rm -rf "$fuzz_probe"
fi
