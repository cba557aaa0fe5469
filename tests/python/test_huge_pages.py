"""attn.huge_pages (attn_huge_pages): a NumPy array's or a CPU torch tensor's memory onto
2 MiB pages. Checked: no value changes, the answer is a bool (the system decides whether
pages become huge: not checked), a small array is fine, anything else is refused;
KVCache.empty, which calls it, still gives zeros; a decoding step over a cache moved so
gives the same bits as over a copy on ordinary pages. PyTorch's part skips without it."""
import numpy as np
import pytest

import attn


def test_values_unchanged_numpy():
    x = np.arange(3 << 20, dtype=np.float32).reshape(3, 1 << 20)  # 12 MiB
    want = x.copy()
    assert attn.huge_pages(x) in (True, False)
    assert np.array_equal(x, want)
    assert attn.huge_pages(x[:, ::2]) in (True, False)  # a strided view: its base's span
    assert np.array_equal(x, want)
    assert attn.huge_pages(np.zeros(5, np.float32)) in (True, False)
    assert attn.huge_pages(np.zeros(0, np.float32)) is True


def test_refused():
    with pytest.raises(TypeError):
        attn.huge_pages([1.0, 2.0])
    with pytest.raises(TypeError):
        attn.huge_pages(None)


def test_torch_tensor():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    t = torch.arange(3 << 20, dtype=torch.float32)
    want = t.clone()
    assert attn.huge_pages(t) in (True, False)
    assert torch.equal(t, want)
    assert attn.huge_pages(t[1::3]) in (True, False)  # a view: its whole storage
    assert torch.equal(t, want)


def test_kvcache_empty_and_decoding_bits():
    c = attn.KVCache.empty(batch=1, max_len=8192, num_kv_heads=2, head_dim=64)
    assert not c.k.any() and not c.v.any()
    rng = np.random.default_rng(5)
    k = rng.standard_normal((1, 4096, 2, 64)).astype(np.float32)
    v = rng.standard_normal((1, 4096, 2, 64)).astype(np.float32)
    q = rng.standard_normal((1, 1, 8, 64)).astype(np.float32)
    moved_k, moved_v = k.copy(), v.copy()
    attn.huge_pages(moved_k), attn.huge_pages(moved_v)
    a = attn.attention_with_kvcache(q, k, v)
    b = attn.attention_with_kvcache(q, moved_k, moved_v)
    assert np.array_equal(np.asarray(a), np.asarray(b))
