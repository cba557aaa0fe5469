"""test_autograd_torch.py — PyTorch autograd through attn.scaled_dot_product_attention
against PyTorch's own SDPA backward (skipped, with the reason, where PyTorch is not installed).

Against PyTorch (float32, same inputs, same upstream gradient): max |attn − torch| <=
TORCH_TOL · (1 + max|g64|) per gradient, g64 being PyTorch's own float64 SDPA gradient.
Both float32 gradients are within the contract's 1e-5 (1 + max|g|) of the exact one, so
their difference is bounded by twice that; measured, it stays under 1.3e-6 (1 + max|g|)
over this file's cases (printed with -s; dq 1.3e-6, dk 9.5e-7, dv 4.6e-7 relative), so
TORCH_TOL = 1e-5 keeps an 8x margin and still catches any error of the size of a wrong
scale, sign, mask or group sum (those are O(1) relative; a planted 1e-4 on dQ is
caught). Each case is also held to grad_failure against the float64 reference, widened
only for logits beyond 16.7 in magnitude (large_logits).

16 bits: each bfloat16/float16 .grad also within 2 x the error of
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
from grads import (
    F, assert_grads, grad_failure, half_grad_failure, max_logit, naive_grads, needs_torch,
    raw_opts, reference_grads, torch
)


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
@pytest.mark.parametrize("how", ["eager", "op"])
def test_torch_layouts_follow_the_inputs(how):
    """transformers' layout ([B, L, H, D] memory read as [B, H, L, D], GQA): the output in
    the query's memory order, as PyTorch's CPU kernel gives it, so that the caller's
    transpose back copies nothing; the gradients contiguous (docs/PYTHON.md: in the views'
    layout the library writes them slower); the values those of dense inputs, bit for
    bit (strides move addresses, not sums). how: the eager autograd Function, or the custom
    op transformers' backend calls (whose output is [B, L, H, D] memory whatever the
    query's)."""
    import attn.integrations.torch_op  # noqa: F401, PLC0415 — registers torch.ops.attn
    B, H, Hkv, L, D = 2, 4, 2, 21, 16
    src = [trand(B, L, h, D, seed=s).requires_grad_() for s, h in enumerate((H, Hkv, Hkv))]
    views = [x.transpose(1, 2) for x in src]
    seen = []
    for x in views:
        x.register_hook(lambda g: seen.append(g.is_contiguous()))

    def call(q, k, v):
        if how == "eager":
            return attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return torch.ops.attn.sdpa(q, k, v, None, True, None, True, -1, -1, 0.0, False)[0]

    out = call(*views)
    assert out.transpose(1, 2).is_contiguous(), out.stride()
    up = trand(*out.shape, seed=9)
    out.backward(up)
    assert seen == [True, True, True], seen
    dense = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in src]
    ref = call(*dense)
    ref.backward(up)
    assert torch.equal(out, ref)
    for x, y in zip(src, dense):
        assert torch.equal(x.grad, y.grad.transpose(1, 2))


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
    # a float mask that requires grad gets it (test_hf_t5.py checks its values); a bool
    # mask cannot require grad in PyTorch
    bias = torch.zeros(5, 7, requires_grad=True)
    attn.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()
    assert bias.grad is not None and bias.grad.shape == bias.shape
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
