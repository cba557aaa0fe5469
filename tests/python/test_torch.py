"""test_torch.py — attn.scaled_dot_product_attention against PyTorch's own
torch.nn.functional.scaled_dot_product_attention on the same float32 CPU tensors (max
absolute difference <= 1e-5, as seed 003 section 5 expects), and the PyTorch side of the
interface: a torch.Tensor comes back, inputs are read in place through DLPack, the
capsules are released.

bfloat16 and float16 tensors, both precision levels: the output keeps the query's dtype
and is held to the half-precision rule against PyTorch's float32 SDPA on the same
(16-bit) values: max |ours - torch32| <= 2 * max |naive - torch32| + 3e-5, naive being
oracle.naive in that dtype (checked here to be PyTorch's own math path in that dtype, to
one ulp) and 3e-5 allowing for torch32's own float32 error (<= 1e-5, the bound above) on
both sides; and no worse than twice the error of PyTorch's own 16-bit SDPA.

Skipped, with the reason, where PyTorch is not installed (CI does not install it;
test_numpy.py and test_half.py cover the same ground against the float64 oracle).
"""
import sys

import numpy as np
import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    pytest.skip("PyTorch is not installed: the comparison with "
                "torch.nn.functional.scaled_dot_product_attention is skipped",
                allow_module_level=True)

import attn
from attn import _attn
from oracle import assert_close, naive, reference, round_to

sdpa = attn.scaled_dot_product_attention
TOL = 1e-5


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def compare(*args, **kwargs):
    ours = sdpa(*args, **kwargs)
    theirs = F.scaled_dot_product_attention(*args, **kwargs)
    assert isinstance(ours, torch.Tensor) and ours.dtype == torch.float32
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs().max().item() if ours.numel() else 0.0
    assert diff <= TOL, "max |attn - torch| = %.3g" % diff
    return ours


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 17, 33, 16), (1, 4, 64, 64, 64),
                                   (2, 2, 5, 130, 8), (1, 1, 200, 7, 128)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch(shape, is_causal):
    B, H, Lq, Lk, D = shape
    compare(randn(B, H, Lq, D), randn(B, H, Lk, D, seed=1), randn(B, H, Lk, D, seed=2),
            is_causal=is_causal)


@pytest.mark.parametrize("rank", [2, 3])
def test_lower_ranks(rank):
    lead = (3,)[: rank - 2]
    compare(randn(*lead, 6, 8), randn(*lead, 9, 8, seed=1), randn(*lead, 9, 5, seed=2))


def test_scale_and_dv():
    q, k, v = randn(2, 2, 9, 16), randn(2, 2, 11, 16, seed=1), randn(2, 2, 11, 24, seed=2)
    for s in (0.0, -0.7, 2.5):
        compare(q, k, v, scale=s)


@pytest.mark.parametrize("mshape", [(1, 11), (9, 11), (1, 9, 11), (3, 1, 11), (2, 3, 9, 11)],
                         ids=str)
def test_masks(mshape):
    q, k, v = randn(2, 3, 9, 8), randn(2, 3, 11, 8, seed=1), randn(2, 3, 11, 8, seed=2)
    g = torch.Generator().manual_seed(7)
    bmask = torch.rand(*mshape, generator=g) < 0.8
    bmask[..., 0] = True                      # no fully masked rows: PyTorch gives NaN there
    compare(q, k, v, attn_mask=bmask)
    fmask = torch.randn(*mshape, generator=g) * 3
    fmask[..., 1] = float("-inf")
    compare(q, k, v, attn_mask=fmask)


@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_gqa(hkv):
    q, k, v = randn(2, 8, 6, 16), randn(2, hkv, 10, 16, seed=1), randn(2, hkv, 10, 12, seed=2)
    if "enable_gqa" not in F.scaled_dot_product_attention.__doc__:
        pytest.skip("this PyTorch has no enable_gqa")
    compare(q, k, v, enable_gqa=True)
    compare(q, k, v, enable_gqa=True, is_causal=True)


def test_strided_views_read_in_place():
    base = randn(2, 9, 3, 8)                   # (B, L, H, D) storage
    q = base.transpose(1, 2)                   # (B, H, L, D) view
    cache = randn(2, 3, 64, 8, seed=1)
    k, v = cache[:, :, 5:25], cache.flip(-1)[:, :, 10:30]
    assert not q.is_contiguous()
    compare(q, k, v)
    compare(q, k.expand(2, 3, 20, 8), v, is_causal=True)
    d = _attn._describe(q)
    assert d["via"] == "torch"   # a torch.Tensor's own attributes, not DLPack's capsule
    assert d["data"] == q.data_ptr() and d["strides"] == q.stride()
    assert d["shape"] == tuple(q.shape)


class _Sub(torch.Tensor):
    """A tensor subclass: read through DLPack, not torch.Tensor's attributes."""


def test_tensor_paths_agree():
    """The same memory through torch.Tensor's attributes and through DLPack (a subclass),
    for every dtype either reads, an offset strided view and an empty tensor."""
    base = randn(3, 9, 4, 10)
    views = [base.transpose(1, 2)[1:, :, 2:7, 1::3], base[:, :0], randn(5)]
    views += [base.to(dt)[0, 1:3] for dt in (torch.float16, torch.bfloat16, torch.float64)]
    views += [base[0] > 0, torch.arange(6, dtype=torch.int32)[1:], torch.arange(4)]
    for x in views:
        d, s = _attn._describe(x), _attn._describe(x.as_subclass(_Sub))
        assert (d["via"], s["via"]) == ("torch", "dlpack")
        for key in ("dtype", "shape", "strides"):
            assert d[key] == s[key], (key, d, s)
        if x.numel():
            assert d["data"] == s["data"] == x.data_ptr()


def test_negative_view_is_read_as_its_values():
    """torch._neg_view's memory holds -x: attn reads the values the tensor stands for
    (through resolve_neg), as PyTorch's own sdpa does."""
    q, k, v = randn(1, 2, 5, 8), randn(1, 2, 7, 8, seed=1), randn(1, 2, 7, 8, seed=2)
    nq = torch._neg_view(-q)
    assert nq.is_neg() and torch.equal(nq, q)
    assert torch.equal(sdpa(nq, k, v), sdpa(q, k, v))


def test_expanded_kv_is_not_copied():
    row = randn(1, 1, 1, 64)
    k = row.expand(1, 1, 1 << 20, 64)          # stride 0: a copy would be 256 MiB
    d = _attn._describe(k)
    assert d["data"] == row.data_ptr() and d["strides"][2] == 0


def test_result_is_a_fresh_torch_tensor():
    q = randn(2, 5, 8)
    out, lse, w = sdpa(q, q, q, return_lse=True, return_weights=True)
    for x in (out, lse, w):
        assert isinstance(x, torch.Tensor) and x.device.type == "cpu"
    assert out.data_ptr() != q.data_ptr()
    assert lse.shape == (2, 5) and w.shape == (2, 5, 5)
    ref = reference(q.numpy(), q.numpy(), q.numpy())
    assert_close(out.numpy(), ref[0])
    assert_close(lse.numpy(), ref[1])
    assert_close(w.numpy(), ref[2])


def test_requires_grad_inputs_are_read():
    """A tensor that requires grad is read in place (through .detach()); under no_grad the
    result is a plain tensor, with grad mode on it is differentiable (test_autograd.py)."""
    q = randn(1, 2, 4, 8).requires_grad_()
    with torch.no_grad():
        out = compare(q, q, q)
    assert not out.requires_grad
    assert compare(q, q, q).requires_grad


def test_capsules_released():
    """torch.Tensor is read from its attributes (no capsule); a subclass through DLPack,
    each capsule taken deleted once."""
    q = randn(2, 2, 6, 8)
    taken0, released0 = _attn._dlpack_counts()
    sdpa(q, q, q, attn_mask=torch.ones(6, 6, dtype=torch.bool), kv_len=torch.tensor([6, 3]))
    taken, released = _attn._dlpack_counts()
    assert taken - taken0 == released - released0 == 0
    for x in (q, torch.ones(6, 6, dtype=torch.bool), torch.tensor([6, 3])):
        _attn._describe(x.as_subclass(_Sub))
    taken, released = _attn._dlpack_counts()
    assert taken - taken0 == released - released0 == 3


def test_contract_differences_from_torch():
    q, k, v = randn(1, 1, 3, 4), randn(1, 1, 5, 4, seed=1), randn(1, 1, 5, 4, seed=2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    ours = sdpa(q, k, v, attn_mask=mask)
    assert (ours[0, 0, 1] == 0).all()                    # ours: 0; PyTorch's math path: NaN
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours[0, 0, [0, 2]] - theirs[0, 0, [0, 2]]).abs().max() <= TOL
    both = sdpa(q, k, v, attn_mask=mask, is_causal=True)  # PyTorch refuses the combination
    causal_and_mask = torch.ones(3, 5, dtype=torch.bool).tril() & mask
    assert_close(both.numpy(), reference(q.numpy(), k.numpy(), v.numpy(),
                                         mask=causal_and_mask.numpy())[0])


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.complex64])  # float64: test_f64.py
def test_other_dtypes_refused(dtype):
    q = randn(1, 2, 4, 8).to(dtype)
    with pytest.raises(TypeError, match=r"^query: dtype"):
        sdpa(q, q, q)


def test_errors_match_torchs_refusals():
    q, k = randn(1, 8, 4, 16), randn(1, 2, 6, 16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(q, k, k)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="^dropout_p="):  # PyTorch: RuntimeError for p > 1
        sdpa(q, q, q, dropout_p=1.5)


def test_cuda_tensor_refused():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: a GPU tensor cannot be made here")
    q = randn(1, 1, 4, 8).cuda()
    with pytest.raises(ValueError, match=r"^query: .*CUDA"):
        sdpa(q, q.cpu(), q.cpu())


# ---- bfloat16 and float16 ---------------------------------------------------------------------

HALF = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def rand16(dtype, *shape, seed=0):
    """Uniform values in [-1, 1) as a tensor of dtype (16-bit values, exact in float32)."""
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


def f32(x):
    return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def compare_half(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                 precisions=("default", "fast")):
    """Ours at each precision level against torch's float32 SDPA of the same values."""
    name = HALF[k.dtype]
    kw = dict(attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    if enable_gqa:
        kw["enable_gqa"] = True
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                           **dict(kw, attn_mask=f32(attn_mask))).double()
    theirs16 = F.scaled_dot_product_attention(q, k, v, **kw).double()
    nv = torch.from_numpy(naive(q.float().numpy(), k.float().numpy(), v.float().numpy(), name,
                                mask=None if attn_mask is None else f32(attn_mask).numpy(),
                                causal=is_causal, scale=scale, gqa=enable_gqa))
    naive_err = (nv - exact).abs().max().item()
    theirs_err = (theirs16 - exact).abs().max().item()
    outs = {}
    for p in precisions:
        ours = sdpa(q, k, v, precision=p, **kw)
        assert isinstance(ours, torch.Tensor) and ours.dtype == q.dtype
        err = (ours.double() - exact).abs().max().item()
        assert err <= 2 * naive_err + 3 * TOL, (
            "%s %s: max |attn - torch32| = %.3g > 2 x naive %.3g" % (name, p, err, naive_err))
        assert err <= 2 * theirs_err + 3 * TOL, (
            "%s %s: max |attn - torch32| = %.3g > 2 x torch's own %s SDPA's %.3g" % (
                name, p, err, name, theirs_err))
        outs[p] = ours
    return outs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 17, 33, 16), (1, 4, 64, 64, 64),
                                   (2, 2, 5, 130, 8), (1, 1, 200, 7, 128), (1, 2, 3, 2500, 64),
                                   (1, 8, 256, 256, 128)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_16_bit_matches_torch(shape, is_causal, dtype):
    B, H, Lq, Lk, D = shape
    outs = compare_half(rand16(dtype, B, H, Lq, D), rand16(dtype, B, H, Lk, D, seed=1),
                        rand16(dtype, B, H, Lk, D, seed=2), is_causal=is_causal)
    # "fast" rounds P only for a bfloat16 value, and only on bf16 dot products (avx512bf16)
    if dtype == torch.float16 or attn.kernel_name() != "avx512bf16":
        assert torch.equal(outs["default"], outs["fast"]), attn.kernel_name()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
def test_16_bit_masks_gqa_and_scale(dtype):
    q, k, v = (rand16(dtype, 2, 4, 9, 16), rand16(dtype, 2, 4, 11, 16, seed=1),
               rand16(dtype, 2, 4, 11, 8, seed=2))
    g = torch.Generator().manual_seed(7)
    bmask = torch.rand(9, 11, generator=g) < 0.8
    bmask[..., 0] = True                      # no fully masked rows: PyTorch gives NaN there
    compare_half(q, k, v, attn_mask=bmask)
    fmask = (torch.randn(2, 1, 9, 11, generator=g) * 3).to(dtype)   # PyTorch: the query's dtype
    fmask[..., 1] = float("-inf")
    compare_half(q, k, v, attn_mask=fmask)
    compare_half(q, k, v, scale=0.7)
    if "enable_gqa" in F.scaled_dot_product_attention.__doc__:
        compare_half(q, k[:, :2], v[:, :2], enable_gqa=True)
        compare_half(q, k[:, :1], v[:, :1], enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
def test_16_bit_strided_views_read_in_place(dtype):
    base = rand16(dtype, 2, 9, 3, 16)          # (B, L, H, D) storage
    q = base.transpose(1, 2)                   # (B, H, L, D) view
    cache = rand16(dtype, 2, 3, 64, 16, seed=1)
    k, v = cache[:, :, 5:25], cache.flip(-1)[:, :, 10:30]
    compare_half(q, k, v, is_causal=True)
    d = _attn._describe(q)
    assert d["via"] == "torch" and d["dtype"] == HALF[dtype]
    assert d["data"] == q.data_ptr() and d["strides"] == q.stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
def test_float32_query_over_16_bit_cache(dtype):
    """A float32 query over a 16-bit K/V cache: a float32 result that meets the float32
    bound against torch's float32 SDPA (the cache's values are exact in float32), except
    where "fast" rounds P to bfloat16."""
    q = randn(1, 8, 4, 64)
    k, v = rand16(dtype, 1, 8, 300, 64, seed=1), rand16(dtype, 1, 8, 300, 64, seed=2)
    theirs = F.scaled_dot_product_attention(q, k.float(), v.float())
    for p in ("default", "fast"):
        ours = sdpa(q, k, v, precision=p)
        assert ours.dtype == torch.float32
        diff = (ours - theirs).abs().max().item()
        if p == "default" or dtype == torch.float16:
            assert diff <= TOL, "%s: max |attn - torch| = %.3g" % (p, diff)
        else:
            nv = torch.from_numpy(naive(q.numpy(), k.float().numpy(), v.float().numpy(),
                                        HALF[dtype]))
            assert diff <= 2 * (nv - theirs.double()).abs().max().item() + 3 * TOL


def test_bfloat16_fast_is_a_different_level():
    """FAST rounds P to bfloat16 for P·V where the kernel has bf16 dot products
    (avx512bf16); on every other kernel it is the default level, bit for bit."""
    q, k, v = (rand16(torch.bfloat16, 1, 4, 64, 64, seed=s) for s in range(3))
    outs = compare_half(q, k, v)
    if attn.kernel_name() == "avx512bf16":
        assert not torch.equal(outs["default"], outs["fast"])   # P rounded to bfloat16
    else:
        assert torch.equal(outs["default"], outs["fast"]), attn.kernel_name()
    _, l_d = sdpa(q, k, v, return_lse=True)
    _, l_f = sdpa(q, k, v, return_lse=True, precision="fast")
    assert torch.equal(l_d, l_f) and l_d.dtype == torch.float32


def test_mixed_key_value_dtypes_refused():
    q, k = rand16(torch.bfloat16, 1, 2, 4, 8), rand16(torch.bfloat16, 1, 2, 6, 8)
    with pytest.raises(TypeError,
                       match=r"^value: dtype is float16, expected bfloat16 like key") as info:
        sdpa(q, k, k.to(torch.float16))
    assert info.value.status == "ATTN_ERR_DTYPE"
    with pytest.raises(TypeError, match=r"^value: dtype is float32, expected bfloat16 like key"):
        sdpa(q, k, k.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
@pytest.mark.parametrize("shape", [(2, 3, 40, 70, 64, 32), (1, 4, 64, 500, 128, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_naive_is_torchs_math_path(dtype, shape):
    """oracle.naive, the yardstick of the half-precision rule, computes what PyTorch's math
    path computes in that dtype — the same roundings, not always the same bits (PyTorch's
    CPU matmuls sum in another order, so a score may round the other way): its error
    against the float64 oracle is PyTorch's to within 25%, and the two differ by less
    than twice that error anywhere."""
    B, H, Lq, Lk, Dk, Dv = shape
    q, k, v = (rand16(dtype, B, H, Lq, Dk), rand16(dtype, B, H, Lk, Dk, seed=1),
               rand16(dtype, B, H, Lk, Dv, seed=2))
    theirs = (torch.softmax(q @ k.transpose(-1, -2) * Dk ** -0.5, dim=-1) @ v).double().numpy()
    ours = naive(q.float().numpy(), k.float().numpy(), v.float().numpy(), HALF[dtype])
    exact = reference(q.float().numpy(), k.float().numpy(), v.float().numpy())[0]
    err_ours, err_theirs = np.abs(ours - exact).max(), np.abs(theirs - exact).max()
    print("%s: naive %.3g, PyTorch's math path %.3g, %d of %d elements differ" % (
        HALF[dtype], err_ours, err_theirs, (ours != theirs).sum(), ours.size))
    assert 0.75 <= err_ours / err_theirs <= 1.25
    assert np.abs(ours - theirs).max() <= 2 * err_theirs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: HALF[d])
def test_round_to_matches_torch(dtype):
    g = torch.Generator().manual_seed(3)
    spread = 10.0 ** torch.randint(-8, 8, (100000,), generator=g)
    x = torch.cat([torch.randn(100000, generator=g) * spread,
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 65504.0,
                                 65520.0, 3.4e38, 1e-40, 1 + 2 ** -8, 1 + 3 * 2 ** -8])])
    want = x.to(dtype).float().numpy()
    np.testing.assert_array_equal(round_to(x.numpy(), HALF[dtype]), want)
