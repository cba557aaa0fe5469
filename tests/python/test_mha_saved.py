"""test_mha_saved.py — the multi-head layer's kept activations (multi_head_attention(
save=True), multi_head_attention_grad(saved=...), attn_mha_forward_save /
attn_mha_backward_saved underneath) against the recomputing pair, and attn.nn's use of them.

The recomputing gradients are held to finite differences by test_mha.py; here the saved
ones must be the same bits (NumPy only), the saved buffer must really be what the
backward reads (a changed byte changes the gradients: the bit-for-bit check's planted
error), a buffer of another layer is refused, and attn.nn.MultiheadAttention's training
step passes one (PyTorch, skipped with the reason where it is absent).
"""
import numpy as np
import pytest

import attn
from oracle import randn


def layer(rng, E=24, Ekv=20, H=4, Hkv=2, Dk=6, Dv=5):
    w = [randn(rng, E, H * Dk, scale=E ** -0.5), randn(rng, Ekv, Hkv * Dk, scale=Ekv ** -0.5),
         randn(rng, Ekv, Hkv * Dv, scale=Ekv ** -0.5), randn(rng, H * Dv, E, scale=0.3)]
    b = [randn(rng, a.shape[1], scale=0.3) for a in w]
    return dict(num_heads=H, num_kv_heads=Hkv, w_q=w[0], w_k=w[1], w_v=w[2], w_o=w[3],
                b_q=b[0], b_k=b[1], b_v=b[2], b_o=b[3])


CASES = [
    dict(cross=True, opts=dict(is_causal=True, rope="half")),
    dict(cross=False, opts=dict(rope="interleaved", need_weights=True)),
    dict(cross=True, opts=dict(need_weights=True, average_attn_weights=False)),
]


@pytest.mark.parametrize("case", CASES)
def test_saved_gradients_are_the_recomputed_ones(rng, case):
    kw = layer(rng) if case["cross"] else layer(rng, Ekv=24, Hkv=4, Dv=6)
    xq = randn(rng, 2, 7, 24)
    xkv = randn(rng, 2, 9, 20) if case["cross"] else None
    G = randn(rng, 2, 7, 24)
    opts = dict(case["opts"])
    y0 = attn.multi_head_attention(xq, xkv, **kw, **opts)
    y1, saved = attn.multi_head_attention(xq, xkv, **kw, save=True, **opts)
    for a, b in zip(y0 if isinstance(y0, tuple) else (y0,), y1 if isinstance(y1, tuple) else (y1,)):
        assert np.array_equal(a, b)
    grad_opts = {k: v for k, v in opts.items() if k not in ("need_weights", "average_attn_weights")}
    g0 = attn.multi_head_attention_grad(G, xq, xkv, **kw, **grad_opts)
    g1 = attn.multi_head_attention_grad(G, xq, xkv, **kw, saved=saved, **grad_opts)
    assert sorted(g0) == sorted(g1)
    for name in g0:
        assert np.array_equal(g0[name], g1[name]), name
    # planted: one byte of the saved activations changed must change the gradients
    bad = bytearray(saved)
    bad[len(bad) // 3] ^= 0x10
    g2 = attn.multi_head_attention_grad(G, xq, xkv, **kw, saved=bad, **grad_opts)
    assert any(not np.array_equal(g0[n], g2[n]) for n in g0)


def test_saved_of_another_layer_is_refused(rng):
    kw = layer(rng)
    xq, xkv = randn(rng, 2, 7, 24), randn(rng, 2, 9, 20)
    _, saved = attn.multi_head_attention(xq, xkv, **kw, save=True)
    G = randn(rng, 1, 7, 24)
    with pytest.raises(ValueError, match="saved"):
        attn.multi_head_attention_grad(G, xq[:1], xkv[:1], **kw, saved=saved)
    with pytest.raises(ValueError, match="saved"):
        attn.multi_head_attention_grad(G, xq[:1], xkv[:1], **kw, saved=bytearray(len(saved)))


def test_nn_training_passes_the_saved_activations(rng, monkeypatch):
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed: attn.nn's training path is not run")
    import attn.nn
    seen = []
    real = attn.nn.multi_head_attention_grad

    def spy(*a, **k):
        seen.append(k.get("saved"))
        return real(*a, **k)

    monkeypatch.setattr(attn.nn, "multi_head_attention_grad", spy)
    E, H = 16, 4
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    mine = attn.nn.MultiheadAttention(E, H, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    x1 = torch.tensor(randn(rng, 2, 5, E), requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    ref(x1, x1, x1)[0].sum().backward()
    mine(x2, x2, x2)[0].sum().backward()
    assert len(seen) == 1 and isinstance(seen[0], (bytes, bytearray)) and len(seen[0]) > 0
    np.testing.assert_allclose(x2.grad.numpy(), x1.grad.numpy(), rtol=1e-4, atol=1e-5)
    # no gradient wanted: nothing kept (the eval forward under no_grad)
    with torch.no_grad():
        mine(x2, x2, x2)
    assert len(seen) == 1
