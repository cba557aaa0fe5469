"""test_hardened.py — the defects of issue 33 ("Hardened") in the Python package, each
refused (or, for the read-only cache, accepted) with nothing written.

Checks: attention_with_kvcache validates every argument before it appends k, v (the
cache rows as they were after each refusal) and reads a read-only cache when it appends
nothing; merge_attention_states checks every partial's shape for any number of leading
dimensions; every integer passed to the library goes through _options.integer /
integers: no wrapping modulo 2^64, no truncation of fractional values, no bools.
"""
import numpy as np
import pytest

import attn


def _cache(rng, B=2, L=8, H=2, D=4):
    k = rng.standard_normal((B, L, H, D)).astype(np.float32)
    v = rng.standard_normal((B, L, H, D)).astype(np.float32)
    return k, v


# ---- item 4: nothing appended when the attention's arguments are bad ------------------------

BAD_ATTENTION = [
    ("softcap -1", dict(softcap=-1.0), None),
    ("softcap NaN", dict(softcap=float("nan")), None),
    ("window (-5, 0)", dict(window_size=(-5, 0)), None),
    ("alibi of the wrong shape", dict(alibi_slopes=np.ones(3, np.float32)), None),
    ("query head dim D + 1", {}, lambda q: np.zeros(q.shape[:3] + (q.shape[3] + 1,), np.float32)),
    ("Hq not a multiple of Hkv", {}, lambda q: np.zeros(q.shape[:2] + (3, q.shape[3]), np.float32)),
    ("wrong query batch", {}, lambda q: np.zeros((q.shape[0] + 1,) + q.shape[1:], np.float32)),
]


@pytest.mark.parametrize("what,kw,make_q", BAD_ATTENTION, ids=[c[0] for c in BAD_ATTENTION])
def test_kvcache_append_validates_first(rng, what, kw, make_q):
    kc, vc = _cache(rng)
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    if make_q:
        q = make_q(q)
    kn = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    vn = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    k0, v0 = kc.copy(), vc.copy()
    with pytest.raises((ValueError, TypeError)):
        attn.attention_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=np.full(2, 3, np.int32),
                                    **kw)
    assert np.array_equal(kc, k0) and np.array_equal(vc, v0), "%s: the cache was written" % what


def test_kvcache_pages_beyond_the_append_checked_first(rng):
    """A table entry outside the pool among the pages the attention reads (not those the
    append writes): refused before the append."""
    pool_k = rng.standard_normal((6, 4, 2, 4)).astype(np.float32)
    pool_v = rng.standard_normal((6, 4, 2, 4)).astype(np.float32)
    table = np.array([[9, 1], [2, 3]], np.int32)  # page 9 of 6: read, not written
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    kn = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    k0 = pool_k.copy()
    with pytest.raises(ValueError):
        attn.attention_with_kvcache(q, pool_k, pool_v, k=kn, v=kn.copy(), cache_seqlens=5,
                                    block_table=table)
    assert np.array_equal(pool_k, k0)


def test_kvcache_good_append_still_writes(rng):
    kc, vc = _cache(rng)
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    kn = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    attn.attention_with_kvcache(q, kc, vc, k=kn, v=kn.copy(), cache_seqlens=3)
    assert np.array_equal(kc[:, 3], kn[:, 0])


# ---- item 11: a read-only cache is fine when nothing is appended ----------------------------

def test_kvcache_read_only_without_append(rng, tmp_path):
    kc, vc = _cache(rng)
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    want = attn.attention_with_kvcache(q, kc, vc, cache_seqlens=5)
    np.save(tmp_path / "k.npy", kc)
    np.save(tmp_path / "v.npy", vc)
    km = np.load(tmp_path / "k.npy", mmap_mode="r")
    vm = np.load(tmp_path / "v.npy", mmap_mode="r")
    assert not km.flags.writeable
    got = attn.attention_with_kvcache(q, km, vm, cache_seqlens=5)
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="read-only"):
        attn.attention_with_kvcache(q, km, vm, k=q[:, :, :2], v=q[:, :, :2], cache_seqlens=5)


# ---- item 6: merge_attention_states checks shapes for any number of leading dims ------------

def test_merge_shapes_any_rank(rng):
    o = rng.standard_normal((2, 3, 4, 5, 8)).astype(np.float32)
    lse_bad = rng.standard_normal((5, 4, 3, 2)).astype(np.float32)  # the same count
    lse = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    with pytest.raises(ValueError, match="lse_parts"):
        attn.merge_attention_states([o, o], [lse_bad, lse_bad])
    with pytest.raises(ValueError, match="lse_parts"):
        attn.merge_attention_states([o, o], [lse, lse_bad])
    with pytest.raises(ValueError, match="o_parts"):
        attn.merge_attention_states([o, o.reshape(3, 2, 4, 5, 8)], [lse, lse])
    # the good call: two partials of one content merge to it
    out, l2 = attn.merge_attention_states([o, o], [lse, lse])
    assert out.shape == o.shape and l2.shape == lse.shape
    np.testing.assert_allclose(out, o, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(l2, lse + np.log(2), rtol=1e-6, atol=1e-6)


# ---- item 7: one integer conversion, no wrapping, no truncation -----------------------------

def test_kvcache_integers(rng):
    kc, vc = _cache(rng)
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="window"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=5, window_size=(2 ** 64 + 1, 0))
    with pytest.raises(TypeError, match="window"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=5, window_size=(1.5, 0))
    with pytest.raises(TypeError, match="cache_seqlens"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=2.5)
    with pytest.raises(ValueError, match="cache_seqlens"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="cache_seqlens"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([2 ** 32 + 1, 1], np.uint64))
    with pytest.raises(TypeError, match="cache_seqlens"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([True, True]))
    # whole numbers in a float array: still a float array (test_api.py's kv_len rule)
    with pytest.raises(TypeError, match="cache_seqlens: dtype float64"):
        attn.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([3.0, 5.0]))


def test_cascade_integers(rng):
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    kp = rng.standard_normal((5, 2, 4)).astype(np.float32)
    with pytest.raises(TypeError, match="prefix_len"):
        attn.cascade_attention(q, kp, kp, prefix_len=2.5)
    with pytest.raises(TypeError, match="threads"):
        attn.cascade_attention(q, kp, kp, threads=1.0)
    ks = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="suffix_lens"):
        attn.cascade_attention(q, kp, kp, ks, ks, suffix_lens=np.array([1, 2.5]))
    with pytest.raises(ValueError, match="suffix_lens"):
        attn.cascade_attention(q, kp, kp, ks, ks, suffix_lens=np.array([2 ** 64 - 1, 1], np.uint64))


def test_additive_key_lengths_integers(rng):
    B, Lq, Lk, Dq, Dk, Dv, A = 2, 3, 4, 5, 6, 3, 7
    q = rng.standard_normal((B, Lq, Dq)).astype(np.float32)
    k = rng.standard_normal((B, Lk, Dk)).astype(np.float32)
    val = rng.standard_normal((B, Lk, Dv)).astype(np.float32)
    W = rng.standard_normal((Dq, A)).astype(np.float32)
    U = rng.standard_normal((Dk, A)).astype(np.float32)
    v = rng.standard_normal(A).astype(np.float32)
    with pytest.raises(ValueError, match="key_lengths"):
        attn.additive_attention(q, k, val, W, U, v, key_lengths=np.array([1.7, 2.0]))
    with pytest.raises(TypeError, match="key_lengths"):
        attn.additive_attention(q, k, val, W, U, v, key_lengths=[1.7, 2])
    with pytest.raises(TypeError, match="key_lengths: dtype float64"):
        attn.additive_attention(q, k, val, W, U, v, key_lengths=np.array([1.0, 2.0]))


def _layer(rng, E=8, H=2, D=4):
    w = [rng.standard_normal((E, H * D)).astype(np.float32) * 0.3 for _ in range(3)]
    w.append(rng.standard_normal((H * D, E)).astype(np.float32) * 0.3)
    return dict(w_q=w[0], w_k=w[1], w_v=w[2], w_o=w[3])


def test_decode_integers(rng):
    w = _layer(rng)
    x = rng.standard_normal((1, 1, 8)).astype(np.float32)
    with pytest.raises(TypeError, match="lengths"):
        attn.KVCache(np.zeros((1, 4, 2, 4), np.float32), np.zeros((1, 4, 2, 4), np.float32),
                     lengths=[1.7])
    with pytest.raises(ValueError, match="lengths"):
        attn.KVCache(np.zeros((1, 4, 2, 4), np.float32), np.zeros((1, 4, 2, 4), np.float32),
                     lengths=np.array([1.7]))
    cache = attn.KVCache.empty(1, 4, 2, 4)
    len0 = cache.len.copy()
    for bad, exc in ((dict(num_heads=2 ** 64 + 2), ValueError), (dict(num_heads=2.0), TypeError),
                     (dict(num_heads=2, rope="half", rope_offset=2 ** 64 + 1), ValueError),
                     (dict(num_heads=2, num_kv_heads=2 ** 64 + 2), ValueError),
                     (dict(num_heads=2, threads=2 ** 40), ValueError),
                     (dict(num_heads=True), TypeError)):
        with pytest.raises(exc):
            attn.mha_decode(x, cache, **w, **bad)
        assert np.array_equal(cache.len, len0)
    attn.mha_decode(x, cache, num_heads=2, **w)
    assert cache.len[0] == 1


def test_mha_integers(rng):
    w = _layer(rng)
    x = rng.standard_normal((1, 3, 8)).astype(np.float32)
    for bad, exc in ((dict(num_heads=2 ** 64 + 2), ValueError), (dict(num_heads=2.5), TypeError),
                     (dict(num_heads=2, rope="half", rope_offset=2 ** 64 + 1), ValueError),
                     (dict(num_heads=2, kv_len=np.array([2.5])), ValueError),
                     (dict(num_heads=2, rotary_dim=2.0), TypeError)):
        with pytest.raises(exc):
            attn.multi_head_attention(x, **w, **bad)
    with pytest.raises(TypeError, match="kv_len: dtype float64"):
        attn.multi_head_attention(x, num_heads=2, kv_len=np.array([2.0]), **w)


def test_sdpa_kv_len_fraction(rng):
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="kv_len"):
        attn.scaled_dot_product_attention(q, q, q, kv_len=np.array([1.5]))
    with pytest.raises(TypeError, match="kv_len"):
        attn.scaled_dot_product_attention(q, q, q, kv_len=np.array([True]))
    with pytest.raises(ValueError, match="window"):
        attn.scaled_dot_product_attention(q, q, q, window=(2 ** 64 + 1, 0))


def test_weights_grid_integers(rng):
    q = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    lse = np.zeros((1, 1, 3), np.float32)
    with pytest.raises(TypeError, match="rows"):
        attn.weights_grid(q, q, lse, rows=2.5)
    with pytest.raises(ValueError, match="cols"):
        attn.weights_grid(q, q, lse, cols=2 ** 64 + 2)
    with pytest.raises(ValueError, match="window"):
        attn.weights_grid(q, q, lse, window=(2 ** 64 + 1, 0))
