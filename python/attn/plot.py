"""attn.plot — attention weights to look at: recomputed cheaply from a call's LSE, and
drawn as a heatmap with matplotlib (an optional dependency, imported only when drawing).

    o, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    w = attn.plot.weights_from_lse(q, k, lse, is_causal=True, masked_value=np.nan)
    attn.plot.heatmap(w[0, 0], tokens=["The", "cat", "sat", "down"])

What it is not: the library's blocked recomputation for long sequences (that is the C
call attn_weights_grid, behind `attn viz`); weights_from_lse is NumPy, one matrix product
per block of rows and no second softmax, and it knows the masks of PyTorch's signature
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
            vmax: Optional[float] = None, numbers: Optional[bool] = None) -> Any:
    """Draws one (L, S) matrix of weights with matplotlib and returns the Axes.

    tokens label the keys (columns) and, unless query_tokens is given, the rows when
    L == S. NaN entries (weights_from_lse(..., masked_value=np.nan)) are drawn grey, apart
    from weight 0 (white), the colours of `attn viz`. vmax: the top of the colour scale
    (default 1). numbers: print each weight in its cell (default: for at most 16 x 16).
    Raises ImportError when matplotlib is not installed (it is optional for attn).
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.colors import LinearSegmentedColormap
    except ImportError as e:  # optional dependency
        raise ImportError("attn.plot.heatmap needs matplotlib (pip install matplotlib)") from e
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError("weights: shape %s, expected (L, S)" % (w.shape,))
    L, S = w.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.45 * max(S, 4), 1.0 + 0.45 * max(L, 4)))
    # white, light, mid and dark blue: the scale of tools/heatmap.c
    cmap = LinearSegmentedColormap.from_list(
        "attn", ["#FFFFFF", "#A8C8F0", "#3870C8", "#102050"]).with_extremes(bad="#B4B4B4")
    top = 1.0 if vmax is None else vmax
    im = ax.imshow(np.ma.masked_invalid(w), cmap=cmap, vmin=0.0, vmax=top, interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, label="weight")
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
                            color="white" if w[i, j] > 0.5 * top else "black")
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return ax
