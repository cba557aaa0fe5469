"""test_merge.py — attn.merge_attention_states (attn_merge) and attn.cascade_attention
(attn_cascade_forward), python/attn/_merge.py.

Checks: partials over a random split of the keys (computed here in float64, rounded to
float32) merged equal the float64 attention over all keys, given as a list or stacked,
in vLLM's layout (o [T, H, D], lse [H, T] as its .T view) and with more than three
leading dimensions; empty partials (LSE -inf, NaN in O) neutral, all empty O 0 and
LSE -inf; cascade_attention against a float64 per-sequence reference over [prefix;
suffix_b], contiguous and paged, with ragged suffixes, GQA, sinks, softcap, bottom-right
causal and its LSE; the tolerance seen failing on a planted error; bad input refused.
NumPy only; the torch part skips (with the reason) where PyTorch is absent.
"""
import numpy as np
import pytest

import attn
from oracle import assert_close, tolerance_failure


def _attend(q, k, v, sinks=None, softcap=0.0, causal_diag=None):
    """float64 attention of rows q [R, D] over k, v [N, D]; (o [R, D], lse [R])."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if causal_diag is not None:
        j = np.arange(k.shape[0])[None, :]
        s = np.where(j <= np.asarray(causal_diag)[:, None], s, -np.inf)
    cols = [s] if sinks is None else [s, np.full((s.shape[0], 1), float(sinks))]
    full = np.concatenate(cols, axis=1)
    if full.shape[1] == 0:  # no key and no sink
        return np.zeros((q.shape[0], v.shape[1])), np.full(q.shape[0], -np.inf)
    m = full.max(axis=1, keepdims=True)
    empty = ~np.isfinite(m[:, 0])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(full - m)
    l = e.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        o = (e[:, :k.shape[0]] @ v) / l[:, None]
        lse = np.log(l) + m[:, 0]
    o[empty] = 0.0
    lse[empty] = -np.inf
    return o, lse


def _split_parts(rng, T, H, D, Lk, cuts):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((T, H, D), (H, Lk, D), (H, Lk, D)))
    o_ref, lse_ref = np.zeros((T, H, D)), np.zeros((T, H))
    parts_o, parts_l = [], []
    for h in range(H):
        o_ref[:, h], lse_ref[:, h] = _attend(q[:, h], k[h], v[h])
    bounds = [0] + list(cuts) + [Lk]
    for a, b in zip(bounds[:-1], bounds[1:]):
        po, pl = np.zeros((T, H, D), np.float32), np.zeros((T, H), np.float32)
        for h in range(H):
            o, l = _attend(q[:, h], k[h, a:b], v[h, a:b])
            po[:, h], pl[:, h] = o, l
        parts_o.append(po)
        parts_l.append(pl)
    return parts_o, parts_l, o_ref, lse_ref


def test_merge_split_list_and_stacked(rng):
    parts_o, parts_l, o_ref, lse_ref = _split_parts(rng, 7, 3, 16, 50, [11, 11, 30])  # an empty part
    for o_in, l_in in ((parts_o, parts_l), (np.stack(parts_o), np.stack(parts_l))):
        o, lse = attn.merge_attention_states(o_in, l_in)
        assert o.dtype == np.float32 and o.shape == (7, 3, 16) and lse.shape == (7, 3)
        assert_close(o, o_ref)
        assert_close(lse, lse_ref, "lse")


def test_merge_vllm_layout_lse_transposed(rng):
    parts_o, parts_l, o_ref, lse_ref = _split_parts(rng, 5, 4, 8, 33, [20])
    # vLLM keeps the LSE as [H, T]: passed as the .T view, read through its strides
    l_ht = [np.ascontiguousarray(p.T) for p in parts_l]
    o, lse = attn.merge_attention_states(parts_o, [p.T for p in l_ht])
    assert_close(o, o_ref)
    assert_close(lse, lse_ref, "lse")


def test_merge_many_leading_dims(rng):
    parts_o, parts_l, o_ref, lse_ref = _split_parts(rng, 6, 4, 8, 20, [7])
    shape = (2, 3, 2, 2)
    o, lse = attn.merge_attention_states([p.reshape(shape + (8,)) for p in parts_o],
                                         [p.reshape(shape) for p in parts_l])
    assert o.shape == shape + (8,) and lse.shape == shape
    assert_close(o.reshape(6, 4, 8), o_ref)


def test_merge_empty_partials():
    o1 = np.ones((2, 3), np.float32)
    nan = np.full((2, 3), np.nan, np.float32)
    l1 = np.array([0.5, -np.inf], np.float32)
    empty = np.full(2, -np.inf, np.float32)
    o, lse = attn.merge_attention_states([nan, o1], [empty, l1])
    assert np.array_equal(o[0], o1[0]) and lse[0] == np.float32(0.5)
    assert np.array_equal(o[1], np.zeros(3)) and lse[1] == -np.inf


def test_merge_tolerance_sees_a_planted_error(rng):
    parts_o, parts_l, o_ref, _ = _split_parts(rng, 4, 2, 8, 30, [9])
    o, _ = attn.merge_attention_states(parts_o, parts_l)
    assert tolerance_failure(o, o_ref) is None
    o[1, 1, 3] += 1e-4 * (1 + abs(o[1, 1, 3]))
    assert tolerance_failure(o, o_ref) is not None


def test_merge_bad_input():
    with pytest.raises(ValueError):
        attn.merge_attention_states([np.zeros((2, 3), np.float32)], [])
    with pytest.raises(ValueError):  # an lse of another row count
        attn.merge_attention_states([np.zeros((2, 3), np.float32)], [np.zeros(3, np.float32)])
    with pytest.raises(ValueError):
        attn.merge_attention_states([], [])


def _cascade_ref(q, kp, vp, ks, vs, lens, sinks=None, softcap=0.0, causal=False):
    """float64: sequence b over [prefix; suffix_b[:lens[b]]], q [B, Lq, Hq, D]."""
    B, Lq, Hq, D = q.shape
    Hkv = kp.shape[1]
    g = Hq // Hkv
    o = np.zeros((B, Lq, Hq, D))
    lse = np.zeros((B, Hq, Lq))
    for b in range(B):
        k = np.concatenate([kp, ks[b, :lens[b]]], axis=0)
        v = np.concatenate([vp, vs[b, :lens[b]]], axis=0)
        diag = np.arange(Lq) + k.shape[0] - Lq if causal else None
        for h in range(Hq):
            oo, ll = _attend(q[b, :, h], k[:, h // g], v[:, h // g], None if sinks is None else sinks[h],
                             softcap, diag)
            o[b, :, h], lse[b, h] = oo, ll
    return o, lse


def _pool(rng, ks, vs, ps):
    """Shuffled page pools [num_pages, ps, Hkv, D] holding each sequence of ks and vs
    ([L_b, Hkv, D] each), NaN in every other slot, and the table [len(ks), max_pages]
    (-1 past each sequence's pages)."""
    mp = max(1, max((k.shape[0] + ps - 1) // ps for k in ks))
    npages = len(ks) * mp + 1
    perm = rng.permutation(npages)
    kpool = np.full((npages, ps) + ks[0].shape[1:], np.nan, np.float32)
    vpool = kpool.copy()
    table = np.full((len(ks), mp), -1, np.int32)
    at = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        for p in range((k.shape[0] + ps - 1) // ps):
            table[b, p] = perm[at]
            at += 1
            n = min(ps, k.shape[0] - p * ps)
            kpool[table[b, p], :n] = k[p * ps:p * ps + n]
            vpool[table[b, p], :n] = v[p * ps:p * ps + n]
    return kpool, vpool, table


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("B,Lq,Hq,Hkv,P,S", [(1, 1, 2, 2, 17, 5), (3, 1, 4, 2, 32, 16), (32, 1, 8, 2, 40, 9),
                                            (3, 2, 4, 1, 0, 6), (3, 3, 2, 2, 19, 0)])
def test_cascade_against_reference(rng, paged, B, Lq, Hq, Hkv, P, S):
    D = 16
    q = rng.standard_normal((B, Lq, Hq, D)).astype(np.float32)
    kp, vp = (rng.standard_normal((P, Hkv, D)).astype(np.float32) for _ in range(2))
    ks, vs = (rng.standard_normal((B, S, Hkv, D)).astype(np.float32) for _ in range(2))
    lo = Lq - 1
    lens = rng.integers(lo, S + 1, size=B).astype(np.int32) if S >= lo else np.full(B, S, np.int32)
    sinks = rng.uniform(-1, 2, Hq).astype(np.float32)
    for variant in ("plain", "sinks+softcap", "causal"):
        kw = {}
        if variant == "sinks+softcap":
            kw = dict(sinks=sinks, softcap=4.0)
        if variant == "causal":
            if S < lo:
                continue
            kw = dict(causal=True)
        if paged:
            pk, pv, tk = _pool(rng, [kp], [vp], 8)
            sk, sv, st = _pool(rng, [ks[b, :lens[b]] for b in range(B)], [vs[b, :lens[b]] for b in range(B)], 4)
            out, lse = attn.cascade_attention(q, pk, pv, sk, sv, suffix_lens=lens, prefix_len=P,
                                              prefix_block_table=tk[0], suffix_block_table=st,
                                              return_lse=True, **kw)
        else:
            out, lse = attn.cascade_attention(q, kp, vp, ks, vs, suffix_lens=lens, return_lse=True, **kw)
        o_ref, l_ref = _cascade_ref(q, kp, vp, ks, vs, lens, **kw)
        assert out.shape == (B, Lq, Hq, D) and out.dtype == np.float32
        assert_close(out, o_ref, "%s O" % variant)
        assert_close(lse, l_ref, "%s LSE" % variant)


def test_cascade_bad_input(rng):
    q = np.zeros((2, 1, 4, 16), np.float32)
    kp = np.zeros((8, 2, 16), np.float32)
    ks = np.zeros((2, 4, 2, 16), np.float32)
    with pytest.raises(ValueError):  # a prefix of 4 dimensions without a block table
        attn.cascade_attention(q, ks, ks, ks, ks)
    with pytest.raises(ValueError):  # the suffixes' width differs from q's
        attn.cascade_attention(q, kp, kp, ks[..., :8], ks[..., :8])
    with pytest.raises(RuntimeError):  # causal with 2 query rows over an empty suffix: UNSUPPORTED
        attn.cascade_attention(np.zeros((2, 2, 4, 16), np.float32), kp, kp, ks, ks,
                               suffix_lens=np.zeros(2, np.int32), causal=True)


def test_torch_tensors(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    parts_o, parts_l, o_ref, lse_ref = _split_parts(rng, 5, 2, 8, 24, [10])
    o, lse = attn.merge_attention_states([torch.from_numpy(p) for p in parts_o],
                                         torch.from_numpy(np.stack(parts_l)))
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert_close(o.numpy(), o_ref)
    assert_close(lse.numpy(), lse_ref, "lse")
    q = torch.randn(3, 1, 4, 16)
    kp, vp = torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    ks, vs = torch.randn(3, 5, 2, 16), torch.randn(3, 5, 2, 16)
    out = attn.cascade_attention(q, kp, vp, ks, vs)
    o_ref, _ = _cascade_ref(q.numpy(), kp.numpy(), vp.numpy(), ks.numpy(), vs.numpy(), [5, 5, 5])
    assert isinstance(out, torch.Tensor)
    assert_close(out.numpy(), o_ref)
