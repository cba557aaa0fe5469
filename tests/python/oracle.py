"""oracle.py — the Python suites' float64 reference of attention, a naive attention
computed in one 16-bit type, and the contract's tolerance checks, written with NumPy alone
(it never calls the attn package).

What it is: the formula of docs/CONTRACT.md, materialized — scores, masks, softmax, the
fully-masked-row rule — over PyTorch-style inputs of rank 2 to 4 with PyTorch's
broadcasting of the leading dimensions (reference); the same formula with every
intermediate rounded to float16 or bfloat16, as PyTorch's math path computes in those
types (naive: the yardstick of the half-precision rule); the float32 tolerance
(tolerance_failure) and the half-precision one (half_tolerance_failure: at most twice the
naive implementation's error). What it is not: fast, or a model of which keys the library
reads; a test that plants NaN in masked keys compares against the reference of the clean
inputs.
"""
import numpy as np


# The shapes the float32 and float16 suites both sweep.
SHAPES = [  # B, H, Lq, Lk, Dk, Dv
    (1, 1, 1, 1, 1, 1),
    (1, 1, 3, 5, 4, 4),
    (2, 3, 17, 33, 16, 16),
    (1, 2, 64, 64, 64, 64),
    (2, 2, 5, 130, 8, 24),
    (1, 1, 200, 7, 128, 32),
    (3, 1, 31, 257, 7, 9),
]


def _as4d(x):
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _setup(q, k, v, mask, causal, scale, gqa, align, window, alibi, kv_len, dtype):
    """The inputs as broadcast 4-D arrays of `dtype`, and what the masks make of the
    scores: (rank, q4, k4, v4, scale, masked [B, H, Lq, Lk] bool, bias: a float64 array
    to add (float mask and ALiBi) or None)."""
    rank = max(np.ndim(q), np.ndim(k), np.ndim(v))
    q4, k4, v4 = (_as4d(x).astype(dtype) for x in (q, k, v))
    B = max(q4.shape[0], k4.shape[0], v4.shape[0])
    Hkv = max(k4.shape[1], v4.shape[1])
    if gqa:
        H = q4.shape[1]
        assert H % Hkv == 0
        k4 = np.repeat(np.broadcast_to(k4, k4.shape[:1] + (Hkv,) + k4.shape[2:]), H // Hkv, 1)
        v4 = np.repeat(np.broadcast_to(v4, v4.shape[:1] + (Hkv,) + v4.shape[2:]), H // Hkv, 1)
    else:
        H = max(q4.shape[1], Hkv)
    Lq, D = q4.shape[2], q4.shape[3]
    Lk, Dv = k4.shape[2], v4.shape[3]
    q4 = np.broadcast_to(q4, (B, H, Lq, D))
    k4 = np.broadcast_to(k4, (B, H, Lk, D))
    v4 = np.broadcast_to(v4, (B, H, Lk, Dv))

    # the library takes scale and softcap as float32
    if scale is None:
        scale = 1.0 / np.sqrt(D) if D > 0 else 1.0
    scale = float(np.float32(scale))
    masked = np.zeros((B, H, Lq, Lk), bool)
    bias = None
    if mask is not None:
        m = _as4d(mask)
        if m.dtype == np.bool_:
            masked |= ~np.broadcast_to(m, masked.shape)
        else:
            bias = np.broadcast_to(m.astype(np.float64), masked.shape)

    lens = np.full(B, Lk, np.int64) if kv_len is None else np.asarray(kv_len, np.int64)
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    for b in range(B):
        d = i if align == "top-left" else i + lens[b] - Lq  # the diagonal d_i
        rule = j >= lens[b]
        if causal:
            rule = rule | (j > d)
        if window is not None:
            left, right = window
            if left >= 0:
                rule = rule | (j < d - left)
            if right >= 0:
                rule = rule | (j > d + right)
        masked[b] |= rule
        if alibi is not None:
            if bias is None or not bias.flags.writeable:
                bias = np.zeros(masked.shape) if bias is None else bias.copy()
            slopes = np.asarray(alibi, np.float64)
            bias[b] = bias[b] - slopes[:, None, None] * np.abs(d - j)[None]
    return rank, q4, k4, v4, scale, masked, bias


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False, align="top-left",
              window=None, softcap=0.0, alibi=None, kv_len=None):
    """(out, lse, weights) in float64. Shapes as attn.scaled_dot_product_attention."""
    rank, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                   window, alibi, kv_len, np.float64)
    B, H, Lq, Lk = masked.shape
    with np.errstate(invalid="ignore", over="ignore"):
        s = scale * np.einsum("bhid,bhjd->bhij", q4, k4)
        if softcap:
            c = float(np.float32(softcap))
            s = c * np.tanh(s / c)
        if bias is not None:
            s = s + bias
    s = np.where(masked, -np.inf, s)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mx = s.max(axis=-1, keepdims=True) if Lk > 0 else np.full((B, H, Lq, 1), -np.inf)
        full = np.isneginf(mx)                      # fully masked rows
        p = np.exp(s - np.where(full, 0.0, mx))     # masked keys: exp(-inf) = 0 exactly
        l = p.sum(axis=-1, keepdims=True)
        w = np.where(full, 0.0, p / np.where(full, 1.0, l))
        out = np.einsum("bhij,bhjd->bhid", w, v4)
        out = np.where(full, 0.0, out)
        lse = np.where(full, -np.inf, mx + np.log(np.where(full, 1.0, l)))[..., 0]
    cut = 4 - rank
    return (out.reshape(out.shape[cut:]), lse.reshape(lse.shape[cut:]),
            w.reshape(w.shape[cut:]))


def _shape_nonfinite_failure(got, ref):
    """(message, None) when the shapes differ or a non-finite entry of either is not the
    same in both (NaN where NaN, the same infinity); else (None, the mask of entries
    finite in both)."""
    if got.shape != ref.shape:
        return "shape %s, expected %s" % (got.shape, ref.shape), None
    fin_g, fin_r = np.isfinite(got), np.isfinite(ref)
    same_nonfinite = (np.isnan(got) & np.isnan(ref)) | (got == ref)
    bad = (~fin_g | ~fin_r) & ~same_nonfinite
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        return "non-finite mismatch at %s: got %r, expected %r" % (idx, got[idx], ref[idx]), None
    return None, fin_g & fin_r


def tolerance_failure(got, ref):
    """None when got (float32) is within the contract's float32 tolerance of ref (float64),
    else a message: shapes equal; non-finite entries of either identical (NaN where NaN,
    the same infinity); max |got - ref| <= 1e-5 * (1 + max |ref|); and the relative
    Frobenius error ||got - ref|| / ||ref|| <= 1e-6."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    msg, fin = _shape_nonfinite_failure(got, ref)
    if msg:
        return msg
    if not fin.any():
        return None
    g, r = got[fin], ref[fin]
    err = np.abs(g - r)
    bound = 1e-5 * (1.0 + np.abs(r).max())
    if err.max() > bound:
        w = int(err.argmax())
        return "max |got - ref| = %.3g > %.3g (got %r, expected %r)" % (
            err.max(), bound, g[w], r[w])
    norm = np.linalg.norm(r)
    if norm > 0 and np.linalg.norm(g - r) / norm > 1e-6:
        return "relative Frobenius error %.3g > 1e-6" % (np.linalg.norm(g - r) / norm)
    return None


# ---- the float32 error model (docs/CONTRACT.md, "The float32 error model"): the Python
# copy of tools/common/tolerance.h's constants and bounds ---------------------------------

TOL_U32 = 2.0 ** -24    # float32's unit roundoff
TOL_EXP_ULP = 2.0       # the kernels' exp: at most 2 ulp
TOL_BK_MIN, TOL_BK_MAX = 16.0, 128.0   # every kernel's key blocks


def tol_dot_rel(n):
    """A float32 dot product of n terms (times a scale): its error relative to its magnitude."""
    return (n + 2.0) * TOL_U32


def tol_sum_rel(n):
    """A float32 sum of n terms: its error relative to the sum of their magnitudes."""
    return (n + 1.0) * TOL_U32


def tol_lse_bound(dk, n_keys, mag):
    """The bound on one row's LSE error, mag its logit magnitude (tolerance.h)."""
    n = float(max(n_keys, 1))
    blocks = min(n, TOL_BK_MAX) + (2 * TOL_EXP_ULP + 2) * np.ceil(n / TOL_BK_MIN)
    return TOL_U32 * ((dk + 5.0) * mag + 2 * TOL_EXP_ULP + blocks + 2.0)


def round_to(x, dtype):
    """x (any floats) rounded to dtype ("float16", "bfloat16" or "float32"), round to
    nearest even, returned as float32 (the value a tensor of that dtype would hold)."""
    x = np.asarray(x, np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        with np.errstate(over="ignore"):                # beyond 65504: inf, as IEEE says
            return x.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        raise ValueError(dtype)
    # bfloat16 is the top half of a float32: add half of the dropped half (less one, plus
    # the kept half's lowest bit: ties to even), then clear the dropped half; a carry
    # into the exponent rounds up to the next binade or to inf, as it should
    b = np.ascontiguousarray(x).view(np.uint32)
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) &
         np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(x), x, r)


def naive(q, k, v, dtype, mask=None, causal=False, scale=None, gqa=False, align="top-left",
          window=None, softcap=0.0, alibi=None, kv_len=None):
    """The output (float64, values of dtype) of attention computed naively in dtype, as
    PyTorch's math path does in a 16-bit type (and tools/common/naive.c): Q·Kᵀ accumulated in
    float32 and rounded to dtype, scaled and rounded again (softcap, bias: each rounded),
    the softmax in float32 rounded to dtype, P·V accumulated in float32 rounded to dtype.
    A fully masked row gives 0. The yardstick of the half-precision rule."""
    rank, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                   window, alibi, kv_len, np.float32)
    r = lambda x: round_to(x, dtype)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = r(r(np.matmul(r(q4), np.swapaxes(r(k4), -1, -2))) * r(scale))
        if softcap:
            c = r(np.float32(softcap))
            s = r(c * np.tanh(s / c))
        if bias is not None:
            s = r(s + r(bias))
        s = np.where(masked, -np.inf, s).astype(np.float32)
        mx = (s.max(axis=-1, keepdims=True) if s.shape[-1]
              else np.full(s.shape[:-1] + (1,), -np.inf, np.float32))
        full = np.isneginf(mx)
        e = np.exp(s - np.where(full, np.float32(0), mx))
        p = r(e / np.where(full, np.float32(1), e.sum(axis=-1, keepdims=True)))
        p = np.where(full, np.float32(0), p)
        out = r(np.matmul(p, r(v4)))
    out = out.astype(np.float64)
    return out.reshape(out.shape[4 - rank:])


def half_tolerance_failure(got, ref, naive_out):
    """None when got (a 16-bit path's output) is within the half-precision rule of ref
    (float64), else a message: shapes equal; non-finite entries identical, as in
    tolerance_failure; max |got - ref| <= 2 * max |naive_out - ref| + 2^-23 (1 + max |ref|),
    naive_out being naive() of the same inputs (the float32 term keeps the rule meaningful
    where the naive result happens to be exact)."""
    got = np.asarray(got, np.float32).astype(np.float64)  # also reads ml_dtypes bfloat16
    ref = np.asarray(ref, np.float64)
    naive_out = np.asarray(naive_out, np.float64)
    msg, fin = _shape_nonfinite_failure(got, ref)
    if msg:
        return msg
    if not fin.any():
        return None
    g, r = got[fin], ref[fin]
    with np.errstate(invalid="ignore"):
        naive_err = np.nan_to_num(np.abs(naive_out[fin] - r), nan=np.inf).max()
    err = np.abs(g - r)
    bound = 2 * naive_err + 2.0 ** -23 * (1 + np.abs(r).max())
    if err.max() > bound:
        w = int(err.argmax())
        return ("max |got - ref| = %.3g > %.3g = 2 x the naive error %.3g (+ float32 noise) "
                "(got %r, expected %r)" % (err.max(), bound, naive_err, g[w], r[w]))
    return None


def assert_half_close(got, ref, naive_out, what="output"):
    why = half_tolerance_failure(got, ref, naive_out)
    assert why is None, "%s: %s" % (what, why)


def assert_close(got, ref, what="output"):
    why = tolerance_failure(got, ref)
    assert why is None, "%s: %s" % (what, why)


def randn(rng, *shape, scale=1.0):
    """float32 standard normal data, times scale."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)
