"""test_torch.py — attn.scaled_dot_product_attention against PyTorch's own
torch.nn.functional.scaled_dot_product_attention on the same float32 CPU tensors (max
absolute difference <= 1e-5, as seed 003 section 5 expects), and the PyTorch side of the
interface: a torch.Tensor comes back, inputs are read in place through DLPack, the
capsules are released. Skipped, with the reason, where PyTorch is not installed (CI does
not install it; test_numpy.py covers the same ground against the float64 oracle).
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
from oracle import assert_close, reference

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
    assert d["via"] == "dlpack"
    assert d["data"] == q.data_ptr() and d["strides"] == q.stride()
    assert d["shape"] == tuple(q.shape)


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
    q = randn(1, 2, 4, 8).requires_grad_()
    out = compare(q, q, q)
    assert not out.requires_grad


def test_capsules_released():
    q = randn(2, 2, 6, 8)
    taken0, released0 = _attn._dlpack_counts()
    sdpa(q, q, q, attn_mask=torch.ones(6, 6, dtype=torch.bool), kv_len=torch.tensor([6, 3]))
    taken, released = _attn._dlpack_counts()
    assert taken - taken0 == released - released0 == 6   # q, k, v, mask, kv_len, output


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
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
    with pytest.raises(NotImplementedError):
        sdpa(q, q, q, dropout_p=0.5)


def test_cuda_tensor_refused():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: a GPU tensor cannot be made here")
    q = randn(1, 1, 4, 8).cuda()
    with pytest.raises(ValueError, match=r"^query: .*CUDA"):
        sdpa(q, q.cpu(), q.cpu())
