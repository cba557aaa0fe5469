"""test_autograd.py — the backward pass from Python: the extension's raw attn._attn.backward
against a float64 NumPy reference of the gradients (always: CI has NumPy only), and
PyTorch autograd through attn.scaled_dot_product_attention against PyTorch's own SDPA
backward (skipped, with the reason, where PyTorch is not installed).

The reference (reference_grads, below) is the textbook backward of the contract's
formula, written here from the float64 forward of oracle.py's masks:
    dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(dO ∘ O)) [∘ (1 − tanh²) under softcap],
    dQ = scale dS K,  dK = scale dSᵀ Q,
summed over the query heads of a group (GQA) and over any broadcast batch or head
dimension; a fully masked row has P = 0 and so contributes 0. It is itself checked
against central finite differences of oracle.reference (float64, relative error < 1e-6).

Tolerance of a float32 gradient against it (grad_failure): the contract's float32 one
(max error <= 1e-5 (1 + max|ref|), relative Frobenius error <= 1e-6), or — for a gradient
that is a near-total cancellation, the same rule as tests/test_backward.c — measured
against the gradient computed over absolute values ("mag": float32 sums err by about
u·Σ|terms|, not u·|Σ terms|): when ‖mag‖ >= 100 ‖ref‖, ‖got − ref‖ <= 2.5e-7 ‖mag‖ and
max error <= 1e-5 (1 + max|mag|). The check is shown to reject planted errors.

Against PyTorch (float32, same inputs, same upstream gradient): max |attn − torch| <=
TORCH_TOL · (1 + max|g64|) per gradient, g64 being PyTorch's own float64 SDPA gradient.
Both float32 gradients are within the contract's 1e-5 (1 + max|g|) of the exact one, so
their difference is bounded by twice that; measured, it stays under 1.3e-6 (1 + max|g|)
over this file's cases (printed with -s; dq 1.3e-6, dk 9.5e-7, dv 4.6e-7 relative), so
TORCH_TOL = 1e-5 keeps an 8x margin and still catches any error of the size of a wrong
scale, sign, mask or group sum (those are O(1) relative; a planted 1e-4 on dQ is
caught). Each case is also held to grad_failure against the float64 reference, widened
only for logits beyond 16.7 in magnitude (large_logits).

16-bit gradients (float16, bfloat16; the library computes in float32 and rounds each
gradient once to its dtype): against the float64 gradient of the same 16-bit values, max
error <= 2 x that of naive_grads — a NumPy backward computing in the 16-bit type, every
materialized step rounded, as tests/test_backward_half.c defines it — plus
2^-22 (1 + max|g|) (half_grad_failure; raw float16 arrays always, ml_dtypes' bfloat16 where
installed). With PyTorch, each bfloat16/float16 .grad also within 2 x the error of
PyTorch's own 16-bit SDPA backward plus HALF_SLACK (1 + max|g64|) (measured: 1.00 x at most
over this file's cases, printed with -s). Both checks shown to reject planted errors.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import attn
from attn import _attn
from oracle import _as4d, _setup, reference, round_to, tolerance_failure

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch is not installed: autograd against PyTorch's SDPA backward "
    "is skipped (the raw backward is checked against the NumPy float64 reference above)")

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


def reference_grads(q, k, v, d_o, mask=None, causal=False, scale=None, gqa=False,
                    align="top-left", window=None, softcap=0.0, alibi=None, kv_len=None):
    """((dq, dk, dv), (mag_q, mag_k, mag_v)) in float64, each of the shape of its input;
    mag_* is the same gradient computed over absolute values (the float32 error scale)."""
    rank, q4, k4, v4, scale, masked, bias = _setup(q, k, v, mask, causal, scale, gqa, align,
                                                   window, alibi, kv_len, np.float64)
    B, H, Lq, Lk = masked.shape
    do4 = np.broadcast_to(_as4d(d_o).astype(np.float64), (B, H, Lq, v4.shape[3]))
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
    o = p @ v4
    dv4 = np.swapaxes(p, -1, -2) @ do4                                   # dV = Pᵀ dO
    dp = do4 @ np.swapaxes(v4, -1, -2)                                   # dP = dO Vᵀ
    ds = p * (dp - (do4 * o).sum(axis=-1, keepdims=True)) * dcap        # dS
    dq4 = scale * ds @ k4                                                # dQ = scale dS K
    dk4 = scale * np.swapaxes(ds, -1, -2) @ q4                           # dK = scale dSᵀ Q
    ads = p * (np.abs(do4) @ np.abs(np.swapaxes(v4, -1, -2)) +
               (np.abs(do4) * np.abs(o)).sum(axis=-1, keepdims=True)) * np.abs(dcap)
    mq4 = abs(scale) * ads @ np.abs(k4)
    mk4 = abs(scale) * np.swapaxes(ads, -1, -2) @ np.abs(q4)
    mv4 = np.swapaxes(p, -1, -2) @ np.abs(do4)

    Hkv = max(_as4d(k).shape[1], _as4d(v).shape[1])
    groups = H // Hkv if gqa else 1
    out = []
    for g4, x, grp in ((dq4, q, 1), (dk4, k, groups), (dv4, v, groups),
                       (mq4, q, 1), (mk4, k, groups), (mv4, v, groups)):
        shape4 = _as4d(x).shape
        out.append(_sum_to(g4, shape4, grp).reshape(np.shape(x)))
    return tuple(out[:3]), tuple(out[3:])


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
    err = np.linalg.norm(got - ref)
    if err > 2.5e-7 * widen * nm:
        return "cancellation: ||got - ref|| = %.3g > 2.5e-7 ||mag|| = %.3g" % (err, 2.5e-7 * nm)
    if np.abs(got - ref).max() > 1e-5 * widen * (1 + np.abs(mag).max()):
        return "cancellation: max error %.3g > 1e-5 (1 + max|mag|)" % np.abs(got - ref).max()
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
             grads=None):
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
    _attn.backward(q, k, v, out, d_o, lse, *grads, **opts)
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


# ---- the reference itself, against finite differences ----------------------------------------

FD_CASES = {
    "plain": dict(),
    "causal-tl-gqa": dict(causal=True, gqa=True),
    "causal-br-wide": dict(causal=True, align="bottom-right"),
    "bool-mask": dict(mask="bool"),
    "bias-inf": dict(mask="bias"),
    "softcap-scale": dict(softcap=1.5, scale=0.9),
    "window-kvlen-alibi": dict(window=(1, 0), kv_len=[4, 0], alibi=[0.5, 0.25, 1.0, 0.1],
                               align="bottom-right"),
}


@pytest.mark.parametrize("case", list(FD_CASES), ids=str)
def test_reference_against_finite_differences(case):
    """reference_grads is the gradient of oracle.reference: central differences in float64,
    h = 1e-6, relative Frobenius error < 1e-6 per gradient (measured: about 1e-9)."""
    rng = np.random.default_rng(3)
    kw = dict(FD_CASES[case])
    gqa = kw.get("gqa", False)
    B, H, Lq, Lk, D, Dv = 2, 4, 3, 5, 3, 2
    q = rng.standard_normal((B, H, Lq, D))
    k = rng.standard_normal((B, 2 if gqa else H, Lk, D))
    v = rng.standard_normal((B, 2 if gqa else H, Lk, Dv))
    w = rng.standard_normal((B, H, Lq, Dv))
    if kw.get("mask") == "bool":
        kw["mask"] = rng.random((B, 1, Lq, Lk)) < 0.6
        kw["mask"][0, 0, 1] = False               # a fully masked row
    elif kw.get("mask") == "bias":
        kw["mask"] = np.where(rng.random((Lq, Lk)) < 0.3, -np.inf, rng.standard_normal((Lq, Lk)))
        kw["mask"][2] = -np.inf
    if "alibi" in kw:
        kw["alibi"] = np.float32(kw["alibi"])
    if case == "causal-br-wide":
        q = q[:, :, :2]
        w = w[:, :, :2]

    def loss(q_, k_, v_):
        return float((reference(q_, k_, v_, **kw)[0] * w).sum())

    (dq, dk, dv), _ = reference_grads(q, k, v, w, **kw)
    h = 1e-6
    for name, x, g in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q, k, v]
            which = ("dq", "dk", "dv").index(name)
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            args[which] = xp
            lp = loss(*args)
            args[which] = xm
            fd[idx] = (lp - loss(*args)) / (2 * h)
        denom = max(np.linalg.norm(fd), 1e-12)
        rel = np.linalg.norm(g - fd) / denom
        assert rel < 1e-6, "%s %s: relative error %.3g against finite differences" % (
            case, name, rel)


# ---- the raw backward against the reference (NumPy only) -----------------------------------

SHAPES = [  # B, H, Hkv, Lq, Lk, D, Dv
    (1, 1, 1, 1, 1, 1, 1),
    (2, 3, 3, 17, 33, 16, 16),
    (1, 4, 2, 64, 64, 64, 32),
    (2, 2, 1, 5, 130, 8, 24),
    (1, 2, 2, 130, 7, 32, 32),
    (1, 8, 2, 70, 150, 64, 64),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, "top-left", "bottom-right"])
@pytest.mark.parametrize("path", ["fused", "reference"])
def test_raw_backward_matches_reference(rng, shape, causal, path):
    B, H, Hkv, Lq, Lk, D, Dv = shape
    q, k, v, d_o = inputs(rng, B, H, Hkv, Lq, Lk, D, Dv)
    kw = dict(causal=bool(causal), align=causal or "top-left", gqa=H != Hkv)
    got = raw_call(q, k, v, d_o, path=path, **kw)
    ref, mag = reference_grads(q, k, v, d_o, **kw)
    assert_grads(got, ref, mag, "%s %s: " % (shape, causal))


MASK_SHAPES = [(17,), (1, 17), (9, 17), (3, 1, 17), (2, 1, 9, 17), (2, 3, 9, 17), (9, 1)]


@pytest.mark.parametrize("mshape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_raw_backward_masks(rng, mshape, kind):
    q, k, v, d_o = inputs(rng, 2, 3, 3, 9, 17, 8, 8)
    if kind == "bool":
        mask = rng.random(mshape) < 0.7
    else:
        mask = randn(rng, *mshape)
        mask[rng.random(mshape) < 0.2] = -np.inf
    for causal in (False, True):
        got = raw_call(q, k, v, d_o, mask=mask, causal=causal)
        ref, mag = reference_grads(q, k, v, d_o, mask=mask, causal=causal)
        assert_grads(got, ref, mag, "%s %s causal=%s: " % (kind, mshape, causal))


FEATURES = {
    "scale-neg": dict(scale=-0.7),
    "scale-zero": dict(scale=0.0),
    "softcap": dict(softcap=2.0, scale=1.0),
    "softcap-causal-br": dict(softcap=5.0, causal=True, align="bottom-right"),
    "window": dict(window=(3, 2)),
    "window-left-br": dict(window=(4, -1), align="bottom-right"),
    "kv_len": dict(kv_len=np.int32([17, 5])),
    "kv_len-causal-br": dict(kv_len=np.int64([11, 17]), causal=True, align="bottom-right"),
    "alibi": dict(alibi=np.float32([0.5, 0.125, 1.0, 0.25])),
    "alibi-window-gqa": dict(alibi=np.float32([0.5, 0.125, 1.0, 0.25]), window=(5, 5),
                             gqa=True),
    "everything": dict(softcap=3.0, causal=True, align="bottom-right", window=(6, -1),
                       kv_len=np.int64([15, 9]), alibi=np.float32([0.3, 0.1, 0.2, 0.4]),
                       gqa=True, scale=0.4),
}


@pytest.mark.parametrize("feature", list(FEATURES), ids=str)
@pytest.mark.parametrize("path", ["fused", "reference"])
def test_raw_backward_features(rng, feature, path):
    kw = dict(FEATURES[feature])
    gqa = kw.get("gqa", False)
    q, k, v, d_o = inputs(rng, 2, 4, 2 if gqa else 4, 13, 17, 16, 12)
    if "mask" not in kw and feature == "everything":
        kw["mask"] = rng.random((13, 17)) < 0.8
    got = raw_call(q, k, v, d_o, path=path, **kw)
    ref, mag = reference_grads(q, k, v, d_o, **kw)
    assert_grads(got, ref, mag, feature + ": ")


def test_softcap_chain_is_needed(rng):
    """The softcap factor matters here: the reference without it is rejected."""
    q, k, v, d_o = inputs(rng, 1, 2, 2, 9, 11, 8, 8, scale=2.0)
    got = raw_call(q, k, v, d_o, softcap=1.0, scale=1.0)
    ref, mag = reference_grads(q, k, v, d_o, softcap=1.0, scale=1.0)
    assert_grads(got, ref, mag)
    # the same softmax, its gradient taken without the tanh's derivative 1 - tanh²
    _, q4, k4, v4, _, _, _ = _setup(q, k, v, None, False, 1.0, False, "top-left", None,
                                    None, None, np.float64)
    s = np.tanh(q4 @ np.swapaxes(k4, -1, -2))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ds = p * (d_o @ np.swapaxes(v4, -1, -2) - (d_o * (p @ v4)).sum(-1, keepdims=True))
    assert grad_failure(got[0], ds @ k4, mag[0]) is not None


def test_gqa_sums_and_broadcasts(rng):
    """dK, dV summed over a group; over a broadcast batch; over the heads a key of one head
    serves without enable_gqa (read as one group); a query broadcast over heads; ranks 2-4
    mixed; a key of one head under a value of H heads (summed by the extension)."""
    q, k, v, d_o = inputs(rng, 2, 4, 1, 9, 12, 8, 6)
    cases = [
        ("one group, no enable_gqa", q, k, v, d_o, False),
        ("one group, enable_gqa", q, k, v, d_o, True),
        ("batch-broadcast key/value", q, k[:1], v[:1], d_o, False),
        ("rank-2 key/value", q, k[0, 0], v[0, 0], d_o, False),
        ("rank-3 query over rank-4 key", q[0], np.repeat(k, 4, 1), np.repeat(v, 4, 1), d_o,
         False),
        ("query of one head", q[:, :1], np.repeat(k, 4, 1), np.repeat(v, 4, 1), d_o, False),
        ("key of one head, value of 4", q, k, np.repeat(v, 4, 1), d_o, False),
        ("rank 2 everywhere", q[0, 0], k[0, 0], v[0, 0], d_o[0, 0], False),
    ]
    for name, q_, k_, v_, do_, gqa in cases:
        do_ = np.ascontiguousarray(np.broadcast_to(do_, reference(q_, k_, v_, gqa=gqa)[0].shape))
        got = raw_call(q_, k_, v_, do_, gqa=gqa)
        ref, mag = reference_grads(q_, k_, v_, do_, gqa=gqa)
        for g, x in zip(got, (q_, k_, v_)):
            assert g.shape == np.shape(x)
        assert_grads(got, ref, mag, name + ": ")


def test_strided_inputs_and_gradients(rng):
    """[B, L, H, D] storage, reversed, sliced and stride-0 views in; gradients written
    into transposed and reversed views of larger arrays, in place."""
    B, H, L, S, D = 2, 3, 10, 14, 8
    qs, ks, vs = randn(rng, B, L, H, D), randn(rng, B, S, H, 2 * D), randn(rng, B, S, H, D)
    q = qs.transpose(0, 2, 1, 3)
    k = ks.transpose(0, 2, 1, 3)[..., ::2]
    v = vs.transpose(0, 2, 1, 3)[:, ::-1]
    d_o = np.broadcast_to(randn(rng, 1, 1, L, D), (B, H, L, D))      # stride 0
    dq_store = np.zeros((B, L, H, D), np.float32)
    dk_store = np.zeros((B, S, H, 2 * D), np.float32)
    dv_store = np.zeros((B, S, H, D), np.float32)
    grads = (dq_store.transpose(0, 2, 1, 3), dk_store.transpose(0, 2, 1, 3)[..., 1::2],
             dv_store.transpose(0, 2, 1, 3)[:, :, ::-1])
    raw_call(q, k, v, d_o, causal=True, grads=grads)
    ref, mag = reference_grads(q, k, v, d_o, causal=True)
    assert_grads(grads, ref, mag)
    assert not dk_store[..., ::2].any(), "a gradient wrote outside its view"


def test_fully_masked_rows_contribute_zero(rng):
    """Rows with every key masked (bool mask, -inf bias, kv_len = 0, an empty window)
    give dQ rows of exactly 0 and nothing to dK, dV — even with NaN in their dO; NaN in
    keys beyond kv_len reaches no gradient."""
    q, k, v, d_o = inputs(rng, 2, 2, 2, 6, 9, 8, 8)
    mask = np.ones((2, 2, 6, 9), bool)
    mask[0, 1, 2] = False
    mask[1, 0, 4] = False
    bias = np.zeros((6, 9), np.float32)
    bias[5] = -np.inf
    kv_len = np.int64([9, 0])
    d_o_nan = d_o.copy()
    d_o_nan[0, 1, 2] = np.nan
    d_o_nan[1, 0, 4] = np.nan
    d_o_nan[:, :, 5] = np.nan
    d_o_nan[1] = np.nan
    kp, vp = k.copy(), v.copy()
    for x in (kp, vp):
        x[1] = np.nan                       # batch 1 has no keys at all
    mask[:, :, 5] = False
    got = raw_call(q, kp, vp, d_o_nan, mask=mask, kv_len=kv_len)
    for g in got:
        assert np.isfinite(g).all()
    assert (got[0][0, 1, 2] == 0).all() and (got[0][:, :, 5] == 0).all()
    assert (got[0][1] == 0).all() and (got[1][1] == 0).all() and (got[2][1] == 0).all()
    full_mask = mask
    d_o_clean = np.where(np.isnan(d_o_nan), 0, d_o_nan).astype(np.float32)
    ref, mag = reference_grads(q, k, v, d_o_clean, mask=full_mask, kv_len=kv_len)
    assert_grads(got, ref, mag)
    # the same through a -inf bias and an empty window
    got = raw_call(q, k, v, d_o, mask=bias, window=(-1, -1), causal=True, align="bottom-right")
    assert (got[0][:, :, 5] == 0).all()
    ref, mag = reference_grads(q, k, v, d_o, mask=bias, causal=True, align="bottom-right")
    assert_grads(got, ref, mag)
    # no key at all (S = 0): every gradient 0
    got = raw_call(q, k[:, :, :0], v[:, :, :0], d_o)
    assert (got[0] == 0).all() and got[1].size == 0 and got[2].size == 0


def test_bit_identical_for_any_thread_count(rng):
    q, k, v, d_o = inputs(rng, 1, 2, 1, 150, 300, 32, 32)
    runs = [raw_call(q, k, v, d_o, causal=True, gqa=True, threads=t) for t in (1, 2, 3, 2)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_grads_not_wanted(rng):
    q, k, v, d_o = inputs(rng, 1, 2, 2, 5, 7, 4, 4)
    ref, mag = reference_grads(q, k, v, d_o)
    dv = np.empty_like(v)
    raw_call(q, k, v, d_o, grads=(None, None, dv))
    assert_grads((None, None, dv), ref, mag)
    raw_call(q, k[:1, :1], v[:1, :1], d_o, grads=(None, None, None))  # scratch only


def test_raw_backward_errors(rng):
    """Errors name the Python argument; nothing is written on failure."""
    q, k, v, d_o = inputs(rng, 2, 2, 2, 5, 7, 4, 4)
    opts = dict(attn_mask=None, is_causal=False, scale=None, enable_gqa=False, align=0,
                window=None, softcap=0.0, alibi_slopes=None, kv_len=None, path=0,
                precision=0, threads=0)
    out, lse, _ = _attn.forward(q, k, v, return_lse=True, return_weights=False,
                                alloc=lambda s, w, d: np.empty(s, np.float32), **opts)

    def call(**over):
        mine = dict(grad_query=np.full_like(q, 7), grad_key=np.full_like(k, 7),
                    grad_value=np.full_like(v, 7))
        a = dict(query=q, key=k, value=v, out=out, grad_out=d_o, lse=lse, **mine)
        a.update(over)
        with pytest.raises(Exception) as info:
            _attn.backward(**a, **opts)
        for name, g in mine.items():
            assert (g == 7).all(), "%s written on failure" % name
        return info

    cases = [
        (dict(grad_out=d_o[..., :3]), ValueError, "grad_out: shape"),
        (dict(out=out[:, :1]), ValueError, "out: shape"),
        (dict(lse=lse[..., None]), ValueError, "lse: rank"),
        (dict(lse=lse[:, :, :4]), ValueError, "lse: shape"),
        (dict(grad_query=np.zeros((2, 2, 5, 3), np.float32)), ValueError,
         r"grad_query: shape \(2, 2, 5, 3\), expected \(2, 2, 5, 4\)"),
        (dict(grad_key=np.zeros_like(k, np.float64)), TypeError, "grad_key: dtype float64"),
        (dict(lse=lse.astype(np.float16)), TypeError, "lse: dtype"),          # float32 only
        (dict(key=k.astype(np.float16)), TypeError, "value: dtype"),    # key, value alike
        (dict(key=k[0, 0], value=v[0, 0], grad_key=np.zeros((7, 4), bool)), TypeError,
         "grad_key: dtype bool, expected float32, float16, bfloat16 or float64"),     # summed here
        (dict(grad_value=np.broadcast_to(np.zeros_like(v), v.shape)), ValueError,
         "grad_value: the array is read-only"),
        (dict(grad_out="x"), TypeError, "grad_out: expected a NumPy array"),
    ]
    for over, exc, pattern in cases:
        info = call(**over)
        assert info.type is exc, (over.keys(), info.value)
        assert info.match(pattern), str(info.value)
    # an overlapping output (stride 0) is refused by the library, status kept
    dq = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), q.shape, (0, 0, 0, 4))
    info = call(grad_query=dq)
    assert info.type is ValueError and info.value.status == "ATTN_ERR_STRIDE"
    assert str(info.value).startswith("grad_query: stride")


def test_planted_errors_are_rejected(rng):
    """grad_failure rejects: a gradient scaled by 1 + 3e-6, one element off by
    2e-5 (1 + max|ref|), a group's dK not summed (its first head only), a fully masked
    row that leaks, the scale applied twice; and accepts the library's gradient."""
    q, k, v, d_o = inputs(rng, 1, 4, 2, 16, 24, 16, 16)
    mask = np.ones((16, 24), bool)
    mask[3] = False
    got = raw_call(q, k, v, d_o, gqa=True, mask=mask)
    ref, mag = reference_grads(q, k, v, d_o, gqa=True, mask=mask)
    assert_grads(got, ref, mag)
    dq, dk, dv = (g.astype(np.float64) for g in got)
    assert grad_failure(dq * (1 + 3e-6), ref[0], mag[0]) is not None
    bad = dv.copy()
    bad[0, 1, 5, 3] += 2e-5 * (1 + np.abs(ref[2]).max())
    assert grad_failure(bad, ref[2], mag[2]) is not None
    # dK of the first query head of each group only (the group sum forgotten)
    q4 = q.astype(np.float64)
    one_head = reference_grads(q4[:, ::2], k, v, d_o[:, ::2], mask=mask)[0][1]
    assert grad_failure(one_head, ref[1], mag[1]) is not None
    leak = dq.copy()
    leak[0, 0, 3, 0] = 1e-3                         # a fully masked row must be 0
    assert grad_failure(leak, ref[0], mag[0]) is not None
    assert grad_failure(dq / np.sqrt(16), ref[0], mag[0]) is not None


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


def test_naive_grads_in_float32_is_the_reference(rng):
    """naive_grads' formulas, rounded to float32 only, are the float64 gradient to the
    float32 tolerance (GQA, causal, a bool mask, a float mask, broadcast K/V): the
    yardstick is the backward, and only its roundings make it naive."""
    q, k, v, d_o = inputs(rng, 2, 4, 2, 13, 17, 16, 8)
    fmask = randn(rng, 4, 1, 17)
    fmask[:, :, 3] = -np.inf
    for kw in (dict(gqa=True, causal=True), dict(mask=rng.random((13, 17)) < 0.7, gqa=True),
               dict(mask=fmask, align="bottom-right", causal=True, gqa=True)):
        ref, mag = reference_grads(q, k, v, d_o, **kw)
        assert_grads(naive_grads(q, k, v, d_o, "float32", **kw), ref, mag, "%s: " % kw)
    ref, mag = reference_grads(q, k[0, 0], v[0, 0], d_o)
    assert_grads(naive_grads(q, k[0, 0], v[0, 0], d_o, "float32"), ref, mag)


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


HALF_CASES = [  # B, H, Hkv, Lq, Lk, D, Dv, options (tests/test_backward_half.c's, and more)
    ((1, 1, 1, 1, 1, 8, 8), dict()),
    ((1, 2, 2, 17, 17, 16, 16), dict(causal=True)),
    ((2, 4, 2, 33, 40, 32, 24), dict(mask="bool", gqa=True)),
    ((1, 2, 1, 64, 64, 64, 64), dict(causal=True, mask="bool", gqa=True)),
    ((1, 1, 1, 130, 129, 80, 64), dict(causal=True)),
    ((2, 3, 3, 21, 47, 16, 8), dict(causal=True, align="bottom-right", mask="float")),
    ((2, 4, 1, 9, 150, 32, 32), dict(gqa=True, window=(20, 3), kv_len=np.int64([150, 77]))),
]


def half_case(rng, dtype, shape, opts):
    """The inputs of a HALF_CASES entry in dtype, and its options with the mask drawn."""
    B, H, Hkv, Lq, Lk, D, Dv = shape
    kw = dict(opts)
    if kw.get("mask") == "bool":
        kw["mask"] = rng.random((Lq, Lk)) < 0.8
    elif kw.get("mask") == "float":
        kw["mask"] = (rng.standard_normal((H, 1, Lk))).astype(np.float32)
        kw["mask"][rng.random((H, 1, Lk)) < 0.2] = -np.inf
    return (draw16(rng, dtype, B, H, Lq, D), draw16(rng, dtype, B, Hkv, Lk, D),
            draw16(rng, dtype, B, Hkv, Lk, Dv), draw16(rng, dtype, B, H, Lq, Dv)), kw


@pytest.mark.parametrize("case", range(len(HALF_CASES)), ids=lambda i: "x".join(
    map(str, HALF_CASES[i][0])) + "".join("-" + k for k in HALF_CASES[i][1]))
@pytest.mark.parametrize("path", ["fused", "reference"])
@pytest.mark.parametrize("dtype", HALF)
def test_raw_backward_16_bit(rng, dtype, case, path):
    """16-bit q, k, v, out, d_o and gradients: each gradient within twice the error of the
    naive 16-bit backward (naive_grads) against the float64 gradient of the same 16-bit
    inputs, with the forward's output in the query's dtype (as the library writes it) and
    in float32 (as the autograd Function keeps it); and a float32 query, out, d_o and dQ
    over a 16-bit K/V (its dK, dV 16-bit), held to the same rule."""
    (q, k, v, d_o), kw = half_case(rng, dtype, *HALF_CASES[case])
    ref, _ = reference_grads(q, k, v, d_o, **kw)
    nv = naive_grads(q, k, v, d_o, dtype, **kw)
    for out_dtype in (None, "float32"):
        got, out, _ = raw_call16(q, k, v, d_o, out_dtype=out_dtype, path=path, **kw)
        for g, x in zip(got, (q, k, v)):
            assert g.dtype == x.dtype and g.shape == x.shape
        assert_half_grads(got, ref, nv, "%s out %s: " % (dtype, out.dtype))
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731 — exact
    got, _, _ = raw_call16(f32(q), k, v, f32(d_o), path=path, **kw)
    assert got[0].dtype == np.float32 and got[1].dtype == got[2].dtype == NP16[dtype]
    assert_half_grads(got, ref, nv, "float32 query over %s K/V: " % dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_raw_backward_16_bit_small_causal_with_float32_out(rng, dtype):
    """Few query rows under a causal mask, where the gradients are small next to |dO||O|:
    with the forward's output in float32 (as the autograd Function passes it) every
    gradient meets the naive rule. (With a 16-bit output the library's rowsum(dO ∘ O)
    carries O's 16-bit rounding into dQ and dK, which can exceed twice the naive error
    here — measured up to 8x at Lq = 2 — hence the Function's float32 output.)"""
    for _ in range(40):
        B, Hkv, g = (int(x) for x in rng.integers(1, (3, 3, 5)))
        Lq, Lk, D = int(rng.integers(2, 6)), int(rng.integers(2, 40)), int(rng.choice([16, 64]))
        kw = dict(causal=True, gqa=g > 1)
        q, k, v, d_o = (draw16(rng, dtype, *s) for s in ((B, Hkv * g, Lq, D), (B, Hkv, Lk, D),
                                                         (B, Hkv, Lk, D), (B, Hkv * g, Lq, D)))
        ref, _ = reference_grads(q, k, v, d_o, **kw)
        got, _, _ = raw_call16(q, k, v, d_o, out_dtype="float32", **kw)
        assert_half_grads(got, ref, naive_grads(q, k, v, d_o, dtype, **kw),
                          "%s: " % ((B, Hkv * g, Hkv, Lq, Lk, D),))


@pytest.mark.parametrize("dtype", HALF)
def test_raw_backward_16_bit_rounds_once(rng, dtype):
    """A 16-bit gradient is the float32 backward of the same values rounded once to its
    dtype: the library widens the 16-bit inputs and recomputes the output and its LSE in
    float32 (a 16-bit output's rounding would leak into dO·O), so the expected value is
    the float32 forward and backward of the widened inputs, rounded: bit for bit where the
    library writes it; where the extension sums a broadcast dimension (in float64,
    rounded once), equal to the float32 result rounded except where that float32 value is
    itself a 16-bit tie (its second rounding may go the other way)."""
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731 — exact
    q, k, v, d_o = (draw16(rng, dtype, *s) for s in ((2, 4, 19, 16), (2, 2, 23, 16),
                                                     (2, 2, 23, 8), (2, 4, 19, 8)))
    cases = [(q, k, v, d_o, False, dict(causal=True, gqa=True)),
             (q, k, v, d_o, False, dict(mask=rng.random((19, 23)) < 0.7, gqa=True,
                                        path="reference")),
             (q, k[0, 0], v[0, 0], d_o, True, dict()),             # broadcast: summed here
             (q[:, :1], k[:1, :1], v[:1, :1], d_o[:, :1], True, dict(causal=True))]
    for q_, k_, v_, do_, summed, kw in cases:
        got, _, _ = raw_call16(q_, k_, v_, do_, **kw)
        want, _, _ = raw_call16(f32(q_), f32(k_), f32(v_), f32(do_), **kw)
        for g, w in zip(got, want):
            once = w.astype(NP16[dtype])
            differ = g.view(np.uint16) != once.view(np.uint16)
            if summed:
                tie = (f32(g).astype(np.float64) + f32(once)) / 2 == w
                differ &= ~tie
            assert not differ.any(), "%s: %d of %d elements differ" % (
                kw, differ.sum(), differ.size)


@pytest.mark.parametrize("dtype", HALF)
def test_raw_backward_16_bit_broadcasts_and_views(rng, dtype):
    """16-bit gradients of broadcast inputs (rank-2 K/V, a batch-shared K/V, a query of one
    head: summed by the extension in float64 and rounded once) and written into
    transposed and reversed views of larger 16-bit arrays, in place; the naive rule."""
    q, k, v, d_o = (draw16(rng, dtype, *s) for s in ((2, 4, 9, 16), (2, 4, 12, 16),
                                                     (2, 4, 12, 8), (2, 4, 9, 8)))
    cases = [
        ("rank-2 key/value", q, k[0, 0], v[0, 0], d_o),
        ("batch-shared key/value", q, k[:1], v[:1], d_o),
        ("query of one head", q[:, :1], k, v, d_o),
        ("rank 2 everywhere", q[0, 0], k[0, 0], v[0, 0], d_o[0, 0]),
    ]
    for name, q_, k_, v_, do_ in cases:
        for causal in (False, True):
            got, _, _ = raw_call16(q_, k_, v_, do_, causal=causal)
            ref, _ = reference_grads(q_, k_, v_, do_, causal=causal)
            nv = naive_grads(q_, k_, v_, do_, dtype, causal=causal)
            for g, x in zip(got, (q_, k_, v_)):
                assert g.shape == x.shape and g.dtype == x.dtype
            assert_half_grads(got, ref, nv, "%s causal=%s: " % (name, causal))
    B, H, L, S, D = 2, 3, 10, 14, 8
    qs, ks, vs = (draw16(rng, dtype, B, n, H, d) for n, d in ((L, D), (S, 2 * D), (S, D)))
    q = qs.transpose(0, 2, 1, 3)
    k = ks.transpose(0, 2, 1, 3)[..., ::2]
    v = vs.transpose(0, 2, 1, 3)[:, ::-1]
    d_o = np.broadcast_to(draw16(rng, dtype, 1, 1, L, D), (B, H, L, D))     # stride 0
    stores = [np.zeros(s, NP16[dtype]) for s in ((B, L, H, D), (B, S, H, 2 * D),
                                                 (B, S, H, D))]
    grads = (stores[0].transpose(0, 2, 1, 3), stores[1].transpose(0, 2, 1, 3)[..., 1::2],
             stores[2].transpose(0, 2, 1, 3)[:, :, ::-1])
    opts = dict(attn_mask=None, is_causal=True, scale=None, enable_gqa=False, align=0,
                window=None, softcap=0.0, alibi_slopes=None, kv_len=None, path=0,
                precision=0, threads=0)
    out, lse, _ = _attn.forward(q, k, v, return_lse=True, return_weights=False,
                                alloc=lambda s, w, d: np.empty(s, NP16[d]), **opts)
    _attn.backward(q, k, v, out, d_o, lse, *grads, **opts)
    ref, _ = reference_grads(q, k, v, d_o, causal=True)
    assert_half_grads(grads, ref, naive_grads(q, k, v, d_o, dtype, causal=True), "views: ")
    assert not np.asarray(stores[1][..., ::2], np.float32).any(), "wrote outside its view"


def test_half_grad_check_rejects_planted_errors(rng):
    """half_grad_failure rejects: one element of dV off by 3 bounds, dQ scaled by
    1 + 2^-7 (two float16 ulps), a group's dK not summed (its first head only), the scale
    applied twice; and accepts the library's float16 gradients."""
    (q, k, v, d_o), kw = half_case(rng, "float16", (1, 4, 2, 24, 40, 16, 16),
                                   dict(gqa=True, causal=True))
    got, _, _ = raw_call16(q, k, v, d_o, **kw)
    ref, _ = reference_grads(q, k, v, d_o, **kw)
    nv = naive_grads(q, k, v, d_o, "float16", **kw)
    assert_half_grads(got, ref, nv)
    dq, dk, dv = (np.asarray(g, np.float64) for g in got)
    bound = 2 * np.abs(nv[2] - ref[2]).max() + 2.0 ** -22 * (1 + np.abs(ref[2]).max())
    bad = dv.copy()
    bad[0, 1, 5, 3] = ref[2][0, 1, 5, 3] + 3 * bound
    assert "2 x the naive error" in half_grad_failure(
        bad.astype(np.float16), ref[2], nv[2])
    assert "2 x the naive error" in half_grad_failure(
        (dq * (1 + 2.0 ** -7)).astype(np.float16), ref[0], nv[0])
    one_head = reference_grads(q[:, ::2], k, v, d_o[:, ::2], causal=True)[0][1]
    assert "2 x the naive error" in half_grad_failure(
        one_head.astype(np.float16), ref[1], nv[1])
    assert "2 x the naive error" in half_grad_failure(
        (dq / 4).astype(np.float16), ref[0], nv[0])
    nan = dk.copy()
    nan[0, 0, 0, 0] = np.nan
    assert "non-finite" in half_grad_failure(nan.astype(np.float16), ref[1], nv[1])


# ---- PyTorch autograd ------------------------------------------------------------------------

TORCH_TOL = 1e-5
WORST = {}   # the largest max |attn - torch| / (1 + max|g64|) seen, per gradient


def trand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float32) * scale


def leaves(*xs, wants=(True, True, True)):
    return [x.detach().clone().requires_grad_(w) for x, w in zip(xs, wants)]


def compare_torch(q, k, v, wants=(True, True, True), up_seed=9, ref_kwargs=None, record=True,
                  **kw):
    """Our .grad against PyTorch's float32 SDPA backward (<= TORCH_TOL (1 + max|g64|)),
    and against the float64 gradients (PyTorch's float64 SDPA: grad_failure with the
    NumPy magnitudes). Returns our grads."""
    ours_in = leaves(q, k, v, wants=wants)
    out = attn.scaled_dot_product_attention(*ours_in, **kw)
    up = trand(*out.shape, seed=up_seed)
    out.backward(up)
    ours = [x.grad for x in ours_in]
    theirs_in = leaves(q, k, v, wants=wants)
    F.scaled_dot_product_attention(*theirs_in, **kw).backward(up)
    theirs = [x.grad for x in theirs_in]
    exact_in = [x.detach().double().requires_grad_(w) for x, w in zip((q, k, v), wants)]
    kw64 = dict(kw)
    if isinstance(kw.get("attn_mask"), torch.Tensor) and kw["attn_mask"].is_floating_point():
        kw64["attn_mask"] = kw["attn_mask"].double()
    F.scaled_dot_product_attention(*exact_in, **kw64).backward(up.double())
    exact = [x.grad for x in exact_in]
    mask = kw.get("attn_mask")
    rk = dict(mask=None if mask is None else mask.numpy(), causal=kw.get("is_causal", False),
              scale=kw.get("scale"), gqa=kw.get("enable_gqa", False))
    rk.update(ref_kwargs or {})
    ref, mag = reference_grads(q.numpy(), k.numpy(), v.numpy(), up.numpy(), **rk)
    smax = max_logit(q.numpy(), k.numpy(), v.numpy(), rk["scale"], rk["gqa"])
    for name, a, b, e, r, m, w in zip(("dq", "dk", "dv"), ours, theirs, exact, ref, mag, wants):
        if not w:
            assert a is None
            continue
        assert a.dtype == torch.float32 and a.shape == b.shape
        if not a.numel():
            continue
        # PyTorch's float64 gradient and ours (NumPy) agree: the reference is sound here
        # (to 1e-6: the library, so the reference, rounds the default scale 1/sqrt(D) to
        # float32; PyTorch keeps it in float64, a relative difference of about 3e-8)
        assert np.abs(e.numpy() - r).max() <= 1e-6 * (1 + np.abs(r).max())
        scale_g = 1 + e.abs().max().item()
        diff = (a - b).abs().max().item() / scale_g
        if record:
            WORST[name] = max(WORST.get(name, 0.0), diff)
            WORST["abs " + name] = max(WORST.get("abs " + name, 0.0),
                                       (a - b).abs().max().item())
        assert diff <= TORCH_TOL, "%s: max |attn - torch| = %.3g (1 + max|g|)" % (name, diff)
        why = grad_failure(a.numpy(), r, m, smax)
        assert why is None, "%s against float64: %s" % (name, why)
    return ours


@needs_torch
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 17, 33, 16), (1, 4, 64, 64, 64),
                                   (2, 2, 5, 130, 8), (1, 1, 200, 7, 128), (1, 2, 90, 150, 32)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_torch_grads_match(shape, is_causal):
    B, H, Lq, Lk, D = shape
    compare_torch(trand(B, H, Lq, D), trand(B, H, Lk, D, seed=1), trand(B, H, Lk, D, seed=2),
                  is_causal=is_causal)


@needs_torch
def test_torch_scale_dv_and_ranks():
    q, k, v = trand(2, 2, 9, 16), trand(2, 2, 11, 16, seed=1), trand(2, 2, 11, 24, seed=2)
    for s in (0.0, -0.7, 2.5):
        compare_torch(q, k, v, scale=s)
    compare_torch(q[0, 0], k[0, 0], v[0, 0])                       # rank 2
    compare_torch(q[0], k[0], v[0], is_causal=True)                 # rank 3
    compare_torch(q, k[0, 0], v[0, 0])                              # broadcast key/value


@needs_torch
@pytest.mark.parametrize("mshape", [(1, 11), (9, 11), (1, 9, 11), (3, 1, 11), (2, 3, 9, 11)],
                         ids=str)
def test_torch_grads_masks(mshape):
    q, k, v = trand(2, 3, 9, 8), trand(2, 3, 11, 8, seed=1), trand(2, 3, 11, 8, seed=2)
    g = torch.Generator().manual_seed(7)
    bmask = torch.rand(*mshape, generator=g) < 0.8
    bmask[..., 0] = True                 # no fully masked row: PyTorch's math path gives NaN
    compare_torch(q, k, v, attn_mask=bmask)
    fmask = torch.randn(*mshape, generator=g)
    fmask[torch.rand(*mshape, generator=g) < 0.2] = float("-inf")
    fmask[..., 0] = 0.0
    compare_torch(q, k, v, attn_mask=fmask)


@needs_torch
@pytest.mark.parametrize("heads", [(4, 2), (8, 2), (6, 1), (4, 4)], ids=str)
def test_torch_grads_gqa(heads):
    H, Hkv = heads
    q, k, v = trand(2, H, 21, 16), trand(2, Hkv, 37, 16, seed=1), trand(2, Hkv, 37, 8, seed=2)
    for causal in (False, True):
        compare_torch(q, k, v, enable_gqa=True, is_causal=causal)


@needs_torch
def test_torch_grads_strided_and_partial():
    """[B, L, H, D] storage (transposed views), a key expanded over the batch (stride 0),
    non-leaf inputs, and only some inputs requiring grad."""
    B, H, L, S, D = 2, 4, 19, 23, 16
    q = trand(B, L, H, D).transpose(1, 2)
    k = trand(B, S, H, D, seed=1).transpose(1, 2)
    v = trand(B, S, H, D, seed=2).transpose(1, 2)
    compare_torch(q, k, v, is_causal=True)
    compare_torch(q, k, v, wants=(True, False, False))
    compare_torch(q, k, v, wants=(False, True, True), is_causal=True)
    compare_torch(q, k, v, wants=(False, False, True))
    # expanded (stride 0 over the batch): PyTorch's autograd sums over the expansion
    k1 = trand(1, H, S, D, seed=3).requires_grad_()
    q1 = q.detach().clone().requires_grad_()
    out = attn.scaled_dot_product_attention(q1, k1.expand(B, H, S, D), v)
    up = trand(*out.shape, seed=4)
    out.backward(up)
    k2 = k1.detach().clone().requires_grad_()
    q2 = q.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(q2, k2.expand(B, H, S, D), v).backward(up)
    assert (k1.grad - k2.grad).abs().max() <= TORCH_TOL * (1 + k2.grad.abs().max())
    assert (q1.grad - q2.grad).abs().max() <= TORCH_TOL * (1 + q2.grad.abs().max())
    # a non-leaf query: the gradient flows on to its source
    w = trand(D, D, seed=5).requires_grad_()
    x = trand(B, H, L, D, seed=6)
    attn.scaled_dot_product_attention(x @ w, k, v).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(x @ w2, k, v).sum().backward()
    assert (w.grad - w2.grad).abs().max() <= TORCH_TOL * (1 + w2.grad.abs().max())


@needs_torch
def test_torch_one_tensor_three_roles():
    """query = key = value = x: x.grad is dQ + dK + dV, as PyTorch accumulates it."""
    x = trand(2, 3, 10, 8).requires_grad_()
    out = attn.scaled_dot_product_attention(x, x, x, is_causal=True)
    up = trand(*out.shape, seed=1)
    out.backward(up)
    y = x.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(y, y, y, is_causal=True).backward(up)
    assert (x.grad - y.grad).abs().max() <= TORCH_TOL * (1 + y.grad.abs().max())


@needs_torch
def test_torch_library_extras_against_reference():
    """Features PyTorch has no argument for (window, softcap, ALiBi, kv_len, bottom-right):
    .grad against the NumPy float64 reference."""
    q, k, v = trand(2, 4, 13, 16), trand(2, 2, 17, 16, seed=1), trand(2, 2, 17, 12, seed=2)
    slopes = torch.tensor([0.5, 0.125, 1.0, 0.25])
    kw = dict(window=(6, 1), softcap=3.0, alibi_slopes=slopes, kv_len=[15, 9],
              align="bottom-right", is_causal=True, enable_gqa=True, scale=0.5)
    xs = leaves(q, k, v)
    out = attn.scaled_dot_product_attention(*xs, **kw)
    up = trand(*out.shape, seed=3)
    out.backward(up)
    ref, mag = reference_grads(q.numpy(), k.numpy(), v.numpy(), up.numpy(), causal=True,
                               window=(6, 1), softcap=3.0, alibi=slopes.numpy(),
                               kv_len=[15, 9], align="bottom-right", gqa=True, scale=0.5)
    assert_grads([x.grad.numpy() for x in xs], ref, mag)


@needs_torch
def test_torch_fully_masked_rows():
    """Fully masked rows: output 0 and no gradient (PyTorch's math path gives NaN there)."""
    q, k, v = leaves(trand(1, 2, 6, 8), trand(1, 2, 9, 8, seed=1), trand(1, 2, 9, 8, seed=2))
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2] = False
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, kv_len=[9])
    up = trand(*out.shape, seed=3)
    out.backward(up)
    assert (out[:, :, 2] == 0).all() and (q.grad[:, :, 2] == 0).all()
    ref, mag = reference_grads(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                               up.numpy(), mask=mask.numpy())
    assert_grads([x.grad.numpy() for x in (q, k, v)], ref, mag)
    # kv_len = 0: every gradient exactly 0
    for x in (q, k, v):
        x.grad = None
    attn.scaled_dot_product_attention(q, k, v, kv_len=[0]).backward(up)
    assert all((x.grad == 0).all() for x in (q, k, v))


@needs_torch
def test_torch_finite_differences():
    """Float32 central differences of L = Σ out · w on tiny shapes, both paths: the
    autograd wiring (which gradient, sign, scale, group sums, broadcast sums) without
    any reference. h = 2^-6; each difference is taken over the float64 loss of float32
    outputs, divided by the perturbation actually stored. Error: truncation h²/6 |L'''|
    (4e-5 |L'''|, O(1) here) plus the outputs' float32 rounding, at most n u |o| |w| / 2h
    (n <= 30 outputs, u = 6e-8: 1e-4 in the worst case, far less as the roundings
    cancel); measured at most 3e-5 (1 + max|g|). Bound 5e-4 (1 + max|g|), under what a
    scale off by 1 + 1e-2 or a group sum left out would give."""
    h = 2.0 ** -6
    cases = [
        (dict(enable_gqa=True, is_causal=True), (1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)),
        (dict(softcap=1.5, window=(1, -1), align="bottom-right"), (2, 2, 3, 4), (2, 2, 4, 4),
         (2, 2, 4, 2)),
        (dict(), (2, 2, 3, 4), (1, 1, 4, 4), (4, 3)),              # broadcast key/value
    ]
    worst = 0.0
    for path in ("fused", "reference"):
        for kw, sq, sk, sv in cases:
            q, k, v = trand(*sq), trand(*sk, seed=1), trand(*sv, seed=2)
            xs = leaves(q, k, v)
            out = attn.scaled_dot_product_attention(*xs, path=path, **kw)
            w = trand(*out.shape, seed=3)
            out.backward(w)
            base = [q, k, v]

            def loss(args):
                o = attn.scaled_dot_product_attention(*args, path=path, **kw)
                return float((o.double() * w.double()).sum())

            for i, x in enumerate(xs):
                g = x.grad
                fd = torch.zeros_like(g)
                for idx in np.ndindex(*g.shape):
                    plus, minus = base[i].clone(), base[i].clone()
                    plus[idx] += h
                    minus[idx] -= h
                    step = float(plus[idx].double() - minus[idx].double())
                    args_p, args_m = list(base), list(base)
                    args_p[i], args_m[i] = plus, minus
                    fd[idx] = (loss(args_p) - loss(args_m)) / step
                err = (g - fd).abs().max().item() / (1 + fd.abs().max().item())
                worst = max(worst, err)
                assert err <= 5e-4, "%s %s input %d: FD error %.3g" % (path, kw, i, err)
    print("finite differences: worst error %.3g (1 + max|g|)" % worst)


@needs_torch
def test_torch_extra_outputs_and_modes():
    q, k, v = leaves(trand(1, 2, 5, 8), trand(1, 2, 7, 8, seed=1), trand(1, 2, 7, 8, seed=2))
    out, lse, w = attn.scaled_dot_product_attention(q, k, v, return_lse=True,
                                                   return_weights=True)
    assert out.requires_grad and not lse.requires_grad and not w.requires_grad
    assert lse.shape == (1, 2, 5) and w.shape == (1, 2, 5, 7)
    out.sum().backward()
    g1 = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    attn.scaled_dot_product_attention(q, k, v).sum().backward()
    for a, b in zip(g1, (q.grad, k.grad, v.grad)):
        assert torch.equal(a, b)                     # the extra outputs change nothing
    out2, lse2 = attn.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert torch.equal(lse2, lse) and torch.equal(out2, out)
    with torch.no_grad():
        assert not attn.scaled_dot_product_attention(q, k, v).requires_grad
    with torch.inference_mode():
        assert not attn.scaled_dot_product_attention(q, k, v).requires_grad
    # deterministic: the same gradients bit for bit on a rerun and for another thread count
    for threads in (1, 2):
        for x in (q, k, v):
            x.grad = None
        attn.scaled_dot_product_attention(q, k, v, threads=threads).sum().backward()
        for a, b in zip(g1, (q.grad, k.grad, v.grad)):
            assert torch.equal(a, b)
    # the backward reads the saved output: changing it in place is caught by PyTorch
    out = attn.scaled_dot_product_attention(q, k, v)
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@needs_torch
def test_torch_refusals():
    q, k, v = leaves(trand(1, 2, 5, 8), trand(1, 2, 7, 8, seed=1), trand(1, 2, 7, 8, seed=2))
    bias = torch.zeros(5, 7, requires_grad=True)
    with pytest.raises(NotImplementedError, match="attn_mask requires grad.*detach"):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    attn.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach()).sum().backward()
    slopes = torch.ones(2, requires_grad=True)
    with pytest.raises(NotImplementedError, match="alibi_slopes requires grad"):
        attn.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes)
    with pytest.raises(TypeError, match="query: a ndarray, but key requires grad"):
        attn.scaled_dot_product_attention(q.detach().numpy(), k, v)
    # no double backward
    out = attn.scaled_dot_product_attention(q, k, v)
    (gq,) = torch.autograd.grad((out ** 2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        gq.sum().backward()


# ---- PyTorch autograd in 16 bits --------------------------------------------------------------
# A float16/bfloat16 tensor's .grad, in its own dtype, against the float64 gradient of the same
# 16-bit values (PyTorch's float64 SDPA backward, same upstream gradient): its max error must
# be at most twice that of PyTorch's own 16-bit SDPA backward on the same tensors, plus
# HALF_SLACK (1 + max|g64|) for the float32 arithmetic under the final rounding (our float32
# gradients differ from PyTorch's float32 ones by up to 1.3e-6 (1 + max|g|), see TORCH_TOL;
# HALF_SLACK is 1/250 of a float16 half-ulp at 1). It must also meet the naive rule above
# (half_grad_failure, bfloat16 too: round_to needs no ml_dtypes).

HALF_SLACK = 2e-6
HALF_WORST = {}  # the largest (our error) / (PyTorch's 16-bit error) seen, per dtype, gradient


def compare_torch_half(q, k, v, dt, wants=(True, True, True), record=True, **kw):
    """q, k, v (float32 values) as dt leaves: attn's .grad against PyTorch's 16-bit SDPA
    backward's error and the naive rule, both relative to PyTorch's float64 gradient."""
    xs = leaves(q.to(dt), k.to(dt), v.to(dt), wants=wants)
    out = attn.scaled_dot_product_attention(*xs, **kw)
    assert out.dtype == dt
    with torch.no_grad():  # the same bits as the library's own 16-bit output
        assert torch.equal(out.view(torch.int16), attn.scaled_dot_product_attention(
            *xs, **kw).view(torch.int16))
    up = trand(*out.shape, seed=9).to(dt)
    out.backward(up)
    theirs = leaves(*(x.detach() for x in xs), wants=wants)
    F.scaled_dot_product_attention(*theirs, **kw).backward(up)
    exact = leaves(*(x.detach().double() for x in xs), wants=wants)
    kw64 = dict(kw)
    if isinstance(kw.get("attn_mask"), torch.Tensor) and kw["attn_mask"].is_floating_point():
        kw64["attn_mask"] = kw["attn_mask"].double()
    F.scaled_dot_product_attention(*exact, **kw64).backward(up.double())
    mask = kw.get("attn_mask")
    rk = dict(mask=None if mask is None else mask.float().numpy() if mask.is_floating_point()
              else mask.numpy(), causal=kw.get("is_causal", False), scale=kw.get("scale"),
              gqa=kw.get("enable_gqa", False))
    f64 = [x.detach().double().numpy() for x in xs]
    ref, _ = reference_grads(*f64, up.double().numpy(), **rk)
    nv = naive_grads(*f64, up.double().numpy(), str(dt).split(".")[1], **rk)
    for name, a, b, e, r, n, w in zip(("dq", "dk", "dv"), xs, theirs, exact, ref, nv, wants):
        if not w:
            assert a.grad is None
            continue
        assert a.grad.dtype == dt and a.grad.shape == a.shape
        g64 = e.grad
        assert np.abs(g64.numpy() - r).max() <= 1e-6 * (1 + np.abs(r).max())  # sound
        ours = (a.grad.double() - g64).abs().max().item()
        err_t = (b.grad.double() - g64).abs().max().item()
        bound = 2 * err_t + HALF_SLACK * (1 + g64.abs().max().item())
        if record and err_t > 0:
            key = "%s %s" % (str(dt).split(".")[1], name)
            HALF_WORST[key] = max(HALF_WORST.get(key, 0.0), ours / err_t)
        assert ours <= bound, "%s %s: max error %.3g > 2 x PyTorch's 16-bit %.3g (+ %.3g)" % (
            dt, name, ours, err_t, bound - 2 * err_t)
        why = half_grad_failure(a.grad.float().numpy(), r, n)
        assert why is None, "%s %s: %s" % (dt, name, why)
    return xs


DT16 = ["bfloat16", "float16"]


@needs_torch
@pytest.mark.parametrize("dt", DT16)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 17, 33, 16), (1, 4, 64, 64, 64),
                                   (2, 2, 5, 130, 8), (1, 1, 200, 7, 128), (1, 2, 90, 150, 32)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_torch_16_bit_grads(dt, shape, is_causal):
    B, H, Lq, Lk, D = shape
    compare_torch_half(trand(B, H, Lq, D), trand(B, H, Lk, D, seed=1),
                       trand(B, H, Lk, D, seed=2), getattr(torch, dt), is_causal=is_causal)


@needs_torch
@pytest.mark.parametrize("dt", DT16)
def test_torch_16_bit_grads_masks_gqa_and_more(dt):
    """GQA (causal too), bool and 16-bit float masks, a scale, broadcast key/value, ranks 2
    and 3, transposed storage, partial requires_grad."""
    t = getattr(torch, dt)
    q, k, v = trand(2, 8, 21, 16), trand(2, 2, 37, 16, seed=1), trand(2, 2, 37, 8, seed=2)
    for causal in (False, True):
        compare_torch_half(q, k, v, t, enable_gqa=True, is_causal=causal)
    q, k, v = trand(2, 3, 9, 8), trand(2, 3, 11, 8, seed=1), trand(2, 3, 11, 8, seed=2)
    g = torch.Generator().manual_seed(7)
    bmask = torch.rand(9, 11, generator=g) < 0.8
    bmask[..., 0] = True                 # no fully masked row: PyTorch's math path gives NaN
    compare_torch_half(q, k, v, t, attn_mask=bmask)
    fmask = torch.randn(2, 3, 9, 11, generator=g)
    fmask[torch.rand(2, 3, 9, 11, generator=g) < 0.2] = float("-inf")
    fmask[..., 0] = 0.0
    compare_torch_half(q, k, v, t, attn_mask=fmask.to(t))
    compare_torch_half(q, k, v, t, scale=2.5)
    compare_torch_half(q, k[0, 0], v[0, 0], t)                    # broadcast key/value
    compare_torch_half(q[0, 0], k[0, 0], v[0, 0], t, is_causal=True)  # rank 2
    compare_torch_half(q[0], k[0], v[0], t)                       # rank 3
    B, H, L, S, D = 2, 4, 19, 23, 16
    qt = trand(B, L, H, D).transpose(1, 2)
    kt, vt = trand(B, S, H, D, seed=1).transpose(1, 2), trand(B, S, H, D, seed=2).transpose(1, 2)
    compare_torch_half(qt, kt, vt, t, is_causal=True)
    compare_torch_half(qt, kt, vt, t, wants=(False, True, False))
    # few causal rows, gradients small next to |dO||O|: where a backward reading the 16-bit
    # output fails (bfloat16 dQ over twice the naive error, float16 dQ over twice PyTorch's)
    compare_torch_half(trand(2, 2, 3, 32, seed=1), trand(2, 1, 16, 32, seed=2),
                       trand(2, 1, 16, 32, seed=3), t, enable_gqa=True, is_causal=True)
    compare_torch_half(trand(1, 4, 2, 64, seed=2), trand(1, 1, 24, 64, seed=3),
                       trand(1, 1, 24, 64, seed=4), t, enable_gqa=True, is_causal=True)


@needs_torch
@pytest.mark.parametrize("dt", DT16)
def test_torch_16_bit_grads_are_rounded_once(dt):
    """.grad of 16-bit leaves is the library's float32 backward of the same values rounded
    once (bit for bit): the forward's float32 output and LSE (what the Function keeps),
    then _attn.backward on float32 copies. A float32 query over a 16-bit K/V: a float32
    q.grad (the float32 tolerance against float64) and 16-bit k.grad, v.grad likewise."""
    t = getattr(torch, dt)
    q, k, v = trand(2, 4, 19, 16).to(t), trand(2, 2, 23, 16, seed=1).to(t), \
        trand(2, 2, 23, 8, seed=2).to(t)
    up = trand(2, 4, 19, 8, seed=3)
    for qq in (q, q.float()):
        xs = leaves(qq, k, v)
        out = attn.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
        assert out.dtype == qq.dtype
        out.backward(up.to(qq.dtype))
        opts = raw_opts(causal=True, gqa=True)
        o32, lse, _ = _attn.forward(qq, k, v, return_lse=True, return_weights=False,
                                    alloc=lambda s, w, d: torch.empty(s, dtype=torch.float32),
                                    **opts)
        want = [torch.empty(x.shape) for x in (q, k, v)]
        _attn.backward(qq.float(), k.float(), v.float(), o32, up.to(qq.dtype).float(), lse,
                       *want, **opts)
        for x, w in zip(xs, want):
            assert x.grad.dtype == x.dtype
            assert torch.equal(x.grad, w.to(x.dtype)), (qq.dtype, x.dtype)
    ref, mag = reference_grads(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                               up.numpy(), causal=True, gqa=True)      # the float32 query
    assert grad_failure(xs[0].grad.numpy(), ref[0], mag[0]) is None


@needs_torch
def test_torch_16_bit_output_in_place():
    """A 16-bit output is a rounded copy of the float32 one the backward reads: changing it
    in place is not an error, and the gradient flows through the change (here: x2)."""
    q, k, v = (trand(1, 2, 5, 8, seed=s).bfloat16() for s in (0, 1, 2))
    xs = leaves(q, k, v)
    out = attn.scaled_dot_product_attention(*xs)
    out.mul_(2)
    out.sum().backward()
    ys = leaves(q, k, v)
    attn.scaled_dot_product_attention(*ys).backward(torch.full((1, 2, 5, 8), 2.0).bfloat16())
    for x, y in zip(xs, ys):
        assert torch.equal(x.grad, y.grad)


@needs_torch
def test_torch_16_bit_planted_error_is_caught(monkeypatch):
    """The 16-bit comparison rejects a dQ scaled by 1 + 2^-6 (four bfloat16 half-ulps at
    most; two float16 ulps and more), as it would any larger mistake."""
    real = _attn.backward

    def planted(q, k, v, o, d_o, lse, dq, dk, dv, *rest):
        real(q, k, v, o, d_o, lse, dq, dk, dv, *rest)
        if dq is not None:
            dq.mul_(1 + 2.0 ** -6)

    monkeypatch.setattr(_attn, "backward", planted)
    q, k, v = trand(1, 2, 33, 16), trand(1, 2, 40, 16, seed=1), trand(1, 2, 40, 16, seed=2)
    for dt in (torch.bfloat16, torch.float16):
        with pytest.raises(AssertionError, match="dq: max error .* > 2 x PyTorch's 16-bit"):
            compare_torch_half(q, k, v, dt, record=False)


@needs_torch
def test_torch_16_bit_worst_ratio_report():
    """Prints the largest ratio of our 16-bit gradient error to PyTorch's own 16-bit SDPA
    backward's error seen so far, per dtype and gradient (run with -s; bound 2)."""
    if HALF_WORST:
        print("16-bit max error / PyTorch's 16-bit max error: " +
              ", ".join("%s %.2f" % kv for kv in sorted(HALF_WORST.items())))


@needs_torch
def test_torch_planted_error_is_caught(monkeypatch):
    """The PyTorch comparison rejects a backward that is off by 1e-4 relative (a planted
    scale on dQ), as it would any larger mistake."""
    real = _attn.backward

    def planted(q, k, v, o, d_o, lse, dq, dk, dv, *rest):
        real(q, k, v, o, d_o, lse, dq, dk, dv, *rest)
        if dq is not None:
            dq.mul_(1 + 1e-4)

    monkeypatch.setattr(_attn, "backward", planted)
    q, k, v = trand(1, 2, 9, 8), trand(1, 2, 11, 8, seed=1), trand(1, 2, 11, 8, seed=2)
    with pytest.raises(AssertionError, match="dq: max \\|attn - torch\\|"):
        compare_torch(q, k, v, record=False)


@needs_torch
def test_torch_worst_difference_report():
    """Prints the largest differences against PyTorch's float32 backward seen so far
    (run with -s; meaningful after the comparisons above): relative to 1 + max|g64|, and
    absolute ("abs")."""
    if WORST:
        print("max |attn - torch| (/ (1 + max|g64|) unless abs): " +
              ", ".join("%s %.3g" % kv for kv in sorted(WORST.items())))


@needs_torch
def test_docs_example():
    """The example of docs/PYTHON.md's Autograd section runs and prints what it says."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "PYTHON.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    code = text.split("## Autograd", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in code.splitlines() if x.startswith("print("))
    assert r.stdout.strip() == line.split("# ", 1)[1].strip()


def test_import_does_not_load_torch():
    code = ("import sys, numpy as np, attn; "
            "q = np.ones((2, 4), np.float32); attn.scaled_dot_product_attention(q, q, q); "
            "assert 'torch' not in sys.modules, 'attn imported torch'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
