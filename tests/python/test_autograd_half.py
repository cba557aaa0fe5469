"""test_autograd_half.py — 16-bit gradients of the raw backward (float16 always; bfloat16
through ml_dtypes where installed) against the float64 gradient of the same 16-bit values,
with the naive 16-bit backward of grads.py as the yardstick (grads.half_grad_failure).
"""
import numpy as np
import pytest

from attn import _attn
from grads import (
    HALF, NP16, assert_grads, assert_half_grads, draw16, half_grad_failure, inputs,
    naive_grads, randn, raw_call16, reference_grads
)


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
