#!/usr/bin/env bash
# test_cli.sh — tests of the `attn` command (mostly `attn run`) through its files and
#               exit codes, as an outside harness drives it.
#
# Usage: bash tests/test_cli.sh [path/to/attn]      (default build/attn)
#
# What it covers: answers on tiny cases checked against a pure-Python reference (and one
# against numbers worked by hand), every option's wiring, the --lse and --weights outputs,
# and each refusal: exit status 1 (data) or 2 (usage), exactly one line on stderr naming
# the file or option, and no output file left behind. What it is not: a numerical test
# of the library (tests/test_forward.c). Needs python3 only, not NumPy: the .npy files are
# made and read with the struct module.

. "$(dirname "$0")/lib.sh"
suite cli
attn_arg "${1:-}"
if [ ! -x "$ATTN" ] || ! command -v python3 >/dev/null; then
    cannot_run "needs an executable attn ($ATTN) and python3"
fi
tmp_dir cd

# ---- npyh.py: write, read and compute what .npy files should hold ----------------------
cat > npyh.py <<'EOF'
import ast, math, struct, sys

CODES = {'f4': 'f', 'f8': 'd', 'f2': 'e', 'i4': 'i', 'i8': 'q', 'b1': '?', 'u1': 'B'}

def write(path, descr, shape, values, fortran='False', hdr=None, cut=0, extra=0, ver=1):
    """A .npy file; hdr (a shape) lies in the header, cut/extra shorten/lengthen the data."""
    data = struct.pack(('>' if descr[0] == '>' else '<') + CODES[descr[1:]] * len(values), *values)
    data = data[:len(data) - cut] + b'\0' * extra
    shape = tuple(hdr if hdr is not None else shape)
    text = "{'descr': '%s', 'fortran_order': %s, 'shape': %r, }" % (descr, fortran, shape)
    pre = 10 if ver == 1 else 12
    text += ' ' * (63 - (pre + len(text)) % 64) + '\n'
    size = struct.pack('<H' if ver == 1 else '<I', len(text))
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY' + bytes([ver, 0]) + size + text.encode() + data)

def read(path):
    b = open(path, 'rb').read()
    assert b[:6] == b'\x93NUMPY', 'bad magic'
    n, pre = (struct.unpack('<H', b[8:10])[0], 10) if b[6] == 1 else (struct.unpack('<I', b[8:12])[0], 12)
    h = ast.literal_eval(b[pre:pre + n].decode())
    count = math.prod(h['shape'])
    code = CODES[h['descr'][1:]]
    return h, list(struct.unpack('<' + code * count, b[pre + n:]))

def attention(q, k, v, scale=None, mask=None, bias=None, causal=False, align='top-left',
              window=None, kvlen=None, slope=None, softcap=0.0):
    """One batch, one head, float64, the contract's definition: (O, P, LSE) as flat lists."""
    Lq, Lk, Dv = len(q), len(k), len(v[0])
    scale = 1 / math.sqrt(len(q[0])) if scale is None else scale
    lk = Lk if kvlen is None else kvlen
    O, P, LSE = [], [], []
    for i in range(Lq):
        d = i if align == 'top-left' else i + lk - Lq
        s = []
        for j in range(Lk):
            x = scale * sum(a * b for a, b in zip(q[i], k[j]))
            if softcap:
                x = softcap * math.tanh(x / softcap)
            x += (bias[i][j] if bias else 0) - (slope * abs(d - j) if slope is not None else 0)
            keep = j < lk and (mask is None or mask[i][j]) and (not causal or j <= d)
            if window:
                keep = keep and (window[0] < 0 or j >= d - window[0]) and (window[1] < 0 or j <= d + window[1])
            s.append(x if keep else -math.inf)
        m = max(s)
        if m == -math.inf:
            O += [0.0] * Dv; P += [0.0] * Lk; LSE.append(-math.inf)
            continue
        e = [math.exp(x - m) for x in s]
        p = [x / sum(e) for x in e]
        O += [sum(p[j] * v[j][c] for j in range(Lk)) for c in range(Dv)]
        P += p
        LSE.append(m + math.log(sum(e)))
    return O, P, LSE

def near(path, shape, want, tol):
    """exit 0 if the float32 (or, when tol >= 1e-3, float16) file has this shape and these
    values (to tol * (1 + |want|))."""
    h, got = read(path)
    kinds = ('<f4', '<f2') if tol >= 1e-3 else ('<f4',)
    if h['descr'] not in kinds or list(h['shape']) != shape or len(got) != len(want):
        sys.exit('%s: %s %s, expected <f4 %s' % (path, h['descr'], h['shape'], shape))
    for i, (g, w) in enumerate(zip(got, want)):
        if not (g == w or abs(g - w) <= tol * (1 + abs(w))):
            sys.exit('%s[%d] = %r, expected %r' % (path, i, g, w))

if __name__ == '__main__':
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == 'w':      # w PATH DESCR SHAPE VALUES [key=value ...]
        nums = [ast.literal_eval(x) for x in args[3].split(',') if x]
        kw = {k: ast.literal_eval(v) for k, v in (a.split('=', 1) for a in args[4:])}
        if 'fortran' in kw:
            kw['fortran'] = str(bool(kw['fortran']))
        write(args[0], args[1], [int(x) for x in args[2].split(',') if x], nums, **kw)
    elif cmd == 'check':  # check O.npy P.npy LSE.npy  PYTHON-DICT-OF-attention()-ARGS
        kw = eval(args[3], {'inf': math.inf})
        ref = attention(**kw)
        Lq, Lk, Dv = len(kw['q']), len(kw['k']), len(kw['v'][0])
        for path, shape, want in zip(args[:3], ([1, 1, Lq, Dv], [1, 1, Lq, Lk], [1, 1, Lq]), ref):
            if path != '-':
                near(path, shape, want, 1e-5)
    elif cmd == 'near':   # near PATH SHAPE VALUES TOL
        near(args[0], [int(x) for x in args[1].split(',')], [float(x) for x in args[2].split(',') if x], float(args[3]))
EOF

npy() { python3 npyh.py w "$@" || { echo "test_cli.sh: cannot write $1"; exit 1; }; }
fresh() { rm -rf out && mkdir out; }

# run_ok NAME PYTHON-DICT ATTN-ARGS... : succeeds, writes out/o.npy, out/p.npy, out/l.npy as
# attention(**DICT) says, prints nothing on stderr, leaves no temporary file
run_ok() {
    local name=$1 ref=$2
    shift 2
    fresh
    "$ATTN" run --out out/o.npy --weights out/p.npy --lse out/l.npy "$@" >stdout.txt 2>err.txt
    local rc=$?
    if [ $rc -ne 0 ]; then bad "$name: exit $rc: $(head -c 300 err.txt)"; return; fi
    if [ -s err.txt ]; then bad "$name: stderr not empty: $(head -c 300 err.txt)"; return; fi
    if [ "$(ls out)" != "$(printf 'l.npy\no.npy\np.npy')" ]; then bad "$name: out/ holds: $(ls out)"; return; fi
    local msg
    if msg=$(python3 npyh.py check out/o.npy out/p.npy out/l.npy "$ref" 2>&1); then ok; else bad "$name: $msg"; fi
}

# expect_fail NAME STATUS TEXT ATTN-ARGS... : exits with STATUS, one line on stderr that
# contains TEXT, no file in out/
expect_fail() {
    local name=$1 want=$2 text=$3
    shift 3
    fresh
    "$ATTN" "$@" >stdout.txt 2>err.txt
    local rc=$? lines
    lines=$(wc -l < err.txt)
    if [ $rc -ne "$want" ]; then bad "$name: exit $rc, expected $want: $(head -c 300 err.txt)"
    elif [ "$lines" -ne 1 ] || [ "$(head -c 6 err.txt)" != "attn: " ]; then
        bad "$name: stderr is not one 'attn: ' line: $(head -c 300 err.txt)"
    elif ! grep -qF -- "$text" err.txt; then bad "$name: stderr lacks '$text': $(cat err.txt)"
    elif [ -n "$(ls -A out)" ]; then bad "$name: left files: $(ls -A out)"
    else ok; fi
}

# ---- inputs ------------------------------------------------------------------------------
# The textbook case: keys (1,0), (0,1), values (10,0), (0,10), d = 2; query rows (2,0), (0,3).
npy q.npy '<f4' 1,1,2,2 2,0,0,3
npy k.npy '<f4' 1,1,2,2 1,0,0,1
npy v.npy '<f4' 1,1,2,2 10,0,0,10
BASE="'q': [[2,0],[0,3]], 'k': [[1,0],[0,1]], 'v': [[10,0],[0,10]]"
IN=(--q q.npy --k k.npy --v v.npy)

# ---- answers -----------------------------------------------------------------------------
# By hand: row 0 logits (2/sqrt 2, 0), p = 1/(1 + e^-1.41421) = 0.80442, o = (8.0442, 1.9558)
fresh
if "$ATTN" run "${IN[@]}" --out out/o.npy 2>err.txt &&
    msg=$(python3 npyh.py near out/o.npy 1,1,2,2 8.0442,1.9558,1.0704,8.9296 1e-4 2>&1); then ok
else bad "textbook case: $(cat err.txt) ${msg:-}"; fi
if [ "$(ls -A out)" = o.npy ]; then ok; else bad "only --out given, out/ holds: $(ls -A out)"; fi

run_ok "plain" "{$BASE}" "${IN[@]}"
run_ok "--reference" "{$BASE}" "${IN[@]}" --reference
run_ok "--threads 1" "{$BASE}" "${IN[@]}" --threads 1
run_ok "--causal" "{$BASE, 'causal': True}" "${IN[@]}" --causal
run_ok "--scale 0.25" "{$BASE, 'scale': 0.25}" "${IN[@]}" --scale 0.25
run_ok "--scale=-1.5e0" "{$BASE, 'scale': -1.5}" "${IN[@]}" --scale=-1.5e0
run_ok "--softcap 1" "{$BASE, 'softcap': 1.0}" "${IN[@]}" --softcap 1
run_ok "--window 0,0" "{$BASE, 'window': (0, 0)}" "${IN[@]}" --window 0,0
run_ok "--window -1,0" "{$BASE, 'window': (-1, 0)}" "${IN[@]}" --window -1,0

npy m_bool2d.npy '|b1' 2,2 1,0,1,1
run_ok "bool mask [Lq,Lk] broadcast" "{$BASE, 'mask': [[1,0],[1,1]]}" "${IN[@]}" --mask m_bool2d.npy
npy m_bool4d.npy '|b1' 1,1,2,2 0,1,1,0
run_ok "bool mask 4-D" "{$BASE, 'mask': [[0,1],[1,0]]}" "${IN[@]}" --mask m_bool4d.npy
npy m_none.npy '|b1' 1,2 0,0
run_ok "bool mask [1,Lk] all false: rows fully masked" "{$BASE, 'mask': [[0,0],[0,0]]}" "${IN[@]}" --mask m_none.npy
npy m_f1d.npy '<f4' 2 0.5,-1
run_ok "float mask [Lk] broadcast" "{$BASE, 'bias': [[0.5,-1],[0.5,-1]]}" "${IN[@]}" --mask m_f1d.npy
npy m_f3d.npy '<f4' 1,2,1 0,-1e999
run_ok "float mask [1,Lq,1] with -inf" "{$BASE, 'bias': [[0,0],[-inf,-inf]]}" "${IN[@]}" --mask m_f3d.npy

npy len1_i32.npy '<i4' 1 1
run_ok "--kv-len int32" "{$BASE, 'kvlen': 1}" "${IN[@]}" --kv-len len1_i32.npy
npy len0_i64.npy '<i8' 1 0
run_ok "--kv-len int64 0: all masked" "{$BASE, 'kvlen': 0}" "${IN[@]}" --kv-len len0_i64.npy
npy slopes.npy '<f4' 1 0.75
run_ok "--alibi" "{$BASE, 'slope': 0.75}" "${IN[@]}" --alibi slopes.npy

# one query row against two keys: the alignment decides what causal keeps
npy q1.npy '<f4' 1,1,1,2 2,0
Q1="'q': [[2,0]], 'k': [[1,0],[0,1]], 'v': [[10,0],[0,10]]"
run_ok "--causal top-left, Lq < Lk" "{$Q1, 'causal': True}" --q q1.npy --k k.npy --v v.npy --causal
run_ok "--causal --align bottom-right" "{$Q1, 'causal': True, 'align': 'bottom-right'}" \
    --q q1.npy --k k.npy --v v.npy --causal --align bottom-right
npy s2.npy '<f4' 1 2
run_ok "--alibi --align=bottom-right" "{$Q1, 'slope': 2.0, 'align': 'bottom-right'}" \
    --q q1.npy --k k.npy --v v.npy --alibi s2.npy --align=bottom-right

# no keys at all (Lk = 0): every row fully masked, O = 0, LSE = -inf, weights [.., 0]
npy k0.npy '<f4' 1,1,0,2 ""
npy v0.npy '<f4' 1,1,0,3 ""
fresh
if "$ATTN" run "${IN[@]:0:2}" --k k0.npy --v v0.npy --out out/o.npy --lse out/l.npy --weights out/p.npy 2>err.txt &&
    python3 npyh.py near out/o.npy 1,1,2,3 0,0,0,0,0,0 0 && python3 npyh.py near out/l.npy 1,1,2 -inf,-inf 0 &&
    python3 npyh.py near out/p.npy 1,1,2,0 "" 0; then ok; else bad "Lk = 0: $(cat err.txt)"; fi

# the library's format 2.0 and an existing output replaced
npy q_v2.npy '<f4' 1,1,2,2 2,0,0,3 ver=2
run_ok "format 2.0 input" "{$BASE}" --q q_v2.npy --k k.npy --v v.npy
fresh
echo stale > out/o.npy
if "$ATTN" run "${IN[@]}" --out out/o.npy 2>err.txt && python3 npyh.py near out/o.npy 1,1,2,2 8.0442,1.9558,1.0704,8.9296 1e-4 &&
    [ "$(ls -A out)" = o.npy ]; then ok; else bad "an existing output is replaced: $(cat err.txt)"; fi

# ---- 16-bit inputs: float16 .npy files, --dtype, --precision ------------------------------
# descr_is PATH DESCR: the .npy file's dtype
descr_is() { python3 -c "import sys; sys.path.insert(0, '.'); import npyh; h, _ = npyh.read('$1'); sys.exit(h['descr'] != '$2')"; }
npy k16.npy '<f2' 1,1,2,2 1,0,0,1
npy v16.npy '<f2' 1,1,2,2 10,0,0,10
npy q16.npy '<f2' 1,1,2,2 2,0,0,3
WANT=8.0442,1.9558,1.0704,8.9296
fresh
if "$ATTN" run --q q.npy --k k16.npy --v v16.npy --out out/o.npy 2>err.txt &&
    python3 npyh.py near out/o.npy 1,1,2,2 $WANT 1e-4 && descr_is out/o.npy '<f4'; then ok
else bad "float32 Q over a float16 K/V cache: $(cat err.txt)"; fi
fresh
if "$ATTN" run --q q16.npy --k k16.npy --v v16.npy --out out/o.npy 2>err.txt &&
    python3 npyh.py near out/o.npy 1,1,2,2 $WANT 1e-2 && descr_is out/o.npy '<f2'; then ok
else bad "all float16: a float16 O: $(cat err.txt)"; fi
for dt in f16 bf16 f32; do
    for prec in default fast; do
        fresh
        if "$ATTN" run "${IN[@]}" --out out/o.npy --dtype $dt --precision $prec 2>err.txt &&
            python3 npyh.py near out/o.npy 1,1,2,2 $WANT 5e-2; then ok
        else bad "--dtype $dt --precision $prec: $(cat err.txt)"; fi
    done
done
fresh
"$ATTN" run "${IN[@]}" --out out/o.npy --dtype f16 && descr_is out/o.npy '<f2' && ok || bad "--dtype f16 writes float16"
fresh
"$ATTN" run "${IN[@]}" --out out/o.npy --dtype bf16 && descr_is out/o.npy '<f4' && ok || bad "--dtype bf16 writes float32"
# float64: '<f8' Q, K, V (or --dtype f64) give '<f8' O and LSE, float32 weights, equal to the
# Python float64 reference to 1e-13 (the library's float64 error is a few eps64)
near64() {  # near64 O.npy LSE.npy P.npy PYTHON-DICT
    python3 - "$@" <<'PY'
import math, sys
sys.path.insert(0, '.')
import npyh
kw = eval(sys.argv[4], {'inf': math.inf})
O, P, L = npyh.attention(**kw)
for path, want, descr, tol in ((sys.argv[1], O, '<f8', 1e-13), (sys.argv[2], L, '<f8', 1e-13),
                               (sys.argv[3], P, '<f4', 1e-6)):
    h, got = npyh.read(path)
    if h['descr'] != descr or len(got) != len(want):
        sys.exit('%s: %s with %d values, expected %s with %d' % (path, h['descr'], len(got), descr, len(want)))
    for i, (g, w) in enumerate(zip(got, want)):
        if not (g == w or abs(g - w) <= tol * (1 + abs(w))):
            sys.exit('%s[%d] = %r, expected %r' % (path, i, g, w))
PY
}
npy q8.npy '<f8' 1,1,2,2 2,0,0,3
npy k8.npy '<f8' 1,1,2,2 1,0,0,1
npy v8.npy '<f8' 1,1,2,2 10,0,0,10
for extra in "" "--reference" "--causal"; do
    fresh
    ref="{$BASE}"; [ "$extra" = "--causal" ] && ref="{$BASE, 'causal': True}"
    if "$ATTN" run --q q8.npy --k k8.npy --v v8.npy --out out/o.npy --lse out/l.npy --weights out/p.npy $extra 2>err.txt &&
        msg=$(near64 out/o.npy out/l.npy out/p.npy "$ref" 2>&1); then ok
    else bad "float64 run $extra: $(cat err.txt) ${msg:-}"; fi
done
fresh
if "$ATTN" run "${IN[@]}" --out out/o.npy --lse out/l.npy --weights out/p.npy --dtype f64 2>err.txt &&
    msg=$(near64 out/o.npy out/l.npy out/p.npy "{$BASE}" 2>&1); then ok
else bad "--dtype f64: $(cat err.txt) ${msg:-}"; fi
expect_fail "--dtype f8" 2 "--dtype: expected f32, f16, bf16 or f64" run "${IN[@]}" --out out/o.npy --dtype f8
expect_fail "--precision high" 2 "--precision: expected default or fast" run "${IN[@]}" --out out/o.npy --precision high

# ---- refusals of data (exit 1) ----------------------------------------------------------
npy qf.npy '<f4' 1,1,2,2 2,0,0,3 fortran=1
expect_fail "Fortran order" 1 "qf.npy: fortran_order" run --q qf.npy --k k.npy --v v.npy --out out/o.npy
expect_fail "float64 keys under float32 q" 1 "k8.npy: dtype float64 but q.npy is float32" run --q q.npy --k k8.npy --v v.npy --out out/o.npy
expect_fail "float32 values under float64 q" 1 "v.npy: dtype float32 but q8.npy is float64" run --q q8.npy --k k8.npy --v v.npy --out out/o.npy
npy v16.npy '<f2' 1,1,2,2 10,0,0,10
expect_fail "float16 values under float32 keys" 1 "v16.npy: dtype float16, expected float32 like k.npy" run --q q.npy --k k.npy --v v16.npy --out out/o.npy
npy qi.npy '<i4' 1,1,2,2 2,0,0,3
expect_fail "int32 query" 1 "qi.npy: dtype int32, expected float32" run --q qi.npy --k k.npy --v v.npy --out out/o.npy
npy q3.npy '<f4' 1,2,2 2,0,0,3
expect_fail "rank 3 query" 1 "q3.npy: shape [1,2,2] has rank 3" run --q q3.npy --k k.npy --v v.npy --out out/o.npy
npy vt.npy '<f4' 1,1,2,2 10,0,0,10 cut=3
expect_fail "truncated data" 1 "vt.npy: truncated" run --q q.npy --k k.npy --v vt.npy --out out/o.npy
npy klie.npy '<f4' 1,1,2,2 1,0,0,1 hdr=1,1,4,2
expect_fail "header bigger than the data" 1 "klie.npy: truncated data: header says 32 bytes of data, file has 16" \
    run --q q.npy --k klie.npy --v v.npy --out out/o.npy
npy kx.npy '<f4' 1,1,2,2 1,0,0,1 extra=4
expect_fail "trailing bytes" 1 "kx.npy: trailing bytes" run --q q.npy --k kx.npy --v v.npy --out out/o.npy
npy kbe.npy '>f4' 1,1,2,2 1,0,0,1
expect_fail "big-endian" 1 "kbe.npy: big-endian" run --q q.npy --k kbe.npy --v v.npy --out out/o.npy
echo "not a npy file" > text.npy
expect_fail "not a .npy file" 1 "text.npy: not a .npy file" run --q text.npy --k k.npy --v v.npy --out out/o.npy
expect_fail "missing file" 1 "absent.npy: cannot open" run --q q.npy --k k.npy --v absent.npy --out out/o.npy
npy kd.npy '<f4' 1,1,2,1 1,0
expect_fail "Dk mismatch" 1 "kd.npy: shape [1,1,2,1] does not match q.npy [1,1,2,2] in dimension 3 (Dk)" \
    run --q q.npy --k kd.npy --v v.npy --out out/o.npy
npy v3.npy '<f4' 1,1,3,2 1,0,0,1,1,1
expect_fail "Lk mismatch" 1 "v3.npy: shape [1,1,3,2] does not match k.npy" run --q q.npy --k k.npy --v v3.npy --out out/o.npy
npy q3h.npy '<f4' 1,3,1,2 1,0,0,1,1,1
npy k2h.npy '<f4' 1,2,2,2 1,0,0,1,1,0,0,1
npy v2h.npy '<f4' 1,2,2,2 1,0,0,1,1,0,0,1
expect_fail "Hq not a multiple of Hkv" 1 "k2h.npy" run --q q3h.npy --k k2h.npy --v v2h.npy --out out/o.npy
npy m_bad.npy '|b1' 3,2 1,1,1,1,1,1
expect_fail "mask shape" 1 "m_bad.npy: shape [3,2] does not broadcast" run "${IN[@]}" --mask m_bad.npy --out out/o.npy
npy m_i4.npy '<i4' 2,2 1,1,1,1
expect_fail "mask dtype" 1 "m_i4.npy: dtype int32, expected bool or float32" run "${IN[@]}" --mask m_i4.npy --out out/o.npy
npy len3.npy '<i4' 1 3
expect_fail "--kv-len beyond Lk" 1 "len3.npy" run "${IN[@]}" --kv-len len3.npy --out out/o.npy
npy lenf.npy '<f4' 1 1
expect_fail "--kv-len float" 1 "lenf.npy: dtype float32" run "${IN[@]}" --kv-len lenf.npy --out out/o.npy
npy len2.npy '<i8' 2 1,1
expect_fail "--kv-len [2] for B = 1" 1 "len2.npy: shape [2]" run "${IN[@]}" --kv-len len2.npy --out out/o.npy
npy sl2.npy '<f4' 2 1,1
expect_fail "--alibi [2] for Hq = 1" 1 "sl2.npy: shape [2]" run "${IN[@]}" --alibi sl2.npy --out out/o.npy
expect_fail "output directory missing" 1 "out/none/o.npy" run "${IN[@]}" --out out/none/o.npy
# an output whose directory does not exist is refused before anything is written
expect_fail "--weights unwritable" 1 "out/none/p.npy" run "${IN[@]}" --out out/o.npy --lse out/l.npy --weights out/none/p.npy
fresh
echo keep > out/o.npy
"$ATTN" run --q qf.npy --k k.npy --v v.npy --out out/o.npy 2>/dev/null
if [ "$(cat out/o.npy)" = keep ] && [ "$(ls -A out)" = o.npy ]; then ok; else bad "a failed run touched an existing output"; fi

# ---- usage errors (exit 2) -------------------------------------------------------------
OUT=(--out out/o.npy)
expect_fail "missing --out" 2 "--out" run "${IN[@]}"
expect_fail "missing --k" 2 "--k" run --q q.npy --v v.npy "${OUT[@]}"
expect_fail "unknown option" 2 "--frobnicate" run "${IN[@]}" "${OUT[@]}" --frobnicate
expect_fail "stray argument" 2 "extra.npy" run "${IN[@]}" "${OUT[@]}" extra.npy
expect_fail "option without its value" 2 "--out" run "${IN[@]}" --out
expect_fail "option followed by an option" 2 "--q" run --q --k k.npy --v v.npy "${OUT[@]}"
expect_fail "option given twice" 2 "--q" run "${IN[@]}" --q q.npy "${OUT[@]}"
expect_fail "flag with a value" 2 "--causal" run "${IN[@]}" "${OUT[@]}" --causal=yes
expect_fail "--lse same as --out" 2 "--lse: out/o.npy is the same file as --out" run "${IN[@]}" "${OUT[@]}" --lse out/o.npy
for bad_scale in 1.5x "" nan inf -inf 1e39 " 1" 0x; do
    expect_fail "--scale '$bad_scale'" 2 "--scale" run "${IN[@]}" "${OUT[@]}" --scale "$bad_scale"
done
for bad_window in 3 a,b -2,0 1,-5 1,2,3 "1, 2" 1.5,2 , 99999999999999999999,1; do
    expect_fail "--window '$bad_window'" 2 "--window: expected LEFT,RIGHT integers >= -1, got '$bad_window'" \
        run "${IN[@]}" "${OUT[@]}" --window "$bad_window"
done
for bad_softcap in -1 x nan; do
    expect_fail "--softcap '$bad_softcap'" 2 "--softcap" run "${IN[@]}" "${OUT[@]}" --softcap "$bad_softcap"
done
for bad_threads in -1 2x "" 1.5 9999999999; do
    expect_fail "--threads '$bad_threads'" 2 "--threads" run "${IN[@]}" "${OUT[@]}" --threads "$bad_threads"
done
expect_fail "--align middle" 2 "--align" run "${IN[@]}" "${OUT[@]}" --align middle
expect_fail "unknown command" 2 "frobnicate" frobnicate
expect_fail "no command" 2 "command"

# ---- files: a run never loses a user's file (docs/CLI.md, "Files") ----------------------
# refused STATUS TEXT NAME ATTN-ARGS... : exits STATUS with one 'attn: ' line holding TEXT
# (out/ is not emptied first: the checks after it look at what is there)
refused() {
    local want=$1 text=$2 name=$3
    shift 3
    "$ATTN" "$@" >stdout.txt 2>err.txt
    local rc=$?
    if [ $rc -ne "$want" ]; then bad "$name: exit $rc, expected $want: $(head -c 300 err.txt)"
    elif [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -qF -- "$text" err.txt; then
        bad "$name: stderr is not one line with '$text': $(head -c 300 err.txt)"
    else ok; fi
}
# same CONTENT FILE...: each FILE still holds what CONTENT holds, and out/ has no temporary
same() {
    local ref=$1 f
    shift
    for f in "$@"; do cmp -s "$ref" "$f" || { bad "$f changed"; return; }; done
    if ls -A out | grep -q tmp; then bad "temporary files left: $(ls -A out)"; else ok; fi
}
cp q.npy keep_q.npy
echo keep > keep.txt
fresh
refused 2 "same file" "--lse ./o.npy beside --out o.npy" run "${IN[@]}" --out out/o.npy --lse ./out/o.npy
if [ -z "$(ls -A out)" ]; then ok; else bad "same-file refusal left: $(ls -A out)"; fi
refused 2 "same file" "--weights through out/../out" run "${IN[@]}" --out out/o.npy --weights out/../out/o.npy
fresh
cp q.npy out/q.npy
refused 2 "is the input --q" "--out an input" run --q out/q.npy --k k.npy --v v.npy --out out/q.npy
same keep_q.npy out/q.npy
refused 1 "/nonexistent/l.npy" "--out an input, --lse unwritable" run --q out/q.npy --k k.npy --v v.npy --out out/o.npy --lse /nonexistent/l.npy
same keep_q.npy out/q.npy
ln out/q.npy out/hard.npy
refused 2 "is the input --q" "--out a hard link to an input" run --q out/q.npy --k k.npy --v v.npy --out out/hard.npy
ln -s q.npy out/soft.npy
refused 2 "is the input --q" "--out a symbolic link to an input" run --q out/q.npy --k k.npy --v v.npy --out out/soft.npy
same keep_q.npy out/q.npy
# an output already there, a later output failing as it is written (file size limit):
# the earlier output and the file already there are as they were
fresh
cp keep.txt out/o.npy
npy q64.npy '<f4' 1,1,64,2 $(python3 -c "print(','.join(['1'] * 128))")
npy k64.npy '<f4' 1,1,64,2 $(python3 -c "print(','.join(['1'] * 128))")
npy v64.npy '<f4' 1,1,64,2 $(python3 -c "print(','.join(['1'] * 128))")
(trap '' XFSZ; ulimit -f 4; "$ATTN" run --q q64.npy --k k64.npy --v v64.npy --out out/o.npy \
    --weights out/p.npy >stdout.txt 2>err.txt)
rc=$?
if [ $rc -eq 1 ] && grep -q "out/p.npy" err.txt; then ok; else bad "write failure of --weights: exit $rc: $(cat err.txt)"; fi
same keep.txt out/o.npy
if [ "$(ls -A out)" = o.npy ]; then ok; else bad "after a failed write out/ holds: $(ls -A out)"; fi
# a symbolic link as --out: written through to the file it names; the link stays
fresh
cp keep.txt out/real.npy
chmod 640 out/real.npy
ln -s real.npy out/link.npy
if "$ATTN" run "${IN[@]}" --out out/link.npy 2>err.txt && [ -L out/link.npy ] &&
    python3 npyh.py near out/real.npy 1,1,2,2 8.0442,1.9558,1.0704,8.9296 1e-4 >/dev/null 2>&1 &&
    [ "$(stat -c %a out/real.npy)" = 640 ]; then ok
else bad "--out a symbolic link: $(cat err.txt); $(ls -l out)"; fi
ln -s nowhere.npy out/dangling.npy
refused 1 "does not exist" "--out a dangling link" run "${IN[@]}" --out out/dangling.npy
if [ -L out/dangling.npy ] && [ ! -e out/nowhere.npy ]; then ok; else bad "dangling link touched"; fi
# special files: never replaced as outputs, never opened as inputs
fresh
mkfifo out/fifo.npy
refused 1 "FIFO" "--out a FIFO" run "${IN[@]}" --out out/fifo.npy
refused 1 "not a regular file" "--q a FIFO (must not block)" run --q out/fifo.npy --k k.npy --v v.npy --out out/o.npy
refused 1 "not a regular file" "--mask a directory" run "${IN[@]}" --mask out --out out/o.npy
if [ -p out/fifo.npy ] && [ ! -e out/o.npy ]; then ok; else bad "FIFO run: out/ holds $(ls -l out)"; fi
if [ "$(id -u)" = 0 ] && mknod out/null c 1 3 2>/dev/null; then dev=out/null; else dev=/dev/null; fi
refused 1 "character device" "--out a character device" run "${IN[@]}" --out "$dev"
if [ -c "$dev" ]; then ok; else bad "$dev is no longer a character device"; fi
refused 1 "character device" "--q a character device" run --q "$dev" --k k.npy --v v.npy --out out/o.npy
# sizes other than 0 whose product does not fit in int64: refused, no o.npy NumPy cannot load
fresh
npy q_huge.npy '<f4' 0,1099511627776,1099511627776,4 ""
npy k_one.npy '<f4' 0,1,1,4 ""
refused 1 "overflows" "q of [0, 2^40, 2^40, 4]" run --q q_huge.npy --k k_one.npy --v k_one.npy --out out/o.npy
if [ -z "$(ls -A out)" ]; then ok; else bad "huge empty q left: $(ls -A out)"; fi

# ---- a paged cache: --block-table ------------------------------------------------------
# Page pools K [num_pages, Hkv, page_size, Dk], V [.., Dv] and a table int32 [B, max_pages]
# (paged.py, from npyh.py's writer; no NumPy), the pages in a shuffled order, NaN in every
# slot no valid key occupies (spare pages, the tail of the last page) and -1 in the table
# past the pages in use. The same keys gathered into a contiguous K, V [B, Hkv, Lk, D]: the
# paged run must write what the contiguous run writes (O, LSE, weights), and O as the
# pure-Python reference says.
cat > paged.py <<'EOF'
import math, random, struct, sys
import npyh

B, HKV, HQ, DK, DV, PS, MAXP, NP = 2, 1, 2, 4, 3, 3, 3, 7
LENS = [8, 4]                     # b 0 ends inside its third page, b 1 on a boundary + 1
TABLE = [[5, 0, 3], [6, 2, -1]]   # pages 1 and 4 spare
LK = MAXP * PS

def flat(x):
    return [v for r in x for v in (flat(r) if isinstance(r, list) else [r])]

def make():
    rnd = random.Random(15)
    nan = float('nan')
    pool = {c: [[[[nan] * D for _ in range(PS)] for _ in range(HKV)] for _ in range(NP)]
            for c, D in (('k', DK), ('v', DV))}
    cont = {c: [[[[0.0] * D for _ in range(LK)] for _ in range(HKV)] for _ in range(B)]
            for c, D in (('k', DK), ('v', DV))}
    for b in range(B):
        for j in range(LENS[b]):
            for g in range(HKV):
                for c, D in (('k', DK), ('v', DV)):
                    row = [round(rnd.uniform(-2, 2), 3) for _ in range(D)]
                    pool[c][TABLE[b][j // PS]][g][j % PS] = row
                    cont[c][b][g][j] = row
    q = [[[[round(rnd.uniform(-1, 1), 3) for _ in range(DK)] for _ in range(2)] for _ in range(HQ)]
         for _ in range(B)]
    npyh.write('pq.npy', '<f4', [B, HQ, 2, DK], flat(q))
    npyh.write('pk.npy', '<f4', [NP, HKV, PS, DK], flat(pool['k']))
    npyh.write('pv.npy', '<f4', [NP, HKV, PS, DV], flat(pool['v']))
    npyh.write('ck.npy', '<f4', [B, HKV, LK, DK], flat(cont['k']))
    npyh.write('cv.npy', '<f4', [B, HKV, LK, DV], flat(cont['v']))
    npyh.write('bt.npy', '<i4', [B, MAXP], flat(TABLE))
    npyh.write('plen.npy', '<i4', [B], LENS)
    # misuse: an entry of a valid page past the pool, a float table, a table for B = 3,
    # V pools of another page count, K pools of page size 0
    npyh.write('bt_big.npy', '<i4', [B, MAXP], [5, NP, 3, 6, 2, -1])
    npyh.write('bt_f.npy', '<f4', [B, MAXP], flat(TABLE))
    npyh.write('bt_b3.npy', '<i4', [3, MAXP], flat(TABLE) + [0, 0, 0])
    npyh.write('pv6.npy', '<f4', [NP - 1, HKV, PS, DV], [0.5] * ((NP - 1) * HKV * PS * DV))
    npyh.write('pk0.npy', '<f4', [NP, HKV, 0, DK], [])
    npyh.write('pv0.npy', '<f4', [NP, HKV, 0, DV], [])
    npyh.write('plen10.npy', '<i4', [B], [10, 4])

def check(path, causal):
    """O of the paged run against the pure-Python reference over the gathered keys."""
    _, q = npyh.read('pq.npy')
    _, k = npyh.read('ck.npy')
    _, v = npyh.read('cv.npy')
    want = []
    for b in range(B):
        for h in range(HQ):
            g = h // (HQ // HKV)
            qs = [q[((b * HQ + h) * 2 + i) * DK:][:DK] for i in range(2)]
            ks = [k[((b * HKV + g) * LK + j) * DK:][:DK] for j in range(LK)]
            vs = [v[((b * HKV + g) * LK + j) * DV:][:DV] for j in range(LK)]
            want += npyh.attention(qs, ks, vs, kvlen=LENS[b], causal=causal, align='bottom-right')[0]
    npyh.near(path, [B, HQ, 2, DV], want, 1e-5)

if __name__ == '__main__':
    if sys.argv[1] == 'make':
        make()
    else:
        check(sys.argv[2], sys.argv[1] == 'causal')
EOF
python3 paged.py make || { echo "test_cli.sh: paged.py make failed"; exit 1; }
PIN=(--q pq.npy --k pk.npy --v pv.npy --block-table bt.npy --kv-len plen.npy)
CIN=(--q pq.npy --k ck.npy --v cv.npy --kv-len plen.npy)
# paged_same NAME ARGS...: the paged and the contiguous run (ARGS added to both) write the
# same bytes: O, LSE and weights
paged_same() {
    local name=$1
    shift
    rm -rf out outc && mkdir out outc
    if ! "$ATTN" run "${PIN[@]}" "$@" --out out/o.npy --lse out/l.npy --weights out/p.npy 2>err.txt ||
        [ -s err.txt ]; then bad "$name: paged run: $(head -c 300 err.txt)"; return; fi
    if ! "$ATTN" run "${CIN[@]}" "$@" --out outc/o.npy --lse outc/l.npy --weights outc/p.npy 2>err.txt; then
        bad "$name: contiguous run: $(head -c 300 err.txt)"; return; fi
    local f
    for f in o l p; do
        if cmp -s "out/$f.npy" "outc/$f.npy"; then ok; else bad "$name: $f.npy paged != contiguous (bytes)"; fi
    done
}
paged_same "--block-table --reference" --reference
paged_same "--block-table --reference --causal bottom-right" --reference --causal --align bottom-right
# the fused path: a decoding-shaped block (4 query rows) on tiles that cross pages, read
# page by page in place: the reference's tolerance, not bits (docs/CONTRACT.md)
for c in plain causal; do
    fresh
    extra=()
    [ $c = causal ] && extra=(--causal --align bottom-right)
    if "$ATTN" run "${PIN[@]}" "${extra[@]}" --out out/o.npy 2>err.txt && [ ! -s err.txt ] &&
        msg=$(python3 paged.py $c out/o.npy 2>&1); then ok
    else bad "--block-table fused ($c): $(head -c 300 err.txt) ${msg:-}"; fi
done
# a prefill-shaped call (8 query rows of one head, no decoding split): bit for bit
npy pq8.npy '<f4' 2,1,8,4 $(python3 -c "print(','.join(str(((i * 7) % 11 - 5) / 4) for i in range(64)))")
rm -rf out outc && mkdir out outc
if "$ATTN" run --q pq8.npy --k pk.npy --v pv.npy --block-table bt.npy --kv-len plen.npy --causal \
        --align bottom-right --out out/o.npy 2>err.txt &&
    "$ATTN" run --q pq8.npy --k ck.npy --v cv.npy --kv-len plen.npy --causal --align bottom-right \
        --out outc/o.npy 2>>err.txt && cmp -s out/o.npy outc/o.npy; then ok
else bad "--block-table, Hq = Hkv, Lq = 8: paged != contiguous: $(head -c 300 err.txt)"; fi
# misuse: one line naming the file, exit 1 (2 for a file named twice), no output
expect_fail "--block-table entry past the pool" 1 "bt_big.npy: element [0][1] is 7" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table bt_big.npy --kv-len plen.npy --out out/o.npy
expect_fail "--block-table -1 read without --kv-len" 1 "bt.npy: element [1][2] is -1" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table bt.npy --out out/o.npy
expect_fail "--block-table float32" 1 "bt_f.npy: dtype float32, expected int32" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table bt_f.npy --kv-len plen.npy --out out/o.npy
expect_fail "--block-table for B = 3" 1 "bt_b3.npy: shape [3,3], expected [B, max_pages] with B = 2" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table bt_b3.npy --kv-len plen.npy --out out/o.npy
expect_fail "--block-table, V of 6 pages" 1 "pv6.npy: shape [6,1,3,3] does not match pk.npy [7,1,3,4] in dimension 0 (num_pages)" \
    run --q pq.npy --k pk.npy --v pv6.npy --block-table bt.npy --kv-len plen.npy --out out/o.npy
expect_fail "--block-table, page size 0" 1 "pk0.npy: shape [7,1,0,4]: a page size (dimension 2) of 0" \
    run --q pq.npy --k pk0.npy --v pv0.npy --block-table bt.npy --kv-len plen.npy --out out/o.npy
expect_fail "--block-table, --kv-len past max_pages * page_size" 1 "plen10.npy: element 0 is 10, expected 0 <= length <= Lk = 9" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table bt.npy --kv-len plen10.npy --out out/o.npy
expect_fail "--block-table, --dtype f64 (the float64 path takes no pages)" 1 "block" \
    run "${PIN[@]}" --dtype f64 --out out/o.npy
expect_fail "--block-table also --out" 2 "bt.npy" run "${PIN[@]}" --out bt.npy
expect_fail "--block-table missing file" 1 "absent_bt.npy" \
    run --q pq.npy --k pk.npy --v pv.npy --block-table absent_bt.npy --out out/o.npy
if python3 -c "import npyh; h, d = npyh.read('bt.npy'); assert d == [5, 0, 3, 6, 2, -1]"; then ok
else bad "--block-table also --out: bt.npy changed"; fi

# ---- help and version ------------------------------------------------------------------
if "$ATTN" --version >stdout.txt 2>err.txt && grep -qE '^attn [0-9]+\.[0-9]+\.[0-9]+ \(kernel [a-z0-9]+; this CPU runs:( [a-z0-9]+)+\)$' stdout.txt; then ok
else bad "--version: $(cat stdout.txt err.txt)"; fi
if "$ATTN" --version >stdout.txt 2>err.txt && grep -qE '^BLAS: .+$' stdout.txt; then ok
else bad "--version names no BLAS: $(cat stdout.txt err.txt)"; fi
# --kernels: one "name runs|cannot-run" a line, generic last and runnable, and the kernels
# that run are exactly those --version lists
if "$ATTN" --kernels >stdout.txt 2>err.txt && [ ! -s err.txt ] &&
    ! grep -qvE '^[a-z0-9_]+ (runs|cannot-run)$' stdout.txt && [ "$(tail -n 1 stdout.txt)" = "generic runs" ] &&
    [ "$(awk '$2 == "runs" { printf " %s", $1 }' stdout.txt)" = "$("$ATTN" --version | head -n 1 | sed -E 's/.*this CPU runs:([^)]*)\).*/\1/')" ]; then ok
else bad "--kernels: $(cat stdout.txt err.txt)"; fi
for h in --help help; do
    if "$ATTN" $h >stdout.txt 2>err.txt && grep -q run stdout.txt && [ ! -s err.txt ]; then ok; else bad "attn $h"; fi
done
if "$ATTN" run --help >stdout.txt 2>err.txt && grep -q -- --window stdout.txt && [ ! -s err.txt ]; then ok
else bad "attn run --help"; fi

# ---- seq2seq: a short run trains, prints its loss and writes a PNG -------------------------
if "$ATTN" seq2seq --steps 20 --len 6 --out s2s.png >stdout.txt 2>err.txt &&
    grep -q "step    20  loss" stdout.txt && grep -q "held-out" stdout.txt &&
    [ "$(head -c 4 s2s.png | od -An -tx1 | tr -d ' ')" = "89504e47" ]; then ok
else bad "attn seq2seq --steps 20: $(tail -3 stdout.txt err.txt)"; fi
expect_fail "seq2seq --len 1" 2 "--len" seq2seq --len 1

finish
