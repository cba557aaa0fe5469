"""test_kv_dtypes.py — quantized and fp8 key/value caches through the Python calls
(attn.attention_with_kvcache, attn.varlen_attention_with_kvcache, attn.flash's
flash_attn_with_kvcache, attn.quantize_kv; python/attn/_kvcache.py).

Checks, for each cache dtype (fp8_e4m3, fp8_e5m2 with no scale, a per-tensor and a
per-head scale; q8_0; q4_0), contiguous and paged: attention over a cache of random valid
bytes equals, bit for bit, the same call over a float32 cache holding the bytes' values as
decoded here by hand (the formats' definitions, not the library's dequantizer): with 16
query rows on the default path, and with one query row on the float64 reference path
(ATTN_PATH_REFERENCE, forced through the options; the decoding step of a scaled fp8 or a
q4_0 cache sums in another order than a float32 cache's, so it is held to the float32
tolerance instead). The append path writes the bytes attn_quantize_q8_0 / q4_0 give
(quantize_kv) and, for fp8, those of a nearest-value search over the 256 codes written
here (ties even, saturating), scaled per tensor or per head. Refusals come before
anything is written. torch float8 tensors and FlashAttention 3's k_descale / v_descale
where PyTorch is installed (skipped with a reason otherwise).

u4 (KIVI; cache_dtype="u4" with k_scale, v_scale, k_zero, v_zero, kv_group): attn's
quantizer (quantize_kv_u4) against the format decoded here by hand and the library's
dequantizer, bit for bit; attention over the u4 cache against the float64 oracle over
those values at the contract's float32 tolerance, a flipped nibble in the reference copy
caught; the refusals (paged, new rows, key scores, varlen, KVCache, missing or misshapen
scales and zeros) before anything is written.
"""
import numpy as np
import pytest

import attn
import attn._kvcache as _kv
from oracle import reference, tolerance_failure

try:
    import torch
except ImportError:  # the NumPy parts still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

B, L, HKV, HQ, D, PS = 2, 32, 2, 4, 64, 8
FP8 = ("fp8_e4m3", "fp8_e5m2")
BLOCK = {"q8_0": 34, "q4_0": 18}


# ---- the formats, decoded by hand -------------------------------------------------------
def _fp8_table(fmt):
    """float64 values of the 256 codes (NaN for NaN codes, inf for e5m2's infinities)."""
    c = np.arange(256)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if fmt == "fp8_e4m3":
        e, m = (c >> 3) & 15, c & 7
        val = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * 2.0 ** (e - 7.0))
        val[(c & 0x7F) == 0x7F] = np.nan
    else:
        e, m = (c >> 2) & 31, c & 3
        val = np.where(e == 0, m * 2.0 ** -16, (1 + m / 4.0) * 2.0 ** (e - 15.0))
        val[(c & 0x7F) == 0x7C] = np.inf
        val[(c & 0x7F) > 0x7C] = np.nan
    return sign * val


def _decode(b, fmt, scale=None):
    """The float32 values of cache bytes b ([..., H, D] fp8, [..., H, nbytes] q8_0 / q4_0);
    fp8 with scale: fl32(value * scale[h]) (float32 scale, one rounding)."""
    if fmt in FP8:
        v = _fp8_table(fmt)[b]
        if scale is not None:
            s = np.asarray(scale, np.float32).astype(np.float64)
            v = v * (s.reshape(-1, 1) if s.size > 1 else s.reshape(()))
        return v.astype(np.float32)
    x = b.reshape(b.shape[:-1] + (-1, BLOCK[fmt]))
    d = np.ascontiguousarray(x[..., :2]).view(np.float16).astype(np.float32)
    if fmt == "q8_0":
        q = np.ascontiguousarray(x[..., 2:]).view(np.int8).astype(np.float32)
    else:
        qs = x[..., 2:].astype(np.int16)
        q = np.concatenate([(qs & 15) - 8, (qs >> 4) - 8], -1).astype(np.float32)
    return (d * q).reshape(b.shape[:-1] + (-1,))


def _fp8_encode(x, fmt, scale=None):
    """fp8(fl32(x / scale)): the nearest code of x's sign, ties to the even code, finite
    values beyond the largest and infinities saturated (x [..., H, D], no NaN)."""
    s = np.float32(1) if scale is None else np.asarray(scale, np.float32)
    y = (x.astype(np.float32) / (s.reshape(-1, 1) if s.size > 1 else s)).astype(np.float64)
    tab = _fp8_table(fmt)
    big = np.nanmax(tab[np.isfinite(tab)])
    y = np.clip(y, -big, big)  # saturating (infinities too)
    codes = np.arange(256)
    out = np.empty(y.shape, np.uint8)
    flat, res = y.reshape(-1), out.reshape(-1)
    for i, val in enumerate(flat):
        neg = np.signbit(val)
        cand = codes[(np.signbit(tab) == neg) & np.isfinite(tab)]
        dist = np.abs(tab[cand] - val)
        best = cand[dist == dist.min()]
        res[i] = best[best % 2 == 0][0] if len(best) > 1 else best[0]
    return out


def _rand_bytes(rng, shape, fmt):
    """Random valid cache bytes of logical shape [..., D]: fp8 finite codes; q8_0 / q4_0
    blocks of a random float16 scale and random quants."""
    if fmt in FP8:
        tab = _fp8_table(fmt)
        ok = np.nonzero(np.isfinite(tab) & (np.abs(tab) < 16))[0].astype(np.uint8)
        return rng.choice(ok, size=shape)
    nblk = int(np.prod(shape)) // 32
    d = rng.uniform(0.01, 0.1, nblk).astype(np.float16).view(np.uint8).reshape(nblk, 2)
    nq = 32 if fmt == "q8_0" else 16
    q = rng.integers(0, 256, (nblk, nq), dtype=np.uint8)
    if fmt == "q8_0":
        q[q == 128] = 129  # -128: valid, but not what llama.cpp's quantizer writes
    return np.concatenate([d, q], 1).reshape(shape[:-1] + (shape[-1] // 32 * BLOCK[fmt],))


def _paged(x, lens, rng):
    """The pool [npages, PS, H, *] of a contiguous [B, L, H, *] cache (pages shuffled,
    spare pages), its block table."""
    mp = L // PS
    npages = B * mp + 2
    perm = rng.permutation(npages).astype(np.int32)
    table = np.zeros((B, mp), np.int32)
    pool = np.zeros((npages, PS) + x.shape[2:], x.dtype)
    at = 0
    for b in range(B):
        for p in range(mp):
            table[b, p] = perm[at]
            at += 1
            pool[table[b, p]] = x[b, p * PS:(p + 1) * PS]
    return pool, table


@pytest.fixture
def reference_path(monkeypatch):
    """attn_options.path = ATTN_PATH_REFERENCE for the calls of python/attn/_kvcache.py."""
    class _Ref(_kv._Options):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.path = 2
    monkeypatch.setattr(_kv, "_Options", _Ref)


CASES = [("fp8_e4m3", None), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "head"),
         ("fp8_e5m2", None), ("fp8_e5m2", "head"), ("q8_0", None), ("q4_0", None)]


def _scales(kind):
    if kind is None:
        return None, None
    if kind == "tensor":
        return 0.37, np.float32(1.9)
    return np.array([0.3, 1.7], np.float32), np.array([2.1, 0.05], np.float32)


def _setup(rng, fmt, paged):
    kb, vb = _rand_bytes(rng, (B, L, HKV, D), fmt), _rand_bytes(rng, (B, L, HKV, D), fmt)
    lens = np.array([L - 5, 11], np.int32)
    table = None
    if paged:
        kb, table = _paged(kb, lens, np.random.default_rng(1))
        vb, _ = _paged(vb, lens, np.random.default_rng(1))
    return kb, vb, lens, table


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt,kind", CASES)
@pytest.mark.parametrize("lq", [16, 1])
def test_equals_float32_cache_of_the_values(rng, request, fmt, kind, paged, lq):
    if lq == 1:
        request.getfixturevalue("reference_path")
    kb, vb, lens, table = _setup(rng, fmt, paged)
    ks, vs = _scales(kind)
    kf, vf = _decode(kb, fmt, ks), _decode(vb, fmt, vs)
    q = rng.standard_normal((B, lq, HQ, D)).astype(np.float32)
    kw = dict(cache_seqlens=lens, block_table=table, causal=True, return_softmax_lse=True)
    o, lse = attn.attention_with_kvcache(q, kb, vb, cache_dtype=fmt, k_scale=ks, v_scale=vs,
                                         **kw)
    o_ref, lse_ref = attn.attention_with_kvcache(q, kf, vf, **kw)
    assert np.isfinite(o).all()
    np.testing.assert_array_equal(o, o_ref)
    np.testing.assert_array_equal(lse, lse_ref)


@pytest.mark.parametrize("fmt,kind", CASES)
def test_decoding_step_within_float32_rule(rng, fmt, kind):
    """One query row on the default path (the decoding step): close, not bit for bit."""
    kb, vb, lens, table = _setup(rng, fmt, False)
    ks, vs = _scales(kind)
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    o = attn.attention_with_kvcache(q, kb, vb, cache_seqlens=lens, cache_dtype=fmt,
                                    k_scale=ks, v_scale=vs)
    o_ref = attn.attention_with_kvcache(q, _decode(kb, fmt, ks), _decode(vb, fmt, vs),
                                        cache_seqlens=lens)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)


def _expected_bytes(x, fmt, scale):
    return _fp8_encode(x, fmt, scale) if fmt in FP8 else attn.quantize_kv(x, fmt)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt,kind", CASES)
def test_append_writes_the_library_bytes(rng, fmt, kind, paged):
    kb, vb, lens, table = _setup(rng, fmt, paged)
    ks, vs = _scales(kind)
    n = 3
    kn = rng.standard_normal((B, n, HKV, D)).astype(np.float32)
    vn = rng.standard_normal((B, n, HKV, D)).astype(np.float32)
    if fmt in FP8:
        kn[0, 0, 0, :3] = [1e9, -1e9, np.inf]  # saturated
    q = rng.standard_normal((B, 16, HQ, D)).astype(np.float32)
    k0, v0 = kb.copy(), vb.copy()
    o = attn.attention_with_kvcache(q, kb, vb, kn, vn, cache_seqlens=lens, block_table=table,
                                    cache_dtype=fmt, k_scale=ks, v_scale=vs)
    ek, ev = _expected_bytes(kn, fmt, ks), _expected_bytes(vn, fmt, vs)
    wk, wv = k0.copy(), v0.copy()
    for b in range(B):
        for t in range(n):
            pos = lens[b] + t
            if paged:
                at = (table[b, pos // PS], pos % PS)
            else:
                at = (b, pos)
            wk[at], wv[at] = ek[b, t], ev[b, t]
    np.testing.assert_array_equal(kb, wk)  # the new rows, and nothing else
    np.testing.assert_array_equal(vb, wv)
    o2 = attn.attention_with_kvcache(q, kb, vb, cache_seqlens=lens + n, block_table=table,
                                     cache_dtype=fmt, k_scale=ks, v_scale=vs)
    np.testing.assert_array_equal(o, o2)


@pytest.mark.parametrize("fmt,kind", [c for c in CASES if c[0] in FP8])
def test_quantize_kv_fp8_is_the_append(rng, fmt, kind):
    ks, _ = _scales(kind)
    x = rng.standard_normal((5, HKV, D)).astype(np.float32) * 30
    x[0, 0, :4] = [1e6, -1e6, np.inf, -np.inf]
    np.testing.assert_array_equal(attn.quantize_kv(x, fmt, ks), _fp8_encode(x, fmt, ks))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantize_kv_blocks(rng, fmt):
    x = rng.standard_normal((3, HKV, D)).astype(np.float32)
    b = attn.quantize_kv(x, fmt)
    assert b.dtype == np.uint8 and b.shape == (3, HKV, D // 32 * BLOCK[fmt])
    d = np.abs(_decode(b, fmt) - x).max()
    assert d < (0.06 if fmt == "q8_0" else 0.5)  # a half step of the block scales here
    np.testing.assert_array_equal(_decode(attn.quantize_kv(_decode(b, fmt), fmt), fmt),
                                  _decode(b, fmt))


@pytest.mark.parametrize("fmt,kind", [("fp8_e4m3", "head"), ("q8_0", None), ("q4_0", None)])
def test_varlen_pool(rng, fmt, kind):
    kb, vb, lens, table = _setup(rng, fmt, True)
    ks, vs = _scales(kind)
    cu = np.array([0, 5, 6], np.int32)
    q = rng.standard_normal((6, HQ, D)).astype(np.float32)
    kw = dict(causal=True, return_softmax_lse=True)
    o, lse = attn.varlen_attention_with_kvcache(q, kb, vb, cu, lens, table, 5, L,
                                                cache_dtype=fmt, k_scale=ks, v_scale=vs, **kw)
    o_ref, lse_ref = attn.varlen_attention_with_kvcache(
        q, _decode(kb, fmt, ks), _decode(vb, fmt, vs), cu, lens, table, 5, L, **kw)
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-6, atol=1e-6)


# ---- refusals: a clear error, nothing written -------------------------------------------
def _refused(rng, exc, match, **over):
    kb, vb, lens, _ = _setup(rng, "q8_0", False)
    args = dict(q=rng.standard_normal((B, 1, HQ, D)).astype(np.float32), k_cache=kb,
                v_cache=vb, k=np.ones((B, 1, HKV, D), np.float32),
                v=np.ones((B, 1, HKV, D), np.float32), cache_seqlens=lens, cache_dtype="q8_0")
    args.update(over)
    before = [np.array(args["k_cache"], copy=True), np.array(args["v_cache"], copy=True)]
    with pytest.raises(exc, match=match):
        attn.attention_with_kvcache(**args)
    np.testing.assert_array_equal(args["k_cache"], before[0])
    np.testing.assert_array_equal(args["v_cache"], before[1])


def test_refusals(rng):
    u8 = _rand_bytes(rng, (B, L, HKV, D), "fp8_e4m3")
    f32 = np.zeros((B, L, HKV, D), np.float32)
    _refused(rng, TypeError, "cache_dtype", cache_dtype=None)  # uint8 needs a name
    _refused(rng, ValueError, "not one of", cache_dtype="int8")
    _refused(rng, ValueError, "uint8 storage", k_cache=f32, v_cache=f32.copy())
    _refused(rng, ValueError, "multiple of 34", k_cache=u8, v_cache=u8.copy())
    wide = np.zeros((B, L, HKV, 2 * 68), np.uint8)[..., ::2]
    _refused(rng, ValueError, "contiguous", k_cache=wide, v_cache=wide.copy())
    bad = np.lib.stride_tricks.as_strided(np.zeros(B * L * HKV * 68 + 100, np.uint8),
                                          (B, L, HKV, 68), (L * HKV * 68 + 1, HKV * 68, 68, 1))
    _refused(rng, ValueError, "multiples of 34", k_cache=bad)  # a row off a block start
    _refused(rng, ValueError, "only an fp8 cache", k_scale=0.5)
    for bad_scale, match in ((0.0, "finite and > 0"), (-1.0, "finite and > 0"),
                             (float("nan"), "finite and > 0"),
                             (np.ones(3, np.float32), r"\[2\]"),
                             (np.ones((1, 2), np.float32), r"\[2\]")):
        _refused(rng, ValueError, match, k_cache=u8, v_cache=u8.copy(), cache_dtype="fp8_e4m3",
                 v_scale=bad_scale)


def test_mixed_float_and_quantized_refused(rng):
    kb, _, lens, _ = _setup(rng, "fp8_e5m2", False)
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    with pytest.raises((ValueError, TypeError)):
        attn.attention_with_kvcache(q, kb, np.zeros((B, L, HKV, D), np.float32),
                                    cache_seqlens=lens, cache_dtype="fp8_e5m2")


# ---- torch ------------------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("fmt", FP8)
def test_torch_float8_tensors(rng, fmt):
    tdt = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
    kb, vb, lens, table = _setup(rng, fmt, True)
    ks, vs = _scales("head")
    q = rng.standard_normal((B, 16, HQ, D)).astype(np.float32)
    kt, vt = torch.from_numpy(kb).view(tdt), torch.from_numpy(vb).view(tdt)
    # torch's own decoding of the bytes agrees with the hand decoder
    np.testing.assert_array_equal(kt.float().numpy(), _decode(kb, fmt))
    o = attn.attention_with_kvcache(torch.from_numpy(q), kt, vt,
                                    cache_seqlens=torch.from_numpy(lens),
                                    block_table=torch.from_numpy(table),
                                    k_scale=torch.from_numpy(ks), v_scale=vs)
    o_np = attn.attention_with_kvcache(q, kb, vb, cache_seqlens=lens, block_table=table,
                                       cache_dtype=fmt, k_scale=ks, v_scale=vs)
    assert isinstance(o, torch.Tensor)
    np.testing.assert_array_equal(o.numpy(), o_np)
    # append through torch: the bytes of the NumPy append
    kn = rng.standard_normal((B, 2, HKV, D)).astype(np.float32)
    attn.attention_with_kvcache(torch.from_numpy(q), kt, vt, torch.from_numpy(kn),
                                torch.from_numpy(kn), cache_seqlens=torch.from_numpy(lens),
                                block_table=torch.from_numpy(table), k_scale=ks, v_scale=vs)
    attn.attention_with_kvcache(q, kb, vb, kn, kn, cache_seqlens=lens, block_table=table,
                                cache_dtype=fmt, k_scale=ks, v_scale=vs)
    np.testing.assert_array_equal(kt.view(torch.uint8).numpy(), kb)  # shared memory: same
    x = torch.from_numpy(kn)
    qk = attn.quantize_kv(x, fmt, ks)
    assert qk.dtype == tdt
    np.testing.assert_array_equal(qk.view(torch.uint8).numpy(), _fp8_encode(kn, fmt, ks))
    with pytest.raises(ValueError, match="cache_dtype"):
        attn.attention_with_kvcache(torch.from_numpy(q), kt, vt, cache_seqlens=2,
                                    cache_dtype="fp8_e5m2" if fmt == "fp8_e4m3" else "fp8_e4m3")


@needs_torch
def test_torch_q8_0_uint8(rng):
    kb, vb, lens, _ = _setup(rng, "q8_0", False)
    q = rng.standard_normal((B, 16, HQ, D)).astype(np.float32)
    o = attn.attention_with_kvcache(torch.from_numpy(q), torch.from_numpy(kb),
                                    torch.from_numpy(vb), cache_seqlens=torch.from_numpy(lens),
                                    cache_dtype="q8_0")
    o_ref = attn.attention_with_kvcache(q, _decode(kb, "q8_0"), _decode(vb, "q8_0"),
                                        cache_seqlens=lens)
    np.testing.assert_array_equal(o.numpy(), o_ref)


@needs_torch
def test_flash_descale(rng):
    from attn.flash import flash_attn_with_kvcache
    kb, vb, lens, _ = _setup(rng, "fp8_e4m3", False)
    kt = torch.from_numpy(kb).view(torch.float8_e4m3fn)
    vt = torch.from_numpy(vb).view(torch.float8_e4m3fn)
    ks, vs = _scales("head")
    q = torch.from_numpy(rng.standard_normal((B, 16, HQ, D)).astype(np.float32))
    cl = torch.from_numpy(lens)
    kd = torch.from_numpy(np.tile(ks, (B, 1)))
    vd = torch.from_numpy(np.tile(vs, (B, 1)))
    o = flash_attn_with_kvcache(q, kt, vt, cache_seqlens=cl, causal=True, k_descale=kd,
                                v_descale=vd)
    o_ref = attn.attention_with_kvcache(q, kt, vt, cache_seqlens=cl, causal=True, k_scale=ks,
                                        v_scale=vs)
    assert torch.equal(o, o_ref)
    o1 = flash_attn_with_kvcache(q, kt, vt, cache_seqlens=cl, k_descale=torch.tensor(0.5),
                                 v_descale=0.25)
    o1_ref = attn.attention_with_kvcache(q, kt, vt, cache_seqlens=cl, k_scale=0.5, v_scale=0.25)
    assert torch.equal(o1, o1_ref)
    kd[1, 0] *= 2
    with pytest.raises(NotImplementedError, match="varies over the batch"):
        flash_attn_with_kvcache(q, kt, vt, cache_seqlens=cl, k_descale=kd)
    with pytest.raises(NotImplementedError, match="q_descale"):
        flash_attn_with_kvcache(q, kt, vt, cache_seqlens=cl, q_descale=torch.ones(B, HKV))


@needs_torch
def test_flash_varlen_descale(rng):
    from attn.flash import flash_attn_varlen_func
    kb, vb, lens, table = _setup(rng, "fp8_e5m2", True)
    kt = torch.from_numpy(kb).view(torch.float8_e5m2)
    vt = torch.from_numpy(vb).view(torch.float8_e5m2)
    ks, vs = _scales("head")
    cu_q = torch.tensor([0, 5, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, int(lens[0]), int(lens[0] + lens[1])], dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((6, HQ, D)).astype(np.float32))
    bt = torch.from_numpy(table)
    o = flash_attn_varlen_func(q, kt, vt, cu_q, cu_k, 5, L, causal=True, block_table=bt,
                               k_descale=torch.from_numpy(np.tile(ks, (B, 1))),
                               v_descale=torch.from_numpy(np.tile(vs, (B, 1))))
    o_ref = attn.varlen_attention_with_kvcache(q, kt, vt, cu_q, torch.from_numpy(lens), bt, 5, L,
                                               causal=True, k_scale=ks, v_scale=vs)
    assert torch.equal(o, o_ref)
    with pytest.raises(NotImplementedError, match="paged pools"):
        flash_attn_varlen_func(q, kt.reshape(-1, HKV, D), vt.reshape(-1, HKV, D), cu_q, cu_k,
                               5, L, k_descale=0.5)
    with pytest.raises(NotImplementedError, match="q_descale"):
        flash_attn_varlen_func(q, kt, vt, cu_q, cu_k, 5, L, block_table=bt, q_descale=1.0)


@needs_torch
def test_traced_refused(rng, monkeypatch):
    """Under torch.compile / torch.export (the custom op attn::kvcache carries no cache
    dtype or scales): NotImplementedError, nothing written."""
    monkeypatch.setattr(_kv, "_traced_ops", lambda *xs: object())
    kb, vb, lens, _ = _setup(rng, "fp8_e4m3", False)
    kt = torch.from_numpy(kb).view(torch.float8_e4m3fn)
    vt = torch.from_numpy(vb).view(torch.float8_e4m3fn)
    q = torch.from_numpy(rng.standard_normal((B, 1, HQ, D)).astype(np.float32))
    with pytest.raises(NotImplementedError, match="torch.compile"):
        attn.attention_with_kvcache(q, kt, vt, cache_seqlens=torch.from_numpy(lens))
    with pytest.raises(NotImplementedError, match="torch.compile"):
        attn.attention_with_kvcache(q, torch.from_numpy(kb), torch.from_numpy(vb),
                                    cache_seqlens=torch.from_numpy(lens), cache_dtype="q8_0")


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_mha_decode_fp8_cache(rng, paged):
    """attn.KVCache(cache_dtype=, k_scale=, v_scale=): a step writes its new rows as
    attn_kv_append_scaled (here exactly representable: one-hot x picks weight rows of
    scale times small multiples of 1/4) and attends as over the float32 cache of the
    values."""
    fmt, E, Dh = "fp8_e4m3", 8, 32
    ks, vs = np.array([0.5, 2.0], np.float32), np.array([0.25, 4.0], np.float32)
    kb, vb, lens, table = _setup(rng, fmt, paged)
    kb, vb = kb[..., :Dh].copy(), vb[..., :Dh].copy()
    w_q = rng.standard_normal((E, HQ * Dh)).astype(np.float32) * 0.3
    w_k = (rng.integers(-8, 9, (E, HKV, Dh)) / 4 * ks[:, None]).astype(np.float32)
    w_v = (rng.integers(-8, 9, (E, HKV, Dh)) / 4 * vs[:, None]).astype(np.float32)
    w_o = rng.standard_normal((HQ * Dh, E)).astype(np.float32) * 0.3
    x = np.zeros((B, 1, E), np.float32)
    x[0, 0, 3] = x[1, 0, 5] = 1
    kw = dict(num_heads=HQ, num_kv_heads=HKV, w_q=w_q, w_k=w_k.reshape(E, -1),
              w_v=w_v.reshape(E, -1), w_o=w_o)
    bt = table if paged else None
    c8 = attn.KVCache(kb, vb, lens, bt, cache_dtype=fmt, k_scale=ks, v_scale=vs)
    c32 = attn.KVCache(_decode(kb, fmt, ks), _decode(vb, fmt, vs), lens, bt)
    y8, y32 = attn.mha_decode(x, c8, **kw), attn.mha_decode(x, c32, **kw)
    np.testing.assert_allclose(y8, y32, rtol=1e-5, atol=1e-6)
    assert list(c8.len) == list(lens + 1)
    for b, row in ((0, 3), (1, 5)):
        pos = lens[b]
        at = (table[b, pos // PS], pos % PS) if paged else (b, pos)
        np.testing.assert_array_equal(kb[at], _fp8_encode(w_k[row], fmt, ks))
        np.testing.assert_array_equal(vb[at], _fp8_encode(w_v[row], fmt, vs))
        np.testing.assert_array_equal(_decode(kb[at], fmt, ks), w_k[row])
    with pytest.raises(ValueError, match="only an fp8 cache"):
        attn.KVCache(np.zeros((B, L, HKV, Dh), np.float32), np.zeros((B, L, HKV, Dh),
                                                                      np.float32), k_scale=1.0)


# ---- u4 (KIVI): keys per channel, values per token, scales and zeros outside ------------
def _u4_codes(b):
    """The codes of u4 bytes [..., D / 2]: element i is the low nibble of byte i / 2 when i
    is even, the high nibble when odd (the documented format, decoded by hand)."""
    c = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), np.uint8)
    c[..., 0::2], c[..., 1::2] = b & 15, b >> 4
    return c


def _u4_decode(b, scale, zero, kind, group=32):
    """float32 values [B, L, H, D] of u4 bytes [B, L, H, D / 2] with attn-order scales and
    zeros ([B, H, ceil(L / G), D] keys, [B, H, L, D / 32] values): fmaf(c, scale, zero),
    computed in float64 (c * scale exact, the sum exact here) and rounded once."""
    c = _u4_codes(b).astype(np.float64)               # [B, L, H, D]
    s = np.asarray(scale, np.float32).astype(np.float64).transpose(0, 2, 1, 3)
    z = np.asarray(zero, np.float32).astype(np.float64).transpose(0, 2, 1, 3)
    if kind == "keys":
        rows = np.arange(c.shape[1]) // (group or 32)
        s, z = s[:, rows], z[:, rows]                  # [B, L, H, D]
    else:
        s, z = np.repeat(s, 32, -1), np.repeat(z, 32, -1)
    return (c * s + z).astype(np.float32)


LU4 = 40  # a partial last key group for G = 16 and 32


def _u4_case(rng, group):
    k = rng.standard_normal((B, LU4, HKV, D)).astype(np.float32)
    k[..., 5] *= 20  # an outlier channel: per-channel keys keep their own range
    v = rng.standard_normal((B, LU4, HKV, D)).astype(np.float32)
    kb, ks, kz = attn.quantize_kv_u4(k, "keys", group)
    vb, vs, vz = attn.quantize_kv_u4(v, "values")
    return k, v, (kb, ks, kz), (vb, vs, vz)


def _bhld(x):  # [B, L, H, D] -> [B, H, L, D]
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3)))


@pytest.mark.parametrize("group", [0, 16, 32, 7])
def test_quantize_kv_u4(rng, group):
    k, v, (kb, ks, kz), (vb, vs, vz) = _u4_case(rng, group)
    ng = -(-LU4 // (group or 32))
    assert kb.dtype == np.uint8 and kb.shape == (B, LU4, HKV, D // 2)
    assert ks.dtype == kz.dtype == np.float32 and ks.shape == kz.shape == (B, HKV, ng, D)
    assert vs.shape == vz.shape == (B, HKV, LU4, D // 32)
    kf, vf = _u4_decode(kb, ks, kz, "keys", group), _u4_decode(vb, vs, vz, "values")
    # the library's dequantizer gives the hand decoding, bit for bit
    np.testing.assert_array_equal(attn.dequantize_kv_u4(kb, ks, kz, "keys", group), kf)
    np.testing.assert_array_equal(attn.dequantize_kv_u4(vb, vs, vz, "values"), vf)
    # zero is each set's least value; within half a step (plus a few ulps) of x
    rows = np.arange(LU4) // (group or 32)
    kmin = np.stack([k[:, rows == g].min(1) for g in range(ng)], 2)  # [B, H, ng, D]
    np.testing.assert_array_equal(kz, kmin)
    np.testing.assert_array_equal(vz, _bhld(v.reshape(B, LU4, HKV, D // 32, 32).min(-1)))
    ksx = _bhld(ks.transpose(0, 2, 1, 3)[:, rows])
    assert (np.abs(kf - k) <= _bhld(ksx) * 0.5 + 1e-5 * np.abs(k).max()).all()
    assert (np.abs(vf - v) <= np.repeat(_bhld(vs), 32, -1) * 0.5 + 1e-5 * 4).all()


@pytest.mark.parametrize("lq", [16, 1])
@pytest.mark.parametrize("group", [0, 16])
def test_u4_attention_against_oracle(rng, lq, group):
    """attention_with_kvcache over the u4 cache = float64 attention over the values the
    format defines (decoded here by hand), at the contract's float32 tolerance; a flipped
    nibble in the reference copy is caught."""
    k, v, (kb, ks, kz), (vb, vs, vz) = _u4_case(rng, group)
    q = rng.standard_normal((B, lq, HQ, D)).astype(np.float32)
    lens = np.array([LU4, 27], np.int32)
    kw = dict(cache_seqlens=lens, causal=True, return_softmax_lse=True)
    o, lse = attn.attention_with_kvcache(q, kb, vb, cache_dtype="u4", k_scale=ks, v_scale=vs,
                                         k_zero=kz, v_zero=vz, kv_group=group, **kw)
    kf, vf = _u4_decode(kb, ks, kz, "keys", group), _u4_decode(vb, vs, vz, "values")

    def oracle(kf, vf):
        return reference(_bhld(q).astype(np.float64), _bhld(kf).astype(np.float64),
                         _bhld(vf).astype(np.float64), causal=True, gqa=True,
                         align="bottom-right", kv_len=lens)
    ref_o, ref_l, _ = oracle(kf, vf)
    assert np.isfinite(o).all()
    assert tolerance_failure(_bhld(o), ref_o) is None, tolerance_failure(_bhld(o), ref_o)
    assert tolerance_failure(lse, ref_l) is None, tolerance_failure(lse, ref_l)
    # the same call over a float32 cache of those values: the same rule, close
    o32, lse32 = attn.attention_with_kvcache(q, kf, vf, **kw)
    np.testing.assert_allclose(o, o32, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lse32, rtol=1e-6, atol=1e-6)
    # planted errors: one nibble flipped in the reference copy (a value in a key every
    # row sees; a key code) must fail the comparison
    for which in ("v", "k"):
        bad = (vb if which == "v" else kb).copy()
        bad[1, 0, 1, 0] ^= 0x08  # element 0's code +-8 (kv head 1, key 0, sequence 1)
        bk = _u4_decode(bad, ks, kz, "keys", group) if which == "k" else kf
        bv = _u4_decode(bad, vs, vz, "values") if which == "v" else vf
        assert tolerance_failure(_bhld(o), oracle(bk, bv)[0]) is not None, which


@needs_torch
def test_u4_torch(rng):
    k, v, (kb, ks, kz), (vb, vs, vz) = _u4_case(rng, 16)
    kt, vt = torch.from_numpy(k), torch.from_numpy(v)
    tkb, tks, tkz = attn.quantize_kv_u4(kt, "keys", 16)
    tvb, tvs, tvz = attn.quantize_kv_u4(vt, kind="values")
    assert isinstance(tkb, torch.Tensor) and tkb.dtype == torch.uint8
    for a, b in ((tkb, kb), (tks, ks), (tkz, kz), (tvb, vb), (tvs, vs), (tvz, vz)):
        np.testing.assert_array_equal(a.numpy(), b)
    q = rng.standard_normal((B, 3, HQ, D)).astype(np.float32)
    lens = np.array([LU4, 27], np.int32)
    o = attn.attention_with_kvcache(torch.from_numpy(q), tkb, tvb,
                                    cache_seqlens=torch.from_numpy(lens), cache_dtype="u4",
                                    k_scale=tks, v_scale=tvs, k_zero=tkz, v_zero=tvz,
                                    kv_group=16)
    o_np = attn.attention_with_kvcache(q, kb, vb, cache_seqlens=lens, cache_dtype="u4",
                                       k_scale=ks, v_scale=vs, k_zero=kz, v_zero=vz,
                                       kv_group=16)
    assert isinstance(o, torch.Tensor)
    np.testing.assert_array_equal(o.numpy(), o_np)
    np.testing.assert_array_equal(attn.dequantize_kv_u4(tkb, tks, tkz, "keys", 16).numpy(),
                                  _u4_decode(kb, ks, kz, "keys", 16))
    # a bfloat16 query over the u4 cache
    ob = attn.attention_with_kvcache(torch.from_numpy(q).bfloat16(), tkb, tvb,
                                     cache_seqlens=torch.from_numpy(lens), cache_dtype="u4",
                                     k_scale=tks, v_scale=tvs, k_zero=tkz, v_zero=tvz,
                                     kv_group=16)
    assert ob.dtype == torch.bfloat16 and torch.isfinite(ob.float()).all()


def test_u4_refusals(rng):
    k, v, (kb, ks, kz), (vb, vs, vz) = _u4_case(rng, 32)
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
    lens = np.array([LU4, 27], np.int32)
    u4 = dict(cache_dtype="u4", k_scale=ks, v_scale=vs, k_zero=kz, v_zero=vz)

    def refused(exc, match, *a, **over):
        args = dict(q=q, k_cache=kb, v_cache=vb, cache_seqlens=lens, **u4)
        args.update(over)
        before = (kb.copy(), vb.copy())
        with pytest.raises(exc, match=match):
            attn.attention_with_kvcache(**args)
        np.testing.assert_array_equal(kb, before[0])
        np.testing.assert_array_equal(vb, before[1])

    table = np.arange(B * (LU4 // 8), dtype=np.int32).reshape(B, -1)
    pool = lambda x: x.reshape(B * (LU4 // 8), 8, HKV, -1)  # noqa: E731
    refused(NotImplementedError, "paged.*C library refuses", k_cache=pool(kb),
            v_cache=pool(vb), block_table=table)
    refused(NotImplementedError, "new rows.*C library refuses",
            k=np.ones((B, 1, HKV, D), np.float32), v=np.ones((B, 1, HKV, D), np.float32))
    refused(NotImplementedError, "return_key_scores", return_key_scores=True)
    for name in ("k_zero", "v_zero", "k_scale", "v_scale"):
        refused(ValueError, "missing %s" % name, **{name: None})
    refused(ValueError, r"k_scale: expected shape \(2, 2, 2, 64\)", k_scale=vs)
    refused(ValueError, r"v_zero: expected shape \(2, 2, 40, 2\)", v_zero=vz[:, :, :4])
    refused(ValueError, "kv_group", kv_group=-1)
    refused(ValueError, r"k_scale: expected shape \(2, 2, 3, 64\)", kv_group=16)  # G != 32
    refused(ValueError, "multiple of 16", k_cache=kb[..., :24], v_cache=vb[..., :24])
    bad_s = ks.copy()
    bad_s[0, 0, 0, 0] = 0.0
    refused(ValueError, "attention_with_kvcache", k_scale=bad_s)  # the C library's check
    bad_z = vz.copy()
    bad_z[0, 0, 0, 0] = np.nan
    refused(ValueError, "attention_with_kvcache", v_zero=bad_z)
    # k_zero, v_zero, kv_group with another cache dtype
    qb, _, _, _ = _setup(rng, "q8_0", False)
    for over in (dict(k_zero=kz), dict(v_zero=vz), dict(kv_group=32)):
        with pytest.raises(ValueError, match="only a u4 cache"):
            attn.attention_with_kvcache(q, qb, qb.copy(), cache_seqlens=lens,
                                        cache_dtype="q8_0", **over)
    # the other calls the C library refuses u4 in
    with pytest.raises(NotImplementedError, match="C library refuses"):
        attn.varlen_attention_with_kvcache(q[:, 0], pool(kb), pool(vb),
                                           np.array([0, 1, 2], np.int32), lens, table, 1, LU4,
                                           cache_dtype="u4", k_scale=ks, v_scale=vs)
    with pytest.raises(NotImplementedError, match="C library refuses"):
        attn.KVCache(kb.copy(), vb.copy(), cache_dtype="u4")
    with pytest.raises(ValueError, match="quantize_kv_u4"):
        attn.quantize_kv(k, "u4")
    bad = k.copy()
    bad[0, 3, 1, 7] = np.inf
    with pytest.raises(ValueError, match="quantize_kv_u4"):
        attn.quantize_kv_u4(bad, "keys")
    with pytest.raises(ValueError, match="kind"):
        attn.quantize_kv_u4(k, "rows")
    with pytest.raises(ValueError, match="multiple of 32"):
        attn.quantize_kv_u4(k[..., :48], "values")
