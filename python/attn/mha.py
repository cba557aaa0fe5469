"""attn.mha — the multi-head attention layer for NumPy arrays: projections through the
library's BLAS, optional rotary positions, the heads' attention, the output projection,
in one C call (attn_mha_forward; its gradients through attn_mha_backward).

    y = attn.multi_head_attention(x, num_heads=8, w_q=wq, w_k=wk, w_v=wv, w_o=wo)

What it is not: a torch.nn.Module (attn.nn.MultiheadAttention wraps this for PyTorch),
or a NumPy implementation: the arithmetic is the C library's, in float32.

Conventions (those of torch.nn.MultiheadAttention, batch first):
  x_q [B, Lq, E], x_kv [B, Lk, Ekv] (None: self-attention, keys and values from x_q);
  weights [in, out] (x @ w), or with weight_layout="out_in" PyTorch's nn.Linear
  [out, in] (read in place, so slices of a packed in_proj_weight cost no copy);
  key_padding_mask [B, Lk]: bool True = ignore that key, or float added;
  attn_mask [Lq, Lk] or [B·H, Lq, Lk]: bool True = not allowed, or float added;
  a row with no key left gives 0 (PyTorch gives NaN there).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _attn
from ._options import _INT32, integer, integers

__all__ = ["multi_head_attention"]

_ROPE = {None: 0, "none": 0, "half": 1, "neox": 1, "interleaved": 2, "gptj": 2}


def _f32(x: Any) -> Optional[np.ndarray]:
    return None if x is None else np.asarray(x, dtype=np.float32)


def _masks(B: int, H: int, Lq: int, Lk: int, key_padding_mask: Any,
           attn_mask: Any) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(bool mask true = attend, float bias), each [B|1, H|1, Lq|1, Lk] or None, from
    PyTorch's key_padding_mask and attn_mask."""
    keep, bias = None, None

    def add(m: np.ndarray) -> None:
        nonlocal keep, bias
        if m.dtype == np.bool_:
            k = ~m
            keep = k if keep is None else (keep & k)
        else:
            f = m.astype(np.float32)
            bias = f if bias is None else (bias + f)

    if key_padding_mask is not None:
        m = np.asarray(key_padding_mask)
        if m.shape != (B, Lk):
            raise ValueError("key_padding_mask: shape %s, expected (%d, %d)" % (m.shape, B, Lk))
        add(m.reshape(B, 1, 1, Lk))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.ndim == 2 and m.shape == (Lq, Lk):
            add(m.reshape(1, 1, Lq, Lk))
        elif m.ndim == 3 and m.shape == (B * H, Lq, Lk):
            add(m.reshape(B, H, Lq, Lk))
        else:
            raise ValueError("attn_mask: shape %s, expected (%d, %d) or (%d, %d, %d)"
                             % (m.shape, Lq, Lk, B * H, Lq, Lk))
    if keep is not None:
        keep = np.ascontiguousarray(keep)
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)
    return keep, bias


def _call(x_q: Any, x_kv: Any, num_heads: int, w: Tuple[Any, Any, Any, Any],
          b: Tuple[Any, Any, Any, Any], num_kv_heads: Optional[int], weight_layout: str,
          key_padding_mask: Any, attn_mask: Any, is_causal: bool, kv_len: Any,
          rope: Optional[str], rotary_dim: int, rope_base: float, rope_offset: int,
          scale: Optional[float], threads: int, **outputs: Any) -> Any:
    if weight_layout not in ("in_out", "out_in"):
        raise ValueError("weight_layout: %r, expected 'in_out' or 'out_in'" % (weight_layout,))
    if rope not in _ROPE:
        raise ValueError("rope: %r, expected None, 'half' or 'interleaved'" % (rope,))
    xq = _f32(x_q)
    xkv = _f32(x_kv)
    if xq.ndim != 3 or (xkv is not None and xkv.ndim != 3):
        raise ValueError("x_q and x_kv: expected [B, L, E] arrays")
    B, Lq = xq.shape[0], xq.shape[1]
    Lk = xkv.shape[1] if xkv is not None else Lq
    mask, bias = _masks(B, num_heads, Lq, Lk, key_padding_mask, attn_mask)
    lens = None if kv_len is None else np.ascontiguousarray(integers("kv_len", kv_len))
    return _attn._mha(
        x_q=xq, x_kv=xkv, w_q=_f32(w[0]), w_k=_f32(w[1]), w_v=_f32(w[2]), w_o=_f32(w[3]),
        b_q=_f32(b[0]), b_k=_f32(b[1]), b_v=_f32(b[2]), b_o=_f32(b[3]),
        mask=mask, bias=bias, kv_len=lens, heads=integer("num_heads", num_heads),
        kv_heads=0 if num_kv_heads is None else integer("num_kv_heads", num_kv_heads), torch_layout=weight_layout == "out_in",
        causal=bool(is_causal), scale=None if scale is None else float(scale),
        rope=_ROPE[rope], rotary_dim=integer("rotary_dim", rotary_dim), rope_base=float(rope_base),
        rope_offset=integer("rope_offset", rope_offset),
        threads=integer("threads", threads, _INT32), **outputs)


def multi_head_attention(x_q: Any, x_kv: Any = None, *, num_heads: int, w_q: Any, w_k: Any,
                         w_v: Any, w_o: Any, b_q: Any = None, b_k: Any = None,
                         b_v: Any = None, b_o: Any = None,
                         num_kv_heads: Optional[int] = None, weight_layout: str = "in_out",
                         key_padding_mask: Any = None, attn_mask: Any = None,
                         is_causal: bool = False, kv_len: Any = None,
                         need_weights: bool = False, average_attn_weights: bool = True,
                         rope: Optional[str] = None, rotary_dim: int = 0,
                         rope_base: float = 10000.0, rope_offset: int = 0,
                         scale: Optional[float] = None, threads: int = 0,
                         save: bool = False, save_into: Optional[bytearray] = None) -> Any:
    """The layer y [B, Lq, E] (float32); with need_weights, (y, weights): [B, Lq, Lk]
    averaged over heads, or [B, H, Lq, Lk] when average_attn_weights is False. With
    save, (that, saved): saved an opaque bytearray of the activations (Q, K, V, O, the
    LSE: attn_mha_forward_save) that multi_head_attention_grad(saved=...) reads instead
    of recomputing the forward; its gradients are the same. save_into: a bytearray that
    an earlier save returned and nothing reads any more, written again (and returned as
    saved) when it is large enough, so that its pages are not faulted in anew; else a
    new one is made.

    num_kv_heads (GQA) defaults to num_heads; W_Q has num_heads·Dk outputs, W_V
    num_kv_heads·Dv. rope: None, "half" (GPT-NeoX, Llama) or "interleaved" (GPT-J) on Q
    and K after projection, rotary_dim 0 meaning Dk. kv_len [B]: keys j >= kv_len[b]
    are masked. is_causal: top-left causal mask. Errors of the library raise ValueError
    (TypeError for dtypes), naming the argument.
    """
    xq = np.asarray(x_q)
    B, Lq = xq.shape[0], xq.shape[1]
    Lk = np.asarray(x_kv).shape[1] if x_kv is not None else Lq
    E = np.asarray(w_o).shape[0 if weight_layout == "out_in" else 1]
    y = np.empty((B, Lq, E), dtype=np.float32)
    weights = None
    if need_weights:
        weights = np.empty((B, 1 if average_attn_weights else num_heads, Lq, Lk),
                           dtype=np.float32)
    saved = _call(x_q, x_kv, num_heads, (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o),
                  num_kv_heads, weight_layout, key_padding_mask, attn_mask, is_causal, kv_len,
                  rope, rotary_dim, rope_base, rope_offset, scale, threads, y=y,
                  weights=weights, average=bool(average_attn_weights), keep=bool(save),
                  saved=save_into if save else None)
    res = y if not need_weights else (y, weights[:, 0] if average_attn_weights else weights)
    return (res, saved) if save else res


def multi_head_attention_grad(dy: Any, x_q: Any, x_kv: Any = None, *, num_heads: int,
                              w_q: Any, w_k: Any, w_v: Any, w_o: Any, b_q: Any = None,
                              b_k: Any = None, b_v: Any = None, b_o: Any = None,
                              num_kv_heads: Optional[int] = None,
                              weight_layout: str = "in_out", key_padding_mask: Any = None,
                              attn_mask: Any = None, is_causal: bool = False,
                              kv_len: Any = None, rope: Optional[str] = None,
                              rotary_dim: int = 0, rope_base: float = 10000.0,
                              rope_offset: int = 0, scale: Optional[float] = None,
                              threads: int = 0, dw_q: Any = None, dw_k: Any = None,
                              dw_v: Any = None, saved: Any = None) -> dict:
    """The gradients of multi_head_attention (same arguments) for dy = dLoss/dy: a dict
    with dx_q, dx_kv (absent in self-attention: dx_q holds both paths), dw_q, dw_k,
    dw_v, dw_o (in the weights' own layout) and db_q ... db_o when the biases are given.
    dw_q, dw_k, dw_v may be given as writable float32 arrays (views of one packed
    gradient, say) to be written in place. saved: what multi_head_attention(save=True)
    returned for these arguments (the forward is then not recomputed); a saved of
    another layer's shapes raises ValueError."""
    w = (w_q, w_k, w_v, w_o)
    b = (b_q, b_k, b_v, b_o)
    names = ("q", "k", "v", "o")
    given = {"q": dw_q, "k": dw_k, "v": dw_v}
    out = {"dx_q": np.empty(np.shape(x_q), dtype=np.float32)}
    if x_kv is not None:
        out["dx_kv"] = np.empty(np.shape(x_kv), dtype=np.float32)
    for n, wt, bt in zip(names, w, b):
        g = given.get(n)
        out["dw_" + n] = g if g is not None else np.empty(np.shape(wt), dtype=np.float32)
        if bt is not None:
            out["db_" + n] = np.empty(np.shape(bt), dtype=np.float32)
    _call(x_q, x_kv, num_heads, w, b, num_kv_heads, weight_layout, key_padding_mask,
          attn_mask, is_causal, kv_len, rope, rotary_dim, rope_base, rope_offset, scale,
          threads, dy=_f32(dy), grad=True, saved=saved, **out)
    return out
