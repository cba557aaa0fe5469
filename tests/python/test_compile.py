"""test_compile.py — attn's public calls under torch.compile and torch.export (issue 37).

On torch tensors, attn.scaled_dot_product_attention, attn.varlen_attention,
attn.attention_with_kvcache, attn.merge_attention_states and attn.cascade_attention go
through custom ops when they are traced (attn::sdpa, attn::varlen, attn::kvcache,
attn::merge_attention_states, attn::cascade: attn.integrations.torch_op). Checked here:
torch.compile(fullgraph=True) with the "eager" and "aot_eager" backends (no C++ compile)
gives outputs and gradients bit-equal to the eager call (torch.equal, no tolerance: both
run the same library code on the same inputs); torch.export keeps attn::sdpa in the graph
and runs; torch.library.opcheck passes on every op (schema, fake shapes, autograd
registration); one small case through the default (inductor) backend. Skipped, with the
reason, where PyTorch is not installed.
"""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile "
                            "and torch.export tests are skipped")

import attn  # noqa: E402
import attn.integrations.torch_op  # noqa: E402,F401 — registers the ops for opcheck

BACKENDS = ("eager", "aot_eager")


def randn(*shape, seed=0, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def same(ours, ref, what):
    """Bit-equal (torch.equal: same shape, dtype and every value)."""
    assert len(ours) == len(ref), "%s: %d results, expected %d" % (what, len(ours), len(ref))
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert a.dtype == b.dtype and a.shape == b.shape, "%s[%d]: %s %s, expected %s %s" % (
            what, i, a.dtype, tuple(a.shape), b.dtype, tuple(b.shape))
        assert torch.equal(a, b), "%s[%d]: max |compiled - eager| = %.3g" % (
            what, i, (a.double() - b.double()).abs().max().item())


def check_compiled(fn, inputs, backend, grad_of=None):
    """fn(*inputs) compiled (fullgraph=True, a fresh Dynamo cache) against fn(*inputs)
    eager: every result, and the gradients of the first result's weighted sum with respect
    to grad_of (the inputs that require grad), bit-equal."""
    torch._dynamo.reset()
    eager = as_tuple(fn(*inputs))
    compiled = as_tuple(torch.compile(fn, fullgraph=True, backend=backend)(*inputs))
    same(compiled, eager, "%s output" % backend)
    if grad_of:
        w = randn(*eager[0].shape, seed=99, dtype=eager[0].dtype)
        g_eager = torch.autograd.grad((eager[0] * w).sum(), grad_of)
        g_comp = torch.autograd.grad((compiled[0] * w).sum(), grad_of)
        same(g_comp, g_eager, "%s gradient" % backend)


# ---- scaled_dot_product_attention: attn::sdpa ------------------------------------------------

def sdpa_cases():
    """name -> (inputs, keyword arguments, the inputs whose gradient is checked)."""
    q, k, v = (randn(2, 4, 9, 16, seed=s, grad=True) for s in (1, 2, 3))
    qg = randn(2, 4, 9, 16, seed=4, grad=True)
    kg, vg = (randn(2, 2, 11, 16, seed=s, grad=True) for s in (5, 6))
    qh, kh, vh = (randn(2, 4, 9, 16, seed=s, dtype=torch.bfloat16, grad=True)
                  for s in (7, 8, 9))
    q3, k3, v3 = (randn(4, 9, 16, seed=s, grad=True) for s in (10, 11, 12))
    bias = randn(1, 4, 9, 9, seed=13, dtype=torch.bfloat16, grad=True)
    sinks = randn(4, seed=14, grad=True)
    bmask = torch.rand(2, 1, 9, 11, generator=torch.Generator().manual_seed(3)) < 0.7
    return {
        "causal": ((q, k, v), dict(is_causal=True), (q, k, v)),
        "gqa-bool-mask-weights": ((qg, kg, vg), dict(attn_mask=bmask, enable_gqa=True,
                                                     return_lse=True, return_weights=True),
                                  (qg, kg, vg)),
        "bf16-bias-sinks": ((qh, kh, vh), dict(attn_mask=bias, sinks=sinks, scale=0.3),
                            (qh, kh, vh, bias, sinks)),
        "extras": ((q, k, v), dict(align="bottom-right", is_causal=True, window=(3, 1),
                                   softcap=2.5, alibi_slopes=[0.1, 0.2, 0.3, 0.4],
                                   kv_len=[7, 9]), (q, k, v)),
        "dropout": ((q, k, v), dict(dropout_p=0.25, seed=2024, return_weights=True),
                    (q, k, v)),
        "3d-reference": ((q3, k3, v3), dict(is_causal=True, path="reference"), (q3, k3, v3)),
        "no-grad": ((q.detach(), k.detach(), v.detach()), dict(is_causal=True), None),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(sdpa_cases()))
def test_sdpa_compiles(name, backend):
    inputs, kwargs, grad_of = sdpa_cases()[name]

    def f(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, **kwargs)
    check_compiled(f, inputs, backend, grad_of)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("call", ["sdpa", "varlen"])
def test_drawn_seed(call, backend):
    """Dropout with no seed: the compiled call draws it from torch's default generator in
    the graph, as the eager call draws it (the same mask after the same torch.manual_seed,
    so outputs and gradients bit-equal), and a new one at each call."""
    q, k, v = (randn(2, 4, 9, 16, seed=s, grad=True) for s in (1, 2, 3))
    cu = torch.tensor([0, 4, 9])

    def f(q, k, v):
        if call == "sdpa":
            return attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
        return attn.varlen_attention(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                     v[0].transpose(0, 1), cu, cu, 5, 5, dropout_p=0.3)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    torch.manual_seed(5)
    eager = f(q, k, v)
    torch.manual_seed(5)
    ours = compiled(q, k, v)
    same((ours,), (eager,), "%s output" % backend)
    same(torch.autograd.grad(ours.sum(), (q, k, v)),
         torch.autograd.grad(eager.sum(), (q, k, v)), "%s gradient" % backend)
    assert not torch.equal(compiled(q, k, v), ours), "the second call reused the mask"


def test_sdpa_export_keeps_op():
    class M(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return attn.scaled_dot_product_attention(q, k, v, mask, is_causal=True)

    q, k, v = (randn(2, 4, 9, 16, seed=s) for s in (1, 2, 3))
    mask = randn(1, 1, 9, 9, seed=4)
    ep = torch.export.export(M(), (q, k, v, mask))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "attn.sdpa.default" in targets, targets
    same((ep.module()(q, k, v, mask),), (M()(q, k, v, mask),), "exported")


def test_sdpa_inductor():
    """The default backend (inductor: C++ code generation around the op): one small case,
    forward and gradients. Inductor's graph caches are off: their key drops arguments
    equal to their default, so a graph compiled against another version of the op's
    schema could be loaded from the disk."""
    q, k, v = (randn(1, 2, 5, 8, seed=s, grad=True) for s in (1, 2, 3))

    def f(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0
    torch._dynamo.reset()
    eager = f(q, k, v)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = torch.compile(f, fullgraph=True)(q, k, v)
        grads = torch.autograd.grad(compiled.sum(), (q, k, v))
    same((compiled,), (eager,), "inductor output")
    same(grads, torch.autograd.grad(eager.sum(), (q, k, v)), "inductor gradient")


def test_eager_stays_direct(monkeypatch):
    """An eager call does not go through the op (the extension is called directly)."""
    from attn.integrations import torch_op

    def refuse(*args, **kwargs):
        raise AssertionError("the eager call went through the op")
    monkeypatch.setattr(torch_op, "public_sdpa", refuse)
    q, k, v = (randn(1, 2, 5, 8, seed=s, grad=True) for s in (1, 2, 3))
    attn.scaled_dot_product_attention(q, k, v).sum().backward()


# ---- varlen_attention: attn::varlen ---------------------------------------------------------

CU_Q, CU_K = torch.tensor([0, 3, 3, 8]), torch.tensor([0, 6, 7, 10])


def varlen_cases():
    q, k, v = (randn(8, 4, 16, seed=1, grad=True), randn(10, 2, 16, seed=2, grad=True),
               randn(10, 2, 16, seed=3, grad=True))
    qh, kh, vh = (randn(8, 4, 16, seed=4, dtype=torch.float16, grad=True),
                  randn(10, 2, 16, seed=5, dtype=torch.float16, grad=True),
                  randn(10, 2, 16, seed=6, dtype=torch.float16, grad=True))
    sinks = randn(4, seed=7, grad=True)
    slopes = torch.tensor([0.1, 0.2, 0.3, 0.4])
    return {
        "causal-lse": ((q, k, v), dict(causal=True, return_lse=True), (q, k, v)),
        "f16-sinks-alibi-window": ((qh, kh, vh), dict(sinks=sinks, alibi_slopes=slopes,
                                                      window_size=(2, 1), softcap=3.0),
                                   (qh, kh, vh, sinks)),
        "dropout": ((q, k, v), dict(dropout_p=0.3, seed=7, causal=True), (q, k, v)),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(varlen_cases()))
def test_varlen_compiles(name, backend):
    inputs, kwargs, grad_of = varlen_cases()[name]

    def f(q, k, v):
        return attn.varlen_attention(q, k, v, CU_Q, CU_K, 5, 6, **kwargs)
    check_compiled(f, inputs, backend, grad_of)


# ---- attention_with_kvcache: attn::kvcache (writes the caches) -------------------------------

def kvcache_inputs(paged):
    q = randn(2, 3, 4, 16, seed=1)
    k, v = randn(2, 3, 2, 16, seed=2), randn(2, 3, 2, 16, seed=3)
    lens = torch.tensor([2, 5], dtype=torch.int32)
    if not paged:
        return q, randn(2, 10, 2, 16, seed=4), randn(2, 10, 2, 16, seed=5), k, v, lens, None
    table = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32)
    return q, randn(4, 5, 2, 16, seed=6), randn(4, 5, 2, 16, seed=7), k, v, lens, table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_compiles(paged, backend):
    """Outputs bit-equal, and the caches written by the compiled call as by the eager one."""
    q, kc, vc, k, v, lens, table = kvcache_inputs(paged)

    def f(q, kc, vc, k, v):
        return attn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens,
                                           block_table=table, causal=True,
                                           return_softmax_lse=True, sinks=[0.5, 0, -1, 2])
    torch._dynamo.reset()
    kc2, vc2 = kc.clone(), vc.clone()
    eager = f(q, kc, vc, k, v)
    compiled = torch.compile(f, fullgraph=True, backend=backend)(q, kc2, vc2, k, v)
    same(compiled, eager, "%s output" % backend)
    same((kc2, vc2), (kc, vc), "%s caches" % backend)


# ---- merge_attention_states and cascade_attention --------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
def test_merge_compiles(stacked, backend):
    o = [randn(2, 4, 9, 16, seed=s) for s in (1, 2, 3)]
    lse = [randn(2, 4, 9, seed=s) for s in (4, 5, 6)]
    lse[1][0, 0, 0] = float("-inf")  # an empty partial

    if stacked:
        def f(o1, o2, o3, l1, l2, l3):
            return attn.merge_attention_states(torch.stack([o1, o2, o3]),
                                               torch.stack([l1, l2, l3]))
    else:
        def f(o1, o2, o3, l1, l2, l3):
            return attn.merge_attention_states([o1, o2, o3], [l1, l2, l3])
    check_compiled(f, tuple(o + lse), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cascade_compiles(backend):
    q = randn(2, 3, 4, 16, seed=1)
    kp, vp = randn(5, 2, 16, seed=2), randn(5, 2, 16, seed=3)
    ks, vs = randn(2, 4, 2, 16, seed=4), randn(2, 4, 2, 16, seed=5)

    def f(q, kp, vp, ks, vs):
        return attn.cascade_attention(q, kp, vp, ks, vs, suffix_lens=[3, 4], causal=True,
                                      softcap=4.0, return_lse=True)
    check_compiled(f, (q, kp, vp, ks, vs), backend)


# ---- torch.library.opcheck on each op --------------------------------------------------------

def op_samples():
    """op name -> [(args, kwargs)]: the arguments the public calls pass."""
    q, k, v = (randn(2, 4, 9, 16, seed=s, grad=True) for s in (1, 2, 3))
    qh, kh, vh = (randn(2, 4, 9, 16, seed=s, dtype=torch.bfloat16, grad=True)
                  for s in (4, 5, 6))
    slopes, lens = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([7, 9])
    sinks = randn(4, seed=7, grad=True)
    vq, vk, vv = (randn(8, 4, 16, seed=8, grad=True), randn(10, 2, 16, seed=9, grad=True),
                  randn(10, 2, 16, seed=10, grad=True))
    hq, hk, hv = (x.detach().half().requires_grad_() for x in (vq, vk, vv))
    kq, kc, vc, kk, kv, klens, table = kvcache_inputs(True)
    o = [randn(2, 4, 9, 16, seed=s) for s in (11, 12)]
    lse = [randn(2, 4, 9, seed=s) for s in (13, 14)]
    cq = randn(2, 3, 4, 16, seed=15)
    kp, vp = randn(5, 2, 16, seed=16), randn(5, 2, 16, seed=17)
    ks, vs = randn(2, 4, 2, 16, seed=18), randn(2, 4, 2, 16, seed=19)
    return {
        # (query, key, value, mask, is_causal, scale, gqa, left, right, softcap, weights,
        #  dropout_p, seed, sinks, align, alibi_slopes, kv_len, path, precision, threads)
        "sdpa": [
            ((q, k, v, None, True, None, False, 3, 1, 2.5, True, 0.0, 0, sinks, 1, slopes,
              lens, 0, 0, 1), {}),
            ((qh, kh, vh, None, False, 0.3, False, -1, -1, 0.0, False, 0.2, -5, None, 0,
              None, None, 0, 0, 0), {}),
        ],
        # (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, alibi,
        #  dropout_p, seed, sinks, path, precision, threads)
        "varlen": [
            ((vq, vk, vv, CU_Q, CU_K, 5, 6, True, None, -1, -1, 0.0, slopes, 0.0, 0, sinks,
              0, 0, 0), {}),
            ((hq, hk, hv, CU_Q, CU_K, 5, 6, False, 0.5, 2, 1, 3.0, None, 0.3, 11, None,
              0, 0, 0), {}),
        ],
        # (q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal, left,
        #  right, softcap, alibi_slopes, sinks)
        "kvcache": [
            ((kq, kc, vc, kk, kv, klens, table, None, True, -1, -1, 0.0, slopes, None), {}),
            ((kq, kc[:2, :5], vc[:2, :5], None, None, None, None, 0.5, False, 2, 0, 3.0,
              None, torch.zeros(4)), {}),
        ],
        "merge_attention_states": [((o, lse, 0), {})],
        # (q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
        #  prefix_block_table, suffix_block_table, scale, causal, softcap, sinks, threads)
        "cascade": [
            ((cq, kp, vp, ks, vs, torch.tensor([3, 4]), 4, None, None, None, True, 0.0,
              None, 0), {}),
            ((cq, kp, vp, None, None, None, None, None, None, 0.7, False, 2.0,
              torch.zeros(4), 1), {}),
        ],
    }


@pytest.mark.parametrize("name", list(op_samples()))
def test_opcheck(name):
    op = getattr(torch.ops.attn, name).default
    for args, kwargs in op_samples()[name]:
        torch.library.opcheck(op, args, kwargs)


def test_opcheck_backward_ops():
    """attn::sdpa_backward and attn::varlen_backward on outputs of their forwards, with a
    transposed (non-contiguous) query: the gradients are contiguous, and the fakes must
    say so (inductor checks the strides a fake gives)."""
    q = randn(2, 9, 4, 16, seed=1).transpose(1, 2)
    k, v = (randn(2, 4, 9, 16, seed=s) for s in (2, 3))
    sinks, lens = randn(4, seed=4), torch.tensor([7, 9])
    out, lse, _ = torch.ops.attn.sdpa(q, k, v, None, True, None, False, -1, -1, 0.0, False,
                                      0.0, 0, sinks, 0, None, lens, 0, 0, 0)
    g = randn(*out.shape, seed=5)
    torch.library.opcheck(torch.ops.attn.sdpa_backward.default,
                          (g, q, k, v, out, lse, None, True, None, False, -1, -1, 0.0, 0.0,
                           0, sinks, False, 0, None, lens, 0, 0, 0))
    vq = randn(4, 8, 16, seed=6).transpose(0, 1)
    vk, vv = randn(10, 2, 16, seed=7), randn(10, 2, 16, seed=8)
    out, lse = torch.ops.attn.varlen(vq, vk, vv, CU_Q, CU_K, 5, 6, True, None, -1, -1, 0.0)
    g = randn(*out.shape, seed=9)
    torch.library.opcheck(torch.ops.attn.varlen_backward.default,
                          (g, vq, vk, vv, out, lse, CU_Q, CU_K, 5, 6, True, None, -1, -1,
                           0.0, None, 0.0, 0, sinks, 0, 0, 0))
