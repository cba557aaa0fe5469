"""test_plot.py — attn.plot: weights_from_lse against the library's own weights output
(return_weights) and the float64 oracle's, masked entries where the masks say; heatmap
with matplotlib where it is installed (skipped with the reason otherwise)."""
import numpy as np
import pytest

import attn
import attn.plot


def _call(rng, mask_kind, causal):
    q = rng.standard_normal((2, 3, 9, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 13, 16)).astype(np.float32)
    v = rng.standard_normal((2, 3, 13, 16)).astype(np.float32)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((9, 13)) < 0.7
    elif mask_kind == "float":
        mask = rng.standard_normal((2, 3, 9, 13)).astype(np.float32)
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    _, lse, w = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  return_lse=True, return_weights=True)
    return q, k, mask, lse, w


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_weights_from_lse_match_the_call(rng, mask_kind, causal):
    q, k, mask, lse, w = _call(rng, mask_kind, causal)
    got = attn.plot.weights_from_lse(q, k, lse, attn_mask=mask, is_causal=causal, rows=4)
    # float32 LSE: each weight is off by |lse| * 2^-24 relatively at most, plus the call's
    # own float32 rounding
    np.testing.assert_allclose(got, w, rtol=2e-6, atol=2e-7)
    nan = attn.plot.weights_from_lse(q, k, lse, attn_mask=mask, is_causal=causal,
                                     masked_value=np.nan)
    masked = np.isnan(nan)
    expect = np.zeros(w.shape, bool)
    if causal:
        expect |= np.triu(np.ones((9, 13), bool), 1)
    if mask_kind == "bool":
        expect |= ~mask
    elif mask_kind == "float":
        expect |= np.isneginf(mask)
    assert np.array_equal(masked, np.broadcast_to(expect, w.shape))
    assert np.all(got[masked] == 0)


def test_heatmap_draws_masked_cells_apart():
    plt = pytest.importorskip("matplotlib.pyplot", reason="matplotlib is not installed "
                              "(optional for attn.plot.heatmap)")
    w = np.tril(np.full((4, 4), 0.25))
    w[np.triu_indices(4, 1)] = np.nan
    ax = attn.plot.heatmap(w, tokens=["The", "cat", "sat", "down"], title="causal")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "cat", "sat", "down"]
    im = ax.get_images()[0]
    rgba = im.cmap(im.norm(im.get_array()))
    assert np.allclose(rgba[0, 1, :3], [0xB4 / 255] * 3)   # masked: grey
    plt.close(ax.figure)


def test_heatmap_without_matplotlib_says_so(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ImportError, match="needs matplotlib"):
        attn.plot.heatmap(np.zeros((2, 2)))
