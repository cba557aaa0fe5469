"""test_half.py — float16 and bfloat16 through the Python API, with NumPy alone: float16
arrays (and ml_dtypes' bfloat16 where it is installed) against the float64 oracle under
the half-precision rule of the contract — the error at most twice that of a naive
implementation computing in the same 16-bit type (oracle.naive, as PyTorch's math path
and tools/common/naive.c do) — over shapes, masks, GQA and strided views; a float32 query over a
16-bit K/V cache (the float32 tolerance: every product is exact); the dtype of the
results; mixed key/value dtypes refused; the precision levels ("fast" is "default" bit for
bit unless value is bfloat16); the contract's edge cases in 16 bits; and the tolerance
check itself shown to fail on planted errors. PyTorch's bfloat16 tensors are in
test_torch.py, DLPack producers of 16-bit tensors in test_api.py.
"""
import numpy as np
import pytest

import attn
from attn import _attn
import oracle
from oracle import (assert_close, assert_half_close, half_tolerance_failure, naive, reference,
                    round_to)

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

sdpa = attn.scaled_dot_product_attention
PATHS = ["fused", "reference"]
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
if ml_dtypes is not None:
    NP["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
needs_bf16 = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed: NumPy "
                                "has no bfloat16 of its own (test_torch.py and test_api.py "
                                "cover bfloat16 through DLPack)")


def draw(rng, dtype, *shape, scale=1.0):
    """Uniform values in [-scale, scale) that dtype holds exactly, as an array of dtype."""
    return round_to(rng.uniform(-1, 1, shape) * scale, dtype).astype(NP[dtype])


def draw3(rng, dtype, *shapes):
    """draw() for each of the shapes (query, key, value)."""
    return tuple(draw(rng, dtype, *shape) for shape in shapes)


def check_half(args, kwargs, ref_kwargs=None, dtype="float16", ref_inputs=None):
    """Runs sdpa and holds its output to the half-precision rule against the oracle of
    (ref_inputs or args)[:3], the naive implementation computing in dtype."""
    out = sdpa(*args, **kwargs)
    assert isinstance(out, np.ndarray) and out.dtype == args[0].dtype
    ins = (ref_inputs or args)[:3]
    rk = ref_kwargs or {}
    assert_half_close(out, reference(*ins, **rk)[0], naive(*ins, dtype, **rk))
    return out


# ---- float16 against the oracle: shapes, masks, GQA, strides ------------------------------

SHAPES = oracle.SHAPES + [
    (1, 2, 3, 2500, 64, 48),     # few rows over many keys: the fused path splits the keys
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float16_shapes(rng, shape, path):
    B, H, Lq, Lk, Dk, Dv = shape
    q, k, v = draw3(rng, "float16", (B, H, Lq, Dk), (B, H, Lk, Dk), (B, H, Lk, Dv))
    check_half((q, k, v), dict(path=path))
    check_half((q, k, v), dict(is_causal=True, path=path), dict(causal=True))
    check_half((q, k, v), dict(is_causal=True, align="bottom-right", path=path),
               dict(causal=True, align="bottom-right"))


def test_float16_lower_ranks(rng):
    for lead in ((), (3,)):
        q, k, v = (draw(rng, "float16", *lead, *s) for s in ((6, 8), (9, 8), (9, 5)))
        assert check_half((q, k, v), {}).shape == lead + (6, 5)


MASKS = ["bool", "float32", "float16", "window", "kv_len", "alibi", "softcap", "scale"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", MASKS)
def test_float16_masks(rng, kind, path):
    q, k, v = draw3(rng, "float16", (2, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 8))
    args, kw, ref = (q, k, v), dict(path=path), {}
    if kind == "bool":
        mask = rng.random((2, 1, 9, 11)) < 0.7
        args, ref = (q, k, v, mask), dict(mask=mask)
    elif kind in ("float32", "float16"):   # a 16-bit float mask is widened to float32
        bias = draw(rng, kind, 9, 11, scale=3.0)
        bias.flat[::4] = -np.inf
        args, ref = (q, k, v, bias), dict(mask=bias)
    elif kind == "window":
        kw.update(window=(3, 1), is_causal=True, align="bottom-right")
        ref = dict(window=(3, 1), causal=True, align="bottom-right")
    elif kind == "kv_len":
        kw.update(kv_len=[11, 4], is_causal=True, align="bottom-right")
        ref = dict(kv_len=[11, 4], causal=True, align="bottom-right")
    elif kind == "alibi":
        slopes = np.array([0.5, 0.25, 0.125], np.float32)
        kw.update(alibi_slopes=slopes.astype(np.float16), is_causal=True)
        ref = dict(alibi=slopes, causal=True)
    elif kind == "softcap":
        q = draw(rng, "float16", 2, 3, 9, 16, scale=8.0)
        args = (q, k, v)
        kw.update(softcap=5.0)
        ref = dict(softcap=5.0)
    elif kind == "scale":
        kw.update(scale=2.5)
        ref = dict(scale=2.5)
    check_half(args, kw, ref)


@pytest.mark.parametrize("hkv", [1, 2, 4, 8])
def test_float16_gqa(rng, hkv):
    q, k, v = draw3(rng, "float16", (2, 8, 6, 32), (2, hkv, 40, 32), (2, hkv, 40, 16))
    check_half((q, k, v), dict(enable_gqa=True), dict(gqa=True))
    check_half((q, k, v), dict(enable_gqa=True, is_causal=True, align="bottom-right"),
               dict(gqa=True, causal=True, align="bottom-right"))
    # decoding: one query row per head over the cache
    check_half((q[:, :, :1], k, v), dict(enable_gqa=True), dict(gqa=True))


@pytest.mark.parametrize("path", PATHS)
def test_float16_strided_views(rng, path):
    qs, ks, vs = draw3(rng, "float16", (2, 9, 3, 16), (2, 12, 3, 16), (2, 12, 3, 16))
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qs, ks, vs))        # [B, L, H, D] storage
    assert not q.flags.c_contiguous
    check_half((q, k, v), dict(is_causal=True, path=path), dict(causal=True))
    cache_k, cache_v = draw(rng, "float16", 2, 4, 64, 16), draw(rng, "float16", 2, 4, 64, 16)
    k, v = cache_k[:, 1:, 5:25], cache_v[:, 1:, 5:25]               # a slice of a larger cache
    q = draw(rng, "float16", 2, 3, 6, 32)[..., ::2]                  # element stride 2 on D
    check_half((q, k, v), dict(path=path))
    check_half((q[:, ::-1], k[:, :, ::-1], v[..., ::-1]), dict(path=path))   # negative strides
    check_half((np.asfortranarray(q), np.asfortranarray(k), v), dict(path=path))
    row = draw(rng, "float16", 1, 1, 1, 16)
    kb = np.broadcast_to(row, (2, 3, 7, 16))                         # stride 0
    vb = np.broadcast_to(draw(rng, "float16", 7, 16), (2, 3, 7, 16))
    check_half((q, kb, vb), dict(path=path))


def test_float16_is_read_in_place(rng):
    base = draw(rng, "float16", 2, 4, 10, 16)
    a = base.transpose(0, 2, 1, 3)[:, 1:7, :, ::2]
    d = _attn._describe(a)
    assert d["via"] == "buffer" and d["dtype"] == "float16"
    assert d["data"] == a.__array_interface__["data"][0]
    assert d["strides"] == tuple(s // 2 for s in a.strides)


@pytest.mark.parametrize("path", PATHS)
def test_float16_lse_and_weights_are_float32(rng, path):
    # the inputs are exact in float32 and the library computes in float32: LSE and the
    # weights (never rounded to 16 bits) meet the float32 tolerance of the contract
    q, k, v = draw3(rng, "float16", (2, 2, 7, 16), (2, 2, 40, 16), (2, 2, 40, 8))
    out, lse, w = sdpa(q, k, v, is_causal=True, return_lse=True, return_weights=True,
                       path=path)
    assert out.dtype == np.float16 and lse.dtype == np.float32 and w.dtype == np.float32
    _, ref_l, ref_w = reference(q, k, v, causal=True)
    assert_close(lse, ref_l, "lse")
    assert_close(w, ref_w, "weights")


# ---- a float32 query over a 16-bit K/V cache -------------------------------------------------

@pytest.mark.parametrize("precision", ["default", "fast"])
@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_float32_query_over_16_bit_cache(rng, kv, precision):
    """The cache's values are exact in float32 and the library computes in float32, so
    the float32 tolerance of the contract holds — except where "fast" rounds P to
    bfloat16 (a bfloat16 value): there the half-precision rule."""
    if kv not in NP:
        pytest.skip("ml_dtypes is not installed: NumPy has no bfloat16 of its own")
    cache_k, cache_v = draw(rng, kv, 2, 2, 300, 64), draw(rng, kv, 2, 2, 300, 48)
    k, v = cache_k[:, :, :257], cache_v[:, :, :257]                  # a view of the cache
    q = draw(rng, kv, 2, 8, 4, 64).astype(np.float32)
    kw = dict(enable_gqa=True, is_causal=True, align="bottom-right", precision=precision)
    rk = dict(gqa=True, causal=True, align="bottom-right")
    for rows in (q, q[:, :, -1:]):                                   # prefill, one new token
        out, lse = sdpa(rows, k, v, return_lse=True, **kw)
        assert out.dtype == np.float32 and lse.dtype == np.float32
        ref_o, ref_l, _ = reference(rows, k, v, **rk)
        assert_close(lse, ref_l, "lse")
        if precision == "fast" and kv == "bfloat16":
            assert_half_close(out, ref_o, naive(rows, k, v, kv, **rk))
        else:
            assert_close(out, ref_o)


# ---- dtypes of the results, and mixed dtypes -------------------------------------------------

@pytest.mark.parametrize("qt, kvt", [("float16", "float16"), ("float32", "float16"),
                                     ("float16", "float32"), ("float32", "float32")])
def test_output_has_the_query_dtype(rng, qt, kvt):
    q, k, v = draw(rng, qt, 2, 5, 8), draw(rng, kvt, 2, 6, 8), draw(rng, kvt, 2, 6, 3)
    out, lse, w = sdpa(q, k, v, return_lse=True, return_weights=True)
    assert out.dtype == NP[qt] and out.shape == (2, 5, 3)
    assert lse.dtype == np.float32 and w.dtype == np.float32
    assert sdpa(q, k, v, path="reference").dtype == NP[qt]


@pytest.mark.parametrize("kt, vt", [("float16", "float32"), ("float32", "float16"),
                                    ("float16", "bfloat16"), ("bfloat16", "float32")])
def test_mixed_key_value_dtypes_refused(rng, kt, vt):
    if kt not in NP or vt not in NP:
        pytest.skip("ml_dtypes is not installed: NumPy has no bfloat16 of its own")
    q, k, v = draw(rng, "float16", 2, 5, 8), draw(rng, kt, 2, 6, 8), draw(rng, vt, 2, 6, 8)
    with pytest.raises(TypeError, match=r"^value: dtype is %s, expected %s like key \(key and "
                       r"value must have one dtype\)" % (vt, kt)) as info:
        sdpa(q, k, v)
    assert info.value.status == "ATTN_ERR_DTYPE"


def test_float16_mask_is_widened_exactly(rng):
    q, k, v = draw3(rng, "float16", (2, 5, 8), (2, 6, 8), (2, 6, 8))
    bias = draw(rng, "float16", 5, 6, scale=4.0)
    bias[:, 2] = -np.inf
    assert np.array_equal(sdpa(q, k, v, bias), sdpa(q, k, v, bias.astype(np.float32)))


# ---- the precision levels -----------------------------------------------------------------

@pytest.mark.parametrize("qt, kvt", [("float16", "float16"), ("float32", "float16"),
                                     ("float32", "float32")])
def test_fast_is_default_unless_value_is_bfloat16(rng, qt, kvt):
    q = draw(rng, qt, 2, 4, 33, 64)
    k, v = draw(rng, kvt, 2, 4, 300, 64), draw(rng, kvt, 2, 4, 300, 64)
    mask = rng.random((33, 300)) < 0.9
    for kw in (dict(), dict(is_causal=True), dict(attn_mask=mask)):
        o_d, l_d = sdpa(q, k, v, return_lse=True, precision="default", **kw)
        o_f, l_f = sdpa(q, k, v, return_lse=True, precision="fast", **kw)
        assert np.array_equal(o_d, o_f) and np.array_equal(l_d, l_f)


def test_precision_names(rng):
    q, k, v = draw3(rng, "float16", (2, 2, 9, 16), (2, 2, 20, 16), (2, 2, 20, 16))
    default = sdpa(q, k, v)
    assert np.array_equal(sdpa(q, k, v, precision="float32"), default)   # the old name
    assert np.array_equal(sdpa(q, k, v, precision="fast", path="fused"), default)
    ref = sdpa(q, k, v, precision="float64")
    assert np.array_equal(ref, sdpa(q, k, v, path="reference")) and ref.dtype == np.float16
    # float64 throughout, rounded once: within half a float16 ulp of the exact result
    exact = reference(q, k, v)[0]
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert (np.abs(ref - exact) <= ulp / 2 * (1 + 2 ** -12)).all()
    with pytest.raises(ValueError, match=r"^precision='fast' runs on the fused path"):
        sdpa(q, k, v, precision="fast", path="reference")
    with pytest.raises(ValueError, match=r"^precision='half': expected 'default', 'fast'"):
        sdpa(q, k, v, precision="half")


# ---- bfloat16 NumPy arrays (ml_dtypes) -------------------------------------------------------

@needs_bf16
@pytest.mark.parametrize("precision", ["default", "fast"])
def test_bfloat16_numpy_arrays(rng, precision):
    bf = NP["bfloat16"]
    for shape in SHAPES[2:]:
        B, H, Lq, Lk, Dk, Dv = shape
        q, k, v = draw3(rng, "bfloat16", (B, H, Lq, Dk), (B, H, Lk, Dk), (B, H, Lk, Dv))
        out = check_half((q, k, v), dict(is_causal=True, precision=precision), dict(causal=True),
                         dtype="bfloat16")
        assert out.dtype == bf
    mask = rng.random((9, 40)) < 0.8
    q, k, v = draw3(rng, "bfloat16", (2, 4, 9, 16), (2, 2, 40, 16), (2, 2, 40, 8))
    check_half((q, k, v, mask), dict(enable_gqa=True, precision=precision),
               dict(mask=mask, gqa=True), dtype="bfloat16")
    qt, kt, vt = (x.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3) for x in (q, k, v))
    check_half((qt[:, ::-1], kt, vt[..., ::-1]), dict(enable_gqa=True, precision=precision),
               dict(gqa=True), dtype="bfloat16")


@needs_bf16
def test_bfloat16_numpy_is_read_in_place(rng):
    base = draw(rng, "bfloat16", 2, 4, 10, 16)
    a = base.transpose(0, 2, 1, 3)[:, 1:7, :, ::2]
    d = _attn._describe(a)
    assert d["via"] == "buffer" and d["dtype"] == "bfloat16"
    assert d["data"] == a.__array_interface__["data"][0]
    assert d["strides"] == tuple(s // 2 for s in a.strides)


@needs_bf16
def test_bfloat16_fast_rounds_p(rng):
    """"fast" differs from "default" only by rounding P to bfloat16, and only on a kernel
    with bf16 dot products (avx512bf16): both within the rule, and on inputs large enough
    to show it, not bit-identical there. On every other kernel rounding P would only cost
    time, so "fast" is "default" bit for bit (docs/CONTRACT.md, "Precision")."""
    q, k, v = draw3(rng, "bfloat16", (1, 4, 64, 64), (1, 4, 512, 64), (1, 4, 512, 64))
    o_d, l_d = sdpa(q, k, v, return_lse=True)
    o_f, l_f = sdpa(q, k, v, return_lse=True, precision="fast")
    assert np.array_equal(l_d, l_f)                 # the LSE does not depend on P·V
    if attn.kernel_name() == "avx512bf16":
        assert not np.array_equal(o_d, o_f)
    else:
        assert np.array_equal(o_d, o_f), attn.kernel_name()
    ref, nv = reference(q, k, v)[0], naive(q, k, v, "bfloat16")
    assert_half_close(o_d, ref, nv)
    assert_half_close(o_f, ref, nv)


# ---- the contract's edge cases in 16 bits ---------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_float16_edge_cases(rng, path):
    q, k, v = draw3(rng, "float16", (1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8))
    mask = np.ones((4, 5), bool)
    mask[1] = False
    out, lse = sdpa(q, k, v, mask, return_lse=True, path=path)
    assert out.dtype == np.float16
    assert (out[:, :, 1] == 0).all() and np.isneginf(lse[:, :, 1]).all()    # exactly 0
    assert not np.isnan(out).any()
    out = sdpa(q, k[:, :, :0], v[:, :, :0], path=path)                        # S = 0
    assert out.dtype == np.float16 and (out == 0).all()
    # NaN and Inf in masked keys do not leak; NaN in a query row stays in its row
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 3], v2[:, :, 3] = np.nan, np.inf
    keep = np.ones((4, 5), bool)
    keep[:, 3] = False
    check_half((q, k2, v2, keep), dict(path=path), dict(mask=keep), ref_inputs=(q, k, v))
    q2 = q.copy()
    q2[0, 0, 2, 1] = np.nan
    out = sdpa(q2, k, v, path=path)
    assert np.isnan(out[0, 0, 2]).all() and not np.isnan(np.delete(out, 2, axis=2)).any()


@pytest.mark.parametrize("path", PATHS)
def test_float16_large_logits_and_overflow(rng, path):
    # logits around 1e4 in float16 inputs: the row maximum is subtracted before exp
    q = draw(rng, "float16", 1, 2, 5, 8, scale=60)
    k, v = draw(rng, "float16", 1, 2, 9, 8, scale=60), draw(rng, "float16", 1, 2, 9, 8)
    out = check_half((q, k, v), dict(scale=1.0, path=path), dict(scale=1.0))
    assert np.isfinite(out).all()
    # an output beyond float16's range (65504) becomes inf when rounded, as IEEE says
    big = np.full((1, 1, 3, 4), 1e5, np.float32)
    big[..., 1] = -1e5
    out = sdpa(np.zeros((1, 1, 2, 4), np.float16), np.zeros((1, 1, 3, 4), np.float32), big,
               path=path)
    assert out.dtype == np.float16
    assert (out[..., 0] == np.inf).all() and (out[..., 1] == -np.inf).all()


# ---- the half-precision check itself ---------------------------------------------------------

def test_half_tolerance_check_rejects_planted_errors(rng):
    q, k, v = draw3(rng, "float16", (2, 8, 16), (2, 40, 16), (2, 40, 16))
    ref, nv = reference(q, k, v)[0], naive(q, k, v, "float16")
    good = sdpa(q, k, v)
    assert half_tolerance_failure(good, ref, nv) is None
    naive_err = np.abs(nv - ref).max()
    bad = good.astype(np.float64)
    bad[1, 3, 5] = ref[1, 3, 5] + 3 * naive_err                     # one element, 3x naive
    assert "2 x the naive error" in half_tolerance_failure(bad, ref, nv)
    # a plausible bug: the mask ignored (a causal call compared with the non-causal oracle)
    causal = sdpa(q, k, v, is_causal=True)
    assert "2 x the naive error" in half_tolerance_failure(causal, ref, nv)
    # a plausible bug: the output rounded twice (through bfloat16 first)
    twice = round_to(round_to(ref, "bfloat16"), "float16")
    assert "2 x the naive error" in half_tolerance_failure(twice, ref, nv)
    nan = good.copy()
    nan[0, 0, 0] = np.nan
    assert "non-finite" in half_tolerance_failure(nan, ref, nv)
    assert "shape" in half_tolerance_failure(good[:1], ref, nv)


def test_round_to_is_round_to_nearest_even():
    # the oracle's own bfloat16 rounding, on the cases that matter: ties go to the even
    # neighbour, a carry rounds up a binade or to inf, NaN stays NaN, subnormals round
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8),
                  3.3895313892515355e38, 3.4e38, np.nan, np.inf, 2 ** -133 * 1.5, 0.0],
                 np.float32)
    got = round_to(x, "bfloat16")
    want = [1.0, 1.0, 1 + 2 ** -6, 1 + 2 ** -7, -1.0, 3.3895313892515355e38, np.inf, np.nan,
            np.inf, 2 ** -132, 0.0]
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert (round_to(x, "float16")[:3] == x[:3]).all()             # float16 keeps 10 bits
    if ml_dtypes is not None:
        y = np.random.default_rng(5).standard_normal(100000).astype(np.float32) * 1e3
        np.testing.assert_array_equal(round_to(y, "bfloat16"),
                                      y.astype(ml_dtypes.bfloat16).astype(np.float32))
