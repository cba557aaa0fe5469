"""test_numpy.py — attn.scaled_dot_product_attention on NumPy arrays against the float64
oracle (oracle.py): shapes, masks, GQA, the keyword extras, strided and transposed
views, and the contract's edge cases, on the fused and the reference path.
"""
import numpy as np
import pytest

import attn
from oracle import SHAPES, assert_close, randn, reference

sdpa = attn.scaled_dot_product_attention
PATHS = ["fused", "reference"]


def check(args, kwargs, ref_kwargs=None, ref_inputs=None):
    """Runs sdpa with return_lse and return_weights and compares all three outputs with
    the oracle of (ref_inputs or args)[:3] (a mask goes to the oracle through ref_kwargs)."""
    out, lse, w = sdpa(*args, return_lse=True, return_weights=True, **kwargs)
    ref_o, ref_l, ref_w = reference(*(ref_inputs or args)[:3], **(ref_kwargs or {}))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert_close(out, ref_o, "output")
    assert_close(lse, ref_l, "lse")
    assert_close(w, ref_w, "weights")
    return out


# ---- shapes ---------------------------------------------------------------------------



@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes_4d(rng, shape, path):
    B, H, Lq, Lk, Dk, Dv = shape
    q, k, v = randn(rng, B, H, Lq, Dk), randn(rng, B, H, Lk, Dk), randn(rng, B, H, Lk, Dv)
    check((q, k, v), dict(path=path))
    check((q, k, v), dict(is_causal=True, path=path), dict(causal=True))


@pytest.mark.parametrize("rank", [2, 3])
def test_lower_ranks(rng, rank):
    lead = (3,)[: rank - 2]
    q, k, v = randn(rng, *lead, 6, 8), randn(rng, *lead, 9, 8), randn(rng, *lead, 9, 5)
    out = check((q, k, v), {})
    assert out.shape == lead + (6, 5)
    out = check((q, k, v), dict(is_causal=True), dict(causal=True))


def test_leading_dims_broadcast(rng):
    # PyTorch broadcasts the batch and head dimensions of query, key and value
    q = randn(rng, 2, 4, 5, 8)
    k, v = randn(rng, 1, 1, 7, 8), randn(rng, 7, 8)
    out = check((q, k, v), {})
    assert out.shape == (2, 4, 5, 8)
    q1 = randn(rng, 1, 1, 5, 8)
    k2, v2 = randn(rng, 2, 3, 7, 8), randn(rng, 2, 3, 7, 8)
    assert check((q1, k2, v2), {}).shape == (2, 3, 5, 8)


def test_scale(rng):
    q, k, v = randn(rng, 2, 2, 9, 16), randn(rng, 2, 2, 11, 16), randn(rng, 2, 2, 11, 16)
    for s in (0.0, -0.7, 2.5, 1e-3):
        check((q, k, v), dict(scale=s), dict(scale=s))


# ---- masks ----------------------------------------------------------------------------

MASK_SHAPES = [(11,), (9, 11), (1, 9, 11), (3, 1, 11), (2, 1, 1, 11), (2, 3, 9, 11),
               (1, 1, 9, 1), ()]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mshape", MASK_SHAPES, ids=str)
def test_bool_mask_broadcast(rng, mshape, path):
    q, k, v = randn(rng, 2, 3, 9, 8), randn(rng, 2, 3, 11, 8), randn(rng, 2, 3, 11, 8)
    mask = rng.random(mshape) < 0.7
    check((q, k, v, mask), dict(path=path), dict(mask=mask))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mshape", MASK_SHAPES, ids=str)
def test_float_mask_broadcast(rng, mshape, path):
    q, k, v = randn(rng, 2, 3, 9, 8), randn(rng, 2, 3, 11, 8), randn(rng, 2, 3, 11, 8)
    bias = randn(rng, *mshape, scale=3.0)
    if bias.size > 1:
        bias.flat[::3] = -np.inf
    check((q, k, v, bias), dict(path=path), dict(mask=bias))


def test_mask_and_causal_together(rng):
    # PyTorch refuses the combination; the contract allows it and means both
    q, k, v = randn(rng, 1, 2, 8, 4), randn(rng, 1, 2, 8, 4), randn(rng, 1, 2, 8, 4)
    mask = rng.random((8, 8)) < 0.5
    check((q, k, v, mask), dict(is_causal=True), dict(mask=mask, causal=True))


# ---- GQA ------------------------------------------------------------------------------

@pytest.mark.parametrize("hkv", [1, 2, 4, 8])
def test_gqa(rng, hkv):
    q, k, v = randn(rng, 2, 8, 6, 16), randn(rng, 2, hkv, 10, 16), randn(rng, 2, hkv, 10, 12)
    check((q, k, v), dict(enable_gqa=True), dict(gqa=True))
    check((q, k, v), dict(enable_gqa=True, is_causal=True), dict(gqa=True, causal=True))


def test_gqa_order_is_repeat_interleave(rng):
    # query head h reads key/value head h // (H // Hkv): heads 0,1 -> 0 and 2,3 -> 1
    q = np.zeros((4, 1, 2), np.float32)
    k = np.zeros((2, 1, 2), np.float32)
    v = np.array([[[1.0, 0.0]], [[0.0, 1.0]]], np.float32)
    out = sdpa(q, k, v, enable_gqa=True)
    assert out[:, 0, 1].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_single_kv_head_broadcasts_without_gqa(rng):
    q, k, v = randn(rng, 2, 4, 5, 8), randn(rng, 2, 1, 6, 8), randn(rng, 2, 1, 6, 8)
    check((q, k, v), {})


# ---- the keyword extras ----------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_bottom_right_alignment(rng, path):
    q, k, v = randn(rng, 2, 2, 4, 8), randn(rng, 2, 2, 10, 8), randn(rng, 2, 2, 10, 8)
    check((q, k, v), dict(is_causal=True, align="bottom-right", path=path),
          dict(causal=True, align="bottom-right"))


@pytest.mark.parametrize("window", [(2, 0), (0, 0), (3, 3), (-1, 1), (1, -1), (100, 100)])
def test_window(rng, window):
    q, k, v = randn(rng, 1, 2, 12, 8), randn(rng, 1, 2, 12, 8), randn(rng, 1, 2, 12, 8)
    check((q, k, v), dict(window=window), dict(window=window))
    check((q, k, v), dict(window=window, is_causal=True, align="bottom-right"),
          dict(window=window, causal=True, align="bottom-right"))


def test_softcap(rng):
    q, k, v = randn(rng, 2, 2, 7, 8, scale=4), randn(rng, 2, 2, 9, 8), randn(rng, 2, 2, 9, 8)
    bias = randn(rng, 7, 9)
    check((q, k, v, bias), dict(softcap=5.0), dict(mask=bias, softcap=5.0))


def test_alibi(rng):
    q, k, v = randn(rng, 2, 4, 7, 8), randn(rng, 2, 4, 9, 8), randn(rng, 2, 4, 9, 8)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    check((q, k, v), dict(alibi_slopes=slopes, is_causal=True), dict(alibi=slopes, causal=True))
    check((q, k, v), dict(alibi_slopes=slopes.tolist(), align="bottom-right"),
          dict(alibi=slopes, align="bottom-right"))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, list])
def test_kv_len(rng, dtype):
    q, k, v = randn(rng, 3, 2, 5, 8), randn(rng, 3, 2, 9, 8), randn(rng, 3, 2, 9, 8)
    lens = [9, 4, 0]
    kv = lens if dtype is list else np.array(lens, dtype)
    out = check((q, k, v), dict(kv_len=kv), dict(kv_len=lens))
    assert not out[2].any()  # kv_len 0: every row fully masked -> 0
    check((q, k, v), dict(kv_len=kv, is_causal=True, align="bottom-right"),
          dict(kv_len=lens, causal=True, align="bottom-right"))


def test_return_tuples(rng):
    q, k, v = randn(rng, 2, 5, 8), randn(rng, 2, 6, 8), randn(rng, 2, 6, 3)
    o = sdpa(q, k, v)
    o1, lse = sdpa(q, k, v, return_lse=True)
    o2, w = sdpa(q, k, v, return_weights=True)
    o3, lse3, w3 = sdpa(q, k, v, return_lse=True, return_weights=True)
    assert o.shape == (2, 5, 3) and lse.shape == (2, 5) and w.shape == (2, 5, 6)
    for x in (o1, o2, o3):
        assert np.array_equal(x, o)
    assert np.array_equal(lse, lse3) and np.array_equal(w, w3)
    assert_close(w.sum(-1), np.ones((2, 5)))


def test_precision_selects_the_path(rng):
    q, k, v = randn(rng, 2, 2, 33, 16), randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    ref64 = sdpa(q, k, v, path="reference")
    assert np.array_equal(sdpa(q, k, v, precision="float64"), ref64)
    assert np.array_equal(sdpa(q, k, v, precision="float32"), sdpa(q, k, v, path="fused"))
    check((q, k, v), dict(precision="float64"))


@pytest.mark.parametrize("path", PATHS)
def test_threads_bit_identical(rng, path):
    q, k, v = randn(rng, 2, 3, 70, 32), randn(rng, 2, 3, 90, 32), randn(rng, 2, 3, 90, 32)
    runs = [sdpa(q, k, v, is_causal=True, threads=t, path=path, return_lse=True)
            for t in (1, 2, 3)]
    for o, lse in runs[1:]:
        assert np.array_equal(o, runs[0][0]) and np.array_equal(lse, runs[0][1])


# ---- strided and transposed inputs -------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_blhd_layout_transposed(rng, path):
    # [B, L, H, D] storage read as [B, H, L, D]: a transposed view, no copy
    qs, ks, vs = randn(rng, 2, 9, 3, 8), randn(rng, 2, 12, 3, 8), randn(rng, 2, 12, 3, 8)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qs, ks, vs))
    assert not q.flags.c_contiguous
    check((q, k, v), dict(is_causal=True, path=path), dict(causal=True))


def test_kv_cache_views_and_odd_strides(rng):
    cache_k, cache_v = randn(rng, 2, 4, 64, 16), randn(rng, 2, 4, 64, 16)
    k, v = cache_k[:, 1:3, 5:25], cache_v[:, 1:3, 5:25]       # a slice of a larger cache
    q = randn(rng, 2, 2, 6, 32)[..., ::2]                      # element stride 2 on D
    check((q, k, v), {})
    check((q[:, ::-1], k[:, :, ::-1], v[..., ::-1]), {})       # negative strides
    check((np.asfortranarray(q), np.asfortranarray(k), v), {})  # Fortran order


def test_stride_zero_broadcast_views(rng):
    q = randn(rng, 2, 2, 5, 8)
    row = randn(rng, 1, 1, 1, 8)
    k = np.broadcast_to(row, (2, 2, 7, 8))      # read-only, stride 0 but on D
    v = np.broadcast_to(randn(rng, 7, 8), (2, 2, 7, 8))
    assert k.strides == (0, 0, 0, 4) and not k.flags.writeable
    check((q, k, v), {})


def test_strided_mask(rng):
    q, k, v = randn(rng, 1, 2, 6, 8), randn(rng, 1, 2, 7, 8), randn(rng, 1, 2, 7, 8)
    big = rng.random((4, 14, 21)) < 0.6
    mask = big[::2, ::2, ::3][:, :6, :7]          # a strided bool view of shape (2, 6, 7)
    check((q, k, v, mask), {}, dict(mask=mask))
    fbig = randn(rng, 7, 12)
    fmask = fbig.T[:6, ::-1][:, :7]              # transposed, reversed float mask
    check((q, k, v, fmask), {}, dict(mask=fmask))


# ---- the contract's edge cases -----------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_fully_masked_rows_give_zero(rng, path):
    q, k, v = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 5, 8), randn(rng, 1, 2, 5, 8)
    mask = np.ones((4, 5), bool)
    mask[1] = False                                   # bool: row 1 sees nothing
    bias = np.zeros((4, 5), np.float32)
    bias[2] = -np.inf                                 # float: row 2 is -inf everywhere
    out, lse, w = sdpa(q, k, v, mask, return_lse=True, return_weights=True, path=path)
    assert (out[:, :, 1] == 0).all() and np.isneginf(lse[:, :, 1]).all()
    assert (w[:, :, 1] == 0).all()
    out, lse, w = sdpa(q, k, v, bias, return_lse=True, return_weights=True, path=path)
    assert (out[:, :, 2] == 0).all() and np.isneginf(lse[:, :, 2]).all()
    assert not np.isnan(out).any()
    # a window that holds no key: every row empty
    out = sdpa(q, k, v, window=(0, 0), align="bottom-right", kv_len=[0], path=path)
    assert (out == 0).all()


@pytest.mark.parametrize("path", PATHS)
def test_nan_in_masked_keys_does_not_leak(rng, path):
    q, k, v = randn(rng, 2, 2, 6, 8), randn(rng, 2, 2, 10, 8), randn(rng, 2, 2, 10, 8)
    clean_k, clean_v = k.copy(), v.copy()
    mask = np.ones((6, 10), bool)
    mask[:, 3] = False
    lens = [7, 10]
    k[:, :, 3], v[:, :, 3] = np.nan, np.inf            # masked by the bool mask
    k[0, :, 7:], v[0, :, 7:] = np.nan, np.nan          # beyond kv_len of batch 0
    check((q, k, v, mask), dict(kv_len=lens, path=path), dict(mask=mask, kv_len=lens),
          ref_inputs=(q, clean_k, clean_v, mask))
    # causal: rows never read the keys above their diagonal
    k2, v2 = randn(rng, 1, 1, 6, 8), randn(rng, 1, 1, 6, 8)
    ck, cv = k2.copy(), v2.copy()
    k2[..., 5, :], v2[..., 5, :] = np.nan, np.nan
    out = sdpa(q[:1, :1], k2, v2, is_causal=True, path=path)
    ref = reference(q[:1, :1], ck, cv, causal=True)[0]
    assert_close(out[..., :5, :], ref[..., :5, :])
    assert np.isnan(out[..., 5, :]).all()              # the last row does read key 5


def test_nan_in_unmasked_input_stays_in_its_row(rng):
    q, k, v = randn(rng, 1, 1, 4, 8), randn(rng, 1, 1, 6, 8), randn(rng, 1, 1, 6, 8)
    q[0, 0, 2, 3] = np.nan
    out = sdpa(q, k, v)
    assert np.isnan(out[0, 0, 2]).all()
    assert np.isfinite(np.delete(out, 2, axis=2)).all()


@pytest.mark.parametrize("path", PATHS)
def test_large_logits(rng, path):
    # logits around 1e4: exp overflows float32 unless the row maximum is subtracted
    q, k, v = randn(rng, 1, 2, 5, 8, scale=40), randn(rng, 1, 2, 9, 8, scale=40), randn(rng, 1, 2, 9, 8)
    out = check((q, k, v), dict(path=path, scale=1.0), dict(scale=1.0))
    assert np.isfinite(out).all()
    big = np.full((1, 1, 1, 2), 100.0, np.float32)
    kk = np.array([[[[100.0, 0.0], [0.0, 100.0]]]], np.float32)
    vv = np.array([[[[10.0, 0.0], [0.0, 10.0]]]], np.float32)
    out = sdpa(big, kk, vv, scale=1.0, path=path)      # logits 1e4, 1e4: equal weights
    assert np.allclose(out, [[[[5.0, 5.0]]]])


@pytest.mark.parametrize("path", PATHS)
def test_empty_sizes(rng, path):
    q, v5 = randn(rng, 2, 3, 4, 8), randn(rng, 2, 3, 0, 5)
    out, lse, w = sdpa(q, randn(rng, 2, 3, 0, 8), v5, return_lse=True, return_weights=True,
                       path=path)                       # Lk = 0: fully masked rows
    assert out.shape == (2, 3, 4, 5) and (out == 0).all() and np.isneginf(lse).all()
    assert w.shape == (2, 3, 4, 0)
    assert sdpa(randn(rng, 0, 3, 4, 8), randn(rng, 0, 3, 6, 8), randn(rng, 0, 3, 6, 8),
                path=path).shape == (0, 3, 4, 8)
    assert sdpa(randn(rng, 2, 3, 0, 8), randn(rng, 2, 3, 6, 8), randn(rng, 2, 3, 6, 8),
                path=path).shape == (2, 3, 0, 8)
    # Dk = 0: every logit is 0 (default scale 1), the output is the mean of the values
    v = randn(rng, 1, 1, 6, 4)
    out = sdpa(randn(rng, 1, 1, 3, 0), randn(rng, 1, 1, 6, 0), v, path=path)
    assert_close(out, np.broadcast_to(v.astype(np.float64).mean(axis=2, keepdims=True), out.shape))


# ---- the tolerance check itself -----------------------------------------------------------

def test_tolerance_check_rejects_planted_errors(rng):
    from oracle import tolerance_failure
    ref = reference(randn(rng, 2, 8, 16), randn(rng, 2, 9, 16), randn(rng, 2, 9, 16))[0]
    good = ref.astype(np.float32)
    assert tolerance_failure(good, ref) is None
    for planted in (2e-5 * (1 + np.abs(ref).max()),):   # one element just over the bound
        bad = good.copy()
        bad[1, 3, 5] += planted
        assert "max |got - ref|" in tolerance_failure(bad, ref)
    spread = good * np.float32(1 + 3e-6)                  # small everywhere: Frobenius catches it
    assert "Frobenius" in tolerance_failure(spread, ref)
    nan = good.copy()
    nan[0, 0, 0] = np.nan
    assert "non-finite" in tolerance_failure(nan, ref)
    ref_inf = ref.copy()
    ref_inf[0, 0] = -np.inf
    assert "non-finite" in tolerance_failure(good, ref_inf)
    assert "shape" in tolerance_failure(good[:1], ref)
