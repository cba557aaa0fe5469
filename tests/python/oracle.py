"""oracle.py — the Python suites' float64 reference of attention and the contract's
tolerance check, written with NumPy alone (it never calls the attn package).

What it is: the formula of docs/CONTRACT.md, materialized — scores, masks, softmax, the
fully-masked-row rule — over PyTorch-style inputs of rank 2 to 4 with PyTorch's
broadcasting of the leading dimensions. What it is not: fast, or a model of which keys
the library reads; a test that plants NaN in masked keys compares against the reference
of the clean inputs.
"""
import numpy as np


def _as4d(x):
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False, align="top-left",
              window=None, softcap=0.0, alibi=None, kv_len=None):
    """(out, lse, weights) in float64. Shapes as attn.scaled_dot_product_attention."""
    rank = max(np.ndim(q), np.ndim(k), np.ndim(v))
    q4, k4, v4 = (_as4d(x).astype(np.float64) for x in (q, k, v))
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
    with np.errstate(invalid="ignore", over="ignore"):
        s = scale * np.einsum("bhid,bhjd->bhij", q4, k4)
        if softcap:
            c = float(np.float32(softcap))
            s = c * np.tanh(s / c)
    masked = np.zeros((B, H, Lq, Lk), bool)
    if mask is not None:
        m = _as4d(mask)
        if m.dtype == np.bool_:
            masked |= ~np.broadcast_to(m, masked.shape)
        else:
            s = s + np.broadcast_to(m.astype(np.float64), masked.shape)

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
            slopes = np.asarray(alibi, np.float64)
            s[b] = s[b] - slopes[:, None, None] * np.abs(d - j)[None]

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


def tolerance_failure(got, ref):
    """None when got (float32) is within the contract's float32 tolerance of ref (float64),
    else a message: shapes equal; non-finite entries of either identical (NaN where NaN,
    the same infinity); max |got - ref| <= 1e-5 * (1 + max |ref|); and the relative
    Frobenius error ||got - ref|| / ||ref|| <= 1e-6."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return "shape %s, expected %s" % (got.shape, ref.shape)
    fin_g, fin_r = np.isfinite(got), np.isfinite(ref)
    same_nonfinite = (np.isnan(got) & np.isnan(ref)) | (got == ref)
    bad = (~fin_g | ~fin_r) & ~same_nonfinite
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        return "non-finite mismatch at %s: got %r, expected %r" % (idx, got[idx], ref[idx])
    fin = fin_g & fin_r
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


def assert_close(got, ref, what="output"):
    why = tolerance_failure(got, ref)
    assert why is None, "%s: %s" % (what, why)


def randn(rng, *shape, scale=1.0):
    """float32 standard normal data, times scale."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)
