"""test_dropout.py — dropout_p and seed= of attn.scaled_dot_product_attention.

Always (NumPy): the mask is the documented one, recomputed here by an independent NumPy
Philox4x32-10 (written from the paper's description, checked on the published known
answers) from (seed, b, h, i, j) as docs/CONTRACT.md ("Dropout") lays it out; the fused
output against a float64 NumPy reference with that mask (the contract's float32
tolerance, shown rejecting another seed's mask); the same seed gives the same bits on
both paths' masks and any thread count; no seed draws from NumPy's global RandomState
(numpy.random.seed makes it reproducible); misuse raises.

With PyTorch (skipped, with the reason, where it is not installed): torch.manual_seed
makes a call without seed= reproducible, and autograd through dropout matches PyTorch's
own float64 autograd of the same formula with the same mask: softmax, times the mask over
(1 - p), @ value.
"""
import sys

import numpy as np
import pytest

import attn

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox(ctr, key, rounds=10):
    """Philox4x32 on arrays of counters: ctr (4, n) and key (2, n) uint64 holding 32-bit
    words; returns (4, n)."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in ctr]
    k0, k1 = (np.asarray(x, dtype=np.uint64) & MASK32 for x in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        p0 = c[0] * np.uint64(M0)  # < 2^64: both factors < 2^32
        p1 = c[2] * np.uint64(M1)
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & MASK32, p1 & MASK32,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & MASK32, p0 & MASK32]
    return np.stack(c)


def test_philox_known_answers():
    # Random123's examples/kat_vectors, the "philox4x32 10" lines (Salmon et al., SC 2011)
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([MASK32] * 4, [MASK32] * 2, [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
         [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
    ]
    for ctr, key, want in cases:
        got = philox([[x] for x in ctr], [[x] for x in key])[:, 0]
        assert [int(x) for x in got] == want
        assert [int(x) for x in philox([[x] for x in ctr], [[x] for x in key], 9)[:, 0]] != want


def keep_mask(seed, offset, p, B, H, L, S):
    """The documented keep decisions, (B, H, L, S) bool."""
    t = int(np.float64(np.float32(p)) * 2.0 ** 32 + 0.5)
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(L), np.arange(S),
                             indexing="ij")
    r = ((b * H + h) * L + i).astype(np.uint64)
    n = r * np.uint64((S + 3) // 4) + (j // 4).astype(np.uint64)
    n = n.ravel()
    lo = np.uint64(MASK32)
    words = philox([n & lo, n >> np.uint64(32), np.full_like(n, offset & MASK32),
                    np.full_like(n, offset >> 32)],
                   [np.full_like(n, seed & MASK32), np.full_like(n, seed >> 32)])
    u = words[(j.ravel() % 4), np.arange(n.size)]
    return (u >= t).reshape(B, H, L, S)


def reference(q, k, v, keep, p, causal=False):
    """float64 softmax(q kᵀ / sqrt(D)) with the mask, times keep / (1 - p), @ v."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    P = e / e.sum(-1, keepdims=True)
    W = P * keep / (1 - p) if p < 1 else np.zeros_like(P)
    return W @ v, W


def tol_ok(got, ref):
    """the contract's float32 tolerance"""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = np.abs(got - ref)
    rel = np.sqrt((err ** 2).sum() / max((ref ** 2).sum(), 1e-300))
    return rel <= 1e-6 and err.max() <= 1e-5 * (1 + np.abs(ref).max())


def inputs(rng, B=2, H=3, L=37, S=70, D=16):
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    k = rng.standard_normal((B, H, S, D)).astype(np.float32)
    v = rng.standard_normal((B, H, S, D)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["fused", "reference"])
def test_forward_against_reference(rng, p, causal, path):
    q, k, v = inputs(rng)
    seed = 12345 + int(p * 10)
    out, w = attn.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal,
                                               seed=seed, return_weights=True, path=path)
    keep = keep_mask(seed, 0, p, *w.shape)
    ref_o, ref_w = reference(q, k, v, keep, p, causal)
    assert tol_ok(out, ref_o)
    assert tol_ok(w, ref_w)
    # the zeros of the weights are the documented mask's (and the causal band's)
    band = np.tril(np.ones(w.shape[-2:], bool)) if causal else True
    assert np.array_equal(w != 0, keep & band)
    # planted: another seed's mask is rejected
    other, _ = reference(q, k, v, keep_mask(seed + 1, 0, p, *w.shape), p, causal)
    assert not tol_ok(out, other)


def test_same_seed_same_bits(rng):
    q, k, v = inputs(rng, L=20, S=300)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=7, threads=1)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=7, threads=2)
    c = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # a negative seed is taken modulo 2^64
    d = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=-1)
    e = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=(1 << 64) - 1)
    assert np.array_equal(d, e)


def test_kept_fraction(rng):
    q, k, v = inputs(rng, B=1, H=4, L=64, S=256, D=8)
    _, w = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.25, seed=99,
                                             return_weights=True)
    n = w.size
    kept = np.count_nonzero(w)
    z = (kept - 0.75 * n) / np.sqrt(n * 0.25 * 0.75)
    assert abs(z) < 5, z
    # per lane j mod 4: chi-square with 3 degrees of freedom
    lanes = np.array([np.count_nonzero(w[..., l::4]) for l in range(4)])
    chi = ((lanes - lanes.mean()) ** 2 / lanes.mean()).sum()
    assert chi < 30, chi


def test_p_one_gives_zeros(rng):
    q, k, v = inputs(rng, L=5, S=9)
    out, lse = attn.scaled_dot_product_attention(q, k, v, dropout_p=1.0, seed=1,
                                                 return_lse=True)
    assert not out.any()
    _, lse0 = attn.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert np.allclose(lse, lse0, rtol=1e-6, atol=1e-6)  # the LSE is the undropped one


def test_numpy_global_seed(rng):
    q, k, v = inputs(rng, L=8, S=40)
    np.random.seed(5)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.random.seed(5)
    c = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert np.array_equal(a, c)
    assert not np.array_equal(a, b)  # each call draws a new seed
    # no dropout draws nothing
    np.random.seed(6)
    attn.scaled_dot_product_attention(q, k, v)
    x = np.random.randint(0, 1000)
    np.random.seed(6)
    assert np.random.randint(0, 1000) == x


@pytest.mark.parametrize("bad, exc", [(-0.1, ValueError), (1.5, ValueError),
                                      (float("nan"), ValueError), (1 + 1e-12, ValueError),
                                      ("0.1", TypeError), (True, TypeError)])
def test_bad_dropout_p(rng, bad, exc):
    q, k, v = inputs(rng, L=2, S=3)
    with pytest.raises(exc, match="^dropout_p="):
        attn.scaled_dot_product_attention(q, k, v, dropout_p=bad, seed=1)


@pytest.mark.parametrize("bad, exc", [("1", TypeError), (1.0, TypeError), (1 << 64, ValueError),
                                      (-(1 << 63) - 1, ValueError)])
def test_bad_seed(rng, bad, exc):
    q, k, v = inputs(rng, L=2, S=3)
    with pytest.raises(exc, match="^seed="):
        attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=bad)


# ---- PyTorch ------------------------------------------------------------------------------

def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        pytest.skip("PyTorch is not installed")
    return torch


def test_torch_manual_seed():
    torch = _torch()
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    torch.manual_seed(3)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    c = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, c)
    assert not torch.equal(a, b)
    # the seed was drawn from torch's generator: torch.manual_seed(3) then one draw is it
    torch.manual_seed(3)
    seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)) & ((1 << 64) - 1)
    d = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=seed)
    assert torch.equal(a, d)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd(causal):
    torch = _torch()
    g = torch.Generator().manual_seed(11)
    B, H, L, S, D, p, seed = 2, 2, 19, 33, 8, 0.3, 4242
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (L, S, S))
    d_o = torch.randn(B, H, L, D, generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attn.scaled_dot_product_attention(*leaves, dropout_p=p, is_causal=causal, seed=seed)
    out.backward(d_o)
    # PyTorch's float64 autograd of the same formula and mask
    keep = torch.from_numpy(keep_mask(seed, 0, p, B, H, L, S))
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    s = ref[0] @ ref[1].transpose(-1, -2) / D ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    o64 = (torch.softmax(s, -1) * keep / (1 - p)) @ ref[2]
    o64.backward(d_o.double())
    assert tol_ok(out.detach().numpy(), o64.detach().numpy())
    for name, a, r in zip("qkv", leaves, ref):
        ga, gr = a.grad.numpy(), r.grad.numpy()
        err = np.abs(ga - gr).max()
        assert err <= 1e-5 * (1 + np.abs(gr).max()), (name, err)
    # planted: another seed's mask gives other gradients
    other = [x.clone().requires_grad_() for x in (q, k, v)]
    attn.scaled_dot_product_attention(*other, dropout_p=p, is_causal=causal,
                                      seed=seed + 1).backward(d_o)
    assert np.abs(other[0].grad.numpy() - ref[0].grad.numpy()).max() > 1e-3


def test_torch_autograd_drawn_seed():
    """Without seed=, the forward's drawn seed is the backward's: the gradients match a
    call with that seed given."""
    torch = _torch()
    q, k, v = (torch.randn(1, 2, 10, 8, requires_grad=True) for _ in range(3))
    torch.manual_seed(9)
    attn.scaled_dot_product_attention(q, k, v, dropout_p=0.4).sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    torch.manual_seed(9)
    seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)) & ((1 << 64) - 1)
    attn.scaled_dot_product_attention(q, k, v, dropout_p=0.4, seed=seed).sum().backward()
    for a, x in zip(grads, (q, k, v)):
        assert torch.equal(a, x.grad)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
