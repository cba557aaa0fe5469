"""test_kvcache.py — attn.attention_with_kvcache (python/attn/_kvcache.py): decoding against
a contiguous or paged cache with FlashAttention's flash_attn_with_kvcache names and layouts.

Checks: a contiguous cache against the float64 oracle; a paged cache (pages shuffled, NaN
in every slot no valid key occupies, -1 in the table past the valid pages) equal to the
contiguous one bit for bit, in both pool layouts; append (k, v) then attend equal to
attending over the concatenated cache, the rows written in place; bad input refused with
nothing written; torch tensors in place where PyTorch is installed.
"""
import numpy as np
import pytest

import attn
from oracle import assert_close, reference


def _bhld(x):  # [B, L, H, D] -> [B, H, L, D]
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3)))


def _paged(k, v, lens, ps, rng, hnd=False):
    """The pools [num_pages, page_size, Hkv, D] (or, hnd, [num_pages, Hkv, page_size, D]
    passed as its transpose view) of a contiguous [B, Lk, Hkv, D] cache, and the table."""
    B, Lk, Hkv, D = k.shape
    mp = Lk // ps
    npages = B * mp + 2
    perm = rng.permutation(npages).astype(np.int32)
    table = np.full((B, mp), -1, np.int32)
    kp = np.full((npages, ps, Hkv, D), np.nan, k.dtype)
    vp = np.full((npages, ps, Hkv, D), np.nan, v.dtype)
    at = 0
    for b in range(B):
        for p in range((lens[b] + ps - 1) // ps):
            table[b, p] = perm[at]
            at += 1
            n = min(ps, lens[b] - p * ps)
            kp[table[b, p], :n] = k[b, p * ps:p * ps + n]
            vp[table[b, p], :n] = v[b, p * ps:p * ps + n]
    if hnd:
        kp = np.ascontiguousarray(kp.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        vp = np.ascontiguousarray(vp.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return kp, vp, table


def _case(rng, B=2, Lq=1, Lk=48, Hq=4, Hkv=2, D=16):
    q = rng.standard_normal((B, Lq, Hq, D)).astype(np.float32)
    k = rng.standard_normal((B, Lk, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, Lk, Hkv, D)).astype(np.float32)
    return q, k, v


def test_contiguous_against_oracle(rng):
    q, k, v = _case(rng, Lq=3)
    lens = np.array([48, 29], np.int32)
    out, lse = attn.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True,
                                           return_softmax_lse=True)
    ref_o, ref_l, _ = reference(_bhld(q), _bhld(k), _bhld(v), causal=True, gqa=True,
                                align="bottom-right", kv_len=lens)
    assert out.shape == q.shape and lse.shape == (2, 4, 3)
    assert_close(_bhld(out), ref_o)
    assert_close(lse, ref_l, "lse")


@pytest.mark.parametrize("ps", [1, 3, 16])
@pytest.mark.parametrize("hnd", [False, True])
def test_paged_equals_contiguous(rng, ps, hnd):
    q, k, v = _case(rng, Lq=2)
    lens = np.array([48, ps * 2 + 1 if ps > 1 else 7], np.int32)
    kp, vp, table = _paged(k, v, lens, ps, rng, hnd)
    kw = dict(cache_seqlens=lens, causal=True, window_size=(20, 0), softcap=4.0,
              alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4], np.float32), return_softmax_lse=True)
    o_c, l_c = attn.attention_with_kvcache(q, k, v, **kw)
    o_p, l_p = attn.attention_with_kvcache(q, kp, vp, block_table=table, **kw)
    assert np.array_equal(o_c, o_p) and np.array_equal(l_c, l_p)
    assert not np.isnan(o_p).any()


@pytest.mark.parametrize("paged", [False, True])
def test_append_then_attend(rng, paged):
    q, k, v = _case(rng, Lq=3)
    lens = np.array([40, 13], np.int32)
    kn = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)
    vn = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)
    full_k, full_v = k.copy(), v.copy()
    for b in range(2):
        full_k[b, lens[b]:lens[b] + 3] = kn[b]
        full_v[b, lens[b]:lens[b] + 3] = vn[b]
    want = attn.attention_with_kvcache(q, full_k, full_v, cache_seqlens=lens + 3, causal=True)
    if paged:
        kc, vc, table = _paged(k, v, lens + 3, 16, rng)
        # the new rows' slots hold NaN now: the append must overwrite them
        for b in range(2):
            for t in range(3):
                pos = lens[b] + t
                kc[table[b, pos // 16], pos % 16] = np.nan
        got = attn.attention_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens,
                                          block_table=table, causal=True)
        pos = lens[0] + 1
        assert np.array_equal(kc[table[0, pos // 16], pos % 16], kn[0, 1])
    else:
        kc, vc = k.copy(), v.copy()
        got = attn.attention_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
        assert np.array_equal(kc[:, :40], full_k[:, :40]) and np.array_equal(kc[1, 13:16], kn[1])
    assert np.array_equal(got, want)


def test_append_float16_cache(rng):
    q, k, v = _case(rng)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    kn = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    vn = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    lens = np.array([10, 20], np.int32)
    attn.attention_with_kvcache(q, k16, v16, k=kn, v=vn, cache_seqlens=lens)
    assert np.array_equal(k16[0, 10], kn[0, 0].astype(np.float16))
    assert np.array_equal(v16[1, 20], vn[1, 0].astype(np.float16))


def test_bad_input_writes_nothing(rng):
    q, k, v = _case(rng)
    lens = np.array([40, 13], np.int32)
    kp, vp, table = _paged(k, v, lens + 1, 16, rng)
    before = kp.copy()
    bad = table.copy()
    bad[0, 2] = kp.shape[0]  # a page the new token of batch 0 reaches, outside the pool
    kn = np.ones((2, 1, 2, 16), np.float32)
    with pytest.raises(ValueError, match="block_table"):
        attn.attention_with_kvcache(q, kp, vp, k=kn, v=kn, cache_seqlens=lens, block_table=bad)
    assert np.array_equal(np.isnan(kp), np.isnan(before)) and np.array_equal(
        np.nan_to_num(kp), np.nan_to_num(before))
    with pytest.raises(ValueError):  # beyond the table's pages
        attn.attention_with_kvcache(q, kp, vp, cache_seqlens=np.array([49, 1], np.int32),
                                    block_table=table)
    with pytest.raises(ValueError):
        attn.attention_with_kvcache(q, kp, vp, k=kn, cache_seqlens=lens, block_table=table)
    ro = k.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        attn.attention_with_kvcache(q, ro, v, k=kn, v=kn, cache_seqlens=lens)


def test_torch_in_place(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    q, k, v = _case(rng, Lq=2)
    lens = np.array([30, 41], np.int32)
    kn = rng.standard_normal((2, 2, 2, 16)).astype(np.float32)
    kp, vp, table = _paged(k, v, lens + 2, 16, rng)
    want = attn.attention_with_kvcache(q, kp.copy(), vp.copy(), k=kn, v=kn, cache_seqlens=lens,
                                       block_table=table, causal=True)
    tk, tv = torch.from_numpy(kp), torch.from_numpy(vp)
    got = attn.attention_with_kvcache(torch.from_numpy(q), tk, tv, k=torch.from_numpy(kn),
                                      v=torch.from_numpy(kn), cache_seqlens=torch.from_numpy(lens),
                                      block_table=torch.from_numpy(table), causal=True)
    assert isinstance(got, torch.Tensor)
    assert np.array_equal(got.numpy(), want)
    pos = lens[1] + 1
    assert np.array_equal(kp[table[1, pos // 16], pos % 16], kn[1, 1])  # written in place


def test_sinks(rng):
    """sinks= (issue 38: the C call had them, this one did not): the same bits as
    attn.scaled_dot_product_attention with the same sinks over the cache's rows, LSE
    included; a sink of -inf is no sink; a wrong shape refused before the append writes."""
    q, k, v = _case(rng, Lq=2)
    lens = np.array([48, 30], np.int32)
    sinks = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)
    out, lse = attn.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True,
                                           sinks=sinks, return_softmax_lse=True)
    ref, ref_lse = attn.scaled_dot_product_attention(
        _bhld(q), _bhld(k), _bhld(v), is_causal=True, align="bottom-right", kv_len=lens,
        enable_gqa=True, sinks=sinks, return_lse=True)
    assert np.array_equal(_bhld(out), ref) and np.array_equal(lse, ref_lse)
    plain = attn.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
    assert not np.array_equal(out[:, :, :3], plain[:, :, :3])  # the sinks change heads 0-2
    assert np.array_equal(out[:, :, 3], plain[:, :, 3])        # -inf: no sink
    kc, vc = k.copy(), v.copy()
    new = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="sinks"):
        attn.attention_with_kvcache(q, kc, vc, k=new, v=new, cache_seqlens=lens - 1,
                                    sinks=sinks[:3])
    assert np.array_equal(kc, k) and np.array_equal(vc, v)
