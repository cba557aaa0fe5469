"""attn.plot — attention weights to look at: recomputed cheaply from a call's LSE, and
drawn as a heatmap with matplotlib (an optional dependency, imported only when drawing).

    o, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    w = attn.plot.weights_from_lse(q, k, lse, is_causal=True, masked_value=np.nan)
    attn.plot.heatmap(w[0, 0], tokens=["The", "cat", "sat", "down"])

For long sequences the library's blocked recomputation (the C call attn_weights_grid,
behind `attn viz`) is attn.weights_grid; heatmap draws its grid with the token positions
on the axes:

    g = attn.weights_grid(q, k, lse, rows=256, cols=256, is_causal=True, reduce="max")
    attn.plot.heatmap(g[0, 0], lengths=(100000, 100000), scale="log")

What it is not: weights_from_lse is NumPy, one matrix product per block of rows and no
second softmax, for checking and short calls; it knows the masks of PyTorch's signature
(attn_mask, is_causal, scale) only.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["weights_from_lse", "heatmap"]


def weights_from_lse(query: Any, key: Any, lse: Any, attn_mask: Any = None,
                     is_causal: bool = False, scale: Optional[float] = None, *,
                     masked_value: float = 0.0, rows: int = 1024) -> np.ndarray:
    """The attention weights exp(scale * query @ key^T + attn_mask - lse) of a call whose
    log-sum-exp is lse (return_lse=True), float32, shape (..., L, S).

    query (..., L, D), key (..., S, D) and lse (..., L) broadcast in their leading
    dimensions; attn_mask (bool, True = attend, or float added to the logits) and
    is_causal (top-left) as in the call. Masked entries get masked_value (0, as the
    library's weights; np.nan lets heatmap() draw them apart from weight 0). Computed in
    float64, `rows` query rows at a time: no softmax, no (L, S) intermediate beyond the
    result itself.
    """
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    L, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = (1.0 / np.sqrt(D) if D > 0 else 1.0) if scale is None else float(scale)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], lse.shape[:-1])
    out = np.empty(lead + (L, S), dtype=np.float32)
    mask = None if attn_mask is None else np.asarray(attn_mask)
    for i0 in range(0, L, max(1, rows)):
        i1 = min(L, i0 + max(1, rows))
        s = scale * (q[..., i0:i1, :] @ np.swapaxes(k, -1, -2))
        keep = np.ones(s.shape[-2:], dtype=bool)
        if is_causal:
            keep &= np.arange(S)[None, :] <= np.arange(i0, i1)[:, None]
        if mask is not None:
            m = np.broadcast_to(mask, lead + (L, S))[..., i0:i1, :] if mask.ndim > 2 else \
                np.broadcast_to(mask, (L, S))[i0:i1]
            if m.dtype == bool:
                keep = keep & m
            else:
                s = s + m
        s = np.where(keep, s, -np.inf)
        p = np.exp(s - lse[..., i0:i1, None])
        out[..., i0:i1, :] = np.where(np.isneginf(s), masked_value, p)
    return out


def heatmap(weights: Any, tokens: Optional[Sequence[str]] = None, *, ax: Any = None,
            query_tokens: Optional[Sequence[str]] = None, title: Optional[str] = None,
            vmax: Optional[float] = None, numbers: Optional[bool] = None,
            scale: str = "linear", vmin: Optional[float] = None,
            lengths: Optional[Sequence[int]] = None) -> Any:
    """Draws one (L, S) matrix of weights with matplotlib and returns the Axes.

    tokens label the keys (columns) and, unless query_tokens is given, the rows when
    L == S. NaN and -inf entries (weights_from_lse(..., masked_value=np.nan), or the
    masked cells of attn.weights_grid) are drawn grey, apart from weight 0 (white), the
    colours of `attn viz`. vmax: the top of the colour scale (default 1, or the largest
    value for a grid of blocks). scale="log": colours by log10 from vmin (default: the
    smallest positive value, at least vmax * 1e-6) to vmax, values at or below vmin
    (0 included) white, as `attn viz --colour-scale log`. lengths=(Lq, Lk): the matrix is
    a grid of blocks of a longer call (attn.weights_grid): the axes show token positions
    0..Lq and 0..Lk, and tokens are not drawn. numbers: print each weight in its cell
    (default: for at most 16 x 16 single weights). Raises ImportError when matplotlib is
    not installed (it is optional for attn).
    """
    if scale not in ("linear", "log"):
        raise ValueError("scale: %r, expected 'linear' or 'log'" % (scale,))
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError("weights: shape %s, expected (L, S)" % (w.shape,))
    L, S = w.shape
    blocks = lengths is not None
    if blocks and (len(lengths) != 2 or lengths[0] < L or lengths[1] < S):
        raise ValueError("lengths: %r, expected (Lq, Lk) with Lq >= %d and Lk >= %d"
                         % (lengths, L, S))
    fin = np.isfinite(w)
    top = vmax if vmax is not None else (
        float(w[fin].max()) if blocks and fin.any() and w[fin].max() > 0 else 1.0)
    low = None
    if scale == "log":
        pos = w[fin & (w > 0)]
        low = vmin if vmin is not None else max(float(pos.min()) if pos.size else 0.0, top * 1e-6)
        if not 0 < low < top:
            raise ValueError("vmin: %r, expected 0 < vmin < vmax = %g" % (low, top))
    try:
        import matplotlib.pyplot as plt
        from matplotlib.colors import LinearSegmentedColormap, LogNorm, Normalize
    except ImportError as e:  # optional dependency
        raise ImportError("attn.plot.heatmap needs matplotlib (pip install matplotlib)") from e
    if ax is None:
        n = 16 if blocks else max(S, 4)
        _, ax = plt.subplots(figsize=(1.2 + 0.45 * min(n, 16), 1.0 + 0.45 * min(max(L, 4), 16)))
    # white, light, mid and dark blue: the scale of tools/attn/heatmap.c
    cmap = LinearSegmentedColormap.from_list(
        "attn", ["#FFFFFF", "#A8C8F0", "#3870C8", "#102050"]).with_extremes(bad="#B4B4B4")
    shown = np.ma.masked_invalid(w)
    if scale == "log":
        # at or below vmin (0 too) the bottom colour, white; masked cells stay grey
        shown = np.ma.masked_invalid(np.where(fin & (w < low), low, w))
        norm = LogNorm(vmin=low, vmax=top, clip=True)
    else:
        norm = Normalize(vmin=0.0, vmax=top)
    extent = None if not blocks else (0, lengths[1], lengths[0], 0)
    im = ax.imshow(shown, cmap=cmap, norm=norm, interpolation="nearest", extent=extent,
                   aspect="auto" if blocks else None)
    ax.figure.colorbar(im, ax=ax, label="weight" + (" (log scale)" if scale == "log" else ""))
    if blocks:
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        if title:
            ax.set_title(title)
        return ax
    rows = query_tokens if query_tokens is not None else (tokens if tokens is not None and L == S else None)
    if tokens is not None:
        if len(tokens) != S:
            raise ValueError("tokens: %d labels, expected one per key (S = %d)" % (len(tokens), S))
        ax.set_xticks(range(S), labels=list(tokens), rotation=90)
    if rows is not None:
        if len(rows) != L:
            raise ValueError("query_tokens: %d labels, expected one per row (L = %d)" % (len(rows), L))
        ax.set_yticks(range(L), labels=list(rows))
    if numbers if numbers is not None else max(L, S) <= 16:
        for i in range(L):
            for j in range(S):
                if np.isfinite(w[i, j]):
                    ax.text(j, i, "%.2f" % w[i, j], ha="center", va="center", fontsize=8,
                            color="white" if norm(w[i, j]) > 0.5 else "black")
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return ax
