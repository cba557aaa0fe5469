"""test_nn_extra.py — attn.nn.MultiheadAttention's composed path (python/attn/_nn_extra.py)
against torch.nn.MultiheadAttention with the same state_dict: add_bias_kv, add_zero_attn,
both, kdim != vdim with a key that is not the value, under key_padding_mask and
attn_mask (bool and float), unbatched and batch-first: outputs and weights within the
contract's float32 tolerance of a float64 run of PyTorch's own module (torch's float32
module beside it as a sanity bound), every gradient within 1e-4 relative of the float64
module's. Dropout while training: the output and the gradients equal a float64
composition that uses the very mask the library drew (read back from the returned
weights), the kept fraction is 1 - p, and eval() turns it off. Skipped, with the reason
printed, where PyTorch is not installed (the NumPy-only suites cover the library's
dropout and sinks: test_dropout.py, test_sinks.py).
"""
import copy

import numpy as np
import pytest

from oracle import assert_close, randn

torch = pytest.importorskip("torch", reason="PyTorch is not installed: attn.nn's composed "
                            "path (dropout, add_bias_kv, add_zero_attn) is not compared")
import attn.nn  # noqa: E402


def grads_close(mine, ref, what, rtol=1e-4):
    """|mine - ref| <= rtol * max |ref| (+ a float32 floor), elementwise."""
    mine, ref = mine.detach().double().numpy(), ref.detach().double().numpy()
    bound = rtol * (np.abs(ref).max() + 1e-6)
    err = np.abs(mine - ref).max()
    assert err <= bound, "%s: max err %.3g > %.3g" % (what, err, bound)


def pair(E, H, seed, **kw):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, **kw)
    with torch.no_grad():  # non-zero biases, so a wrong bias path shows
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_()
    mine = attn.nn.MultiheadAttention(E, H, **kw)
    mine.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    return ref, ref64, mine


CASES = [
    dict(add_bias_kv=True),
    dict(add_zero_attn=True),
    dict(add_bias_kv=True, add_zero_attn=True),
    dict(add_bias_kv=True, add_zero_attn=True, kdim=12, vdim=7, batch_first=True),
]


@pytest.mark.parametrize("masks", ["none", "bool", "float"])
@pytest.mark.parametrize("kw", CASES, ids=lambda k: ",".join(sorted(k)))
def test_matches_torch(rng, kw, masks):
    E, H, B, Lq, Lk = 16, 4, 2, 5, 6
    ref, ref64, mine = pair(E, H, 1, **kw)
    bf = kw.get("batch_first", False)
    sh = (lambda L, C: (B, L, C)) if bf else (lambda L, C: (L, B, C))
    q = randn(rng, *sh(Lq, E))
    k = randn(rng, *sh(Lk, kw.get("kdim", E)))
    v = randn(rng, *sh(Lk, kw.get("vdim", E))) if "vdim" in kw else k
    kpm = am = None
    if masks == "bool":
        kpm = torch.zeros(B, Lk, dtype=torch.bool)
        kpm[1, 3:] = True
        am = torch.from_numpy(rng.random((Lq, Lk)) < 0.3)
        am[:, 0] = False  # every row keeps a key (PyTorch gives NaN for none)
    elif masks == "float":
        kpm = torch.zeros(B, Lk)
        kpm[0, 4:] = float("-inf")
        am = torch.from_numpy(randn(rng, B * H, Lq, Lk))
    outs = {}
    for name, mod, dt in (("ref", ref, torch.float32), ("ref64", ref64, torch.float64),
                          ("mine", mine, torch.float32)):
        tq = torch.tensor(q, dtype=dt, requires_grad=True)
        tk = torch.tensor(k, dtype=dt, requires_grad=True)
        tv = tk if v is k else torch.tensor(v, dtype=dt, requires_grad=True)
        m = None if am is None else (am if am.dtype == torch.bool else am.to(dt))
        p = None if kpm is None else (kpm if kpm.dtype == torch.bool else kpm.to(dt))
        y, w = mod(tq, tk, tv, key_padding_mask=p, attn_mask=m, need_weights=True,
                   average_attn_weights=False)
        G = torch.tensor(randn(np.random.default_rng(5), *y.shape), dtype=dt)
        (y * G).sum().backward()
        grads = {"query": tq.grad, "key": tk.grad}
        if tv is not tk:
            grads["value"] = tv.grad
        grads.update({n: pp.grad for n, pp in mod.named_parameters()})
        outs[name] = (y, w, grads)
    y64, w64, g64 = outs["ref64"]
    y, w, g = outs["mine"]
    assert w.shape == w64.shape  # [B, H, Lq, Lk (+1 bias_kv) (+1 zero attention)]
    assert_close(y.detach().numpy(), y64.detach().numpy(), "y")
    assert_close(w.detach().numpy(), w64.detach().numpy(), "weights")
    assert set(g) == set(g64)
    for n in g64:
        grads_close(g[n], g64[n], n)
    # the averaged weights and need_weights=False give the same y
    tq = torch.tensor(q)
    tk = torch.tensor(k)
    tv = tk if v is k else torch.tensor(v)
    y2, w2 = mine(tq, tk, tv, key_padding_mask=kpm, attn_mask=am)
    assert_close(w2.detach().numpy(), w64.detach().mean(dim=1).numpy(), "averaged weights")
    y3, none = mine(tq, tk, tv, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert none is None and torch.equal(y2, y3)


def test_unbatched_and_state_dict():
    E, H = 8, 2
    ref, ref64, mine = pair(E, H, 2, add_bias_kv=True, add_zero_attn=True)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in mine.named_parameters()]
    ref.load_state_dict(mine.state_dict())  # and back
    x = torch.randn(5, E)
    y, w = mine(x, x, x)
    y64, w64 = ref64(x.double(), x.double(), x.double())
    assert y.shape == (5, E) and w.shape == (5, 7)
    assert_close(y.detach().numpy(), y64.detach().numpy(), "y")
    assert_close(w.detach().numpy(), w64.detach().numpy(), "weights")


def test_zero_attention_takes_fully_masked_rows():
    """Every key padded away: PyTorch's zero key is still there (weight 1, output b_O);
    the sink of 0 gives the same, no NaN."""
    E, H, B, L = 8, 2, 1, 4
    ref, ref64, mine = pair(E, H, 3, add_zero_attn=True)
    x = torch.randn(L, B, E)
    kpm = torch.ones(B, L, dtype=torch.bool)
    y, w = mine(x, x, x, key_padding_mask=kpm)
    y64, w64 = ref64(x.double(), x.double(), x.double(), key_padding_mask=kpm)
    assert_close(y.detach().numpy(), y64.detach().numpy(), "y")
    assert_close(w.detach().numpy(), w64.detach().numpy(), "weights")
    assert torch.all(w[..., -1] == 1)


def test_planted_error_fails():
    """The comparison rejects a zero-attention column left out of the denominator (a
    module that forgets the sink)."""
    E, H = 8, 2
    ref, ref64, mine = pair(E, H, 4, add_zero_attn=True)
    x = torch.randn(6, 2, E)
    y64, _ = ref64(x.double(), x.double(), x.double())
    mine.add_zero_attn = False  # the planted error: no sink
    y, _ = mine(x, x, x)
    with pytest.raises(AssertionError):
        assert_close(y.detach().numpy(), y64.detach().numpy(), "planted")


@pytest.mark.parametrize("kw", [{}, dict(add_bias_kv=True, add_zero_attn=True)],
                         ids=["plain", "bias_kv,zero_attn"])
def test_dropout_uses_the_library_mask(rng, kw):
    E, H, B, L, p = 16, 4, 2, 7, 0.3
    ref, ref64, mine = pair(E, H, 6, dropout=p, **kw)
    mine.train()
    x = torch.tensor(randn(rng, L, B, E), requires_grad=True)
    torch.manual_seed(11)
    y, w = mine(x, x, x, need_weights=True, average_attn_weights=False)
    G = torch.tensor(randn(rng, L, B, E))
    (y * G).sum().backward()
    # the float64 composition with the mask the library drew (read from the weights)
    S = w.shape[-1]
    zero_col = kw.get("add_zero_attn", False)
    keep = (w != 0).double()
    x64 = x.detach().double().requires_grad_(True)
    sd = {n: t.detach().double().requires_grad_(True) for n, t in mine.named_parameters()}
    Wi, bi = sd["in_proj_weight"], sd["in_proj_bias"]
    xb = x64.transpose(0, 1)  # [B, L, E]
    q, k, v = (torch.nn.functional.linear(xb, Wi[i * E:(i + 1) * E], bi[i * E:(i + 1) * E])
               for i in range(3))
    if "bias_k" in sd:
        k = torch.cat([k, sd["bias_k"].expand(B, 1, E)], 1)
        v = torch.cat([v, sd["bias_v"].expand(B, 1, E)], 1)
    if zero_col:
        k = torch.cat([k, torch.zeros(B, 1, E, dtype=torch.float64)], 1)
        v = torch.cat([v, torch.zeros(B, 1, E, dtype=torch.float64)], 1)
    heads = lambda t: t.reshape(B, t.shape[1], H, E // H).transpose(1, 2)  # noqa: E731
    s = heads(q) @ heads(k).transpose(-1, -2) / np.sqrt(E // H)
    P = torch.softmax(s, -1)
    if zero_col:
        keep[..., -1] = 1 - p  # undropped and unscaled in the weights returned
    Pd = P * keep / (1 - p)
    o = (Pd @ heads(v)).transpose(1, 2).reshape(B, L, E)
    y64 = torch.nn.functional.linear(o, sd["out_proj.weight"], sd["out_proj.bias"])
    assert_close(y.detach().numpy(), y64.transpose(0, 1).detach().numpy(), "y with dropout")
    assert_close(w.detach().numpy(), Pd.detach().numpy(), "dropped weights")
    (y64.transpose(0, 1) * G.double()).sum().backward()
    grads_close(x.grad, x64.grad, "x")
    for n, t in mine.named_parameters():
        grads_close(t.grad, sd[n].grad, n)
    frac = float((w[..., :S - (1 if zero_col else 0)] != 0).double().mean())
    assert abs(frac - (1 - p)) < 0.1, frac
    # eval(): no dropout, PyTorch's eval output
    mine.eval()
    ref64.eval()
    ye, _ = mine(x.detach(), x.detach(), x.detach())
    yr, _ = ref64(x.detach().double(), x.detach().double(), x.detach().double())
    assert_close(ye.detach().numpy(), yr.detach().numpy(), "eval")
