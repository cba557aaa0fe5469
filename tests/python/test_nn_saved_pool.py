"""test_nn_saved_pool.py — attn.nn.MultiheadAttention's saved activations kept in a pool
of the module (python/attn/nn.py: a bytearray handed back when its graph lets go of it,
written again by a later forward through multi_head_attention(save_into=...)).

What it covers, against torch.nn.MultiheadAttention with the same state_dict (every
gradient within 1e-4 relative of the float64 module's):
  1. two and three forwards before their backwards, in an interleaved order where a
     buffer handed back by one graph is written by the next forward while another graph
     still holds its own: every graph's gradients are its own forward's;
  2. the buffer is reused: the forward after a backward writes the very bytearray the
     backward released, and a graph freed without a backward hands it back too;
  3. retain_graph: a second backward of one graph (its buffer already handed back, so
     recomputed) gives the same gradients;
  4. a change of shape: a too-small pooled buffer is not written (a new one is made), and
     the answers stay right;
  5. multi_head_attention(save_into=...) on NumPy: the given bytearray is returned when
     large enough, a new one when not, with the same outputs and gradients.
Items 1-4 are skipped, with the reason printed, where PyTorch is not installed; item 5
(test_mha_save_into) runs on NumPy alone.
"""
import copy
import gc

import numpy as np
import pytest

import attn


def test_mha_save_into():
    rng = np.random.default_rng(5)
    B, L, E, H = 2, 6, 8, 2
    x = rng.standard_normal((B, L, E)).astype(np.float32)
    w = [rng.standard_normal((E, E)).astype(np.float32) * 0.3 for _ in range(4)]
    kw = dict(num_heads=H, w_q=w[0], w_k=w[1], w_v=w[2], w_o=w[3])
    y0, s0 = attn.multi_head_attention(x, save=True, **kw)
    g0 = attn.multi_head_attention_grad(np.ones_like(y0), x, saved=s0, **kw)
    big = bytearray(len(s0) + 100)
    y1, s1 = attn.multi_head_attention(x, save=True, save_into=big, **kw)
    assert s1 is big
    np.testing.assert_array_equal(y1, y0)
    g1 = attn.multi_head_attention_grad(np.ones_like(y0), x, saved=s1, **kw)
    for k in g0:
        np.testing.assert_array_equal(g1[k], g0[k], err_msg=k)
    small = bytearray(len(s0) - 4)
    y2, s2 = attn.multi_head_attention(x, save=True, save_into=small, **kw)
    assert s2 is not small and len(s2) == len(s0)
    np.testing.assert_array_equal(y2, y0)


try:
    import torch
    import attn.nn
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed: attn.nn's "
                                 "pool of saved buffers is not exercised (test_mha_save_into "
                                 "covers save_into on NumPy)")


def grads_close(mine, ref, what, rtol=1e-4):
    mine, ref = mine.detach().double().numpy(), ref.detach().double().numpy()
    bound = rtol * (np.abs(ref).max() + 1e-6)
    err = np.abs(mine - ref).max()
    assert err <= bound, "%s: max err %.3g > %.3g" % (what, err, bound)


def make(E=16, H=4, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_()
    mine = attn.nn.MultiheadAttention(E, H, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    return copy.deepcopy(ref).double(), mine


def ref_grads(ref64, x):
    xr = x.detach().double().requires_grad_(True)
    ref64.zero_grad(set_to_none=True)
    y, _ = ref64(xr, xr, xr, need_weights=False)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).cos()).sum().backward()
    return xr.grad, {n: p.grad.clone() for n, p in ref64.named_parameters()}


def fwd(mine, x):
    xm = x.clone().requires_grad_(True)
    y, _ = mine(xm, xm, xm, need_weights=False)
    return xm, y


def bwd(mine, xm, y, retain=False):
    mine.zero_grad(set_to_none=True)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).cos()).sum().backward(
        retain_graph=retain)
    return xm.grad.clone(), {n: p.grad.clone() for n, p in mine.named_parameters()}


def check(got, want, what):
    grads_close(got[0], want[0], what + " dx")
    for n in want[1]:
        grads_close(got[1][n], want[1][n], what + " d" + n)


@needs_torch
def test_forwards_before_backwards():
    ref64, mine = make()
    mine.train()
    xs = [torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    want = [ref_grads(ref64, x) for x in xs]
    a = fwd(mine, xs[0])
    b = fwd(mine, xs[1])
    check(bwd(mine, *a), want[0], "graph 0")  # its buffer back to the pool
    c = fwd(mine, xs[2])  # writes graph 0's buffer while graph 1 holds its own
    assert c[1].grad_fn.attn_saved.buf is not b[1].grad_fn.attn_saved.buf
    check(bwd(mine, *b), want[1], "graph 1")
    check(bwd(mine, *c), want[2], "graph 2")


@needs_torch
def test_buffer_reused_and_freed_graphs():
    _, mine = make(seed=1)
    mine.train()
    x = torch.randn(2, 9, 16)
    xm, y = fwd(mine, x)
    buf = y.grad_fn.attn_saved.buf
    bwd(mine, xm, y)
    xm2, y2 = fwd(mine, x)
    assert y2.grad_fn.attn_saved.buf is buf, "the released buffer was not reused"
    del xm2, y2  # a graph dropped without a backward hands its buffer back too
    gc.collect()
    xm3, y3 = fwd(mine, x)
    assert y3.grad_fn.attn_saved.buf is buf
    pickled = mine.__getstate__()
    assert "_attn_saved_pool" not in pickled


@needs_torch
def test_retain_graph_second_backward():
    ref64, mine = make(seed=2)
    mine.train()
    x = torch.randn(3, 7, 16)
    want = ref_grads(ref64, x)
    xm, y = fwd(mine, x)
    check(bwd(mine, xm, y, retain=True), want, "first backward")
    xm.grad = None
    other = fwd(mine, torch.randn(3, 7, 16))  # takes the released buffer, writes it
    check(bwd(mine, xm, y), want, "second backward (recomputed)")
    del other


@needs_torch
def test_shape_change():
    ref64, mine = make(seed=3)
    mine.train()
    small, large = torch.randn(1, 5, 16), torch.randn(2, 11, 16)
    xm, y = fwd(mine, small)
    bwd(mine, xm, y)
    xm, y = fwd(mine, large)  # the pooled buffer is too small: a new one
    assert len(y.grad_fn.attn_saved.buf) > 0
    check(bwd(mine, xm, y), ref_grads(ref64, large), "larger shape")
    xm, y = fwd(mine, small)  # a larger pooled buffer serves the smaller shape
    check(bwd(mine, xm, y), ref_grads(ref64, small), "smaller shape again")
