#!/usr/bin/env bash
# test_files.sh — the file rules (docs/CLI.md, "Files"; tools/attn/cli_files.c) for every
#                 command that writes files beside `attn run`: `attn viz` (--png, --grid),
#                 `attn train` (--png, --viz DIR), the pictures of demo and seq2seq and
#                 `attn bench masks --json-out`.
#
# Usage: bash tests/test_files.sh [path/to/attn]      (default build/attn)
#
# What it covers: an output that is an input or another output (by path, hard link,
# symbolic link) refused with exit 2; an existing output that is a FIFO refused with
# exit 1 without blocking; a failed write (a file size limit, a missing directory) that
# leaves every file as it was, the outputs written before it included, and no temporary
# file — also under a plain `ulimit -f`, whose SIGXFSZ would otherwise kill the command
# mid-write; `attn train` exiting 1 when its picture cannot be written; token files
# with lines longer than any buffer. attn run's own cases are in tests/test_cli.sh.
# Needs python3 with NumPy.

. "$(dirname "$0")/lib.sh"
suite files
attn_arg "${1:-}"
if [ ! -x "$ATTN" ] || ! python3 -c "import numpy" 2>/dev/null; then
    cannot_run "needs an executable attn ($ATTN) and python3 with NumPy"
fi
tmp_dir cd

python3 -c "
import numpy as np
r = np.random.default_rng(1)
for n in 'qkv': np.save(n + '.npy', r.standard_normal((1, 1, 4, 8), dtype=np.float32))
for n in 'qkv': np.save(n + '64.npy', r.standard_normal((1, 1, 64, 8), dtype=np.float32))
open('tok.txt', 'w').write('The\ncat\nsat\n \n')
open('d.txt', 'w').write(''.join(r.choice(list('abcdefgh \n'), 2000)))
"
IN=(--q q.npy --k k.npy --v v.npy)
IN64=(--q q64.npy --k k64.npy --v v64.npy)
TRAIN=(--steps 2 --batch 2 --ctx 8 --d-model 8 --heads 1 --layers 1 --sample 0 --eval-every 1
       --mask causal --quiet)
echo keep > keep.txt

# refused STATUS TEXT NAME ATTN-ARGS...: exits STATUS (within 20 s: a FIFO must not block)
# with one 'attn' line on stderr holding TEXT
refused() {
    local want=$1 text=$2 name=$3
    shift 3
    timeout 20 "$ATTN" "$@" >stdout.txt 2>err.txt </dev/null
    local rc=$?
    if [ $rc -ne "$want" ]; then bad "$name: exit $rc, expected $want: $(head -c 300 err.txt)"
    elif [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -qF -- "$text" err.txt; then
        bad "$name: stderr is not one line with '$text': $(head -c 300 err.txt)"
    else ok; fi
}
# kept NAME FILE...: each FILE still holds what keep.txt holds (or its saved copy
# FILE.keep when there is one), and out/ has no temporary file
kept() {
    local name=$1 f
    shift
    for f in "$@"; do
        local ref=keep.txt
        [ -e "$f.keep" ] && ref=$f.keep
        cmp -s "$ref" "$f" || { bad "$name: $f changed or removed"; return; }
    done
    if ls -A out | grep -q tmp; then bad "$name: temporary files left: $(ls -A out)"; else ok; fi
}
fresh() { rm -rf out; mkdir out; }
# a fresh out/ with these files already there, holding keep.txt
primed() { fresh; local f; for f in "$@"; do cp keep.txt "$f"; done; }
# the attn command under a file size limit of $1 blocks (the default SIGXFSZ)
under_limit() { local blocks=$1; shift; (ulimit -f "$blocks"; exec "$ATTN" "$@" >stdout.txt 2>err.txt); }

# ---- an output that is an input or another output: exit 2, nothing written ------------------
fresh
cp q.npy out/q.npy
cp q.npy out/q.npy.keep
cp k.npy out/k.npy
cp k.npy out/k.npy.keep
refused 2 "is the input --q" "viz --png its own --q" viz --q out/q.npy --k k.npy --v v.npy --png out/q.npy
refused 2 "is the input --k" "viz --grid its own --k" viz --q q.npy --k out/k.npy --v v.npy --png out/x.png --grid out/k.npy
kept "viz output = input" out/q.npy out/k.npy
refused 2 "same file" "viz --png X --grid X" viz "${IN[@]}" --png out/x.npy --grid out/x.npy
refused 2 "same file" "viz --png X --grid ./X" viz "${IN[@]}" --png out/x.png --grid ./out/../out/x.png
[ -z "$(ls -A out | grep -v '^[qk]\.npy')" ] && ok || bad "same-file refusal left: $(ls -A out)"
cp tok.txt out/tok.txt
cp tok.txt out/tok.txt.keep
refused 2 "is the input --tokens" "viz --png its --tokens" viz "${IN[@]}" --tokens out/tok.txt --png out/tok.txt
ln out/q.npy out/hard.png
refused 2 "is the input --q" "viz --png a hard link to --q" viz --q out/q.npy --k k.npy --v v.npy --png out/hard.png
ln -s q.npy out/soft.png
refused 2 "is the input --q" "viz --png a symbolic link to --q" viz --q out/q.npy --k k.npy --v v.npy --png out/soft.png
kept "viz output = input, links" out/q.npy out/tok.txt
cp d.txt out/d.txt
cp d.txt out/d.txt.keep
refused 2 "is the input --data" "train --png its --data" train --data out/d.txt --png out/d.txt "${TRAIN[@]}"
kept "train --png = --data" out/d.txt
# --viz DIR's files are outputs too: DIR/tokens.txt is read as text when DIR is --data
fresh
cp d.txt out/d.txt
cp keep.txt out/tokens.txt
refused 2 "is the input --data" "train --viz DIR over its --data DIR" train --data out --viz out --png none "${TRAIN[@]}"
kept "train --viz = --data" out/tokens.txt

# ---- existing outputs that are not regular files: refused, exit 1, never blocking -----------
fresh
mkfifo out/fifo
refused 1 "FIFO" "viz --png a FIFO" viz "${IN[@]}" --png out/fifo
refused 1 "FIFO" "viz --grid a FIFO" viz "${IN[@]}" --png out/x.png --grid out/fifo
refused 1 "not a regular file" "viz --tokens a FIFO (an input: must not block)" viz "${IN[@]}" --tokens out/fifo --png out/x.png
refused 1 "FIFO" "train --png a FIFO" train --data d.txt --png out/fifo "${TRAIN[@]}"
# refused before the work (a million steps, the full bench would pass the 20 s limit)
refused 1 "FIFO" "seq2seq --out a FIFO" seq2seq --steps 1000000 --len 6 --out out/fifo
refused 1 "FIFO" "bench masks --json-out a FIFO" bench masks --json-out out/fifo
refused 1 "FIFO" "bench --json-out a FIFO" bench --json-out out/fifo
refused 1 "FIFO" "demo --png a FIFO" demo --png out/fifo
if [ -p out/fifo ] && [ "$(ls -A out)" = fifo ]; then ok; else bad "FIFO runs: out/ holds $(ls -l out)"; fi
if "$ATTN" bench masks --quick --reps 1 --json-out out/b.json >stdout.txt 2>err.txt &&
    python3 -c "import json; json.load(open('out/b.json'))"; then ok
else bad "bench masks --json-out: $(cat err.txt)"; fi

# ---- a failed write leaves every file as it was and no temporary ----------------------------
# the picture cannot be written (its directory does not exist): the grid is not replaced
fresh
cp keep.txt out/g.npy
refused 1 "/nonexistent/x.png" "viz --png in a missing directory, --grid existing" viz "${IN[@]}" --png /nonexistent/x.png --grid out/g.npy
kept "viz: a picture that cannot be written" out/g.npy
# a file size limit (SIGXFSZ ignored) as the picture is written: the picture already there
# and the grid written before it stay as they were (the 4 x 4 grid fits in 2 KiB, the PNG does not)
fresh
cp keep.txt out/pic.png
cp keep.txt out/g.npy
(trap '' XFSZ; ulimit -f 2; exec "$ATTN" viz "${IN[@]}" --png out/pic.png --grid out/g.npy >stdout.txt 2>err.txt)
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < err.txt)" -eq 1 ] && ok || bad "viz, a write over the size limit: exit $rc: $(cat err.txt)"
kept "viz: a failed PNG write" out/pic.png out/g.npy
# the same, with the default SIGXFSZ (a plain ulimit -f): exit 1, not killed; no temporary
primed out/pic.png out/g.npy
under_limit 2 viz "${IN[@]}" --png out/pic.png --grid out/g.npy
rc=$?
[ $rc -eq 1 ] && ok || bad "viz under a plain ulimit -f: exit $rc (want 1, not killed): $(cat err.txt)"
kept "viz under a plain ulimit -f" out/pic.png out/g.npy
# a grid over the limit (64 x 64 float32: 16 KiB), plain ulimit -f
primed out/g.npy
under_limit 8 viz "${IN64[@]}" --png out/pic.png --grid out/g.npy
rc=$?
[ $rc -eq 1 ] && grep -q "out/g.npy" err.txt && ok || bad "viz --grid under a plain ulimit -f: exit $rc: $(cat err.txt)"
kept "viz --grid under a plain ulimit -f" out/g.npy
[ ! -e out/pic.png ] && ok || bad "viz --grid under a plain ulimit -f: the picture was written"
# attn run, plain ulimit -f: --weights 64 x 64 float32 fails; --out already there stays
primed out/o.npy
under_limit 8 run "${IN64[@]}" --out out/o.npy --weights out/p.npy
rc=$?
[ $rc -eq 1 ] && grep -q "out/p.npy" err.txt && ok || bad "run under a plain ulimit -f: exit $rc: $(cat err.txt)"
kept "run under a plain ulimit -f" out/o.npy
[ "$(ls -A out)" = o.npy ] && ok || bad "run under a plain ulimit -f: out/ holds $(ls -A out)"
# attn train: a picture that cannot be written is a failure (exit 1), the one there stays
fresh
refused 1 "/nonexistent/x.png" "train --png in a missing directory" train --data d.txt --png /nonexistent/x.png "${TRAIN[@]}"
cp keep.txt out/pic.png
cp keep.txt out/tokens.txt
(ulimit -f 2; exec "$ATTN" train --data d.txt --png out/pic.png --viz out "${TRAIN[@]}" >stdout.txt 2>err.txt)
rc=$?
[ $rc -eq 1 ] && grep -q "out/pic.png" err.txt && ok || bad "train under a plain ulimit -f: exit $rc: $(cat err.txt)"
kept "train under a plain ulimit -f (picture and --viz files)" out/pic.png out/tokens.txt
[ "$(ls -A out | sort | tr '\n' ' ')" = "pic.png tokens.txt " ] && ok || bad "train, failed: out/ holds $(ls -A out)"
# and when all can be written, all are
fresh
if "$ATTN" train --data d.txt --png out/pic.png --viz out "${TRAIN[@]}" >stdout.txt 2>err.txt &&
    [ "$(head -c 4 out/pic.png | od -An -tx1 | tr -d ' ')" = 89504e47 ] && [ -s out/layer0_q.npy ] &&
    [ "$(wc -l < out/tokens.txt)" -ge 2 ]; then ok; else bad "train --png --viz: $(cat err.txt); $(ls -A out)"; fi
kept "train, done" 
if "$ATTN" viz "${IN[@]}" --png out/pic.png --grid out/g.npy 2>err.txt &&
    [ "$(head -c 4 out/pic.png | od -An -tx1 | tr -d ' ')" = 89504e47 ] && [ -s out/g.npy ]; then ok
else bad "viz --png --grid over existing files: $(cat err.txt)"; fi

# ---- --tokens: lines of any length -----------------------------------------------------------
python3 -c "open('long.txt', 'w').write('The\n' + 'x' * 5000 + '\n' + 'y' * 9000 + '\n \n')"
if "$ATTN" viz "${IN[@]}" --tokens long.txt --png out/long.png 2>err.txt && [ -s out/long.png ]; then ok
else bad "--tokens with lines of 5000 and 9000 characters: $(cat err.txt)"; fi

finish
