#!/usr/bin/env bash
# test_ring_cli.sh — `attn ring` (tools/attn/cli_ring_exec.c → tools/mpi/attn_ring.c) under
#                    mpirun with 1 to 4 processes, against `attn run` on the same files.
#
# Usage: bash tests/test_ring_cli.sh [path/to/attn]      (default build/attn)
#
# For each case and each P: O (and the LSE) written by `mpirun -n P attn ring` against
# `attn run --reference` (the float64 path) at the contract's float32 tolerance
# (relative Frobenius error <= 1e-6 and max error <= 1e-5 (1 + max |ref|); a bfloat16 O
# within one bfloat16 unit), and `attn run`'s own fused O checked the same way: uneven
# lengths with GQA, causal zigzag on an odd length, a window with kv_len, softcap and a
# scale, a bottom-right window with Lq < Lk, --dtype bf16, and --reference (causal,
# P = 3). The comparison is shown rejecting a planted error of 1e-4 in one element. Refusals (P = 2): --mask (usage, 2),
# causal with Lq != Lk (library, 1), a missing input (1), an output naming an input (2),
# each with no output file left behind. Skips, with the reason, where mpirun, attn-ring
# or NumPy is missing.

. "$(dirname "$0")/lib.sh"
suite ring_cli
attn_arg "${1:-}"
skip() { echo "test_ring_cli.sh: skipped: $1"; echo "ring_cli: 0 passed, 0 failed (skipped)"; exit 0; }
command -v mpirun >/dev/null 2>&1 || skip "no mpirun (scripts/deps.sh installs Open MPI)"
[ -x "$(dirname "$ATTN")/attn-ring" ] || skip "no $(dirname "$ATTN")/attn-ring (built where mpicc exists)"
python3 -c 'import numpy' 2>/dev/null || skip "python3 has no NumPy"
tmp_dir cd

M="mpirun --oversubscribe --bind-to none --mca btl self,vader"
[ "$(id -u)" -ne 0 ] || M="$M --allow-run-as-root"
export OMP_NUM_THREADS=1

cat > cmp.py <<'EOF'
import sys
import numpy as np
# cmp.py GOT REF [bf16|plant]: exit 0 when GOT is within the float32 tolerance of REF
got, ref = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
mode = sys.argv[3] if len(sys.argv) > 3 else ''
if got.shape != ref.shape:
    sys.exit('shape %s against %s' % (got.shape, ref.shape))
if mode == 'plant' and got.size:
    got.flat[got.size // 2] += 1e-4
fin = np.isfinite(ref)
if (np.isfinite(got) != fin).any() or (got[~fin] != ref[~fin]).any():
    sys.exit('non-finite values differ')
g, r = got[fin], ref[fin]
err = np.abs(g - r)
if mode == 'bf16':
    ok = (err <= 2.0 ** -8 * np.abs(r) + 1e-6).all()
else:
    den = np.sqrt((r * r).sum())
    rel = np.sqrt((err * err).sum()) / (den if den > 0 else 1.0)
    ok = rel <= 1e-6 and (err.max(initial=0) <= 1e-5 * (1 + np.abs(r).max(initial=0)))
sys.exit(0 if ok else 'max error %.3g' % err.max(initial=0))
EOF

# make.py NAME B HQ HKV LQ LK D [kvlen...]: NAME_q/k/v.npy (and NAME_kvl.npy)
cat > make.py <<'EOF'
import sys
import numpy as np
n, B, Hq, Hkv, Lq, Lk, D = sys.argv[1], *map(int, sys.argv[2:8])
r = np.random.default_rng(Lq * 131 + Lk)
np.save(n + '_q.npy', r.standard_normal((B, Hq, Lq, D)).astype(np.float32))
np.save(n + '_k.npy', r.standard_normal((B, Hkv, Lk, D)).astype(np.float32))
np.save(n + '_v.npy', r.standard_normal((B, Hkv, Lk, D)).astype(np.float32))
if len(sys.argv) > 8:
    np.save(n + '_kvl.npy', np.array(list(map(int, sys.argv[8:])), dtype=np.int64))
EOF

# case NAME MODE OPTIONS...: the reference and attn run once, then attn ring on P = 1..4
case_() {
    local name=$1 mode=$2
    shift 2
    local files="--q ${name}_q.npy --k ${name}_k.npy --v ${name}_v.npy"
    if ! "$ATTN" run $files --out ${name}_ref.npy --lse ${name}_lref.npy --reference "$@" ||
       ! "$ATTN" run $files --out ${name}_run.npy "$@"; then
        bad "$name: attn run failed"
        return
    fi
    python3 cmp.py ${name}_run.npy ${name}_ref.npy $mode && ok || bad "$name: attn run against the reference"
    for P in 1 2 3 4; do
        rm -f ${name}_ring.npy ${name}_lring.npy
        if ! $M -n $P "$ATTN" ring $files --out ${name}_ring.npy --lse ${name}_lring.npy "$@" >out.txt 2>&1; then
            bad "$name P=$P: attn ring failed: $(head -3 out.txt)"
            continue
        fi
        python3 cmp.py ${name}_ring.npy ${name}_ref.npy $mode && ok || bad "$name P=$P: O"
        python3 cmp.py ${name}_lring.npy ${name}_lref.npy && ok || bad "$name P=$P: LSE"
    done
    # the comparison rejects a planted error in one element
    [ "$mode" = bf16 ] || { python3 cmp.py ${name}_ring.npy ${name}_ref.npy plant 2>/dev/null && bad "$name: planted error accepted" || ok; }
}

python3 make.py gqa 2 4 2 37 23 8
case_ gqa f32
python3 make.py causal 1 2 1 37 37 16
case_ causal f32 --causal
python3 make.py win 2 2 1 29 29 8 11 29
case_ win f32 --window 5,2 --kv-len win_kvl.npy --softcap 30 --scale 0.3
python3 make.py br 1 2 2 9 31 8
case_ br f32 --window 3,1 --align bottom-right
python3 make.py bf 1 2 1 26 26 16
case_ bf bf16 --causal --dtype bf16

# --reference: every block on the float64 path
rm -f causal_rr.npy
$M -n 3 "$ATTN" ring --q causal_q.npy --k causal_k.npy --v causal_v.npy --out causal_rr.npy --causal --reference >out.txt 2>&1 &&
    python3 cmp.py causal_rr.npy causal_ref.npy && ok || bad "--reference P=3: $(head -2 out.txt)"

# refusals: the exit status, a message, and no output left
refuse() {
    local want=$1 what=$2
    shift 2
    rm -f r_out.npy
    $M -n 2 "$ATTN" ring "$@" >out.txt 2>&1
    local rc=$?
    if [ $rc -ne $want ] || ! grep -q "attn: ring:\|attn: run:" out.txt || [ -e r_out.npy ]; then
        bad "$what: exit $rc (expected $want): $(head -2 out.txt)"
    else
        ok
    fi
}
F="--q gqa_q.npy --k gqa_k.npy --v gqa_v.npy"
refuse 2 "--mask" $F --out r_out.npy --mask gqa_q.npy
refuse 1 "causal with Lq != Lk" $F --out r_out.npy --causal
refuse 1 "a missing input" --q nothere.npy --k gqa_k.npy --v gqa_v.npy --out r_out.npy
refuse 2 "an output naming an input" $F --out gqa_k.npy --lse r_out.npy
# attn without attn-ring beside it: a usage exit and why
ATTN_RING=$T/none "$ATTN" ring $F --out r_out.npy 2>out.txt
rc=$?
[ $rc -eq 2 ] && grep -q "built without MPI" out.txt && [ ! -e r_out.npy ] && ok || bad "without attn-ring: exit $rc"

finish
