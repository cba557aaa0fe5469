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
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import attn
from attn import _attn
from oracle import _as4d, _setup, reference, tolerance_failure

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

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
        (dict(grad_value=np.zeros_like(v, np.float16)), NotImplementedError, "grad_value"),
        (dict(grad_out=d_o.astype(np.float16)), NotImplementedError, "grad_out"),
        (dict(query=q.astype(np.float16)), NotImplementedError, "query: 16-bit"),
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
    # 16-bit: the forward runs, the backward says why it cannot
    for dt in (torch.bfloat16, torch.float16):
        qh, kh, vh = leaves(q.to(dt), k.to(dt), v.to(dt))
        out = attn.scaled_dot_product_attention(qh, kh, vh)
        assert out.dtype == dt and out.requires_grad
        with pytest.raises(NotImplementedError, match="no backward pass for float16/bfloat16 "
                           "yet .*query is torch.%s.*float32" % str(dt).split(".")[1]):
            out.sum().backward()
    # a float32 query over a 16-bit cache: refused in the backward too, naming key
    kh = k.detach().bfloat16()
    out = attn.scaled_dot_product_attention(q, kh, kh)
    with pytest.raises(NotImplementedError, match=r"\(key is torch.bfloat16, value is"):
        out.sum().backward()
    # no double backward
    out = attn.scaled_dot_product_attention(q, k, v)
    (gq,) = torch.autograd.grad((out ** 2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        gq.sum().backward()


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
