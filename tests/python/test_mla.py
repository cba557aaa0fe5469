"""test_mla.py — attn.flash.flash_mla_with_kvcache (FlashMLA's call: DeepSeek's latent
attention over a paged latent cache) and get_mla_metadata.

Checked, with NumPy (and the same through PyTorch tensors where it is installed):
- decoding (Lq 1) and a chunk of prefill (Lq 4, bottom-right causal) over a shuffled page
  pool of latent rows [c_kv, k_rope], many query heads on one latent head, per-sequence
  cache lengths: against the float64 oracle over K = the rows and V = their first
  head_dim_v columns, copied out (the contract's float32 rule), the LSE too;
- bit for bit attn.attention_with_kvcache given K and V as two separate arrays of the
  same values (the view changes what is read, not the arithmetic);
- a planted error (V one column on) fails that rule; bad head_dim_v, is_fp8_kvcache and
  indices are refused.
"""
import numpy as np
import pytest

import attn
from attn import flash
from oracle import reference, tolerance_failure

# (B, Lq, Hq, Dl, Dr, page, lengths)
CASES = [
    (2, 1, 16, 64, 16, 16, [37, 64]),
    (3, 1, 64, 32, 16, 1, [5, 1, 20]),
    (1, 4, 8, 512, 64, 64, [100]),
    (2, 2, 32, 64, 32, 8, [9, 33]),
]


def _case(rng, B, Lq, Hq, Dl, Dr, page, lengths):
    Dk = Dl + Dr
    max_pages = -(-max(lengths) // page)
    pages = B * max_pages + 2
    pool = rng.uniform(-1, 1, (pages, page, 1, Dk)).astype(np.float32)
    table = rng.permutation(pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
    q = rng.uniform(-1, 1, (B, Lq, Hq, Dk)).astype(np.float32)
    seqlens = np.array(lengths, np.int32)
    return q, pool, table, seqlens


def _expanded(pool, table, seqlens):
    """K rows [B, Lmax, 1, Dk] in logical order (0 past each sequence's pages)"""
    B, max_pages = table.shape
    page = pool.shape[1]
    rows = pool[table.reshape(-1)].reshape(B, max_pages * page, 1, pool.shape[-1])
    return np.ascontiguousarray(rows)


@pytest.mark.parametrize("case", CASES)
def test_mla_against_oracle_and_copies(case):
    rng = np.random.default_rng(38)
    B, Lq, Hq, Dl, Dr, page, lengths = case
    q, pool, table, seqlens = _case(rng, *case)
    md, splits = flash.get_mla_metadata(seqlens, Lq * Hq, 1)
    out, lse = flash.flash_mla_with_kvcache(q, pool, table, seqlens, Dl, md, splits,
                                            causal=Lq > 1)
    assert out.shape == (B, Lq, Hq, Dl) and lse.shape == (B, Hq, Lq)
    kx = _expanded(pool, table, seqlens)
    vx = np.ascontiguousarray(kx[..., :Dl])
    for b in range(B):
        n = int(seqlens[b])
        qb = np.transpose(q[b], (1, 0, 2))  # [Hq, Lq, Dk]
        kb = np.broadcast_to(kx[b, :n, 0][None], (Hq, n, Dl + Dr))
        vb = np.broadcast_to(vx[b, :n, 0][None], (Hq, n, Dl))
        o_ref, l_ref, _ = reference(qb, kb, vb, causal=Lq > 1, align="bottom-right")
        msg = tolerance_failure(np.transpose(out[b], (1, 0, 2)), o_ref)
        assert msg is None, "batch %d: %s" % (b, msg)
        assert np.allclose(lse[b], l_ref, rtol=0, atol=1e-5 * (1 + np.abs(l_ref).max()))
        shifted = np.concatenate([vb[:, :, 1:], kb[:, :, Dl:Dl + 1]], axis=2)  # planted
        assert tolerance_failure(np.transpose(out[b], (1, 0, 2)),
                                 reference(qb, kb, shifted, causal=Lq > 1,
                                           align="bottom-right")[0]) is not None
    # the same values as two separate paged caches: the same bits
    vpool = np.ascontiguousarray(pool[..., :Dl])
    out2, lse2 = attn.attention_with_kvcache(q, np.ascontiguousarray(pool), vpool,
                                             cache_seqlens=seqlens, block_table=table,
                                             causal=Lq > 1, return_softmax_lse=True)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)


def test_mla_torch_tensors():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch "
                                "tensors of flash_mla_with_kvcache are not tested")
    rng = np.random.default_rng(7)
    q, pool, table, seqlens = _case(rng, *CASES[0])
    out, lse = flash.flash_mla_with_kvcache(q, pool, table, seqlens, CASES[0][3])
    tout, tlse = flash.flash_mla_with_kvcache(torch.from_numpy(q), torch.from_numpy(pool),
                                              torch.from_numpy(table),
                                              torch.from_numpy(seqlens), CASES[0][3])
    assert isinstance(tout, torch.Tensor)
    assert np.array_equal(tout.numpy(), out) and np.array_equal(tlse.numpy(), lse)


def test_mla_refusals():
    rng = np.random.default_rng(1)
    q, pool, table, seqlens = _case(rng, *CASES[0])
    for dv in (0, pool.shape[-1] + 1):
        with pytest.raises(ValueError):
            flash.flash_mla_with_kvcache(q, pool, table, seqlens, dv)
    with pytest.raises(NotImplementedError):
        flash.flash_mla_with_kvcache(q, pool, table, seqlens, 64, is_fp8_kvcache=True)
    with pytest.raises(NotImplementedError):
        flash.flash_mla_with_kvcache(q, pool, table, seqlens, 64, indices=np.zeros(1))
