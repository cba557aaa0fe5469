"""test_f64.py — float64 query, key and value (CONTRACT.md "float64") through
attn.scaled_dot_product_attention: NumPy arrays always, PyTorch tensors (with autograd)
where PyTorch is installed.

float64 in, float64 out (the output and the LSE; the weights stay float32), computed on
the library's fused float64 path. Held to the NumPy float64 oracle (tests/python/oracle.py,
on head widths whose default scale is exact in float32, so that the oracle's float32
scale is the library's float64 one) within F64_TOL * (1 + max|ref|) elementwise: the
library's measured float64 error is a few eps64 (tests/test_f64.c), and NumPy's einsum
adds its own; 1e-12 is far below any float32 answer (~1e-7), so a path that fell back to
float32 anywhere fails it (shown by test_f64_bound_catches_float32). Mixed float64 /
float32 inputs are refused; a float64 attn_mask is read in float32.
"""
import numpy as np
import pytest

import attn
from oracle import reference

sdpa = attn.scaled_dot_product_attention
F64_TOL = 1e-12


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _close(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), fin)
    err = np.abs(got[fin] - ref[fin]).max(initial=0.0)
    bound = F64_TOL * (1 + np.abs(ref[fin]).max(initial=0.0))
    return err <= bound, err, bound


CASES = [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, align="bottom-right"),
    dict(window=(5, 2)),
    dict(softcap=4.0),
    dict(scale=-0.375),
    dict(kv_len=[13, 0]),
    dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
]


@pytest.mark.parametrize("opts", CASES)
@pytest.mark.parametrize("shape", [(2, 4, 29, 40, 16, 16), (2, 4, 7, 70, 64, 24)])
def test_f64_numpy_against_oracle(rng, opts, shape):
    B, H, Lq, Lk, D, Dv = shape
    q, k, v = _rand(rng, B, H, Lq, D), _rand(rng, B, H, Lk, D), _rand(rng, B, H, Lk, Dv)
    kw = dict(opts)
    ref_kw = {("causal" if a == "is_causal" else "alibi" if a == "alibi_slopes" else a): b
              for a, b in kw.items()}
    out, lse, w = sdpa(q, k, v, return_lse=True, return_weights=True, **kw)
    assert out.dtype == np.float64 and lse.dtype == np.float64 and w.dtype == np.float32
    ro, rl, rw = reference(q, k, v, **ref_kw)
    for got, ref, what in ((out, ro, "out"), (lse, rl, "lse")):
        ok, err, bound = _close(got, ref)
        assert ok, "%s: max err %.3g > %.3g" % (what, err, bound)
    assert np.abs(w - rw).max(initial=0) <= 1e-6
    # the reference path on float64 agrees too
    out_r = sdpa(q, k, v, path="reference", **kw)
    assert out_r.dtype == np.float64
    assert _close(out_r, ro)[0]


def test_f64_masks(rng):
    B, H, L, D = 2, 2, 33, 16
    q, k, v = _rand(rng, B, H, L, D), _rand(rng, B, H, L, D), _rand(rng, B, H, L, D)
    keep = rng.random((B, 1, L, L)) < 0.6
    keep[..., 0] = True
    ro = reference(q, k, v, mask=keep)[0]
    assert _close(sdpa(q, k, v, attn_mask=keep), ro)[0]
    # a float64 additive mask of 0 / -inf, as a float64 model passes it: read in float32
    add = np.where(keep, 0.0, -np.inf)
    assert _close(sdpa(q, k, v, attn_mask=add), ro)[0]
    # a float64 bias with other values: rounded to float32 once, then added in float64
    bias = rng.standard_normal((L, L))
    ref_b = reference(q, k, v, mask=bias.astype(np.float32))[0]
    assert _close(sdpa(q, k, v, attn_mask=bias), ref_b)[0]


def test_f64_scale_not_rounded(rng):
    """The default scale of a float64 call is 1/sqrt(D) in float64 (D = 24: not exact in
    float32), and an explicit Python float scale is used in float64 too."""
    q, k, v = _rand(rng, 1, 2, 9, 24), _rand(rng, 1, 2, 11, 24), _rand(rng, 1, 2, 11, 8)
    s = 1 / np.sqrt(24.0)
    a = sdpa(q, k, v)
    assert np.array_equal(a, sdpa(q, k, v, scale=s))
    assert not np.array_equal(a, sdpa(q, k, v, scale=float(np.float32(s))))


def test_f64_bound_catches_float32(rng):
    """The planted error: the float32 answer of the same inputs fails the float64 bound."""
    q, k, v = _rand(rng, 2, 4, 29, 16), _rand(rng, 2, 4, 40, 16), _rand(rng, 2, 4, 40, 16)
    ro = reference(q, k, v)[0]
    o32 = sdpa(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    assert not _close(o32, ro)[0]
    assert _close(sdpa(q, k, v), ro)[0]


@pytest.mark.parametrize("which", ["key", "value"])
def test_f64_mixed_refused(rng, which):
    a = dict(query=_rand(rng, 1, 2, 5, 8), key=_rand(rng, 1, 2, 6, 8),
             value=_rand(rng, 1, 2, 6, 8))
    a[which] = a[which].astype(np.float32)
    with pytest.raises(TypeError, match=r"dtype is float32, expected float64"):
        sdpa(**a)
    with pytest.raises(TypeError, match=r"^key: dtype is float64"):
        sdpa(a["query"].astype(np.float32), _rand(rng, 1, 2, 6, 8), _rand(rng, 1, 2, 6, 8))


# ---- PyTorch: tensors, autograd (skipped where PyTorch is not installed) ----------------

def _torch():
    try:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415
    except ImportError:
        pytest.skip("PyTorch is not installed: float64 tensors and autograd are skipped")
    return torch, F


@pytest.mark.parametrize("causal", [False, True])
def test_f64_torch_forward_and_grad(causal):
    torch, F = _torch()
    g = torch.Generator().manual_seed(7)
    B, H, Hkv, L, S, D = 2, 4, 2, 13, 17, 8
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64, requires_grad=True)
    out = sdpa(q, k, v, is_causal=causal, enable_gqa=True, align="bottom-right")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    # PyTorch's float64 SDPA (its causal is top-left: build the bottom-right mask)
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(H // Hkv, 1),
                                         v.repeat_interleave(H // Hkv, 1), attn_mask=keep)
    assert (out - ref).abs().max().item() <= F64_TOL * (1 + ref.abs().max().item())
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), go)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), go)
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        assert a.dtype == torch.float64
        assert (a - b).abs().max().item() <= F64_TOL * (1 + b.abs().max().item())
    # finite differences in float64 (torch.autograd.gradcheck, its default 1e-6 step)
    assert torch.autograd.gradcheck(
        lambda a, b, c: sdpa(a, b, c, is_causal=causal, enable_gqa=True, align="bottom-right"),
        (q, k, v))


def test_f64_torch_broadcast_grad():
    """A key shared by every batch ([1, H, S, D] under a batch of 2): its gradient is the
    float64 sum of the call's, in float64 (the extension's scratch is float64)."""
    torch, F = _torch()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa(a, b, c), (q, k, v))


@pytest.mark.parametrize("opts", [dict(), dict(is_causal=True, softcap=3.0),
                                  dict(window=(20, 5), sinks=True), dict(mask=True)])
def test_f64_torch_fused_backward(opts):
    """Autograd in float64 on the default path runs the fused float64 backward
    (src/backward/backward_f64.c): over several 16 x 64 tiles (Lq 40, Lk 150, GQA), with softcap,
    window, sinks (their gradient too) or a bool mask, it agrees with the float64
    reference backward (path="reference") within F64_TOL, and passes gradcheck on a
    small shape."""
    torch, F = _torch()
    g = torch.Generator().manual_seed(11)
    opts = dict(opts)
    B, H, Hkv, L, S, D = 2, 4, 2, 40, 150, 8

    def inputs(L, S):
        q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64, requires_grad=True)
        extra = {}
        if opts.get("sinks"):
            extra["sinks"] = torch.randn(H, generator=g, dtype=torch.float32, requires_grad=True)
        if opts.get("mask"):
            extra["attn_mask"] = torch.rand(B, H, L, S, generator=g) < 0.7
        return (q, k, v), extra

    kw = {k: v for k, v in opts.items() if k not in ("sinks", "mask")}
    (q, k, v), extra = inputs(L, S)
    leaves = (q, k, v) + ((extra["sinks"],) if "sinks" in extra else ())
    go = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(sdpa(q, k, v, enable_gqa=True, **kw, **extra), leaves, go)
    ref = torch.autograd.grad(sdpa(q, k, v, enable_gqa=True, path="reference", **kw, **extra),
                              leaves, go)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype
        tol = F64_TOL if a.dtype == torch.float64 else 1e-6  # d_sinks is float32
        assert (a - b).abs().max().item() <= tol * (1 + b.abs().max().item())
    (q, k, v), extra = inputs(5, 70)
    extra.pop("sinks", None)
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa(a, b, c, enable_gqa=True, **kw, **extra),
                                    (q, k, v))
