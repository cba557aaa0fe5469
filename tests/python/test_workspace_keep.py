"""test_workspace_keep.py — the workspaces the package keeps between calls (one for the
forward, one for the backward: python/attn/_attn_inputs.c, docs/PYTHON.md) change no
result: calls of shapes that grow and shrink the kept block, and calls from two Python
threads at once (one of them then finds the block taken and the library allocates its
own), give the bits each call gives alone. The library is deterministic for any thread
count, so any difference is the kept block's fault (a block too small, or shared by two
calls at once). Skipped, with the reason, where PyTorch is not installed.
"""
import threading

import numpy as np

import attn
from grads import needs_torch, torch

# (B, Hq, Hkv, L, D, causal): GQA and not, causal and not, two head dims, sizes that move
# the workspace both ways
SHAPES = [(1, 4, 2, 300, 64, True), (2, 2, 2, 517, 128, False), (1, 8, 1, 96, 32, True)]


def run(shape, seed):
    B, Hq, Hkv, L, D, causal = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, L, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, L, D, generator=g, requires_grad=True)
    go = torch.randn(B, Hq, L, D, generator=g)
    o = attn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
    o.backward(go)
    return [x.detach().numpy().copy() for x in (o, q.grad, k.grad, v.grad)]


def same(a, b):
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))


@needs_torch
def test_kept_workspace_changes_no_bit():
    alone = [run(s, i) for i, s in enumerate(SHAPES)]
    # in turn, each shape after one of another size (the block grown, or kept larger)
    for order in ([0, 1, 2, 0, 2, 1], [2, 1, 0, 1]):
        for i in order:
            assert same(run(SHAPES[i], i), alone[i]), f"shape {SHAPES[i]} after a resize"
    # two threads at once, each its shapes in its own order
    got, errors = {}, []

    def worker(name, order):
        try:
            got[name] = [(i, run(SHAPES[i], i)) for i in order]
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=("a", [0, 1, 2, 1, 0])),
               threading.Thread(target=worker, args=("b", [2, 0, 1, 2, 0]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for name in ("a", "b"):
        for i, r in got[name]:
            assert same(r, alone[i]), f"thread {name}, shape {SHAPES[i]}"
