"""test_torch_op.py — the PyTorch custom operators attn::sdpa and attn::sdpa_backward
(attn.integrations.torch_op): torch.library.opcheck (schema, fake tensors, autograd
registration, AOT dispatch with dynamic shapes) over masks, causal, GQA, windows, softcap,
weights and 16-bit inputs; values and gradients against
torch.nn.functional.scaled_dot_product_attention (max |attn - torch| <= 1e-5 · (1 + max
|torch|), the float32 bound of test_torch.py; test_planted shows it rejecting a scale off by
1e-4); torch.compile(fullgraph=True) of a function calling the op (no graph break, same
values and gradients) and torch.export keeping it; misuse raising SDPA's exception types.
Skipped, with the reason, where PyTorch is not installed.
"""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the custom-op tests "
                            "are skipped")
F = torch.nn.functional

import attn.integrations.torch_op as op  # noqa: E402

TOL = 1e-5


def randn(*shape, seed=0, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


def close(ours, ref, tol=TOL, what=""):
    err = (ours - ref).abs().max().item()
    bound = tol * (1.0 + ref.abs().max().item())
    assert err <= bound, "%s: max |attn - torch| = %.3g > %.3g" % (what, err, bound)


def qkv(B=2, H=4, Hkv=4, L=9, S=11, D=16, Dv=16, dtype=torch.float32, grad=True):
    return (randn(B, H, L, D, seed=1, dtype=dtype, grad=grad),
            randn(B, Hkv, S, D, seed=2, dtype=dtype, grad=grad),
            randn(B, Hkv, S, Dv, seed=3, dtype=dtype, grad=grad))


def samples():
    q, k, v = qkv()
    qg, kg, vg = qkv(H=4, Hkv=2)
    bmask = torch.rand(2, 1, 9, 11, generator=torch.Generator().manual_seed(3)) < 0.7
    fmask = torch.randn(1, 4, 9, 11, generator=torch.Generator().manual_seed(4))
    qh, kh, vh = qkv(dtype=torch.bfloat16)
    # transformers' layout: [B, L, H, D] memory read as [B, H, L, D] (the fake's output
    # and gradients must have the real ones' strides)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
                  for x in (qg, kg, vg))
    # (query, key, value, mask, is_causal, scale, gqa, left, right, softcap, weights)
    return {
        "plain": (q, k, v, None, False, None, False, -1, -1, 0.0, False),
        "causal": (q, k, v, None, True, None, False, -1, -1, 0.0, False),
        "bool-mask": (q, k, v, bmask, False, 0.3, False, -1, -1, 0.0, True),
        "float-mask": (q, k, v, fmask, False, None, False, -1, -1, 0.0, False),
        "gqa": (qg, kg, vg, bmask, False, None, True, -1, -1, 0.0, True),
        "gqa-causal": (qg, kg, vg, None, True, 0.7, True, -1, -1, 0.0, False),
        "mask-and-causal": (q, k, v, bmask, True, None, False, -1, -1, 0.0, True),
        "window-softcap": (q, k, v, None, True, None, False, 3, 0, 2.5, False),
        "bf16": (qh, kh, vh, None, True, None, False, -1, -1, 0.0, False),
        "blhd-gqa": (qt, kt, vt, None, True, None, True, -1, -1, 0.0, False),
    }


@pytest.mark.parametrize("name", list(samples()))
def test_opcheck(name):
    torch.library.opcheck(torch.ops.attn.sdpa.default, samples()[name])


@pytest.mark.parametrize("name", ["plain", "causal", "bool-mask", "float-mask", "gqa",
                                  "gqa-causal"])
def test_matches_sdpa(name):
    q, k, v, mask, causal, scale, gqa = samples()[name][:7]
    ours = op.sdpa(q, k, v, mask, causal, scale, gqa)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         scale=scale, enable_gqa=gqa)
    close(ours, ref, what=name)
    g = randn(*ref.shape, seed=9)
    for a, b, n in zip(torch.autograd.grad(ours, (q, k, v), g),
                       torch.autograd.grad(ref, (q, k, v), g), "qkv"):
        close(a, b, what="%s d%s" % (name, n))


def test_weights():
    q, k, v, mask = samples()["bool-mask"][:4]
    out, w = op.sdpa(q, k, v, mask, scale=0.3, return_weights=True)
    ref = torch.softmax((q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf")), -1)
    close(w, ref.nan_to_num(0.0), what="weights")
    close(out, w @ v, what="weights @ v")


def test_planted():
    q, k, v = qkv(grad=False)
    ref = F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(AssertionError):
        close(op.sdpa(q, k, v, scale=(1 + 1e-4) / 4.0), ref)


def test_compile_fullgraph():
    q, k, v = qkv(H=4, Hkv=2)

    def f(q, k, v):
        return op.sdpa(q * 2.0, k, v, is_causal=True, enable_gqa=True).sin().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a = compiled(q, k, v)
    ga = torch.autograd.grad(a, (q, k, v))
    b = f(q, k, v)
    gb = torch.autograd.grad(b, (q, k, v))
    close(a, b, 1e-6, "compiled")
    for x, y in zip(ga, gb):
        close(x, y, 1e-6, "compiled grad")


def test_export_keeps_op():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return op.sdpa(q, k, v, is_causal=True)

    q, k, v = qkv(grad=False)
    ep = torch.export.export(M(), (q, k, v))
    assert any("attn.sdpa" in str(n.target) for n in ep.graph.nodes)
    close(ep.module()(q, k, v), M()(q, k, v), 0.0, "exported")


def test_misuse_matches_sdpa_types():
    q = torch.randn(2, 4, 8, 16)
    cases = {
        "mask shape": (q, q, q, torch.ones(2, 1, 8, 5, dtype=torch.bool)),
        "int dtype": (q.int(), q.int(), q.int(), None),
        "key/value dtypes": (q, q.half(), q, None),
        "int mask": (q, q, q, torch.ones(8, 8, dtype=torch.int32)),
        "heads": (q, q[:, :3], q[:, :3], None),
        "head dim": (q, q[..., :8], q, None),
    }
    for name, (a, b, c, m) in cases.items():
        with pytest.raises(Exception) as theirs:
            F.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True)
        with pytest.raises(Exception) as ours:
            op.sdpa(a, b, c, m, enable_gqa=True)
        assert isinstance(ours.value, type(theirs.value)), (name, ours.value, theirs.value)
    # deliberately accepted where SDPA refuses: a float32 query over a 16-bit K/V cache
    close(op.sdpa(q, q.half(), q.half()),
          F.scaled_dot_product_attention(q, q.half().float(), q.half().float()))
    with pytest.raises(RuntimeError, match="4-D"):
        op.sdpa(q[0], q[0], q[0])
