#!/usr/bin/env bash
# check.sh — the whole test suite: builds, runs every suite, runs the C suites again on
# an AArch64 build under qemu-user (the portable kernel alone), then everything again
# under AddressSanitizer + UndefinedBehaviorSanitizer, and closes with one
# "N passed, N failed" line summed over every suite of every run.
#
# Usage: bash scripts/check.sh            (what `make check` and .ci/run run)
#        ATTN_CHECK_SANITIZE=0 bash scripts/check.sh   skip the sanitizer run
#        ATTN_CHECK_CROSS=0 bash scripts/check.sh      skip the AArch64 run under qemu
# then the hardening runs of scripts/check_harden.sh (ThreadSanitizer, valgrind, the
# fuzzers; ATTN_CHECK_TSAN=0, ATTN_CHECK_VALGRIND=0, ATTN_CHECK_FUZZ=0 skip them). The
# sanitizer build is also the fault-injection build (src/core/alloc.h) that test_nomem needs.
set -u
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
# No suite reads a wisdom file (attn tune's, docs/KERNELS.md "Tuner"): one in the
# developer's ~/.cache/attn/wisdom would change which kernel and tiles a call takes, hence
# its last bits. test_wisdom and test_tune.sh set their own files and this variable.
export ATTN_TUNE=0
unset ATTN_WISDOM
total_pass=0
total_fail=0
log=$(mktemp)
times_file=$(mktemp)
kernels_file=$(mktemp)
cpu_tmp=$(mktemp)
trap 'rm -f "$log" "$times_file" "$kernels_file" "$cpu_tmp"' EXIT
check_start=$(date +%s)

# stage_time NAME START_NS CPU_BEFORE: one line of the closing per-stage table (wall
# seconds, and the CPU seconds of the stage's processes, which load from other jobs
# inflates less than the wall time)
# (times in this shell, not in a pipeline's subshell, whose children's times start at 0)
# (times in this shell, not in a subshell, whose children's times start at 0): sets CPU
cpu_now() { times >"$cpu_tmp"; CPU=$(awk 'END { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$cpu_tmp"); }
stage_time() {
    local name=$1 t0=$2 c0=$3 t1 c1
    t1=$(date +%s.%N)
    cpu_now
    c1=$CPU
    awk -v n="$name" -v a="$t0" -v b="$t1" -v c="$c0" -v d="$c1" \
        'BEGIN { printf "%8.1f %8.1f  %s\n", b - a, d - c, n }' >>"$times_file"
}
# timed NAME COMMAND...: a build step, timed as a stage
timed() {
    local name=$1 t0 c0 rc
    shift
    t0=$(date +%s.%N)
    cpu_now
    c0=$CPU
    "$@"
    rc=$?
    stage_time "$name" "$t0" "$c0"
    return $rc
}

# run_suite NAME COMMAND...: runs one suite, echoes its output, adds its counts.
run_suite() {
    local name=$1 t0 c0
    shift
    echo "== $name"
    t0=$(date +%s.%N)
    cpu_now
    c0=$CPU
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    stage_time "$name" "$t0" "$c0"
    count_suite "$name" "$rc" "$log"
}

# count_suite NAME RC OUTPUT_FILE: adds one suite's counts (its last summary line) to the
# totals; no summary line, or a failed exit with no failed check, is one failure.
count_suite() {
    local name=$1 rc=$2 out=$3 line
    line=$(grep -E '^[A-Za-z0-9_-]+: [0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: no summary line (exit $rc): counted as 1 failure"
        total_fail=$((total_fail + 1))
        return
    fi
    local p f
    p=$(sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$line")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "$name: exited $rc with no failed check: counted as 1 failure"
        f=1
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}

# The suites whose results depend on the micro-kernels run once per kernel this CPU
# supports (ATTN_ISA), not only the one dispatch picks; the others run once.
PER_KERNEL="test_forward test_paged test_paged_decode test_edge test_onnx test_half test_backward test_backward_edge test_backward_half test_masks test_mask_lengths test_key_padding_paths test_team_threshold test_weights test_q8_0 test_kv_append_q8 test_fp8_q4 test_u4 test_sinks test_sinks_backward test_dropout test_dropout_backward test_cascade test_weights_fast test_fast_level test_varlen test_bias_grad test_block_mask test_mla test_varlen_paged test_key_scores test_dense_kv"

# The suites that test each kernel table the CPU runs from inside, one after another (the
# rest run the kernel dispatch picks).
EVERY_KERNEL_INSIDE="test_additive test_kernels test_kernels_half test_fwd_geom test_from_f32 test_half test_gemm test_dropout_words test_q8_0 test_paged_decode"

# kernel_line NAME TEXT: says which kernels a suite ran, now and in the closing table
kernel_line() {
    echo "== $1: kernels: $2"
    printf '  %-44s %s\n' "$1" "$2" >>"$kernels_file"
}

rotation=0

# run_all BUILD_DIR LABEL: every suite against one build (LABEL empty: the plain build).
run_all() {
    local b=$1 label=$2 kernels cannot picked cli=$1/attn
    [ -x "$cli" ] || cli=build/attn  # a build of the suites alone: the plain build's command
    kernels=$("$cli" --kernels | awk '$2 == "runs" { print $1 }' | xargs)
    cannot=$("$cli" --kernels | awk '$2 != "runs" { print $1 }' | xargs)
    picked=$("$cli" --version | sed -n -E 's/.*\(kernel ([a-z0-9_]+);.*/\1/p')
    local not_here=""
    [ -z "$cannot" ] || not_here="; not run, this CPU cannot: $cannot"
    echo "== ${label}kernels this CPU runs: $kernels (dispatch picks $picked)$not_here"
    for t in "$b"/tests/test_*; do
        [ -x "$t" ] || continue
        local name
        name=$(basename "$t")
        if [[ " $PER_KERNEL " == *" $name "* ]] && [ -n "$label" ]; then
            # under the sanitizers each such suite runs once, the kernels taken in turn
            # (every kernel's own code also runs under them in the suites that call each
            # kernel table: EVERY_KERNEL_INSIDE); the framework code they share is the
            # same for all, and each kernel's numbers are the plain run's business
            local list=($kernels)
            local isa=${list[$((rotation % ${#list[@]}))]}
            rotation=$((rotation + 1))
            run_suite "$label$name [$isa]" env ATTN_ISA="$isa" "$t"
            kernel_line "$label$name" "$isa (the kernels in turn, one a suite)"
        elif [[ " $PER_KERNEL " == *" $name "* ]]; then
            # the kernel dispatch picks runs the whole matrix; each other kernel one case in
            # 2, the halves alternating from kernel to kernel (make check in 20 minutes;
            # every case still runs on the picked kernel and on some other one where the
            # CPU runs three or more)
            local other=0
            for isa in $kernels; do
                if [ "$isa" = "$picked" ]; then
                    run_suite "$label$name [$isa]" env ATTN_ISA="$isa" "$t"
                else
                    run_suite "$label$name [$isa, half]" env ATTN_ISA="$isa" ATTN_TEST_EVERY=2 \
                        ATTN_TEST_PHASE=$((other % 2)) "$t"
                    other=$((other + 1))
                fi
            done
            kernel_line "$label$name" "$kernels (a run each: $picked all cases, the others one in 2)$not_here"
        else
            run_suite "$label$name" "$t"
            if [[ " $EVERY_KERNEL_INSIDE " == *" $name "* ]]; then
                kernel_line "$label$name" "$kernels (each inside the suite)$not_here"
            else
                kernel_line "$label$name" "$picked (the one dispatch picks)"
            fi
        fi
    done
    run_suite "${label}test_cli.sh" bash tests/test_cli.sh "$b/attn"
    run_suite "${label}test_viz.sh" bash tests/test_viz.sh "$b/attn"   # attn viz's pictures
    run_suite "${label}test_files.sh" bash tests/test_files.sh "$b/attn"   # viz's, train's files
    run_suite "${label}test_demo.sh" bash tests/test_demo.sh "$b/attn"   # attn demo's sections
    # the installed library is linked into a plain program: not with a sanitized build
    [ -n "$label" ] || run_suite "test_install.sh" bash tests/test_install.sh "$b"
    # attn tune: one quick tune, its file and --show (timings are not checked; about 5 s)
    [ -n "$label" ] || run_suite "test_tune.sh" bash tests/test_tune.sh "$b/attn"
    # the bench's logic on its tiny sweep (timings are not checked; too slow under ASan)
    [ -n "$label" ] || run_suite "test_bench.sh" bash tests/test_bench.sh "$b/attn"
    # the 100K-token picture's benchmark at its quick 4096 tokens (peak memory bounded)
    [ -n "$label" ] || run_suite "test_bench_viz.sh" bash tests/test_bench_viz.sh "$b/attn"
}

timed "build" make -s -j"$jobs" all tests || { echo "0 passed, 1 failed"; exit 1; }
# The projections need a BLAS (scripts/deps.sh installs OpenBLAS): a build without one
# would skip their tests, so here it is a failure unless asked for.
if build/attn --version | grep -q '^BLAS: none$' && [ "${ATTN_CHECK_NO_BLAS:-0}" != 1 ]; then
    echo "build has no BLAS (run scripts/deps.sh, or ATTN_CHECK_NO_BLAS=1): counted as 1 failure"
    total_fail=$((total_fail + 1))
fi
run_all build ""
run_suite python bash tests/python/run.sh   # the Python package, built from this tree

# Ring attention over MPI (libattn_mpi, built where mpicc exists): its suite under mpirun
# with 1, 2, 3 and 4 processes, oversubscribed, one OpenMP thread each, shared memory
# only (btl self,vader: no network address is used).
if [ -x build/tests/mpi/test_ring ] && command -v mpirun >/dev/null 2>&1; then
    mpi_flags="--oversubscribe --bind-to none --mca btl self,vader"
    [ "$(id -u)" -ne 0 ] || mpi_flags="$mpi_flags --allow-run-as-root"
    for np in 1 2 3 4; do
        # shellcheck disable=SC2086
        run_suite "test_ring (mpirun -n $np)" env OMP_NUM_THREADS=1 \
            OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun $mpi_flags -n "$np" \
            build/tests/mpi/test_ring
    done
    # attn ring (build/attn-ring) on 1..4 processes against attn run
    run_suite "test_ring_cli.sh" env OMPI_MCA_btl_vader_single_copy_mechanism=none \
        bash tests/test_ring_cli.sh build/attn
    # the Python binding through mpi4py (skips with the reason where mpi4py is absent)
    run_suite "test_ring.py (mpirun -n 2)" env OMP_NUM_THREADS=1 \
        OMPI_MCA_btl_vader_single_copy_mechanism=none bash tests/python/run_ring.sh 2
else
    echo "== test_ring: skipped, no mpicc or mpirun (scripts/deps.sh installs Open MPI)"
fi

# The portable build on another CPU: on an x86-64 machine with an AArch64 cross compiler
# and qemu-user (scripts/deps.sh installs them), the library and the C suites are built
# for AArch64, where only the generic kernel exists, and run under emulation.
CROSS_SUITES="test_api test_kernels test_gemm test_edge test_npy test_forward test_half test_onnx test_backward test_backward_edge test_backward_half test_empty test_alias test_weights test_q8_0 test_kv_append_q8 test_fp8_q4 test_sinks test_sinks_backward test_dropout test_dropout_backward test_cascade test_weights_fast test_f64_masks test_fast_level test_varlen test_bias_grad test_mla test_varlen_paged test_key_scores test_u4 test_dense_kv"
if [ "${ATTN_CHECK_CROSS:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ]; then
    if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
        targets="build-arm64/libattn.a"
        for t in $CROSS_SUITES; do targets="$targets build-arm64/tests/$t"; done
        # shellcheck disable=SC2086
        if timed "build aarch64" make -s -j"$jobs" CC=aarch64-linux-gnu-gcc BUILD=build-arm64 BLAS=none $targets; then
            # the case matrices one case in 8: the build and the generic kernel on this
            # ISA are what this run tests; the matrices run in full natively. Each suite
            # is one emulated thread nearly all the time, so $jobs run at once, each into
            # a file of its own; their outputs, counts and stage lines then follow in order.
            qdir=$(mktemp -d)
            q0=$(date +%s)
            running=0
            for t in $CROSS_SUITES; do
                if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
                (
                    s0=$(date +%s.%N)
                    env QEMU_LD_PREFIX=/usr/aarch64-linux-gnu ATTN_TEST_EVERY=8 \
                        qemu-aarch64 "build-arm64/tests/$t" >"$qdir/$t.out" 2>&1
                    echo $? >"$qdir/$t.rc"
                    times >"$qdir/$t.cpu"  # this subshell's children: the suite alone
                    awk -v n="aarch64 (qemu) $t" -v a="$s0" -v b="$(date +%s.%N)" -v f="$qdir/$t.cpu" \
                        'BEGIN { getline l1 < f; getline l2 < f; split(l2, x, " ");
                                 split(x[1], u, /[ms]/); split(x[2], v, /[ms]/);
                                 printf "%8.1f %8.1f  %s\n", b - a, u[1] * 60 + u[2] + v[1] * 60 + v[2], n }' \
                        >"$qdir/$t.time"
                ) &
                running=$((running + 1))
            done
            wait
            for t in $CROSS_SUITES; do
                echo "== aarch64 (qemu) $t"
                cat "$qdir/$t.out"
                cat "$qdir/$t.time" >>"$times_file" 2>/dev/null
                count_suite "aarch64 (qemu) $t" "$(cat "$qdir/$t.rc" 2>/dev/null || echo 1)" "$qdir/$t.out"
            done
            echo "== aarch64 (qemu): $(wc -w <<<"$CROSS_SUITES") suites in $(($(date +%s) - q0)) s wall, $jobs at a time"
            rm -rf "$qdir"
        else
            echo "aarch64 cross build failed: counted as 1 failure"
            total_fail=$((total_fail + 1))
        fi
    else
        echo "== aarch64 (qemu): skipped, no aarch64-linux-gnu-gcc or qemu-aarch64 (scripts/deps.sh installs them)"
    fi
fi

if [ "${ATTN_CHECK_SANITIZE:-1}" != 0 ]; then
    san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    san="$san -DATTN_FAULT_INJECTION"
    # the library, the C suites and the command the shell suites run (no bench examples'
    # ring), every file at -O1, the kernels' own -O3 included
    if timed "build asan+ubsan" make -s -j"$jobs" BUILD=build-san OPT=-O1 SAN="$san" test-bins build-san/attn; then
        export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
        export UBSAN_OPTIONS=print_stacktrace=1
        # the case matrices one case in 4 under the sanitizers (every code path they reach
        # still runs; the full matrices run in the plain build): `make check` in 20 minutes
        export ATTN_TEST_EVERY=4
        run_all build-san "asan+ubsan "
        unset ATTN_TEST_EVERY
    else
        echo "sanitizer build failed: counted as 1 failure"
        total_fail=$((total_fail + 1))
    fi
fi

# shellcheck source=scripts/check_harden.sh
. scripts/check_harden.sh

echo
echo "== which kernels each C suite ran on this CPU"
cat "$kernels_file"
echo
echo "== per-stage times: wall s, CPU s (this run, $(nproc 2>/dev/null || echo ?) cores), longest first"
sort -rn "$times_file"
awk -v t="$(($(date +%s) - check_start))" 'BEGIN { printf "%8d s wall in all\n", t }'
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
