#!/bin/sh
# decode_ab.sh — the AVX2 decoding step of two or more commits side by side in one process
# (scripts/decode_ab.c, docs/KERNELS.md "The decoding step's P·V loop"). Each REV is a
# commit whose src/kernels/avx2/decode.c is built against this tree's headers, or WORK for
# the working tree's file; v0 is the first. Not run by make check.
#   scripts/decode_ab.sh HEAD~1 WORK [-- DTYPE BK ROUNDS G L HKV REPS]
#   NT=1 scripts/decode_ab.sh HEAD~1 WORK -- 0 64 21 4 256 1 200   # K and V in L2
#   PAGE=16 scripts/decode_ab.sh HEAD~1 WORK -- 0 64 9   # pages of 16, decode_rows
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
objs=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    if [ "$1" = WORK ]; then
        cp src/kernels/avx2/decode.c "$tmp/dec$n.c"
    else
        git show "$1:src/kernels/avx2/decode.c" > "$tmp/dec$n.c"
    fi
    ${CC:-cc} -O3 -mavx2 -mfma -mf16c -Isrc -Isrc/kernels/avx2 -Iinclude \
        -Dai_decode_avx2=dec_v$n -Dai_decode_qk_avx2=dqk_v$n \
        -Dai_decode_rows_avx2=drw_v$n -c "$tmp/dec$n.c" -o "$tmp/dec$n.o"
    objs="$objs $tmp/dec$n.o"
    n=$((n + 1))
    shift
done
[ $# -gt 0 ] && shift
if [ "$n" -lt 2 ] || [ "$n" -gt 6 ]; then
    echo "decode_ab.sh: 2 to 6 builds (REV or WORK), then -- and decode_ab's arguments" >&2
    exit 2
fi
# shellcheck disable=SC2086
${CC:-cc} -O2 -fopenmp -DNV=$n -Isrc -Iinclude scripts/decode_ab.c $objs -lm -o "$tmp/decode_ab"
"$tmp/decode_ab" "$@"
