"""test_additive.py — attn.additive_attention on NumPy against a NumPy float64
implementation written as its users write it (broadcast W s + U h, tanh, @ v, softmax,
@ V), over shapes, masks and the weight-normalized form; its gradients against central
differences of that implementation; each tolerance check failing on a planted error; and
an optional comparison with PyTorch (skipped, with the reason, where it is not installed).
"""
import ctypes
import math

import numpy as np
import pytest

import attn


def reference(q, k, val, W, U, v, bias=None, key_lengths=None, attn_mask=None,
              normalize=False, g=None):
    """float64: e = tanh(q W [:, :, None] + k U [:, None]) @ ṽ, masked softmax, @ value."""
    q, k, val, W, U, v = (np.asarray(x, np.float64) for x in (q, k, val, W, U, v))
    A = v.shape[0]
    if normalize:
        g = math.sqrt(1.0 / A) if g is None else g
        v = g * v / np.linalg.norm(v)
    x = (q @ W)[:, :, None, :] + (k @ U)[:, None, :, :]          # [B, Lq, Lk, A]
    if bias is not None:
        x = x + np.asarray(bias, np.float64)
    e = np.tanh(x) @ v                                           # [B, Lq, Lk]
    keep = np.ones(e.shape, bool)
    if key_lengths is not None:
        keep &= np.arange(e.shape[2])[None, None, :] < np.asarray(key_lengths)[:, None, None]
    if attn_mask is not None:
        keep &= np.broadcast_to(attn_mask, e.shape)
    e = np.where(keep, e, -np.inf)
    m = e.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(keep, np.exp(e - m), 0.0)
    s = p.sum(axis=2, keepdims=True)
    p = np.divide(p, s, out=np.zeros_like(p), where=s > 0)
    return p @ val, p


def tolerance_failure(got, ref):
    """None within the additive tolerance of docs/CONTRACT.md, else the reason."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(got)):
        return "non-finite output"
    err = np.abs(got - ref)
    den = np.linalg.norm(ref)
    rel = np.linalg.norm(got - ref) / (den if den > 0 else 1.0)
    if rel > 1e-5:
        return "relative error %.3g > 1e-5" % rel
    if err.size and err.max() > 1e-4 * (1 + np.abs(ref).max()):
        return "max error %.3g" % err.max()
    return None


def make(seed, B, Lq, Lk, Dq, Dk, Dv, A):
    r = np.random.default_rng(seed)
    f = np.float32
    return (r.uniform(-1, 1, (B, Lq, Dq)).astype(f), r.uniform(-1, 1, (B, Lk, Dk)).astype(f),
            r.uniform(-1, 1, (B, Lk, Dv)).astype(f),
            (r.uniform(-1, 1, (Dq, A)) / math.sqrt(Dq)).astype(f),
            (r.uniform(-1, 1, (Dk, A)) / math.sqrt(Dk)).astype(f),
            r.uniform(-1, 1, A).astype(f), r.uniform(-0.5, 0.5, A).astype(f))


SHAPES = [(1, 1, 1, 1, 1, 1, 1), (2, 5, 7, 3, 4, 6, 8), (3, 17, 65, 8, 5, 9, 33),
          (2, 9, 130, 16, 16, 16, 128), (1, 64, 64, 32, 24, 16, 64)]


def test_options_mirror_is_the_c_struct():
    """The ctypes attn_options (every ctypes call: additive attention, the weights grid) is
    exactly as long as include/attn.h's: a field added there and not here would be read
    past the end of the Python object."""
    from attn import _additive, _attn
    assert ctypes.sizeof(_additive._Options) == _attn.OPTIONS_SIZE


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "bias", "lengths", "mask", "normalize"])
def test_forward(shape, variant):
    q, k, val, W, U, v, b = make(sum(shape), *shape)
    B, Lq, Lk = shape[0], shape[1], shape[2]
    kw = {}
    r = np.random.default_rng(7)
    if variant == "bias":
        kw["bias"] = b
    if variant == "lengths":
        kw["key_lengths"] = r.integers(0, Lk + 1, B)
    if variant == "mask":
        kw["attn_mask"] = r.random((B, Lq, Lk)) < 0.7
    if variant == "normalize":
        kw.update(normalize=True, g=1.3, bias=b)
    out, w = attn.additive_attention(q, k, val, W, U, v, return_weights=True, **kw)
    ref_o, ref_w = reference(q, k, val, W, U, v, **kw)
    assert out.dtype == np.float32 and out.shape == ref_o.shape
    assert tolerance_failure(out, ref_o) is None, tolerance_failure(out, ref_o)
    assert tolerance_failure(w, ref_w) is None, tolerance_failure(w, ref_w)


def test_fully_masked_rows_are_zero():
    q, k, val, W, U, v, _ = make(3, 3, 4, 6, 2, 2, 3, 5)
    out = attn.additive_attention(q, k, val, W, U, v, key_lengths=[6, 0, 2])
    assert np.all(out[1] == 0) and np.all(np.isfinite(out))


def test_gradients_against_finite_differences():
    q, k, val, W, U, v, b = make(11, 2, 4, 9, 3, 4, 5, 7)
    kw = dict(bias=b, key_lengths=[9, 5], normalize=True, g=0.8)
    r = np.random.default_rng(5)
    d_o = r.uniform(-1, 1, (2, 4, 5))
    grads = attn.additive_attention_grad(q, k, val, W, U, v, d_o.astype(np.float32), **kw)
    params = [q, k, val, W, U, v, b]
    for idx, x in enumerate(params):
        d = r.uniform(-1, 1, x.shape)
        h = 1e-4

        def loss(step):
            args = [p.astype(np.float64) for p in params]
            args[idx] = args[idx] + step * d
            o, _ = reference(*args[:6], bias=args[6], key_lengths=kw["key_lengths"],
                             normalize=True, g=0.8)
            return float(np.sum(o * d_o))

        fd = (loss(h) - loss(-h)) / (2 * h)
        an = float(np.sum(grads[idx] * d))
        assert abs(fd - an) <= 2e-5 * abs(an) + 1e-9, (idx, fd, an)
        # planted: the same check rejects a gradient 1e-4 off
        assert not abs(fd - an * (1 + 1e-4)) <= 2e-5 * abs(an) + 1e-9
    # g: d/dg of the loss
    def loss_g(gv):
        o, _ = reference(q, k, val, W, U, v, bias=b, key_lengths=kw["key_lengths"],
                         normalize=True, g=gv)
        return float(np.sum(o * d_o))
    fd = (loss_g(0.8 + 1e-5) - loss_g(0.8 - 1e-5)) / 2e-5
    assert abs(fd - grads[7]) <= 1e-4 * abs(fd) + 1e-7, (fd, grads[7])


def test_planted_tolerance():
    ref = np.random.default_rng(1).uniform(-1, 1, 100)
    assert tolerance_failure(ref.astype(np.float32), ref) is None
    bad = ref.copy()
    bad[3] += 3e-4
    assert tolerance_failure(bad, ref) is not None
    assert tolerance_failure(ref * (1 + 2e-5), ref) is not None


def test_bad_arguments():
    q, k, val, W, U, v, _ = make(2, 2, 3, 4, 2, 2, 2, 3)
    with pytest.raises(ValueError):
        attn.additive_attention(q[0], k, val, W, U, v)
    with pytest.raises(ValueError):
        attn.additive_attention(q, k, val, W.T, U, v)
    with pytest.raises(ValueError):
        attn.additive_attention(q, k, val, W, U, v, key_lengths=[1, 9])


def test_torch_optional():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the optional "
                                "comparison with a PyTorch implementation is skipped")
    q, k, val, W, U, v, b = (torch.tensor(x, requires_grad=True)
                             for x in make(4, 2, 6, 10, 3, 4, 5, 8))
    out = attn.additive_attention(q, k, val, W, U, v, bias=b)
    e = torch.tanh((q @ W)[:, :, None] + (k @ U)[:, None] + b) @ v
    ref = torch.softmax(e, dim=-1) @ val
    assert torch.allclose(out, ref, atol=1e-5)
    gq = torch.autograd.grad(out.sum(), q)[0]
    gr = torch.autograd.grad(ref.sum(), q)[0]
    assert torch.allclose(gq, gr, atol=1e-4)
