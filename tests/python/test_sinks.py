"""test_sinks.py — the sinks= keyword of attn.scaled_dot_product_attention (attention sinks).

Against this file's own float64 oracle, which appends each head's sink to every row as one
more logit whose value row is zero: NumPy inputs on both paths (GQA, causal, kv_len with a
fully masked batch, LSE and weights outputs, sinks as a list); the raw backward's sinks
gradient; bad sinks refused with the argument named; and, where PyTorch is installed, the
autograd gradients of query, key, value and sinks against PyTorch's own autograd of the
same float64 formula (skipped with the reason otherwise). The tolerance is the contract's
float32 rule (oracle.tolerance_failure), shown to reject a planted error.
"""
import numpy as np
import pytest

import attn
from attn import _attn
from oracle import tolerance_failure

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch is not installed: the autograd of sinks is skipped (the "
    "raw backward's sinks gradient is checked against finite differences above)")


def sink_reference(q, k, v, sinks, causal=False, kv_len=None):
    """(O, LSE, weights) in float64 with the sink appended as a logit of value 0.
    q (B, H, L, D), k/v (B, Hkv, S, D); top-left causal; kv_len (B,) or None."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    keep = np.ones((B, 1, L, S), bool)
    if causal:
        keep &= np.tril(np.ones((L, S), bool))[None, None]
    if kv_len is not None:
        keep &= (np.arange(S)[None, :] < np.asarray(kv_len)[:, None])[:, None, None, :]
    s = np.where(keep, s, -np.inf)
    sink = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], (B, H, L, 1))
    s = np.concatenate([s, sink], axis=-1)                     # the sink: one more logit
    v = np.concatenate([v, np.zeros((B, H, 1, v.shape[-1]))], axis=2)  # ... whose value is 0
    m = s.max(axis=-1, keepdims=True)
    empty = m == -np.inf
    e = np.where(empty, 0.0, np.exp(s - np.where(empty, 0.0, m)))
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0.0, e / np.where(empty, 1.0, l))
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))[..., 0]
    return p @ v, lse, p[..., :S]


def data(rng, B=2, H=4, Hkv=2, L=19, S=33, D=16):
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    sinks = rng.uniform(-1, 2, H).astype(np.float32)
    sinks[1] = 0.0
    sinks[2] = -np.inf
    return q, k, v, sinks


@pytest.mark.parametrize("path", ["fused", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward(rng, path, causal):
    q, k, v, sinks = data(rng)
    kv_len = np.array([33, 0], np.int64)  # batch 1: every row fully masked
    o, lse, w = attn.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=True, kv_len=kv_len, sinks=sinks, path=path,
        return_lse=True, return_weights=True)
    ro, rl, rw = sink_reference(q, k, v, sinks, causal, kv_len)
    for got, ref, what in ((o, ro, "output"), (lse, rl, "lse"), (w, rw, "weights")):
        msg = tolerance_failure(got, ref)
        assert msg is None, "%s: %s" % (what, msg)
    # fully masked rows: output exactly 0, LSE exactly the sink
    assert (o[1] == 0).all()
    assert (lse[1] == sinks[:, None]).all()
    # the weights sum to 1 - exp(sink - lse) where a key is kept
    s = w[0].sum(axis=-1)
    np.testing.assert_allclose(s, 1 - np.exp(sinks[:, None].astype(np.float64) - lse[0]),
                               atol=1e-5)


def test_sinks_as_list_and_decode(rng):
    q, k, v, sinks = data(rng, L=1, S=5000)
    o = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=list(map(float, sinks)))
    assert tolerance_failure(o, sink_reference(q, k, v, sinks)[0]) is None


def test_tolerance_rejects_a_planted_error(rng):
    q, k, v, sinks = data(rng)
    o = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks)
    ref = sink_reference(q, k, v, sinks)[0]
    assert tolerance_failure(o, ref) is None
    bad = o.copy()
    bad[0, 0, 0, 0] += 4e-5
    assert tolerance_failure(bad, ref) is not None
    # and the call without its sinks is far from the sink reference
    plain = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert tolerance_failure(plain, ref) is not None


def test_bad_sinks(rng):
    q, k, v, sinks = data(rng)
    with pytest.raises(ValueError) as e:
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks[:3])
    assert getattr(e.value, "status", None) == "ATTN_ERR_SHAPE" and "sinks" in str(e.value)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks.reshape(2, 2))
    with pytest.raises(TypeError):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=np.zeros(4, np.int32))
    with pytest.raises(TypeError):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=["a", 1, 2, 3])


def _loss(q, k, v, sinks, g):
    return float((sink_reference(q, k, v, sinks)[0] * g).sum())


def test_raw_backward_sinks_gradient(rng):
    """_attn.backward's grad_sinks against central differences of the float64 oracle."""
    q, k, v, sinks = data(rng, L=7, S=11, D=8)
    g = rng.standard_normal((2, 4, 7, 8)).astype(np.float32)
    o, lse = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks,
                                               return_lse=True)
    gq, gk, gv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    gs = np.empty(4, np.float32)
    _attn.backward(q, k, v, o, g, lse, gq, gk, gv, None, False, None, True, 0, None, 0.0,
                   None, None, 0, 0, 0, sinks=sinks, grad_sinks=gs)
    s64 = sinks.astype(np.float64)
    fd = np.zeros(4)
    for h in range(4):
        if not np.isfinite(s64[h]):
            continue
        e = np.zeros(4)
        e[h] = 1e-5
        fd[h] = (_loss(q, k, v, s64 + e, g) - _loss(q, k, v, s64 - e, g)) / 2e-5
    assert tolerance_failure(gs, fd) is None
    assert gs[2] == 0.0  # no sink, no gradient


@needs_torch
@pytest.mark.parametrize("path", ["fused", "reference"])
def test_autograd(rng, path):
    q, k, v, sinks = data(rng, L=9, S=13, D=8)
    sinks[2] = 0.5  # a finite sink on every head, so each gets a gradient
    ts = [torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v, sinks)]
    o = attn.scaled_dot_product_attention(*ts[:3], enable_gqa=True, is_causal=True,
                                          sinks=ts[3], path=path)
    g = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    (o * g).sum().backward()
    # PyTorch's autograd of the same formula in float64
    rs = [torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v, sinks)]
    kk = rs[1].repeat_interleave(2, dim=1)
    vv = rs[2].repeat_interleave(2, dim=1)
    s = rs[0] @ kk.transpose(-1, -2) / np.sqrt(8)
    s = s.masked_fill(~torch.ones(9, 13, dtype=torch.bool).tril(), float("-inf"))
    s = torch.cat([s, rs[3][None, :, None, None].expand(2, 4, 9, 1)], dim=-1)
    ro = torch.softmax(s, dim=-1)[..., :13] @ vv
    (ro * g.double()).sum().backward()
    assert tolerance_failure(o.detach().numpy(), ro.detach().numpy()) is None
    for name, t, r in zip(("query", "key", "value", "sinks"), ts, rs):
        msg = tolerance_failure(t.grad.numpy(), r.grad.numpy())
        assert msg is None, "%s.grad: %s" % (name, msg)


@needs_torch
def test_autograd_sinks_alone(rng):
    """Only the sinks require grad: the call still goes through the autograd Function."""
    q, k, v, sinks = data(rng, L=5, S=6, D=8)
    ts = torch.from_numpy(sinks.copy()).requires_grad_()
    o = attn.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                          enable_gqa=True, sinks=ts)
    assert o.requires_grad
    o.sum().backward()
    assert ts.grad is not None and ts.grad.shape == (4,) and ts.grad[2] == 0.0
