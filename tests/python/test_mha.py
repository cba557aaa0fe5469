"""test_mha.py — attn.multi_head_attention and its gradients (NumPy) against a NumPy
float64 composition (projections in float64, oracle.reference for the heads, W_O), and
attn.nn.MultiheadAttention against torch.nn.MultiheadAttention where PyTorch is
installed (skipped otherwise, with the reason printed).
"""
import numpy as np
import pytest

import attn
from oracle import assert_close, randn, reference

mha = attn.multi_head_attention


def rope_ref(x, kind, rdim, base, offset):
    """x [B, L, H, D] rotated by the formula, in float64"""
    if kind is None:
        return x
    x = x.copy()
    B, L, H, D = x.shape
    r = rdim or D
    pos = (offset + np.arange(L))[:, None].astype(np.float64)
    theta = pos / base ** (2.0 * np.arange(r // 2) / r)[None, :]  # [L, r/2]
    c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    lo = np.arange(r // 2) if kind == "half" else 2 * np.arange(r // 2)
    hi = lo + r // 2 if kind == "half" else lo + 1
    x1, x2 = x[..., lo].copy(), x[..., hi].copy()
    x[..., lo] = x1 * c - x2 * s
    x[..., hi] = x2 * c + x1 * s
    return x


def compose(xq, xkv, H, Hkv, w, b, keep=None, bias=None, causal=False, rope=None,
            rotary_dim=0, base=10000.0, offset=0, kv=None):
    """The layer in float64 with weights [in, out]: (y, per-head weights). kv: (k, v)
    [B, Lk, Hkv, D] to attend over instead of the projections (a decoding cache's values)."""
    xkv = xq if xkv is None else xkv
    f = [np.asarray(a, np.float64) for a in w]
    bb = [np.zeros(a.shape[1]) if c is None else np.asarray(c, np.float64)
          for a, c in zip(f, b)]
    B, Lq, _ = xq.shape
    Lk = xkv.shape[1]
    Dk = f[0].shape[1] // H
    Dv = f[2].shape[1] // Hkv
    q = rope_ref((xq @ f[0] + bb[0]).reshape(B, Lq, H, Dk), rope, rotary_dim, base, offset)
    k = rope_ref((xkv @ f[1] + bb[1]).reshape(B, Lk, Hkv, Dk), rope, rotary_dim, base, offset)
    v = (xkv @ f[2] + bb[2]).reshape(B, Lk, Hkv, Dv)
    if kv is not None:
        k, v = (np.asarray(a, np.float64) for a in kv)
    mask = keep if bias is None else (bias if keep is None else np.where(keep, bias, -np.inf))
    o, _, p = reference(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                        v.transpose(0, 2, 1, 3), mask=mask, causal=causal, gqa=True)
    y = o.transpose(0, 2, 1, 3).reshape(B, Lq, H * Dv) @ f[3] + bb[3]
    return y, p


def layer(rng, E=24, Ekv=20, H=4, Hkv=2, Dk=6, Dv=5, bias=True):
    w = [randn(rng, E, H * Dk, scale=E ** -0.5), randn(rng, Ekv, Hkv * Dk, scale=Ekv ** -0.5),
         randn(rng, Ekv, Hkv * Dv, scale=Ekv ** -0.5), randn(rng, H * Dv, E, scale=0.3)]
    b = [randn(rng, a.shape[1], scale=0.3) if bias else None for a in w]
    return w, b


def kw(w, b, H, Hkv=None):
    return dict(num_heads=H, num_kv_heads=Hkv, w_q=w[0], w_k=w[1], w_v=w[2], w_o=w[3],
                b_q=b[0], b_k=b[1], b_v=b[2], b_o=b[3])


def test_cross_gqa_rope_float_mask(rng):
    w, b = layer(rng)
    xq, xkv = randn(rng, 2, 7, 24), randn(rng, 2, 11, 20)
    am = randn(rng, 7, 11)
    y, p = mha(xq, xkv, **kw(w, b, 4, 2), attn_mask=am, rope="half", need_weights=True,
               average_attn_weights=False)
    ry, rp = compose(xq, xkv, 4, 2, w, b, bias=am[None, None], rope="half")
    assert_close(y, ry, "y")
    assert_close(p, rp, "weights")


def test_self_packed_torch_layout(rng):
    E, H = 16, 4
    in_proj = randn(rng, 3 * E, E, scale=0.25)  # PyTorch's [3E, E], rows W^T
    in_bias, out_w, out_b = randn(rng, 3 * E), randn(rng, E, E, scale=0.25), randn(rng, E)
    x = randn(rng, 3, 9, E)
    pad = np.zeros((3, 9), bool)
    pad[0, 5:] = True
    pad[2, :] = True  # every key of batch 2 ignored: its rows are 0 (PyTorch: NaN)
    y, p = mha(x, num_heads=H, w_q=in_proj[:E], w_k=in_proj[E:2 * E], w_v=in_proj[2 * E:],
               w_o=out_w, b_q=in_bias[:E], b_k=in_bias[E:2 * E], b_v=in_bias[2 * E:],
               b_o=out_b, weight_layout="out_in", key_padding_mask=pad, need_weights=True)
    w = [in_proj[:E].T, in_proj[E:2 * E].T, in_proj[2 * E:].T, out_w.T]
    b = [in_bias[:E], in_bias[E:2 * E], in_bias[2 * E:], out_b]
    ry, rp = compose(x, None, H, H, w, b, keep=~pad[:, None, None, :])
    assert_close(y, ry, "y")
    assert p.shape == (3, 9, 9)
    assert_close(p, rp.mean(axis=1), "averaged weights")
    assert np.all(p[2] == 0) and np.all(np.isfinite(y))


def test_bool_attn_mask_causal_interleaved(rng):
    w, b = layer(rng, E=16, Ekv=16, H=2, Hkv=2, Dk=8, Dv=8, bias=False)
    x = randn(rng, 2, 10, 16)
    am = rng.random((2 * 2, 10, 10)) < 0.2  # True = not allowed
    y = mha(x, **kw(w, b, 2), attn_mask=am, is_causal=True, rope="interleaved",
            rotary_dim=4, rope_base=100.0, rope_offset=3)
    ry, _ = compose(x, None, 2, 2, w, b, keep=~am.reshape(2, 2, 10, 10), causal=True,
                    rope="interleaved", rotary_dim=4, base=100.0, offset=3)
    assert_close(y, ry, "y")


def test_kv_len_and_misuse(rng):
    w, b = layer(rng)
    xq, xkv = randn(rng, 2, 5, 24), randn(rng, 2, 6, 20)
    y = mha(xq, xkv, **kw(w, b, 4, 2), kv_len=[6, 2])
    keep = np.arange(6)[None, None, None, :] < np.array([6, 2])[:, None, None, None]
    assert_close(y, compose(xq, xkv, 4, 2, w, b, keep=keep)[0], "y")
    with pytest.raises(ValueError, match="w_k"):
        mha(xq, xkv, **kw([w[0], w[1][:-1], w[2], w[3]], b, 4, 2))
    with pytest.raises(ValueError, match="rotary_dim"):
        mha(xq, xkv, **kw(w, b, 4, 2), rope="half", rotary_dim=5)
    with pytest.raises(ValueError, match="HEADS|heads"):
        mha(xq, xkv, **kw(w, b, 3, 2))


def test_gradients_against_differences(rng):
    """the module's gradients against central differences of the float64 composition"""
    w, b = layer(rng, E=6, Ekv=5, H=2, Hkv=1, Dk=2, Dv=3)
    xq, xkv = randn(rng, 2, 3, 6), randn(rng, 2, 4, 5)
    G = randn(rng, 2, 3, 6)
    opts = dict(is_causal=True, rope="half")
    g = attn.multi_head_attention_grad(G, xq, xkv, **kw(w, b, 2, 1), **opts)

    def loss(xq_, xkv_, w_, b_):
        return float((compose(xq_, xkv_, 2, 1, w_, b_, causal=True, rope="half")[0] * G).sum())

    h = 1e-6
    params = {"dx_q": xq, "dx_kv": xkv, "dw_q": w[0], "dw_k": w[1], "dw_v": w[2],
              "dw_o": w[3], "db_q": b[0], "db_k": b[1], "db_v": b[2], "db_o": b[3]}
    for name, arr in params.items():
        base = np.asarray(arr, np.float64)
        fd = np.zeros(base.shape)
        for idx in np.ndindex(base.shape):
            for sign in (1, -1):
                pert = base.copy()
                pert[idx] += sign * h
                args = {k: np.asarray(v, np.float64) for k, v in params.items()}
                args[name] = pert
                val = loss(args["dx_q"], args["dx_kv"],
                           [args["dw_q"], args["dw_k"], args["dw_v"], args["dw_o"]],
                           [args["db_q"], args["db_k"], args["db_v"], args["db_o"]])
                fd[idx] += sign * val / (2 * h)
        err = np.abs(g[name] - fd).max()
        assert err <= 2e-5 * (1 + np.abs(fd).max()), (name, err)


def test_planted_error_fails(rng):
    w, b = layer(rng)
    xq, xkv = randn(rng, 2, 7, 24), randn(rng, 2, 11, 20)
    y = mha(xq, xkv, **kw(w, b, 4, 2))
    ry, _ = compose(xq, xkv, 4, 2, w, b)
    bad = y.copy()
    bad[1, 3, 5] *= 1.0001
    with pytest.raises(AssertionError):
        assert_close(bad, ry, "planted")


# ---- PyTorch (optional) ------------------------------------------------------------------

def _torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed: attn.nn.MultiheadAttention is not compared")
    return torch


@pytest.mark.parametrize("batch_first", [False, True])
def test_nn_module_matches_torch(rng, batch_first):
    torch = _torch()
    import attn.nn
    E, H, B, L = 32, 4, 2, 9
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    mine = attn.nn.MultiheadAttention(E, H, batch_first=batch_first)
    mine.load_state_dict(ref.state_dict())
    shape = (B, L, E) if batch_first else (L, B, E)
    x1 = torch.tensor(randn(rng, *shape), requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, 6:] = True
    y1, w1 = ref(x1, x1, x1, key_padding_mask=pad)
    y2, w2 = mine(x2, x2, x2, key_padding_mask=pad)
    assert_close(y2.detach().numpy(), y1.detach().numpy().astype(np.float64), "y")
    assert_close(w2.detach().numpy(), w1.detach().numpy().astype(np.float64), "weights")
    G = torch.tensor(randn(rng, *shape))
    (y1 * G).sum().backward()
    (y2 * G).sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), x1.grad.numpy(), rtol=1e-4, atol=1e-5)
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), mine.named_parameters()):
        assert n1 == n2
        np.testing.assert_allclose(p2.grad.numpy(), p1.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=n1)
