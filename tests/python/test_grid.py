"""test_grid.py — attn.weights_grid (the C library's attn_weights_grid through ctypes,
python/attn/_grid.py) against NumPy: the float64 oracle's weights (tests/python/oracle.py)
folded into blocks by floor(i R / L), floor(j C / S), sum and max, under every mask the
call takes; the full grid against the call's own weights; the layouts, share=True, and
the refusals. heatmap drawing a grid (log scale, masked cells) where matplotlib is
installed, skipped with the reason otherwise."""
import numpy as np
import pytest

import attn
import attn.plot
import oracle


def blocks(w, masked, R, C, reduce):
    """w (..., L, S) float64 folded into (..., R, C) cells; -inf where all is masked."""
    L, S = w.shape[-2:]
    ri, cj = np.arange(L) * R // L, np.arange(S) * C // S
    out = np.full(w.shape[:-2] + (R, C), -np.inf)
    for r in range(R):
        for c in range(C):
            sub = w[..., ri == r, :][..., cj == c]
            keep = ~masked[..., ri == r, :][..., cj == c]
            any_kept = keep.reshape(keep.shape[:-2] + (-1,)).any(-1)
            val = (np.where(keep, sub, 0).sum((-2, -1)) if reduce == "sum"
                   else np.where(keep, sub, -np.inf).max((-2, -1)))
            out[..., r, c] = np.where(any_kept, val, -np.inf)
    return out


def _case(rng, mask_kind, B=2, Hq=4, Hkv=2, L=37, S=53, D=16):
    q = rng.standard_normal((B, Hq, L, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((L, S)) < 0.7
        mask[:, 10:20] = False            # whole blocks of keys masked
    elif mask_kind == "float":
        mask = rng.standard_normal((B, 1, L, S)).astype(np.float32)
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    return q, k, v, mask


def _masked(q, k, v, mask, causal, window=None, align="top-left"):
    *_, masked, bias = oracle._setup(q, k, v, mask, causal, None, True, align, window, None,
                                     None, np.float64)
    if bias is not None:
        masked = masked | np.isneginf(bias)
    return masked


# A block's sum of up to 8 x 8 weights: each weight off by the float32 LSE (|lse| 2^-24
# relative) and float32 exp, a few 1e-7 relative; summed in float64.
RTOL, ATOL = 1e-5, 1e-6


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_blocks_against_numpy(rng, mask_kind, causal, reduce):
    q, k, v, mask = _case(rng, mask_kind)
    _, lse = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                               enable_gqa=True, return_lse=True)
    _, _, w = oracle.reference(q, k, v, mask=mask, causal=causal, gqa=True)
    masked = _masked(q, k, v, mask, causal)
    for R, C in ((5, 7), (37, 53), (1, 1), (36, 2)):
        got = attn.weights_grid(q, k, lse, rows=R, cols=C, reduce=reduce, attn_mask=mask,
                                is_causal=causal)
        want = blocks(w, masked, R, C, reduce)
        assert got.shape == (2, 4, R, C) and got.dtype == np.float32
        assert np.array_equal(np.isneginf(got), np.isneginf(want)), (R, C)
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=RTOL, atol=ATOL)


def test_full_grid_is_the_calls_weights(rng):
    q, k, v, mask = _case(rng, "bool")
    _, lse, w = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True,
                                                  enable_gqa=True, return_lse=True,
                                                  return_weights=True)
    g = attn.weights_grid(q, k, lse, rows=37, cols=53, attn_mask=mask, is_causal=True)
    masked = _masked(q, k, v, mask, True)
    assert np.array_equal(np.isneginf(g), masked)
    np.testing.assert_allclose(np.where(masked, 0, g), w, rtol=2e-6, atol=2e-7)


def test_window_softcap_scale_bottom_right_reference(rng):
    q = rng.standard_normal((3, 20, 8)).astype(np.float32)    # (H, L, D)
    k = rng.standard_normal((3, 29, 8)).astype(np.float32)
    v = rng.standard_normal((3, 29, 8)).astype(np.float32)
    kw = dict(is_causal=True, scale=0.7, softcap=2.5, window=(6, 1), align="bottom-right")
    _, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    _, _, w = oracle.reference(q, k, v, causal=True, scale=0.7, softcap=2.5, window=(6, 1),
                               align="bottom-right")
    masked = _masked(q, k, v, None, True, window=(6, 1), align="bottom-right")[0]
    for path in ("auto", "reference"):
        got = attn.weights_grid(q, k, lse, rows=6, cols=9, reduce="max", is_causal=True,
                                scale=0.7, softcap=2.5, window=(6, 1), align="bottom-right",
                                path=path)
        want = blocks(w, masked, 6, 9, "max")
        assert got.shape == (3, 6, 9)
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=RTOL, atol=ATOL)


def test_two_dimensional_share_and_defaults(rng):
    q = rng.standard_normal((300, 16)).astype(np.float32)
    k = rng.standard_normal((300, 16)).astype(np.float32)
    _, lse = attn.scaled_dot_product_attention(q, k, k, is_causal=True, return_lse=True)
    g = attn.weights_grid(q, k, lse, is_causal=True)      # default min(L, 256) cells a side
    assert g.shape == (256, 256)
    rows = np.diff(attn._grid.block_edges(300, 256))
    # every row's weights sum to 1: a grid row sums to its rows' count
    np.testing.assert_allclose(np.where(np.isfinite(g), g, 0).sum(1), rows, rtol=1e-5)
    s = attn.weights_grid(q, k, lse, rows=7, cols=11, is_causal=True, share=True)
    np.testing.assert_allclose(np.where(np.isfinite(s), s, 0).sum(1), np.ones(7), rtol=1e-5)
    assert np.all(s[np.isfinite(s)] <= 1 + 1e-6)


def test_a_wrong_lse_gives_rows_that_do_not_sum_to_one(rng):
    q = rng.standard_normal((50, 16)).astype(np.float32)
    _, lse = attn.scaled_dot_product_attention(q, q, q, return_lse=True)
    g = attn.weights_grid(q, q, lse + 1e-3, rows=5, cols=5)
    assert np.all(np.abs(g.sum(1) / 10 - np.exp(-1e-3)) < 1e-5)
    assert not np.allclose(g.sum(1), 10, rtol=1e-4)


def test_refusals(rng):
    q = rng.standard_normal((2, 10, 8)).astype(np.float32)
    _, lse = attn.scaled_dot_product_attention(q, q, q, return_lse=True)
    with pytest.raises(ValueError, match="reduce"):
        attn.weights_grid(q, q, lse, reduce="mean")
    with pytest.raises(ValueError, match="grid"):
        attn.weights_grid(q, q, lse, rows=11, cols=4)      # R > L: the C library's message
    with pytest.raises(ValueError, match="lse"):
        attn.weights_grid(q, q, lse[:, :5])
    with pytest.raises(ValueError, match="align"):
        attn.weights_grid(q, q, lse, align="middle")


def test_heatmap_of_a_long_grid():
    plt = pytest.importorskip("matplotlib.pyplot", reason="matplotlib is not installed "
                              "(optional for attn.plot.heatmap)")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 2000, 16)).astype(np.float32)
    _, lse = attn.scaled_dot_product_attention(q, q, q, is_causal=True, return_lse=True)
    g = attn.weights_grid(q, q, lse, rows=50, cols=50, is_causal=True, reduce="max")[0, 0]
    g[0, 1] = 0.0                                    # a weight of 0 (not masked): white
    ax = attn.plot.heatmap(g, lengths=(2000, 2000), scale="log")
    im = ax.get_images()[0]
    assert im.get_extent() == [0, 2000, 2000, 0]
    rgba = im.cmap(im.norm(im.get_array()))
    assert np.allclose(rgba[0, 2, :3], [0xB4 / 255] * 3)   # masked (-inf): grey
    assert np.allclose(rgba[0, 1, :3], [1, 1, 1])          # 0, below vmin: white
    assert type(im.norm).__name__ == "LogNorm" and im.norm.vmax == pytest.approx(float(g.max()))
    # the log scale of attn viz: t = log(x / vmin) / log(vmax / vmin)
    lo, hi = im.norm.vmin, im.norm.vmax
    x = lo * (hi / lo) ** np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(im.norm(x), np.log(x / lo) / np.log(hi / lo), rtol=1e-9)
    plt.close(ax.figure)
