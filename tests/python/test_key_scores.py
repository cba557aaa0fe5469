"""test_key_scores.py — attn.attention_with_kvcache(..., return_key_scores=True): the
eviction scores [B, Hkv, Lk], the attention mass each cached key received over the call's
rows and the query heads of its key/value head (attn_options.key_scores).

Checked against the column sums of the float64 oracle's weights (the contract's float32
rule), contiguous and paged, decoding and a chunk of prefill under bottom-right causal; a
planted error (one head of each group left out) fails it; out and the LSE are the call's
without the scores, bit for bit; torch tensors where PyTorch is installed.
"""
import numpy as np
import pytest

import attn
from oracle import reference, tolerance_failure


def _want(q, kc, vc, lens, Hkv, heads=None):
    B, Lq, Hq, D = q.shape
    Lk = kc.shape[1]
    g = Hq // Hkv
    want = np.zeros((B, Hkv, Lk))
    for b in range(B):
        n = int(lens[b])
        _, _, w = reference(np.transpose(q[b], (1, 0, 2)), np.transpose(kc[b, :n], (1, 0, 2)),
                            np.transpose(vc[b, :n], (1, 0, 2)), causal=True, gqa=True,
                            align="bottom-right")
        w = w.reshape(Hkv, g, Lq, n)[:, :heads]
        want[b, :, :n] = w.sum(axis=(1, 2))
    return want


@pytest.mark.parametrize("Lq,page", [(1, None), (5, None), (1, 16), (3, 8)])
def test_key_scores(Lq, page):
    rng = np.random.default_rng(Lq * 10 + (page or 0))
    B, Hq, Hkv, D, Lk = 2, 8, 2, 32, 70
    q = rng.uniform(-1, 1, (B, Lq, Hq, D)).astype(np.float32)
    kc = rng.uniform(-1, 1, (B, Lk, Hkv, D)).astype(np.float32)
    vc = rng.uniform(-1, 1, (B, Lk, Hkv, D)).astype(np.float32)
    lens = np.array([Lk, 40], np.int32)
    want = _want(q, kc, vc, lens, Hkv)
    if page:
        maxp = -(-Lk // page)
        perm = rng.permutation(B * maxp).astype(np.int32)
        table = perm.reshape(B, maxp)
        pad = np.zeros((B, maxp * page, Hkv, D), np.float32)
        pk, pv = pad.copy(), pad.copy()
        pk[:, :Lk], pv[:, :Lk] = kc, vc
        kp = np.zeros((B * maxp, page, Hkv, D), np.float32)
        vp = np.zeros_like(kp)
        kp[table.reshape(-1)] = pk.reshape(B * maxp, page, Hkv, D)
        vp[table.reshape(-1)] = pv.reshape(B * maxp, page, Hkv, D)
        args = dict(block_table=table)
        k_cache, v_cache = kp, vp
        want = np.concatenate([want, np.zeros((B, Hkv, maxp * page - Lk))], axis=2)
    else:
        args = {}
        k_cache, v_cache = kc, vc
    out, lse, ks = attn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                               causal=True, return_softmax_lse=True,
                                               return_key_scores=True, **args)
    assert ks.shape == want.shape and ks.dtype == np.float32
    assert tolerance_failure(ks, want) is None
    o2, l2 = attn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=True,
                                         return_softmax_lse=True, **args)
    assert np.array_equal(out, o2) and np.array_equal(lse, l2)
    bad = _want(q, kc, vc, lens, Hkv, heads=Hq // Hkv - 1)
    if page:
        bad = np.concatenate([bad, np.zeros((B, Hkv, want.shape[2] - Lk))], axis=2)
    assert tolerance_failure(ks, bad) is not None
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch tensors "
                                "of return_key_scores are not tested")
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    targs = {k: t(v) for k, v in args.items()}
    _, tks = attn.attention_with_kvcache(t(q), t(k_cache), t(v_cache), cache_seqlens=t(lens),
                                         causal=True, return_key_scores=True, **targs)
    assert isinstance(tks, torch.Tensor) and np.array_equal(tks.numpy(), ks)
