"""test_mha_decode.py — attn.mha_decode and attn.KVCache (the multi-head layer's cached
decoding step, attn_mha_decode): a loop of steps over a contiguous or paged cache gives
one causal call's result over the whole sequence, against the NumPy float64 composition
of test_mha.py (the contract's float32 tolerance; a 16-bit cache within its rounding);
attn.nn.MultiheadAttention.decode against the same composition of the module's weights
and torch.nn.MultiheadAttention's causal forward where PyTorch is installed (skipped
otherwise, with the reason printed).
"""
import numpy as np
import pytest

import attn
from oracle import assert_close, randn, tolerance_failure
from test_mha import compose, layer, kw

STEPS = [3, 1, 2, 1, 1, 2]  # a prefill of 3 tokens, then 1, 2, 1, ...: 10 in all


def run_steps(x, cache, steps, plant=False, **k):
    ys, t0 = [], 0
    for s, n in enumerate(steps):
        kk = dict(k, rope_offset=k.get("rope_offset", 0) + (1 if plant and s > 0 else 0))
        ys.append(attn.mha_decode(x[:, t0:t0 + n], cache, **kk))
        t0 += n
    return np.concatenate(ys, axis=1)


def reference(x, w, b, H, Hkv, rope=None, offset=0):
    return compose(x, None, H, Hkv, w, b, causal=True, rope=rope, base=10000.0, offset=offset)[0]


def rel_frobenius(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


def test_contiguous_loop_equals_one_causal_call(rng):
    w, b = layer(rng, E=24, Ekv=24, H=4, Hkv=2, Dk=6, Dv=5)
    x = randn(rng, 2, 10, 24)
    cache = attn.KVCache.empty(batch=2, max_len=13, num_kv_heads=2, head_dim=6, v_head_dim=5)
    y = run_steps(x, cache, STEPS, **kw(w, b, 4, 2), rope="half", rope_offset=4)
    assert_close(y, reference(x, w, b, 4, 2, "half", 4), "y")
    assert list(cache.len) == [10, 10]
    assert np.all(cache.k[:, 10:] == 0) and np.all(cache.v[:, 10:] == 0)  # rows past len
    # the same as the library's own one-call causal layer, within the float32 tolerance
    one = attn.multi_head_attention(x, **kw(w, b, 4, 2), is_causal=True, rope="half",
                                    rope_offset=4)
    assert_close(y, one.astype(np.float64), "y against multi_head_attention")


def test_paged_loop_shuffled_pages(rng):
    w, b = layer(rng, E=16, Ekv=16, H=2, Hkv=1, Dk=8, Dv=8)
    x = randn(rng, 3, 10, 16)
    page, max_pages = 3, 4
    perm = rng.permutation(3 * max_pages).astype(np.int32) + 2  # pages 0, 1 never used
    table = perm.reshape(3, max_pages)
    pool_k = np.full((3 * max_pages + 2, page, 1, 8), np.nan, np.float32)
    pool_v = np.full_like(pool_k, np.nan)
    cache = attn.KVCache(pool_k, pool_v, block_table=table)
    assert cache.paged
    y = run_steps(x, cache, STEPS, **kw(w, b, 2, 1), rope="interleaved")
    assert_close(y, reference(x, w, b, 2, 1, "interleaved"), "y")
    assert list(cache.len) == [10, 10, 10]
    assert np.isnan(pool_k[:2]).all(), "unused pages written"
    # the 2 spare rows of each sequence's last page are never written
    last = table[:, 3]
    assert np.isnan(pool_k[last, 1:]).all()


def test_float16_cache_within_its_rounding(rng):
    """Each stored K, V value within one float16 rounding (2^-11 relative, half a 2^-24
    step below 2^-14) of its float32 projection, whose own bound is the dot product's
    (Ekv + 3) u of its magnitude (test_mha_decode.c's mref_cache_bound, without RoPE
    here); y within the float32 tolerance of the float64 layer over the stored values."""
    E, H, Hkv, Dk, Dv, L = 24, 4, 2, 6, 5, 10
    w, b = layer(rng, E=E, Ekv=E, H=H, Hkv=Hkv, Dk=Dk, Dv=Dv)
    x = randn(rng, 2, L, E)
    cache = attn.KVCache.empty(2, L, Hkv, Dk, Dv, dtype=np.float16)
    y = run_steps(x, cache, STEPS, **kw(w, b, H, Hkv))
    assert cache.k.dtype == np.float16 and list(cache.len) == [L, L]
    x64, u = x.astype(np.float64), 2.0 ** -24
    for n, (stored, D) in enumerate([(cache.k, Dk), (cache.v, Dv)], start=1):
        W, bias = np.asarray(w[n], np.float64), np.asarray(b[n], np.float64)
        ref = (x64 @ W + bias).reshape(2, L, Hkv, D)
        mag = (np.abs(x64) @ np.abs(W) + np.abs(bias)).reshape(2, L, Hkv, D)
        f32 = (E + 3) * u * mag
        bound = f32 + 2.0 ** -11 * (np.abs(ref) + f32) + 2.0 ** -25
        ratio = np.abs(stored.astype(np.float64) - ref) / bound
        assert ratio.max() <= 1.0, (n, ratio.max())
    kv = (cache.k.astype(np.float64), cache.v.astype(np.float64))
    ref = compose(x, None, H, Hkv, w, b, causal=True, kv=kv)[0]
    assert_close(y, ref, "y over the cache's values")


def test_lengths_differ_per_sequence(rng):
    """Sequence 1 starts with 3 tokens already in its cache (a prefill done earlier)."""
    w, b = layer(rng, E=16, Ekv=16, H=2, Hkv=2, Dk=4, Dv=4)
    x = randn(rng, 2, 7, 16)
    c0 = attn.KVCache.empty(2, 7, 2, 4)
    attn.mha_decode(x[:, :3], c0, **kw(w, b, 2))            # both sequences: 3 tokens
    c1 = attn.KVCache(c0.k, c0.v, lengths=[0, 3])           # sequence 0 restarts
    y = attn.mha_decode(np.stack([x[0, :4], x[1, 3:7]]), c1, **kw(w, b, 2))
    ref = reference(x, w, b, 2, 2)
    assert_close(y[1], ref[1, 3:7], "sequence 1 continued")
    assert_close(y[0], ref[0, :4], "sequence 0 restarted")
    assert list(c1.len) == [4, 7]


def test_misuse_writes_nothing(rng):
    w, b = layer(rng, E=16, Ekv=16, H=2, Hkv=2, Dk=4, Dv=4)
    x = randn(rng, 2, 5, 16)
    cache = attn.KVCache.empty(2, 4, 2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        attn.mha_decode(x, cache, **kw(w, b, 2))
    assert list(cache.len) == [0, 0] and np.all(cache.k == 0)
    with pytest.raises(ValueError, match="weight_layout"):
        attn.mha_decode(x[:, :1], cache, **kw(w, b, 2), weight_layout="rows")
    with pytest.raises(TypeError, match="KVCache"):
        attn.mha_decode(x[:, :1], (cache.k, cache.v), **kw(w, b, 2))
    table = np.array([[0], [7]], np.int32)  # page 7 of a pool of 2
    paged = attn.KVCache(np.zeros((2, 4, 2, 4), np.float32), np.zeros((2, 4, 2, 4), np.float32),
                         block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        attn.mha_decode(x[:, :1], paged, **kw(w, b, 2))
    assert list(paged.len) == [0, 0] and np.all(paged.k == 0)
    with pytest.raises(TypeError, match="int32"):
        attn.KVCache(paged.k, paged.v, block_table=table.astype(np.int64))


def test_planted_position_error_fails(rng):
    """The float32 check rejects steps whose positions are one late."""
    w, b = layer(rng, E=24, Ekv=24, H=4, Hkv=2, Dk=6, Dv=5)
    x = randn(rng, 2, 10, 24)
    cache = attn.KVCache.empty(2, 10, 2, 6, 5)
    bad = run_steps(x, cache, STEPS, plant=True, **kw(w, b, 4, 2), rope="half")
    assert tolerance_failure(bad, reference(x, w, b, 4, 2, "half")) is not None


# ---- attn.nn.MultiheadAttention.decode (PyTorch, optional) -----------------------------

def _torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed: attn.nn.MultiheadAttention.decode is not tested")
    return torch


@pytest.mark.parametrize("batch_first", [False, True])
def test_nn_decode_matches_causal_forward(rng, batch_first):
    torch = _torch()
    import attn.nn
    E, H, B, L = 16, 4, 2, 10
    torch.manual_seed(3)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    mine = attn.nn.MultiheadAttention(E, H, batch_first=batch_first)
    mine.load_state_dict(ref.state_dict())
    xb = randn(rng, B, L, E)  # [B, L, E]
    xt = torch.from_numpy(xb if batch_first else np.ascontiguousarray(xb.transpose(1, 0, 2)))
    cache = mine.new_cache(batch=B, max_len=L)
    ys, t0 = [], 0
    for n in STEPS:
        step = xt[:, t0:t0 + n] if batch_first else xt[t0:t0 + n]
        ys.append(mine.decode(step, cache))
        t0 += n
    y = torch.cat(ys, dim=1 if batch_first else 0)
    assert y.dtype == torch.float32 and not y.requires_grad
    sd = {k: v.detach().numpy().astype(np.float64) for k, v in ref.state_dict().items()}
    W, bias = sd["in_proj_weight"], sd["in_proj_bias"]
    w = [W[:E].T, W[E:2 * E].T, W[2 * E:].T, sd["out_proj.weight"].T]
    bb = [bias[:E], bias[E:2 * E], bias[2 * E:], sd["out_proj.bias"]]
    want = compose(xb.astype(np.float64), None, H, H, w, bb, causal=True)[0]
    got = y.numpy() if batch_first else y.numpy().transpose(1, 0, 2)
    assert_close(got, want, "decode against the float64 layer")
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    yt, _ = ref(xt, xt, xt, attn_mask=causal, need_weights=False)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_nn_decode_zero_attn_and_paged_torch_cache(rng):
    """add_zero_attn decodes as a sink of 0; a paged cache of torch bfloat16 pools."""
    torch = _torch()
    import attn.nn
    E, H, B, L = 16, 2, 2, 10
    torch.manual_seed(4)
    ref = torch.nn.MultiheadAttention(E, H, add_zero_attn=True, batch_first=True)
    mine = attn.nn.MultiheadAttention(E, H, add_zero_attn=True, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    x = torch.from_numpy(randn(rng, B, L, E))
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    want, _ = ref(x, x, x, attn_mask=causal, need_weights=False)
    cache = mine.new_cache(batch=B, max_len=L)
    ys, t0 = [], 0
    for n in STEPS:
        ys.append(mine.decode(x[:, t0:t0 + n], cache))
        t0 += n
    np.testing.assert_allclose(torch.cat(ys, 1).numpy(), want.detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    # bfloat16 pools [num_pages, page_size, H, D] with a shuffled table
    page, max_pages = 4, 3
    table = torch.randperm(B * max_pages, dtype=torch.int32).reshape(B, max_pages)
    pools = [torch.zeros(B * max_pages, page, H, E // H, dtype=torch.bfloat16) for _ in "kv"]
    paged = attn.KVCache(pools[0], pools[1], block_table=table)
    ys, t0 = [], 0
    for n in STEPS:
        ys.append(mine.decode(x[:, t0:t0 + n], paged))
        t0 += n
    got = torch.cat(ys, 1).numpy()
    err = np.linalg.norm(got - want.detach().numpy()) / np.linalg.norm(want.detach().numpy())
    assert err <= 3e-3, err  # K and V rounded once to bfloat16 (test_mha_decode.c's bound)
    assert pools[0].abs().sum() > 0 and list(paged.len) == [L, L]
