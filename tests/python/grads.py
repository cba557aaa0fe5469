"""grads.py — what the autograd suites share (test_autograd.py, test_autograd_half.py,
test_autograd_torch.py): the float64 NumPy reference of the gradients, the float32
tolerance of a gradient, the naive 16-bit backward that is the yardstick of the 16-bit
gradients, and calls of the extension's raw backward.

The reference (reference_grads, below) is the textbook backward of the contract's
formula, written here from the float64 forward of oracle.py's masks:
    dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(dO ∘ O)) [∘ (1 − tanh²) under softcap],
    dQ = scale dS K,  dK = scale dSᵀ Q,
summed over the query heads of a group (GQA) and over any broadcast batch or head
dimension; a fully masked row has P = 0 and so contributes 0. It is itself checked
against central finite differences of oracle.reference (float64, relative error < 1e-6).

Tolerance of a float32 gradient against it (grad_failure): the contract's float32 one
(max error <= 1e-5 (1 + max|ref|), relative Frobenius error <= 1e-6), or — for a gradient
that is a near-total cancellation, the same rule as tests/test_backward.c — the error
model's worst case element by element: when ‖mag‖ >= 100 ‖ref‖ (mag the gradient computed
over absolute values, float32 sums err by about u·Σ|terms|, not u·|Σ terms|),
|got − ref| <= eps·mag with eps from grad_eps (the port of backward_case.h's). The check is
shown to reject planted errors.

16-bit gradients (float16, bfloat16; the library computes in float32 and rounds each
gradient once to its dtype): against the float64 gradient of the same 16-bit values, max
error <= 2 x that of naive_grads — a NumPy backward computing in the 16-bit type, every
materialized step rounded, as tests/test_backward_half.c defines it — plus
2^-22 (1 + max|g|) (half_grad_failure; raw float16 arrays always, ml_dtypes' bfloat16 where
installed).
"""
import numpy as np
import pytest

from attn import _attn
from oracle import (TOL_EXP_ULP, TOL_U32, _as4d, _setup, round_to, tol_dot_rel, tol_lse_bound,
                    tol_sum_rel, tolerance_failure)

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None
    F = None
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch is not installed: autograd against PyTorch's SDPA backward "
    "is skipped (the raw backward is checked against the NumPy float64 reference)")

ALIGN = {"top-left": 0, "bottom-right": 1}
PATH = {"auto": 0, "fused": 1, "reference": 2}


# ---- the float64 reference of the gradients ------------------------------------------------

def _sum_to(g, shape4, groups=1):
    """g (B, H, L, D) summed back to an input's 4-D shape: first the GQA groups (query head
    h read key/value head h // groups: consecutive heads form a group), then every batch or
    head dimension the input had as 1."""
    if groups > 1:
        B, H, L, D = g.shape
        g = g.reshape(B, H // groups, groups, L, D).sum(axis=2)
    for d in (0, 1):
        if shape4[d] == 1 and g.shape[d] != 1:
            g = g.sum(axis=d, keepdims=True)
    return g


def _softmax64(q4, k4, scale, masked, bias, softcap):
    """(P, d s / d raw) in float64 of _setup's arrays: the contract's softmax of the logits
    (softcap, then bias, then the masks), a fully masked row 0; the derivative 1 without
    softcap."""
    B, H, Lq, Lk = masked.shape
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        raw = scale * np.einsum("bhid,bhjd->bhij", q4, k4)
        dcap = 1.0
        s = raw
        if softcap:
            c = float(np.float32(softcap))
            t = np.tanh(raw / c)
            s, dcap = c * t, 1.0 - t * t           # d s / d raw = 1 - tanh²
        if bias is not None:
            s = s + bias
        s = np.where(masked, -np.inf, s)
        m = s.max(axis=-1, keepdims=True) if Lk else np.full((B, H, Lq, 1), -np.inf)
        full = np.isneginf(m)
        e = np.exp(s - np.where(full, 0.0, m))
        p = np.where(full, 0.0, e / np.where(full, 1.0, e.sum(axis=-1, keepdims=True)))
    return p, dcap


def _logit_mag(q4, k4, scale, masked, bias, softcap):
    """A (tolerance.h): the largest logit magnitude |scale| Σ|q k| + |bias| + softcap over
    the unmasked logits."""
    with np.errstate(invalid="ignore", over="ignore"):
        a = abs(scale) * (np.abs(q4) @ np.abs(np.swapaxes(k4, -1, -2)))
        if bias is not None:
            a = a + np.where(np.isfinite(bias), np.abs(bias), 0.0)
        a = a + (float(np.float32(softcap)) if softcap else 0.0)
        a = np.where(masked | ~np.isfinite(a), 0.0, a)
    return float(a.max()) if a.size else 0.0


def reference_grads(q, k, v, d_o, mask=None, causal=False, scale=None, gqa=False,
                    align="top-left", window=None, softcap=0.0, alibi=None, kv_len=None):
    """((dq, dk, dv), (mag_q, mag_k, mag_v)) in float64, each of the shape of its input;
    mag_* is the same gradient computed over absolute values (the float32 error scale)."""
    rank, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                   window, alibi, kv_len, np.float64)
    B, H, Lq, Lk = masked.shape
    do4 = np.broadcast_to(_as4d(d_o).astype(np.float64), (B, H, Lq, v4.shape[3]))
    p, dcap = _softmax64(q4, k4, scale, masked, bias, softcap)
    o = p @ v4
    dv4 = np.swapaxes(p, -1, -2) @ do4                                   # dV = Pᵀ dO
    dp = do4 @ np.swapaxes(v4, -1, -2)                                   # dP = dO Vᵀ
    ds = p * (dp - (do4 * o).sum(axis=-1, keepdims=True)) * dcap        # dS
    dq4 = scale * ds @ k4                                                # dQ = scale dS K
    dk4 = scale * np.swapaxes(ds, -1, -2) @ q4                           # dK = scale dSᵀ Q
    adp = np.abs(do4) @ np.abs(np.swapaxes(v4, -1, -2))                 # |dP| = Σ|dO||v|
    ads = p * (adp + (p * adp).sum(axis=-1, keepdims=True))             # P (|dP| + |D|)
    mq4 = abs(scale) * ads @ np.abs(k4)
    mk4 = abs(scale) * np.swapaxes(ads, -1, -2) @ np.abs(q4)
    mv4 = np.swapaxes(p, -1, -2) @ np.abs(do4)

    Hkv = max(_as4d(k).shape[1], _as4d(v).shape[1])
    groups = H // Hkv if gqa else 1
    A = _logit_mag(q4, k4, scale, masked, bias, softcap)
    D, Dv = q4.shape[3], v4.shape[3]
    out = []
    for n, (g4, x, grp) in enumerate(((dq4, q, 1), (dk4, k, groups), (dv4, v, groups),
                                      (mq4, q, 1), (mk4, k, groups), (mv4, v, groups))):
        shape4 = _as4d(x).shape
        g = _sum_to(g4, shape4, grp).reshape(np.shape(x))
        if n >= 3:   # a magnitude: carries its gradient's relative bound
            terms = Lk if n == 3 else Lq * (B * H // max(shape4[0] * shape4[1], 1))
            g = g.view(Magnitude)
            g.eps = grad_eps(A, D, Dv, Lk, terms, softcap, dv=n == 5)
        out.append(g)
    return tuple(out[:3]), tuple(out[3:])


class Magnitude(np.ndarray):
    """A gradient computed over absolute values, with eps: the relative bound (to it) of a
    float32 backward's error on that gradient (grad_eps)."""
    eps = None

    def __array_finalize__(self, obj):
        self.eps = getattr(obj, "eps", None)


def grad_eps(A, Dk, Dv, Lk, terms, softcap, dv):
    """tests/support/backward_case.h's grad_eps: the relative bound, to its magnitude, on
    the error of a gradient of a float32 backward meeting the error model — P = exp(s - lse)
    with the logit's and the float32 LSE's bounds, O's error in D = dO . O, the dP and D
    dots, softcap's factor; then the gradient's sum of `terms` products (Lk for dQ, the
    rows summed into a key for dK and dV). dV's is P's, not dS's."""
    u, E = TOL_U32, TOL_EXP_ULP
    eP = (Dk + 5.0) * u * A + tol_lse_bound(Dk, Lk, A) + (2 * E + 1) * u
    eO = eP + tol_sum_rel(Lk) + 2 * u
    eS = 2 * tol_dot_rel(Dv) + eO + eP + 4 * u
    if softcap:
        eS += (Dk + 2.0) * u * A / float(np.float32(softcap)) + (4 * E + 2) * u
    return (eP if dv else eS) + tol_sum_rel(terms) + 2 * u


def reference_bias_grad(q, k, v, d_o, mask, causal=False, scale=None, gqa=False,
                        align="top-left", window=None, softcap=0.0):
    """(d_mask, mag, eps) for a float mask (a bias, any broadcast shape): the gradient of
    the final logit, P (dP - D) — the bias is added after the scale and softcap, so neither
    multiplies it — summed to the mask's shape (right-aligned, as it broadcasts); mag the
    same over P (|dP| + |D|); eps the relative bound (to mag) of a float32 backward's
    error on it (backward_case.h's dbias_eps: dS's error model before softcap and the
    scale, + 2u, + the float32 sum of the logits an element gathers)."""
    rank, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                   window, None, None, np.float64)
    B, H, Lq, Lk = masked.shape
    do4 = np.broadcast_to(_as4d(d_o).astype(np.float64), (B, H, Lq, v4.shape[3]))
    p = _softmax64(q4, k4, scale, masked, bias, softcap)[0]
    A = _logit_mag(q4, k4, scale, masked, bias, softcap)
    o = p @ v4
    dp = do4 @ np.swapaxes(v4, -1, -2)
    g = p * (dp - (do4 * o).sum(axis=-1, keepdims=True))
    adp = np.abs(do4) @ np.abs(np.swapaxes(v4, -1, -2))
    gm = p * (adp + (p * adp).sum(axis=-1, keepdims=True))
    shape = np.shape(mask)
    m4 = (1,) * (4 - len(shape)) + tuple(shape)
    axes = tuple(d for d in range(4) if m4[d] == 1 and g.shape[d] != 1)
    d_mask = g.sum(axis=axes, keepdims=True).reshape(shape)
    mag = gm.sum(axis=axes, keepdims=True).reshape(shape)
    u, E, D, Dv = TOL_U32, TOL_EXP_ULP, q4.shape[3], v4.shape[3]
    eP = (D + 5.0) * u * A + tol_lse_bound(D, Lk, A) + (2 * E + 1) * u
    eO = eP + tol_sum_rel(Lk) + 2 * u
    n = g.size // max(int(np.prod(m4)), 1)
    eps = 2 * tol_dot_rel(Dv) + eO + eP + 4 * u + 2 * u + tol_sum_rel(n)
    return d_mask, mag, eps


def large_logits(smax):
    """How much the float32 bounds widen for logits up to smax in magnitude: a float32
    logit carries a rounding error of about |s| 2^-24 before any kernel touches it, which
    moves its weight by that much relatively (docs/CONTRACT.md, "Precision"): 1 while that
    stays under the contract's 1e-6 (|s| <= 16.7), |s| 2^-24 / 1e-6 beyond."""
    return max(1.0, smax * 2.0 ** -24 / 1e-6)


def grad_failure(got, ref, mag, smax=0.0):
    """None when the float32 gradient got is within tolerance of ref (module docstring);
    smax: the largest |logit| of the call, for large_logits."""
    widen = large_logits(smax)
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    why = tolerance_failure(got, ref) if widen == 1.0 else tolerance_failure(
        ref + (got - ref) / widen, ref)
    if why is None:
        return None
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return why
    nm, nr = np.linalg.norm(mag), np.linalg.norm(ref)
    if not nm >= 100 * nr:   # not a cancellation: the contract's verdict stands
        return why
    eps = getattr(mag, "eps", None)
    if eps is None:
        return why + " (a cancellation, but no bound came with its magnitude)"
    bound = eps * widen * np.asarray(mag, np.float64) + 2.0 ** -126
    ratio = np.abs(got - ref) / bound
    if ratio.max() > 1.0:
        return "cancellation: an error %.3g of its derived bound (eps %.3g of the magnitude)" % (
            ratio.max(), eps)
    return None


def assert_grads(got, ref, mag, what=""):
    for name, g, r, m in zip(("dq", "dk", "dv"), got, ref, mag):
        if g is None:
            continue
        why = grad_failure(g, r, m)
        assert why is None, "%s%s: %s" % (what, name, why)


# ---- calling the raw backward --------------------------------------------------------------

def raw_call(q, k, v, d_o, mask=None, causal=False, scale=None, gqa=False, align="top-left",
             window=None, softcap=0.0, alibi=None, kv_len=None, path="auto", threads=0,
             grads=None, grad_mask=None):
    """_attn.forward (with its LSE) then _attn.backward with the same options; returns
    (dq, dk, dv) written into fresh float32 arrays of the inputs' shapes (or into grads)."""
    opts = dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa,
                align=ALIGN[align], window=window, softcap=softcap, alibi_slopes=alibi,
                kv_len=kv_len, path=PATH[path], precision=0, threads=threads)
    out, lse, _ = _attn.forward(q, k, v, return_lse=True, return_weights=False,
                                alloc=lambda shape, which, dt: np.empty(shape, np.float32),
                                **opts)
    if grads is None:
        grads = tuple(np.full(np.shape(x), np.nan, np.float32) for x in (q, k, v))
    _attn.backward(q, k, v, out, d_o, lse, *grads, **opts, grad_attn_mask=grad_mask)
    return grads


def max_logit(q, k, v, scale=None, gqa=False):
    """The largest |scale q·k| of a call (for large_logits)."""
    _, q4, k4, _, scale, masked, _ = _setup(q, k, v, None, False, scale, gqa, "top-left",
                                            None, None, None, np.float64)
    s = scale * np.einsum("bhid,bhjd->bhij", q4, k4)
    return float(np.abs(s).max()) if s.size else 0.0


def randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def inputs(rng, B, H, Hkv, Lq, Lk, D, Dv, scale=1.0):
    return (randn(rng, B, H, Lq, D, scale=scale), randn(rng, B, Hkv, Lk, D, scale=scale),
            randn(rng, B, Hkv, Lk, Dv), randn(rng, B, H, Lq, Dv))



# ---- 16-bit gradients (NumPy: float16; bfloat16 through ml_dtypes, where installed) -----------

NP16 = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
if ml_dtypes is not None:
    NP16["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
HALF = ["float16", pytest.param("bfloat16", marks=pytest.mark.skipif(
    ml_dtypes is None, reason="ml_dtypes is not installed: NumPy has no bfloat16 of its own "
    "(the PyTorch tests below cover bfloat16 gradients)"))]


def naive_grads(q, k, v, d_o, dtype, mask=None, causal=False, scale=None, gqa=False,
                align="top-left", window=None, kv_len=None):
    """(dq, dk, dv) of a backward computed naively in dtype ("float16" or "bfloat16"), as
    tests/test_backward_half.c's naive_backward_head and PyTorch's math path in a 16-bit
    type do: every product and sum accumulated in float32, every materialized step rounded
    to dtype — S = r(r(Q Kᵀ) r(scale)) (a float mask added and rounded), P = r(softmax(S))
    (the softmax in float32; a fully masked row 0), per head dV = r(Pᵀ dO), dP = r(dO Vᵀ),
    the row sums r(Σⱼ P dP), dS = r(P (dP − rowsum)), dQ = r(r(dS K) r(scale)),
    dK = r(r(dSᵀ Q) r(scale)); the sums over a GQA group and over broadcast batch or head
    dimensions in float32, rounded once more. float64 arrays (values of dtype) of the
    inputs' shapes: the yardstick of the half-precision rule for gradients."""
    _, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                window, None, kv_len, np.float32)
    r = lambda x: round_to(x, dtype)  # noqa: E731
    B, H, Lq, Lk = masked.shape
    q4, k4, v4 = r(q4), r(k4), r(v4)
    do4 = np.broadcast_to(r(_as4d(np.asarray(d_o, np.float32))), (B, H, Lq, v4.shape[3]))
    sc = r(np.float32(scale))
    kT = np.swapaxes(k4, -1, -2)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = r(r(np.matmul(q4, kT)) * sc)
        if bias is not None:
            s = r(s + r(bias))
        s = np.where(masked, -np.inf, s).astype(np.float32)
        mx = (s.max(axis=-1, keepdims=True) if Lk
              else np.full((B, H, Lq, 1), -np.inf, np.float32))
        full = np.isneginf(mx)
        e = np.exp(s - np.where(full, np.float32(0), mx))
        p = r(e / np.where(full, np.float32(1), e.sum(axis=-1, keepdims=True)))
        p = np.where(full, np.float32(0), p).astype(np.float32)
    dv4 = r(np.matmul(np.swapaxes(p, -1, -2), do4))
    dp = r(np.matmul(do4, np.swapaxes(v4, -1, -2)))
    rowsum = r((p * dp).sum(axis=-1, keepdims=True, dtype=np.float32))
    ds = r(p * (dp - rowsum))
    dq4 = r(r(np.matmul(ds, k4)) * sc)
    dk4 = r(r(np.matmul(np.swapaxes(ds, -1, -2), q4)) * sc)
    Hkv = max(_as4d(k).shape[1], _as4d(v).shape[1])
    groups = H // Hkv if gqa else 1
    return tuple(r(_sum_to(g4, _as4d(x).shape, grp)).astype(np.float64).reshape(np.shape(x))
                 for g4, x, grp in ((dq4, q, 1), (dk4, k, groups), (dv4, v, groups)))


def half_grad_failure(got, ref, naive_g):
    """None when a 16-bit call's gradient got is within the half-precision rule of the
    float64 gradient ref (of the same 16-bit inputs), else a message: finite, and max
    |got − ref| <= 2 max |naive − ref| + 2^-22 (1 + max|ref|) — the rule of
    tests/test_backward_half.c (the float32 term keeps it meaningful where the naive
    gradient happens to be exact)."""
    got = np.asarray(got, np.float32).astype(np.float64)   # also reads ml_dtypes bfloat16
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return "shape %s, expected %s" % (got.shape, ref.shape)
    if not got.size:
        return None
    if not np.isfinite(got).all():
        return "non-finite gradient at %s" % (tuple(np.argwhere(~np.isfinite(got))[0]),)
    naive_err = np.abs(np.asarray(naive_g, np.float64) - ref).max()
    err = np.abs(got - ref)
    bound = 2 * naive_err + 2.0 ** -22 * (1 + np.abs(ref).max())
    if err.max() > bound:
        w = np.unravel_index(int(err.argmax()), err.shape)
        return ("max |got - ref| = %.3g > %.3g = 2 x the naive error %.3g (+ float32 noise) "
                "at %s (got %r, expected %r)" % (err.max(), bound, naive_err, w, got[w],
                                                 ref[w]))
    return None


def assert_half_grads(got, ref, naive_g, what=""):
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive_g):
        if g is not None:
            why = half_grad_failure(g, r, n)
            assert why is None, "%s%s: %s" % (what, name, why)




def draw16(rng, dtype, *shape):
    """Standard normal values that dtype holds exactly, as an array of dtype."""
    return round_to(rng.standard_normal(shape), dtype).astype(NP16[dtype])


def raw_opts(mask=None, causal=False, scale=None, gqa=False, align="top-left", window=None,
             kv_len=None, path="auto"):
    """The C arguments (keywords) of _attn.forward/_attn.backward after the tensors."""
    return dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa,
                align=ALIGN[align], window=window, softcap=0.0, alibi_slopes=None,
                kv_len=kv_len, path=PATH[path], precision=0, threads=0)


def raw_call16(q, k, v, d_o, out_dtype=None, grad_dtypes=None, **kw):
    """raw_call for 16-bit inputs: the forward's output in out_dtype (the query's by
    default; "float32" is what the autograd Function keeps for its backward), then the
    backward into fresh NaN-filled gradients of grad_dtypes (the inputs' by default).
    Returns (grads, out, lse)."""
    opts = raw_opts(**kw)
    odt = NP16[out_dtype] if out_dtype else q.dtype
    out, lse, _ = _attn.forward(q, k, v, return_lse=True, return_weights=False,
                                alloc=lambda shape, which, dt: np.empty(
                                    shape, odt if which == "output" else np.float32), **opts)
    assert out.dtype == odt
    dts = grad_dtypes or (q.dtype, k.dtype, v.dtype)
    grads = tuple(np.full(np.shape(x), np.nan, dt) for x, dt in zip((q, k, v), dts))
    _attn.backward(q, k, v, out, d_o, lse, *grads, **opts)
    return grads, out, lse
