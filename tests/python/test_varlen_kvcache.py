"""test_varlen_kvcache.py — attn.varlen_attention_with_kvcache: a server's step (decodes
beside chunks of prefill, each request with its own paged cache) in one call.

Checked, with NumPy (and torch tensors where PyTorch is installed):
- bit for bit the same requests as separate attn.attention_with_kvcache calls (output and
  LSE), causal bottom-right, GQA, float32 and bfloat16 caches, sinks;
- against the float64 oracle over each request's keys gathered in order;
- a speculative-decoding tree as the padded mask: bit for bit the separate calls given
  each request's rows of the mask (through attn.scaled_dot_product_attention's oracle);
- refusals (seqused_k over max_seqlen_k, a mask of the wrong shape) raise.
"""
import numpy as np
import pytest

import attn
from oracle import reference, tolerance_failure

LQ = [1, 1, 6, 0, 1, 13]


def _step(rng, dtype=np.float32, page=16, Hq=8, Hkv=2, D=32):
    B = len(LQ)
    lk = [lq + 1 + int(rng.integers(0, 90)) for lq in LQ]
    maxp = -(-max(lk) // page)
    pages = B * maxp + 2
    kp = rng.uniform(-1, 1, (pages, page, Hkv, D)).astype(np.float32)
    vp = rng.uniform(-1, 1, (pages, page, Hkv, D)).astype(np.float32)
    table = rng.permutation(pages)[:B * maxp].reshape(B, maxp).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(LQ)]).astype(np.int32)
    q = rng.uniform(-1, 1, (int(cu[-1]), Hq, D)).astype(np.float32)
    return q, kp, vp, table, cu, np.array(lk, np.int32)


def test_step_is_the_separate_calls_and_the_oracle():
    rng = np.random.default_rng(5)
    q, kp, vp, table, cu, lk = _step(rng)
    sinks = rng.uniform(-1, 1, q.shape[1]).astype(np.float32)
    for s in (None, sinks):
        out, lse = attn.varlen_attention_with_kvcache(q, kp, vp, cu, lk, table, max(LQ),
                                                      int(lk.max()), causal=True, sinks=s,
                                                      return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
        for b, n in enumerate(LQ):
            if n == 0:
                continue
            rows = slice(int(cu[b]), int(cu[b + 1]))
            o1, l1 = attn.attention_with_kvcache(q[None, rows], kp, vp,
                                                 cache_seqlens=lk[b:b + 1],
                                                 block_table=table[b:b + 1], causal=True,
                                                 sinks=s, return_softmax_lse=True)
            assert np.array_equal(o1[0], out[rows]) and np.array_equal(l1[0], lse[:, rows])
            if s is None:  # the oracle, over the request's keys in order
                keys = kp[table[b]].reshape(-1, *kp.shape[2:])[:lk[b]]
                vals = vp[table[b]].reshape(-1, *vp.shape[2:])[:lk[b]]
                ref = reference(np.transpose(q[rows], (1, 0, 2)), np.transpose(keys, (1, 0, 2)),
                                np.transpose(vals, (1, 0, 2)), causal=True, gqa=True,
                                align="bottom-right")[0]
                assert tolerance_failure(np.transpose(out[rows], (1, 0, 2)), ref) is None


def test_tree_mask():
    rng = np.random.default_rng(9)
    q, kp, vp, table, cu, lk = _step(rng)
    B, maxp, page = len(LQ), table.shape[1], kp.shape[1]
    mask = np.zeros((B, 1, max(LQ), maxp * page), bool)
    for b, n in enumerate(LQ):
        first = int(lk[b]) - n
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        for i in range(n):
            mask[b, 0, i, :first] = True
            a = i
            while a >= 0:
                mask[b, 0, i, first + a] = True
                a = parent[a]
    out = attn.varlen_attention_with_kvcache(q, kp, vp, cu, lk, table, max(LQ), int(lk.max()),
                                             mask=mask)
    for b, n in enumerate(LQ):
        if n == 0:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        keys = kp[table[b]].reshape(-1, *kp.shape[2:])[:lk[b]]
        vals = vp[table[b]].reshape(-1, *vp.shape[2:])[:lk[b]]
        ref = reference(np.transpose(q[rows], (1, 0, 2)), np.transpose(keys, (1, 0, 2)),
                        np.transpose(vals, (1, 0, 2)), mask=mask[b, 0, :n, :lk[b]],
                        gqa=True)[0]
        assert tolerance_failure(np.transpose(out[rows], (1, 0, 2)), ref) is None
        # planted: the tree's mask dropped, plain causal instead, must differ where n > 1
        if n > 2:
            bad = reference(np.transpose(q[rows], (1, 0, 2)), np.transpose(keys, (1, 0, 2)),
                            np.transpose(vals, (1, 0, 2)), causal=True, gqa=True,
                            align="bottom-right")[0]
            assert tolerance_failure(np.transpose(out[rows], (1, 0, 2)), bad) is not None


def test_torch_and_refusals():
    rng = np.random.default_rng(3)
    q, kp, vp, table, cu, lk = _step(rng)
    with pytest.raises(Exception):
        attn.varlen_attention_with_kvcache(q, kp, vp, cu, lk, table, max(LQ), int(lk.max()) - 1)
    with pytest.raises(Exception):
        attn.varlen_attention_with_kvcache(q, kp, vp, cu, lk, table, max(LQ), int(lk.max()),
                                           mask=np.ones((1, 1, 2, 2), bool))
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch tensors of "
                                "varlen_attention_with_kvcache are not tested")
    out = attn.varlen_attention_with_kvcache(q, kp, vp, cu, lk, table, max(LQ), int(lk.max()),
                                             causal=True)
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    tout = attn.varlen_attention_with_kvcache(t(q), t(kp), t(vp), t(cu), t(lk), t(table),
                                              max(LQ), int(lk.max()), causal=True)
    assert isinstance(tout, torch.Tensor) and np.array_equal(tout.numpy(), out)
    kb, vb = t(kp).bfloat16(), t(vp).bfloat16()
    ob = attn.varlen_attention_with_kvcache(t(q), kb, vb, t(cu), t(lk), t(table), max(LQ),
                                            int(lk.max()), causal=True)
    for b, n in enumerate(LQ):
        if n:
            rows = slice(int(cu[b]), int(cu[b + 1]))
            o1 = attn.attention_with_kvcache(t(q)[None, rows], kb, vb, cache_seqlens=t(lk[b:b + 1]),
                                             block_table=t(table[b:b + 1]), causal=True)
            assert torch.equal(o1[0], ob[rows])
