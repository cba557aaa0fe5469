#!/usr/bin/env bash
# test_viz.sh — tests of `attn viz` through its files: the PNG read back pixel by pixel
#               (tests/png_read.py) and the --grid .npy it drew from.
#
# Usage: bash tests/test_viz.sh [path/to/attn]      (default build/attn)
#
# What it covers: a causal 4 x 4 comes out lower-triangular in the image (masked cells in
# their own grey, the others coloured by their weight on the documented scale); a weight
# that underflows to 0 is white, not grey; the picture's size is one square of pixels a
# cell; every head gets its panel; token labels are drawn; a long call's blocks (sum and
# max) against the weights computed directly in float64 by NumPy; and the refusals (exit
# status 2 for usage, 1 for data, no picture left). Needs python3 with NumPy.

. "$(dirname "$0")/lib.sh"
suite viz
attn_arg "${1:-}"
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$ATTN" ] || ! python3 -c "import numpy" 2>/dev/null; then
    cannot_run "needs an executable attn ($ATTN) and python3 with NumPy"
fi
tmp_dir cd

# ---- vizh.py: inputs, the direct weights, and reading the picture back -----------------
cat > vizh.py <<EOF
import sys
sys.path.insert(0, '$HERE')
import numpy as np
import png_read

MASKED, FRAME = (180, 180, 180), (96, 96, 96)
ANCHORS = [0xFFFFFF, 0xA8C8F0, 0x3870C8, 0x102050]   # tools/attn/heatmap.c's colour scale

def colour(v, vmax=1.0):
    """heat_colour of heatmap.h, as documented: linear between four anchors."""
    t = min(max(v / vmax, 0.0), 1.0)
    seg = 2 if t >= 1 else int(t * 3)
    f = t * 3 - seg
    a, b = ANCHORS[seg], ANCHORS[seg + 1]
    return tuple(int(np.floor(((a >> s) & 255) + (((b >> s) & 255) - ((a >> s) & 255)) * f + 0.5))
                 for s in (16, 8, 0))

def panels(img):
    """The frames (grey 96) of the picture, left to right and top to bottom, as the
    (x0, y0, x1, y1) of the pixels inside them; the last one is the colour bar."""
    fr = np.all(img == FRAME, axis=2)
    seen, boxes = np.zeros_like(fr), []
    for y, x in zip(*np.nonzero(fr)):
        if seen[y, x]:
            continue
        x1 = x
        while x1 + 1 < fr.shape[1] and fr[y, x1 + 1]:
            x1 += 1
        y1 = y
        while y1 + 1 < fr.shape[0] and fr[y1 + 1, x]:
            y1 += 1
        if x1 - x >= 2 and y1 - y >= 2:
            seen[y:y1 + 1, x:x1 + 1] = True
            boxes.append((x + 1, y + 1, x1 - 1, y1 - 1))
        else:
            seen[y, x] = True
    return boxes

def cells(img, box, rows, cols):
    """The colour of each cell of a panel, a fifth of the way in from its top-left corner
    (its centre may hold its number), as a (rows, cols) list."""
    x0, y0, x1, y1 = box
    w, h = (x1 - x0 + 1) / cols, (y1 - y0 + 1) / rows
    return [[tuple(int(c) for c in img[int(y0 + (r + 0.2) * h), int(x0 + (k + 0.2) * w)])
             for k in range(cols)] for r in range(rows)]

def direct(q, k, causal=False, bias=None, scale=None):
    """softmax(scale q k^T + bias) in float64, per (b, h); -inf logits masked."""
    s = np.einsum('bhid,bhjd->bhij', q.astype(np.float64), k.astype(np.float64))
    s *= (1 / np.sqrt(q.shape[-1])) if scale is None else scale
    if bias is not None:
        s = s + bias
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    keep = s != -np.inf
    m = np.max(np.where(keep, s, -np.inf), axis=-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    l = p.sum(-1, keepdims=True)
    return np.divide(p, l, out=np.zeros_like(p), where=l > 0), keep

def blocks(p, keep, R, C, reduce):
    """p (Lq, Lk) folded into (R, C) cells: floor(i R / Lq), floor(j C / Lk); -inf where
    every entry is masked."""
    Lq, Lk = p.shape
    g = np.full((R, C), -np.inf)
    ri, cj = np.arange(Lq) * R // Lq, np.arange(Lk) * C // Lk
    for r in range(R):
        for c in range(C):
            sub, kp = p[ri == r][:, cj == c], keep[ri == r][:, cj == c]
            if kp.any():
                g[r, c] = sub[kp].sum() if reduce == 'sum' else sub[kp].max()
    return g
EOF

py() { python3 -c "import sys; sys.path.insert(0, '.'); from vizh import *; $1"; }

# ---- a causal 4 x 4, one head ------------------------------------------------------------
py "
r = np.random.default_rng(1)
for n in 'qkv': np.save(n + '.npy', r.standard_normal((1, 1, 4, 8), dtype=np.float32))
for n in 'qkv': np.save('h' + n + '.npy', r.standard_normal((2, 3, 4, 8), dtype=np.float32))
open('tok.txt', 'w').write('The\ncat\nsat\n \n')
"
if "$ATTN" viz --q q.npy --k k.npy --v v.npy --causal --png c.png --grid g.npy 2>err; then ok; else bad "causal 4x4: $(cat err)"; fi
out=$(py "
img = png_read.read('c.png')
b = panels(img)
P, keep = direct(np.load('q.npy'), np.load('k.npy'), causal=True)
g = np.load('g.npy')[0, 0]
col = cells(img, b[0], 4, 4)
bad = []
for i in range(4):
    for j in range(4):
        want = MASKED if j > i else colour(P[0, 0, i, j])
        if col[i][j] != want: bad.append('cell %d,%d: %s, want %s' % (i, j, col[i][j], want))
        if (j > i) != (g[i, j] == -np.inf): bad.append('grid %d,%d: %s' % (i, j, g[i, j]))
        if j <= i and abs(g[i, j] - P[0, 0, i, j]) > 1e-5: bad.append('weight %d,%d' % (i, j))
x0, y0, x1, y1 = b[0]
print('ok' if not bad else '; '.join(bad))
print(len(b), x1 - x0 + 1, y1 - y0 + 1, img.shape[1], img.shape[0])
")
[ "$(sed -n 1p <<<"$out")" = ok ] && ok || bad "causal 4x4 pixels: $(sed -n 1p <<<"$out")"
# one panel and the colour bar; 4 cells of 96 pixels a side (heat_cell_pixels: 420 / 4, at most 96)
read -r nbox pw ph iw ih <<<"$(sed -n 2p <<<"$out")"
[ "$nbox" = 2 ] && ok || bad "causal 4x4: $nbox frames, want the panel and the colour bar"
[ "$pw" = 384 ] && [ "$ph" = 384 ] && ok || bad "causal 4x4: panel ${pw}x${ph}, want 384x384"
[ "$iw" -gt 384 ] && [ "$ih" -gt 384 ] && ok || bad "causal 4x4: picture ${iw}x${ih}"

# ---- a weight of 0 is white, a masked one grey ---------------------------------------------
# scale 1000 drives every weight but the largest of each row to exactly 0; a bool mask
# masks the cells (0, 1) and (2, 3)
py "
m = np.ones((4, 4), bool); m[0, 1] = m[2, 3] = False
np.save('m.npy', m)
"
if "$ATTN" viz --q q.npy --k k.npy --v v.npy --mask m.npy --scale 1000 --png z.png --grid zg.npy 2>err; then ok; else bad "zero vs masked: $(cat err)"; fi
out=$(py "
img = png_read.read('z.png')
col = cells(img, panels(img)[0], 4, 4)
g = np.load('zg.npy')[0, 0]
bad = []
for i in range(4):
    for j in range(4):
        masked = (i, j) in ((0, 1), (2, 3))
        want = MASKED if masked else colour(g[i, j])
        if col[i][j] != want: bad.append('cell %d,%d: %s want %s' % (i, j, col[i][j], want))
zeros = sum(1 for i in range(4) for j in range(4) if g[i, j] == 0 and col[i][j] == (255, 255, 255))
print('ok' if not bad and zeros >= 6 else '; '.join(bad) + ' zeros=%d' % zeros)
")
[ "$out" = ok ] && ok || bad "zero weights white, masked grey: $out"

# ---- every head, and token labels ----------------------------------------------------------
if "$ATTN" viz --q hq.npy --k hk.npy --v hv.npy --causal --batch 1 --png h.png --tokens tok.txt 2>err; then ok; else bad "heads: $(cat err)"; fi
out=$(py "
img = png_read.read('h.png')
b = panels(img)
x0, y0 = b[0][0], b[0][1]
left = img[y0:y0 + 100, max(0, x0 - 60):x0 - 2]
print(len(b), int(np.all(left == 0, axis=2).sum() > 20))
")
[ "$out" = "4 1" ] && ok || bad "heads with tokens: frames and label ink '$out', want '4 1' (3 panels and the bar)"
if "$ATTN" viz --q hq.npy --k hk.npy --v hv.npy --head 2 --png h2.png 2>err; then ok; else bad "--head: $(cat err)"; fi
n=$(py "print(len(panels(png_read.read('h2.png'))))")
[ "$n" = 2 ] && ok || bad "--head 2: $n frames, want 2"

# ---- a longer call in blocks, against the direct weights ----------------------------------
py "
r = np.random.default_rng(2)
Lq, Lk = 150, 230
for n in 'qkv': np.save('l' + n + '.npy', r.standard_normal((1, 2, Lq if n == 'q' else Lk, 16), dtype=np.float32))
b = r.standard_normal((Lq, Lk)).astype(np.float32); b[r.random((Lq, Lk)) < 0.2] = -np.inf
b[:, 40:70] = -np.inf                    # whole blocks of keys masked
np.save('lb.npy', b)
"
for red in sum max; do
    if "$ATTN" viz --q lq.npy --k lk.npy --v lv.npy --mask lb.npy --causal --pixels 23 --reduce $red \
        --png l$red.png --grid l$red.npy 2>err; then ok; else bad "blocks $red: $(cat err)"; fi
    out=$(py "
q, k = np.load('lq.npy'), np.load('lk.npy')
P, keep = direct(q, k, causal=True, bias=np.load('lb.npy'))
g = np.load('l$red.npy')
bad = []
for h in range(2):
    want = blocks(P[0, h], keep[0, h], 23, 23, '$red')
    same_mask = np.array_equal(want == -np.inf, g[0, h] == -np.inf)
    fin = want != -np.inf
    err = np.max(np.abs(want[fin] - g[0, h][fin]))
    if not same_mask or not err <= 2e-5: bad.append('head %d: masks %s, max err %.3g' % (h, same_mask, err))
img = png_read.read('l$red.png')
bx = panels(img)[0]
col = cells(img, bx, 23, 23)
rows = np.bincount(np.arange(150) * 23 // 150)
shown = g[0, 0] / (rows[:, None] if '$red' == 'sum' else 1)
vmax = shown[np.isfinite(shown)].max()
wrong = sum(col[r][c] != (MASKED if shown[r, c] == -np.inf else colour(shown[r, c], vmax))
            for r in range(23) for c in range(23))
if wrong: bad.append('%d cells of the picture not in their colour' % wrong)
if (bx[2] - bx[0] + 1) % 23 or (bx[3] - bx[1] + 1) % 23: bad.append('panel %s not whole cells' % (bx,))
print('ok' if not bad else '; '.join(bad))
")
    [ "$out" = ok ] && ok || bad "blocks $red against the direct weights: $out"
done

# ---- the log colour scale: each cell at log(v / vmin) / log(vmax / vmin) of the same
# anchors, 0 and values below vmin white, masked grey; the bar's ends and its legend ------
cat >> vizh.py <<'EOF'

def colour_log(v, vmin, vmax):
    """heat_colour_log of heatmap.h: the anchors at t = log(v / vmin) / log(vmax / vmin)."""
    return colour(0.0 if not v > vmin else float(np.log(v / vmin) / np.log(vmax / vmin)))
EOF
for vmin in 1e-4 auto; do
    if "$ATTN" viz --q lq.npy --k lk.npy --v lv.npy --mask lb.npy --causal --pixels 23 --reduce max \
        --colour-scale log --vmin $vmin --vmax 0.5 --png log$vmin.png --grid log$vmin.npy 2>err; then ok; else bad "log scale: $(cat err)"; fi
    out=$(py "
g = np.load('log$vmin.npy')[0, 0]
fin = np.isfinite(g)
vmin = 1e-4 if '$vmin' != 'auto' else max(g[fin & (g > 0)].min(), 0.5e-6)
img = png_read.read('log$vmin.png')
bx = panels(img)
col = cells(img, bx[0], 23, 23)
wrong = sum(col[r][c] != (MASKED if g[r, c] == -np.inf else colour_log(float(g[r, c]), vmin, 0.5))
            for r in range(23) for c in range(23))
# the same cells on the linear scale would differ: the log scale is really drawn
lin = sum(col[r][c] != (MASKED if g[r, c] == -np.inf else colour(float(g[r, c]), 0.5))
          for r in range(23) for c in range(23))
x0, y0, x1, y1 = bx[-1]
ends = tuple(int(c) for c in img[y0, (x0 + x1) // 2]), tuple(int(c) for c in img[y1, (x0 + x1) // 2])
ink = int(np.all(img[y1 + 30:y1 + 48, x0:x0 + 60] == 0, axis=2).sum() > 20)   # 'log scale'
print('ok' if not wrong and lin > 50 and ends == ((16, 32, 80), (255, 255, 255)) and ink else
      'wrong %d, linear-different %d, bar ends %s, legend ink %d' % (wrong, lin, ends, ink))
")
    [ "$out" = ok ] && ok || bad "log scale, --vmin $vmin: $out"
done

# ---- a float mask of only 0s and 1s: a warning on stderr, the call still made --------------
py "np.save('m01.npy', np.tril(np.ones((4, 4), np.float32)))"
if "$ATTN" viz --q q.npy --k k.npy --v v.npy --mask m01.npy --png w.png 2>err && [ -e w.png ] &&
    grep -q "warning: m01.npy: a float32 mask of only 0s and 1s" err; then ok; else bad "0/1 float mask: no warning ($(cat err))"; fi
py "np.save('mhalf.npy', np.tril(np.ones((4, 4), np.float32)) * 0.5)"
"$ATTN" viz --q q.npy --k k.npy --v v.npy --mask mhalf.npy --png w.png 2>err
[ ! -s err ] && ok || bad "a float mask of 0 and 0.5 warned: $(cat err)"

# ---- refusals: exit status and no picture -------------------------------------------------
expect() {  # expect STATUS WHAT ARGS...: exit status, one line on stderr, no x.png
    local want=$1 what=$2
    shift 2
    rm -f x.png
    "$ATTN" viz "$@" 2>err >/dev/null
    local rc=$?
    if [ "$rc" = "$want" ] && [ "$(wc -l <err)" = 1 ] && [ ! -e x.png ]; then ok
    else bad "$what: exit $rc (want $want), stderr '$(cat err)', png $([ -e x.png ] && echo left || echo none)"; fi
}
expect 2 "missing --png" --q q.npy --k k.npy --v v.npy
expect 2 "missing --k" --q q.npy --v v.npy --png x.png
expect 2 "--reduce mean" --q q.npy --k k.npy --v v.npy --png x.png --reduce mean
expect 2 "--head out of range" --q q.npy --k k.npy --v v.npy --png x.png --head 1
expect 2 "--pixels 0" --q q.npy --k k.npy --v v.npy --png x.png --pixels 0
expect 2 "--vmax -1" --q q.npy --k k.npy --v v.npy --png x.png --vmax -1
expect 2 "an attn run option that viz does not take" --q q.npy --k k.npy --v v.npy --png x.png --out o.npy
expect 2 "--colour-scale cubic" --q q.npy --k k.npy --v v.npy --png x.png --colour-scale cubic
expect 2 "--vmin without the log scale" --q q.npy --k k.npy --v v.npy --png x.png --vmin 0.1
expect 2 "--vmin above vmax" --q q.npy --k k.npy --v v.npy --png x.png --colour-scale log --vmin 2
printf 'a\nb\n' > short.txt
expect 1 "tokens of the wrong count" --q q.npy --k k.npy --v v.npy --png x.png --tokens short.txt
expect 1 "a mask of the wrong shape" --q q.npy --k k.npy --v v.npy --png x.png --mask lb.npy

finish
