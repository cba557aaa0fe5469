"""attn.nn — PyTorch modules over the attn library (importing it imports torch).

MultiheadAttention has torch.nn.MultiheadAttention's constructor, parameters (so its
state_dict loads into this one and back), forward signature and results, computed by the
library's multi-head module (attn_mha_forward, attn_mha_backward through a
torch.autograd.Function) in float32 on the CPU.

Dropout while training, add_bias_kv, add_zero_attn and a key that is not the value
(kdim != vdim) take a composed path (python/attn/_nn_extra.py): PyTorch's F.linear
projections around the library's attention (attn.scaled_dot_product_attention, its
dropout and sinks, with autograd). decode() is the layer's cached decoding step
(attn.mha_decode) on the module's weights.

What it is not (each raises NotImplementedError rather than computing something else):
tensors on another device. Differences: a row whose keys are all masked gives 0, where
PyTorch gives NaN; dropout's mask is the library's (Philox), not PyTorch's.
"""
from __future__ import annotations

import collections
from typing import Optional, Tuple

import numpy as np
import torch

from . import _nn_extra
from .mha import multi_head_attention, multi_head_attention_grad

__all__ = ["MultiheadAttention"]


def _np(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    if t is None:
        return None
    if t.device.type != "cpu":
        raise NotImplementedError("attn.nn: tensors on %s (the library runs on the CPU)"
                                  % t.device)
    return t.detach().to(torch.float32).numpy()


def _mask(m: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    """a PyTorch mask as NumPy: bool kept (True = ignore, PyTorch's sense), float32 else"""
    if m is None:
        return None
    return m.cpu().numpy() if m.dtype == torch.bool else _np(m)


class _Lease:
    """A saved-activations bytearray on loan to one autograd graph: handed back to its
    module's pool when the graph lets go of it (after its backward, or when the graph is
    freed without one), never while a graph can still read it."""

    __slots__ = ("buf", "pool")

    def __init__(self, buf: bytearray, pool: "collections.deque") -> None:
        self.buf, self.pool = buf, pool

    def __del__(self) -> None:
        self.pool.append(self.buf)  # deque(maxlen=2): the oldest beyond two is dropped


def _pool(mod: torch.nn.Module) -> "collections.deque":
    """mod's free saved buffers (deque append / pop are atomic: safe from any thread and
    from a finalizer)"""
    p = mod.__dict__.get("_attn_saved_pool")
    if p is None:
        p = mod.__dict__.setdefault("_attn_saved_pool", collections.deque(maxlen=2))
    return p


class _MhaFunction(torch.autograd.Function):
    """(x_q, x_kv or None, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o) -> y, with the
    weights in PyTorch's [out, in] layout and the call's options in a dict."""

    @staticmethod
    def forward(ctx, opts, x_q, x_kv, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o):
        arrays = [_np(t) for t in (x_q, x_kv, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)]
        ctx.save_for_backward(x_q, x_kv, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)
        # a backward to come keeps the forward's activations rather than recomputing them
        # in a buffer of the module's pool: one no graph reads any more, its pages kept
        save = any(ctx.needs_input_grad)
        pool = opts.pop("pool")
        ctx.opts = opts
        reuse = None
        if save:
            try:
                reuse = pool.pop()
            except IndexError:
                pass
        res = multi_head_attention(
            arrays[0], arrays[1], w_q=arrays[2], w_k=arrays[3], w_v=arrays[4],
            w_o=arrays[5], b_q=arrays[6], b_k=arrays[7], b_v=arrays[8], b_o=arrays[9],
            weight_layout="out_in", save=save, save_into=reuse, **opts)
        if save:
            res, buf = res
            ctx.attn_saved = _Lease(buf, pool)
        y, weights = res if opts["need_weights"] else (res, np.zeros(0, np.float32))
        weights = torch.from_numpy(np.ascontiguousarray(weights)).to(x_q.dtype)
        ctx.mark_non_differentiable(weights)
        return torch.from_numpy(y).to(x_q.dtype), weights

    @staticmethod
    def backward(ctx, dy, dweights):
        saved = ctx.saved_tensors
        arrays = [_np(t) for t in saved]
        lease = getattr(ctx, "attn_saved", None)
        opts = {k: v for k, v in ctx.opts.items()
                if k not in ("need_weights", "average_attn_weights")}
        g = multi_head_attention_grad(
            _np(dy.contiguous()), arrays[0], arrays[1], w_q=arrays[2], w_k=arrays[3],
            w_v=arrays[4], w_o=arrays[5], b_q=arrays[6], b_k=arrays[7], b_v=arrays[8],
            b_o=arrays[9], weight_layout="out_in", saved=lease.buf if lease else None,
            **opts)
        # the buffer back to the pool; a second backward (retain_graph) recomputes
        if lease is not None:
            del ctx.attn_saved, lease

        def back(name, like):
            if like is None or name not in g:
                return None
            return torch.from_numpy(np.ascontiguousarray(g[name])).to(like.dtype)

        x_q, x_kv = saved[0], saved[1]
        return (None, back("dx_q", x_q), back("dx_kv", x_kv),
                back("dw_q", saved[2]), back("dw_k", saved[3]), back("dw_v", saved[4]),
                back("dw_o", saved[5]), back("db_q", saved[6]), back("db_k", saved[7]),
                back("db_v", saved[8]), back("db_o", saved[9]))


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention on the attn library (see the module's docstring)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError("embed_dim and num_heads must be greater than 0, got %d and %d"
                             % (embed_dim, num_heads))
        if embed_dim % num_heads != 0:
            raise ValueError("embed_dim must be divisible by num_heads")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        P = torch.nn.Parameter
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = P(torch.empty((embed_dim, embed_dim), **factory))
            self.k_proj_weight = P(torch.empty((embed_dim, self.kdim), **factory))
            self.v_proj_weight = P(torch.empty((embed_dim, self.vdim), **factory))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = P(torch.empty((3 * embed_dim, embed_dim), **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = P(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:  # learned K and V rows appended to every sequence (_nn_extra.py)
            self.bias_k = P(torch.empty((1, 1, embed_dim), **factory))
            self.bias_v = P(torch.empty((1, 1, embed_dim), **factory))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            torch.nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            torch.nn.init.xavier_uniform_(self.q_proj_weight)
            torch.nn.init.xavier_uniform_(self.k_proj_weight)
            torch.nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            torch.nn.init.xavier_normal_(self.bias_k)
            torch.nn.init.xavier_normal_(self.bias_v)

    def __getstate__(self):
        """the module's state without its pool of saved buffers (scratch, not state)"""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state.pop("_attn_saved_pool", None)
        return state

    def _weights(self):
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        return wq, wk, wv, self.out_proj.weight, bq, bk, bv, self.out_proj.bias

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None,
                average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if _nn_extra.needs_composed(self, key, value):  # dropout, bias_kv, zero attn, k != v
            return _nn_extra.forward(self, query, key, value, key_padding_mask,
                                     bool(need_weights), attn_mask,
                                     bool(average_attn_weights), bool(is_causal))
        unbatched = query.dim() == 2
        self_attn = query is key
        if unbatched:
            query, key = query.unsqueeze(1), key.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if not self.batch_first or unbatched:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        opts = dict(num_heads=self.num_heads, need_weights=bool(need_weights),
                    average_attn_weights=bool(average_attn_weights),
                    key_padding_mask=_mask(key_padding_mask), attn_mask=_mask(attn_mask),
                    is_causal=bool(is_causal and attn_mask is None), pool=_pool(self))
        y, weights = _MhaFunction.apply(opts, query, None if self_attn else key,
                                        *self._weights())
        if not self.batch_first or unbatched:
            y = y.transpose(0, 1)
        if not need_weights:
            return (y.squeeze(1) if unbatched else y), None
        if unbatched:
            y, weights = y.squeeze(1), weights.squeeze(0)
        return y, weights

    def new_cache(self, batch: int, max_len: int, dtype=None):
        """A zeroed contiguous attn.KVCache for decode(): torch tensors [batch, max_len,
        num_heads, head_dim] of dtype (float32 by default; float16 or bfloat16 work)."""
        return _nn_extra.new_cache(self, batch, max_len, dtype)

    def decode(self, x: torch.Tensor, cache) -> torch.Tensor:
        """One cached decoding step of this (self-attention) layer: x holds the n new
        tokens of each sequence ([B, n, E] when batch_first, else [n, B, E]; or [n, E]),
        projected, appended to cache (an attn.KVCache, contiguous or paged) at positions
        cache.len[b] + i, attended with causal alignment over every cached row, projected
        out; cache.len advances by n. A loop of steps gives forward(x, x, x) with a
        causal attn_mask over the whole sequence. float32 result, no gradient."""
        return _nn_extra.decode(self, x, cache)
