#!/usr/bin/env bash
# bit_identity.sh — whether two revisions of attn compute the same bytes: builds the `attn`
# command of each (in temporary worktrees, BLAS as the Makefile finds it), runs both on a
# fixed set of seeded cases through `attn run` (O, LSE and weights; every mask form, the
# dtypes, paged, GQA, softcap, ALiBi, windows, key lengths, the reference path; 1 and 2
# threads) and `attn demo`, and compares the output files byte for byte.
#
# Usage: bash scripts/bit_identity.sh REV_A [REV_B]     (REV_B: the working tree)
# Exit status: 0 every output the same bytes, 1 some differ (listed), 2 a build or run
# failed. For a change meant to move code and not arithmetic (issue 34's layout work):
# the bits must not move. What it is not: a test of correctness (the suite is).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: bash scripts/bit_identity.sh REV_A [REV_B]" >&2; exit 2; }
work=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$work/a" >/dev/null 2>&1;
      git -C "$here" worktree remove --force "$work/b" >/dev/null 2>&1; rm -rf "$work"' EXIT

build() {  # build REV DIR: the attn command of REV (the working tree when REV is empty)
    local rev=$1 dir=$2 src
    if [ -n "$rev" ]; then
        git -C "$here" worktree add -q --detach "$dir" "$rev" || return 1
        src=$dir
    else
        src=$here
    fi
    make -s -C "$src" -j"$(nproc)" BUILD="$dir.build" "$dir.build/attn" >"$dir.log" 2>&1 ||
        { echo "bit_identity: the build of ${rev:-the working tree} failed ($dir.log)" >&2; return 1; }
}
build "$1" "$work/a" || exit 2
build "${2:-}" "$work/b" || exit 2

# the inputs, from a fixed seed (NumPy)
python3 - "$work/in" <<'EOF' || exit 2
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
r = np.random.default_rng(20261203)
def save(name, x):
    np.save(os.path.join(d, name + ".npy"), x)
for name, (B, Hq, Hkv, Lq, Lk, D) in {"mha": (2, 4, 4, 130, 260, 32), "gqa": (2, 8, 2, 65, 300, 64),
                                       "dec": (3, 8, 2, 1, 2100, 128), "small": (1, 2, 1, 7, 9, 16)}.items():
    save(name + "_q", r.standard_normal((B, Hq, Lq, D)).astype(np.float32))
    save(name + "_k", r.standard_normal((B, Hkv, Lk, D)).astype(np.float32))
    save(name + "_v", r.standard_normal((B, Hkv, Lk, D)).astype(np.float32))
    save(name + "_bool", r.random((B, 1, Lq, Lk)) < 0.7)
    save(name + "_bias", r.standard_normal((1, Hq, Lq, Lk)).astype(np.float32))
    save(name + "_lens", np.array([max(1, Lk - 17 * b) for b in range(B)], np.int64))
    save(name + "_slopes", (0.1 * np.arange(1, Hq + 1)).astype(np.float32))
EOF

# the cases: a name, an input set and `attn run` options
cases=(
    "plain mha" "causal mha --causal" "bool mha --mask @bool" "bias mha --mask @bias"
    "br gqa --causal --align bottom-right" "window gqa --window 20,3" "lens gqa --kv-len @lens"
    "softcap gqa --softcap 5 --causal" "alibi mha --alibi @slopes --causal" "dec dec --kv-len @lens"
    "f16 gqa --dtype f16 --causal" "bf16 mha --dtype bf16" "f64 small --dtype f64 --causal"
    "ref small --reference --mask @bool" "fast gqa --dtype bf16 --precision fast"
)
status=0
for side in a b; do
    mkdir -p "$work/out_$side"
    for c in "${cases[@]}"; do
        read -r name set opts <<<"$c"
        opts=${opts//@/$work/in/${set}_}
        opts=$(sed -E 's#(/[^ ]*_(bool|bias|lens|slopes))#\1.npy#g' <<<"$opts")
        for t in 1 2; do
            o="$work/out_$side/${name}_t$t"
            # shellcheck disable=SC2086
            "$work/$side.build/attn" run --q "$work/in/${set}_q.npy" --k "$work/in/${set}_k.npy" \
                --v "$work/in/${set}_v.npy" --out "$o.o.npy" --lse "$o.lse.npy" --threads $t \
                $opts >/dev/null 2>"$o.err" ||
                { echo "bit_identity: $side: attn run $name failed: $(cat "$o.err")" >&2; status=2; }
        done
    done
    "$work/$side.build/attn" demo >"$work/out_$side/demo.txt" 2>&1 || status=2
done
[ $status = 0 ] || exit $status
differ=0 total=0
for f in "$work"/out_a/*; do
    [ "${f##*.}" = err ] && continue
    total=$((total + 1))
    if ! cmp -s "$f" "$work/out_b/$(basename "$f")"; then
        echo "differs: $(basename "$f")"
        differ=$((differ + 1))
    fi
done
echo "bit_identity: $((total - differ)) of $total outputs the same bytes (${1} against ${2:-the working tree})"
[ $differ = 0 ]
