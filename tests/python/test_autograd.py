"""test_autograd.py — the backward pass from Python: the extension's raw attn._attn.backward
against the float64 NumPy reference of the gradients (grads.py; always: CI has NumPy only),
the reference itself against central finite differences, and the raw call's promises
(masks, GQA sums, views, fully masked rows, thread counts, errors, planted errors).
16-bit gradients: test_autograd_half.py; PyTorch autograd: test_autograd_torch.py.
"""
import subprocess
import sys

import numpy as np
import pytest

from attn import _attn
from grads import (assert_grads, grad_failure, inputs, randn, raw_call, reference_bias_grad,
                   reference_grads)
from oracle import _setup, reference


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




def test_import_does_not_load_torch():
    code = ("import sys, numpy as np, attn; "
            "q = np.ones((2, 4), np.float32); attn.scaled_dot_product_attention(q, q, q); "
            "assert 'torch' not in sys.modules, 'attn imported torch'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


def test_cancellation_rule(rng):
    """One key per row: the exact dQ and dK are 0 (P = 1, so dP - D = 0), and the library's
    float32 ones are rounding noise judged by grad_failure's cancellation rule (the
    derived bound, eps times the magnitude); a dQ computed without D is rejected."""
    q, k, v, d_o = inputs(rng, 1, 2, 2, 9, 1, 16, 16)
    got = raw_call(q, k, v, d_o)
    ref, mag = reference_grads(q, k, v, d_o)
    assert np.linalg.norm(mag[0]) >= 100 * np.linalg.norm(ref[0])   # the rule's branch
    assert mag[0].eps is not None and 0 < mag[0].eps < 1e-3
    assert_grads(got, ref, mag)
    q4, k4, v4, do4 = (x.astype(np.float64) for x in (q, k, v, d_o))
    no_d = (do4 @ np.swapaxes(v4, -1, -2)) @ k4 / np.sqrt(16)   # dS = P dP, D forgotten
    assert grad_failure(no_d, ref[0], mag[0]) is not None
    assert grad_failure(ref[0] + 2 * mag[0].eps * mag[0], ref[0], mag[0]) is not None


@pytest.mark.parametrize("mshape", [(2, 3, 6, 9), (1, 3, 6, 9), (3, 6, 9), (6, 9), (2, 1, 1, 9),
                                    (1, 1, 6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_bias_gradient_raw(rng, mshape, causal):
    """grad_attn_mask (the library's d_bias): a float mask's gradient, summed over the
    dimensions it broadcasts along, within its derived bound of the float64 reference,
    -inf entries exactly 0; dq, dk, dv the same bits as without it; a gradient of the
    batch's first slice alone (the sum forgotten) rejected."""
    q, k, v, d_o = inputs(rng, 2, 3, 3, 6, 9, 8, 8)
    mask = randn(rng, *mshape)
    mask.flat[::7] = -np.inf
    got = raw_call(q, k, v, d_o, mask=mask, causal=causal)
    d_mask = np.full(mask.shape, np.nan, np.float32)
    with_db = raw_call(q, k, v, d_o, mask=mask, causal=causal, grad_mask=d_mask)
    for a, b in zip(got, with_db):
        assert np.array_equal(a, b, equal_nan=True)
    ref, mag, eps = reference_bias_grad(q, k, v, d_o, mask, causal=causal)
    err = np.abs(d_mask.astype(np.float64) - ref)
    assert np.all(err <= eps * mag + 2.0 ** -126), (err / (eps * mag + 2.0 ** -126)).max()
    assert np.all(d_mask[np.isneginf(mask)] == 0)
    # the batch's sum: batch 0 alone is wrong (unless the bias is one value per row,
    # whose gradient is Σ_j P (dP - D) = 0: softmax ignores a shift of its row)
    if mask.ndim == 4 and mask.shape[0] == 1 and mask.shape[-1] > 1:
        one = reference_bias_grad(q[:1], k[:1], v[:1], d_o[:1], mask, causal=causal)[0]
        assert not np.all(np.abs(one - ref) <= eps * mag + 2.0 ** -126)


def test_bias_gradient_refused(rng):
    q, k, v, d_o = inputs(rng, 1, 2, 2, 4, 5, 8, 8)
    keep = np.ones((4, 5), bool)
    with pytest.raises(ValueError):  # a bool mask has no gradient
        raw_call(q, k, v, d_o, mask=keep, grad_mask=np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError):  # another shape
        raw_call(q, k, v, d_o, mask=randn(rng, 4, 5), grad_mask=np.zeros((1, 4, 5), np.float32))
