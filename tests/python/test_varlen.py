"""test_varlen.py — attn.varlen_attention and the extension's varlen_forward /
varlen_backward: packed (variable-length) batches in FlashAttention's layout
(q [total_q, Hq, D], k, v [total_k, Hkv, D], cu_seqlens, max_seqlen).

Against, sequence by sequence:
- the float64 reference (oracle.reference on that sequence's rows alone, bottom-right
  alignment, GQA; sinks added to it exactly: lse' = logaddexp(lse, sink), O' = O exp(lse -
  lse')) under the contract's float32 rule (tolerance_failure), and the half-precision
  rule (half_tolerance_failure, against oracle.naive) for float16;
- attn.scaled_dot_product_attention of that sequence alone (align="bottom-right",
  enable_gqa=True): bit for bit, which is the C contract's promise;
- the raw backward (_attn.varlen_backward) against grads.reference_grads of each sequence
  (grad_failure), and bit for bit against the rectangular _attn.backward of each
  sequence (d_sinks: their float32 sum in sequence order);
- with dropout (reference path): bit for bit the padded call with kv_len (the contract's
  dropout layout).
Lengths include 0, 1, 16 and ~200, with Lq != Lk per sequence. Refusals (cu_seqlens not
from 0, decreasing, last != total, a sequence longer than max_seqlen, a wrong dtype)
raise with nothing written; a planted error (a sequence boundary off by one) is rejected
by both checks. PyTorch autograd tests skip without PyTorch.
"""
import numpy as np
import pytest

import attn
from attn import _attn
from grads import grad_failure, reference_grads
from oracle import half_tolerance_failure, naive, reference, tolerance_failure

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch is not installed: varlen_attention's autograd Function "
    "is skipped (the raw varlen_backward is checked against the float64 reference above)")

# (Lq_s, Lk_s) per sequence: empty on either side, single rows, equal, Lq != Lk, long
LENS = [(0, 5), (1, 1), (16, 16), (7, 23), (200, 180), (3, 0), (16, 40), (1, 9)]
SHORT = [(0, 3), (1, 1), (16, 16), (5, 21), (40, 33), (2, 0)]


def cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def pack(rng, lens, Hq=4, Hkv=2, D=16, Dv=16, dtype=np.float32):
    """q, k, v packed [total, H, D] of dtype (values the dtype holds), cu_seqlens int32."""
    lq, lk = [a for a, _ in lens], [b for _, b in lens]
    q = rng.standard_normal((sum(lq), Hq, D)).astype(dtype)
    k = rng.standard_normal((sum(lk), Hkv, D)).astype(dtype)
    v = rng.standard_normal((sum(lk), Hkv, Dv)).astype(dtype)
    return q, k, v, cu(lq), cu(lk), max(lq), max(lk)


def seqs(cu_q, cu_k):
    return [(slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1]))
            for s in range(len(cu_q) - 1)]


def heads_first(x):
    return np.ascontiguousarray(np.swapaxes(x, 0, 1))   # [L, H, D] -> [H, L, D]


def ref_opts(o):
    """varlen_attention's keywords as oracle.reference's."""
    w = o.get("window_size", (-1, -1))
    return dict(causal=o.get("causal", False), scale=o.get("softmax_scale"), gqa=True,
                align="bottom-right", window=None if tuple(w) == (-1, -1) else tuple(w),
                softcap=o.get("softcap", 0.0), alibi=o.get("alibi_slopes"))


def sdpa_opts(o):
    w = o.get("window_size", (-1, -1))
    return dict(is_causal=o.get("causal", False), scale=o.get("softmax_scale"),
                enable_gqa=True, align="bottom-right",
                window=None if tuple(w) == (-1, -1) else tuple(w),
                softcap=o.get("softcap", 0.0), alibi_slopes=o.get("alibi_slopes"),
                sinks=o.get("sinks"))


def reference_packed(q, k, v, cu_q, cu_k, o):
    """The float64 (out [total_q, Hq, Dv], lse [Hq, total_q]), one sequence at a time."""
    Hq, Dv = q.shape[1], v.shape[2]
    out = np.zeros((q.shape[0], Hq, Dv))
    lse = np.full((Hq, q.shape[0]), -np.inf)
    for sq, sk in seqs(cu_q, cu_k):
        if sq.stop == sq.start:
            continue
        r_o, r_l, _ = reference(heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]),
                                **ref_opts(o))
        sinks = o.get("sinks")
        if sinks is not None:  # exp(sink) added to each row's denominator, exactly
            s = np.asarray(sinks, np.float64)[:, None]
            with np.errstate(invalid="ignore"):
                l2 = np.logaddexp(r_l, s)
                r_o = r_o * np.where(np.isneginf(r_l), 0.0, np.exp(r_l - l2))[..., None]
            r_l = l2
        out[sq] = np.swapaxes(r_o, 0, 1)
        lse[:, sq] = r_l
    return out, lse


def naive_packed(q, k, v, cu_q, cu_k, o, dtype):
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    for sq, sk in seqs(cu_q, cu_k):
        if sq.stop > sq.start:
            out[sq] = np.swapaxes(naive(heads_first(q[sq]), heads_first(k[sk]),
                                        heads_first(v[sk]), dtype, **ref_opts(o)), 0, 1)
    return out


def slopes(Hq):
    return (2.0 ** -np.arange(1, Hq + 1)).astype(np.float32)


OPTIONS = {
    "plain": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(8, 2)),
    "causal_window": dict(causal=True, window_size=(16, 0)),
    "softcap": dict(softcap=5.0, softmax_scale=0.4),
    "alibi": dict(alibi_slopes=slopes(4)),
    "causal_alibi_window": dict(causal=True, alibi_slopes=slopes(4), window_size=(32, -1)),
    "sinks": dict(sinks=np.array([0.5, 0.0, -1.0, 2.0], np.float32), causal=True),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_float32_against_reference_and_per_sequence(rng, name):
    o = OPTIONS[name]
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, LENS)
    out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, return_lse=True, **o)
    assert out.dtype == np.float32 and out.shape == q.shape[:2] + (v.shape[2],)
    assert lse.dtype == np.float32 and lse.shape == (q.shape[1], q.shape[0])
    r_o, r_l = reference_packed(q, k, v, cu_q, cu_k, o)
    for what, got, ref in (("out", out, r_o), ("lse", lse, r_l)):
        why = tolerance_failure(got, ref)
        assert why is None, "%s %s: %s" % (name, what, why)
    # bit for bit each sequence's own rectangular call
    for s, (sq, sk) in enumerate(seqs(cu_q, cu_k)):
        o_s, l_s = attn.scaled_dot_product_attention(
            heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]), return_lse=True,
            **sdpa_opts(o))
        assert np.array_equal(np.swapaxes(o_s, 0, 1), out[sq]), "%s: sequence %d" % (name, s)
        assert np.array_equal(l_s, lse[:, sq]), "%s: sequence %d's lse" % (name, s)


@pytest.mark.parametrize("name", ["plain", "causal", "causal_window", "softcap", "alibi"])
def test_float16_against_reference(rng, name):
    o = OPTIONS[name]
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, LENS, dtype=np.float16)
    out = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, **o)
    assert out.dtype == np.float16
    r_o, _ = reference_packed(q, k, v, cu_q, cu_k, o)
    n_o = naive_packed(q, k, v, cu_q, cu_k, o, "float16")
    why = half_tolerance_failure(out, r_o, n_o)
    assert why is None, "%s: %s" % (name, why)
    for sq, sk in seqs(cu_q, cu_k):
        o_s = attn.scaled_dot_product_attention(heads_first(q[sq]), heads_first(k[sk]),
                                                heads_first(v[sk]), **sdpa_opts(o))
        assert np.array_equal(np.swapaxes(o_s, 0, 1), out[sq])


def test_float64(rng):
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, SHORT, dtype=np.float64)
    out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True,
                                     return_lse=True)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    r_o, r_l = reference_packed(q, k, v, cu_q, cu_k, dict(causal=True))
    fin = np.isfinite(r_l)
    assert np.array_equal(np.isneginf(lse), ~fin)
    assert np.abs(out - r_o).max() <= 1e-12 and np.abs(lse[fin] - r_l[fin]).max() <= 1e-12


def test_layouts_int64_lists_and_flash_conventions(rng):
    """Any strides (q, k, v as slices of one [total, 3, H, D] buffer), int64 and list
    cu_seqlens, return_attn_probs' triple: the same bits."""
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, SHORT, Hq=2, Hkv=2)
    base = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    qkv = np.full((q.shape[0], 3) + q.shape[1:], np.nan, np.float32)
    qkv[:, 1] = q
    strided = qkv[:, 1]
    assert not strided.flags.c_contiguous
    got = attn.varlen_attention(strided, k, v, cu_q.astype(np.int64), list(map(int, cu_k)),
                                mq, mk, causal=True)
    assert np.array_equal(got, base)
    out, lse, probs = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True,
                                            return_attn_probs=True, deterministic=True)
    assert probs is None and np.array_equal(out, base) and lse.shape == (2, q.shape[0])
    # k, v as a [total_k, Hkv, D] view of a [Hkv, total_k, D] buffer (transposed)
    kt = np.ascontiguousarray(np.swapaxes(k, 0, 1)).swapaxes(0, 1)
    assert np.array_equal(attn.varlen_attention(q, kt, v, cu_q, cu_k, mq, mk, causal=True),
                          base)


def test_empty_batch_and_fully_masked_rows(rng):
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, [(4, 0), (0, 0), (2, 3)])
    out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, return_lse=True)
    assert np.all(out[:4] == 0) and np.all(np.isneginf(lse[:, :4]))
    z = np.zeros((0, 4, 16), np.float32)
    out = attn.varlen_attention(z, z[:, :2], z[:, :2], np.zeros(1, np.int32),
                                np.zeros(1, np.int32), 0, 0)
    assert out.shape == (0, 4, 16)


def test_dropout_is_the_padded_calls(rng):
    """Reference path: bit for bit the padded [B, Hq, max_q, max_k] call with kv_len
    (top-left; no causal), the contract's dropout layout; fused: within tolerance of it."""
    lens = [(3, 5), (0, 2), (9, 9), (6, 1)]
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, lens)
    B, Hq, Hkv, D = len(lens), q.shape[1], k.shape[1], q.shape[2]
    qp = np.zeros((B, Hq, mq, D), np.float32)
    kp = np.zeros((B, Hkv, mk, D), np.float32)
    vp = np.zeros((B, Hkv, mk, D), np.float32)
    for s, (sq, sk) in enumerate(seqs(cu_q, cu_k)):
        qp[s, :, :sq.stop - sq.start] = heads_first(q[sq])
        kp[s, :, :sk.stop - sk.start] = heads_first(k[sk])
        vp[s, :, :sk.stop - sk.start] = heads_first(v[sk])
    kv_len = np.diff(cu_k).astype(np.int64)
    for path in ("reference", "fused"):
        got = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, dropout_p=0.3, seed=7,
                                    path=path)
        pad = attn.scaled_dot_product_attention(qp, kp, vp, dropout_p=0.3, seed=7,
                                                enable_gqa=True, kv_len=kv_len, path=path)
        for s, (sq, sk) in enumerate(seqs(cu_q, cu_k)):
            want = np.swapaxes(pad[s, :, :sq.stop - sq.start], 0, 1)
            if path == "reference":
                assert np.array_equal(got[sq], want), "sequence %d" % s
            else:
                assert tolerance_failure(got[sq], want) is None, "sequence %d" % s
    other = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, dropout_p=0.3, seed=8)
    assert not np.array_equal(other, got)


# ---- the raw backward ----------------------------------------------------------------------

def raw_varlen(q, k, v, d_o, cu_q, cu_k, mq, mk, causal=False, scale=None, window=None,
               softcap=0.0, alibi=None, sinks=None, want_dsinks=False, path=0, **drop):
    args = dict(is_causal=causal, scale=scale, align=1, window=window, softcap=softcap,
                alibi_slopes=alibi, path=path, precision=0, threads=0)
    out, lse = _attn.varlen_forward(q, k, v, cu_q, cu_k, mq, mk, return_lse=True,
                                    alloc=lambda shape, which, dt: np.empty(shape, np.float32),
                                    sinks=sinks, **args, **drop)
    grads = tuple(np.full(x.shape, np.nan, np.float32) for x in (q, k, v))
    ds = np.full(q.shape[1], np.nan, np.float32) if want_dsinks else None
    _attn.varlen_backward(q, k, v, out, d_o, lse, *grads, cu_q, cu_k, mq, mk, sinks=sinks,
                          grad_sinks=ds, **args, **drop)
    return grads, ds


BACKWARD = {
    "plain": {},
    "causal": dict(causal=True),
    "causal_window": dict(causal=True, window=(16, 0)),
    "softcap": dict(softcap=5.0, scale=0.4),
    "alibi_window": dict(alibi=slopes(4), window=(8, 3)),
}


@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_raw_backward_against_reference(rng, name):
    o = BACKWARD[name]
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, LENS)
    d_o = rng.standard_normal(q.shape[:2] + (v.shape[2],)).astype(np.float32)
    (dq, dk, dv), _ = raw_varlen(q, k, v, d_o, cu_q, cu_k, mq, mk, **o)
    ro = dict(causal=o.get("causal", False), scale=o.get("scale"), gqa=True,
              align="bottom-right", window=o.get("window"), softcap=o.get("softcap", 0.0),
              alibi=o.get("alibi"))
    for s, (sq, sk) in enumerate(seqs(cu_q, cu_k)):
        ref, mag = reference_grads(heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]),
                                   heads_first(d_o[sq]), **ro)
        for g_name, got, r, m in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), ref, mag):
            why = grad_failure(heads_first(got), r, m)
            assert why is None, "%s: sequence %d %s: %s" % (name, s, g_name, why)


def test_raw_backward_is_the_per_sequence_backward(rng):
    """Bit for bit the rectangular backward of each sequence (sinks and their gradient:
    the float32 sum of the sequences' own, in sequence order)."""
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, LENS)
    d_o = rng.standard_normal(q.shape[:2] + (v.shape[2],)).astype(np.float32)
    sinks = np.array([0.5, 0.0, -1.0, 2.0], np.float32)
    (dq, dk, dv), ds = raw_varlen(q, k, v, d_o, cu_q, cu_k, mq, mk, causal=True,
                                  window=(20, 0), sinks=sinks, want_dsinks=True)
    total = np.zeros(4, np.float32)
    opts = dict(attn_mask=None, is_causal=True, scale=None, enable_gqa=True, align=1,
                window=(20, 0), softcap=0.0, alibi_slopes=None, kv_len=None, path=0,
                precision=0, threads=0)
    for s, (sq, sk) in enumerate(seqs(cu_q, cu_k)):
        qs, ks, vs = heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk])
        out, lse, _ = _attn.forward(qs, ks, vs, return_lse=True, return_weights=False,
                                    alloc=lambda sh, w, dt: np.empty(sh, np.float32),
                                    sinks=sinks, **opts)
        g = tuple(np.full(x.shape, np.nan, np.float32) for x in (qs, ks, vs))
        d = np.zeros(4, np.float32)
        if sq.stop > sq.start or sk.stop > sk.start:
            _attn.backward(qs, ks, vs, out, heads_first(d_o[sq]), lse, *g, sinks=sinks,
                           grad_sinks=d, **opts)
        else:
            g = tuple(np.zeros_like(x) for x in g)
        for name, got, want in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), g):
            assert np.array_equal(heads_first(got), want), "sequence %d %s" % (s, name)
        total = total + d
    assert np.array_equal(ds, total)


def test_raw_backward_gradients_may_be_none_and_strided(rng):
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, SHORT)
    d_o = rng.standard_normal(q.shape[:2] + (v.shape[2],)).astype(np.float32)
    (dq, dk, dv), _ = raw_varlen(q, k, v, d_o, cu_q, cu_k, mq, mk, causal=True)
    args = dict(is_causal=True, scale=None, align=1, window=None, softcap=0.0,
                alibi_slopes=None, path=0, precision=0, threads=0)
    out, lse = _attn.varlen_forward(q, k, v, cu_q, cu_k, mq, mk, return_lse=True,
                                    alloc=lambda s, w, d: np.empty(s, np.float32), **args)
    dk2 = np.full((k.shape[1], k.shape[0], k.shape[2]), np.nan, np.float32).swapaxes(0, 1)
    _attn.varlen_backward(q, k, v, out, d_o, lse, None, dk2, None, cu_q, cu_k, mq, mk,
                          **args)
    assert np.array_equal(dk2, dk)


# ---- refusals --------------------------------------------------------------------------------

def _refused(exc, q, k, v, cu_q, cu_k, mq, mk, match):
    """The forward and the backward both refuse, writing nothing (the forward never asks
    for its output; the backward's gradients keep their NaN)."""
    calls = []

    def alloc(shape, which, dt):
        calls.append(which)
        return np.empty(shape, np.float32)
    args = dict(is_causal=False, scale=None, align=1, window=None, softcap=0.0,
                alibi_slopes=None, path=0, precision=0, threads=0)
    match = match or None
    with pytest.raises(exc, match=match) as info:
        _attn.varlen_forward(q, k, v, cu_q, cu_k, mq, mk, return_lse=True, alloc=alloc, **args)
    assert calls == []
    assert getattr(info.value, "status", "ATTN_ERR").startswith("ATTN_ERR")
    with pytest.raises(exc, match=match):
        attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk)
    out = np.zeros(q.shape[:2] + (v.shape[2],), np.float32)
    lse = np.zeros((q.shape[1], q.shape[0]), np.float32)
    grads = tuple(np.full(x.shape, np.nan, np.float32) for x in (q, k, v))
    with pytest.raises(exc, match=match):
        _attn.varlen_backward(q, k, v, out, out, lse, *grads, cu_q, cu_k, mq, mk, **args)
    assert all(np.isnan(g).all() for g in grads)


def test_refusals(rng):
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, [(3, 4), (5, 2), (2, 6)])
    bad = cu_q.copy()
    bad[1], bad[2] = 6, 4                          # decreasing
    _refused(ValueError, q, k, v, bad, cu_k, mq, mk, "cu_seqlens_q")
    bad = cu_k.copy()
    bad[-1] -= 1                                    # last != total_k
    _refused(ValueError, q, k, v, cu_q, bad, mq, mk, "cu_seqlens_k")
    bad = cu_q + 1                                  # not from 0
    _refused(ValueError, q, k, v, bad, cu_k, mq, mk, "cu_seqlens_q")
    _refused(ValueError, q, k, v, cu_q, cu_k, mq - 1, mk, "max_seqlen_q")   # too small
    _refused(ValueError, q, k, v, cu_q, cu_k, mq, -1, "")                   # negative
    _refused(TypeError, q, k, v, cu_q.astype(np.float32), cu_k, mq, mk, "cu_seqlens_q")
    _refused(TypeError, q, k.astype(np.float64), v.astype(np.float64), cu_q, cu_k, mq, mk, "")
    _refused(ValueError, q, k, v, cu_q[:-1], cu_k, mq, mk, "")              # B differs
    _refused(ValueError, q[:, :3], k, v, cu_q, cu_k, mq, mk, "")            # 3 % 2 heads
    with pytest.raises(ValueError, match="rank"):
        attn.varlen_attention(q[None], k, v, cu_q, cu_k, mq, mk)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        attn.varlen_attention(q, k, v, cu_q, cu_k, 5.0, mk)
    with pytest.raises(TypeError, match="cu_seqlens_k"):
        attn.varlen_attention(q, k, v, cu_q, [0, 4, 6.5, 12], mq, mk)
    with pytest.raises(ValueError, match="window"):
        attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, window_size=(1, 2, 3))


def test_planted_boundary_error_is_rejected(rng):
    """A boundary off by one (query rows shifted between two sequences) is caught by the
    tolerance check against the reference and by the per-sequence bit-for-bit check."""
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, [(5, 9), (16, 16), (8, 12)])
    wrong = cu_q.copy()
    wrong[1] += 1
    out = attn.varlen_attention(q, k, v, wrong, cu_k, mq + 1, mk, causal=True)
    r_o, _ = reference_packed(q, k, v, cu_q, cu_k, dict(causal=True))
    assert tolerance_failure(out, r_o) is not None
    sq, sk = seqs(cu_q, cu_k)[0]
    o_s = attn.scaled_dot_product_attention(heads_first(q[sq]), heads_first(k[sk]),
                                            heads_first(v[sk]), is_causal=True,
                                            align="bottom-right", enable_gqa=True)
    assert not np.array_equal(np.swapaxes(o_s, 0, 1), out[sq])
    # and the backward's check: a gradient of the wrong packing fails grad_failure
    d_o = rng.standard_normal(q.shape[:2] + (v.shape[2],)).astype(np.float32)
    (dq, _, _), _ = raw_varlen(q, k, v, d_o, wrong, cu_k, mq + 1, mk, causal=True)
    sq, sk = seqs(cu_q, cu_k)[1]
    ref, mag = reference_grads(heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]),
                               heads_first(d_o[sq]), causal=True, gqa=True,
                               align="bottom-right")
    assert grad_failure(heads_first(dq[sq]), ref[0], mag[0]) is not None


# ---- PyTorch -----------------------------------------------------------------------------------

@needs_torch
def test_torch_forward_kinds(rng):
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, SHORT)
    want = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    got, lse = attn.varlen_attention(tq, tk, tv, torch.from_numpy(cu_q),
                                     torch.from_numpy(cu_k), mq, mk, causal=True,
                                     return_lse=True)
    assert isinstance(got, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert np.array_equal(got.numpy(), want)
    for dt in (torch.float16, torch.bfloat16):
        h = attn.varlen_attention(tq.to(dt), tk.to(dt), tv.to(dt), torch.from_numpy(cu_q),
                                  torch.from_numpy(cu_k), mq, mk, causal=True)
        assert h.dtype == dt and h.shape == got.shape


@needs_torch
@pytest.mark.parametrize("with_sinks", [False, True])
def test_torch_autograd_is_the_raw_backward(rng, with_sinks):
    """.grad of q, k, v (and sinks) through the Function: bit for bit the raw
    varlen_backward (float32), itself checked against the float64 reference and the
    per-sequence backward above."""
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, LENS)
    d_o = rng.standard_normal(q.shape[:2] + (v.shape[2],)).astype(np.float32)
    sinks = np.array([0.5, 0.0, -1.0, 2.0], np.float32) if with_sinks else None
    (dq, dk, dv), ds = raw_varlen(q, k, v, d_o, cu_q, cu_k, mq, mk, causal=True,
                                  sinks=sinks, want_dsinks=with_sinks)
    tq, tk, tv = (torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v))
    ts = torch.from_numpy(sinks.copy()).requires_grad_() if with_sinks else None
    out = attn.varlen_attention(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k),
                                mq, mk, causal=True, sinks=ts)
    out.backward(torch.from_numpy(d_o))
    for name, t, want in (("dq", tq, dq), ("dk", tk, dk), ("dv", tv, dv)):
        assert np.array_equal(t.grad.numpy(), want), name
    if with_sinks:  # the raw one is the per-sequence rectangular sum (test above)
        assert np.array_equal(ts.grad.numpy(), ds)


@needs_torch
def test_torch_autograd_half_and_partial(rng):
    """A bfloat16 call's gradients in bfloat16; only k requiring grad."""
    q, k, v, cu_q, cu_k, mq, mk = pack(rng, SHORT)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16).requires_grad_() for x in (q, k, v))
    out = attn.varlen_attention(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k),
                                mq, mk, causal=True)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert tq.grad.dtype == torch.bfloat16 and torch.isfinite(tq.grad.float()).all()
    tk2 = torch.from_numpy(k).requires_grad_()
    out = attn.varlen_attention(torch.from_numpy(q), tk2, torch.from_numpy(v),
                                torch.from_numpy(cu_q), torch.from_numpy(cu_k), mq, mk)
    out.sum().backward()
    assert tk2.grad is not None and tk2.grad.shape == tk2.shape
    with pytest.raises(NotImplementedError):
        attn.varlen_attention(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k),
                              mq, mk, alibi_slopes=torch.ones(4, requires_grad=True))
