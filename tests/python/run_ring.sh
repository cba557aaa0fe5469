#!/usr/bin/env bash
# run_ring.sh — tests/python/test_ring.py (attn.ring through mpi4py) under mpirun on N
# processes (default 2), as scripts/check.sh runs it; closes with "python_ring: N passed,
# N failed" summed over the processes. Skips, with the reason, without mpirun, mpi4py or
# build/libattn_mpi.so. --noconftest: the ring module is loaded from the tree by its path
# when the attn package is not built (conftest.py imports it).
#
# Usage: bash tests/python/run_ring.sh [N]
set -u
cd "$(dirname "$0")/../.."
np=${1:-2}
skip() { echo "test_ring.py: skipped: $1"; echo "python_ring: 0 passed, 0 failed (skipped)"; exit 0; }
command -v mpirun >/dev/null 2>&1 || skip "no mpirun"
python3 -c 'import mpi4py' 2>/dev/null || skip "mpi4py is not installed (scripts/deps.sh installs it)"
[ -f build/libattn_mpi.so ] || skip "no build/libattn_mpi.so (built where mpicc exists)"
flags="--oversubscribe --bind-to none --mca btl self,vader"
[ "$(id -u)" -ne 0 ] || flags="$flags --allow-run-as-root"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
ATTN_MPI_LIB=$PWD/build/libattn_mpi.so OMP_NUM_THREADS=1 mpirun $flags -n "$np" \
    python3 -m pytest -q -rs -p no:cacheprovider --noconftest --color=no tests/python/test_ring.py 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
passed=0 failed=0
while read -r line; do
    p=$(grep -oE '[0-9]+ passed' <<<"$line" | cut -d' ' -f1)
    f=0
    for x in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | cut -d' ' -f1); do f=$((f + x)); done
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
done < <(grep -E '(passed|failed|error|skipped).* in [0-9.]+s' "$out")
[ "$rc" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
echo "python_ring: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
