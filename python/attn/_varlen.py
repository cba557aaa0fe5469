"""_varlen.py — attn.varlen_attention: packed (variable-length) batches with
FlashAttention's flash_attn_varlen_func argument names, layouts and meanings, on the C
library's attn_varlen_forward / attn_varlen_backward (docs/CONTRACT.md, "Packed
(variable-length) batches") through the extension's varlen_forward / varlen_backward.

What it is: the Python signature, the option checks (_options.py, as
scaled_dot_product_attention's), the result's kind, and the torch.autograd.Function whose
backward is attn_varlen_backward. What it is not: the C binding (_attn_varlen.c) or the
Hugging Face packed-sequence path (integrations/transformers.py, which calls this).
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import (_ALIGN, _PATH, _allocator, _attn, _call_seed, _dropout_path_level, _options,
               _plain, _to_query_kind, _torch_tensor_type, _traced_ops, _vector,
               _wants_autograd, _widen)

__all__ = ["varlen_attention"]


def _cu(name: str, x: Any, tt: Optional[type]) -> Any:
    """cu_seqlens: an int32 / int64 array or CPU tensor as it is (the library reads either,
    and refuses any other dtype with TypeError); a list, tuple or range as int64."""
    if isinstance(x, (list, tuple, range)):
        return _options.integers(name, x)
    return _plain(x, tt)


def _call(q, k, v, cu_q, cu_k, max_q, max_k, alibi, sinks, options, want_lse, alloc):
    """_attn.varlen_forward with the options tuple (causal, scale, align, window, softcap,
    path, level, threads, dropout_p, seed, offset)."""
    causal, scale, align, window, softcap, path, level, threads = options[:8]
    return _attn.varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, align,
                                window, softcap, alibi, want_lse, path, level, threads, alloc,
                                sinks, **_dropout_kwargs(options))


def _dropout_kwargs(options: tuple) -> dict:
    p, seed, offset = options[8:]
    return dict(dropout_p=p, dropout_seed=seed, dropout_offset=offset) if p > 0.0 else {}


_FUNCTION = None


def _varlen_function() -> Any:
    """The torch.autograd.Function behind a varlen call that needs gradients (made on
    first use: torch is never imported by this module)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    torch = sys.modules["torch"]
    from torch.autograd.function import once_differentiable  # noqa: PLC0415 — torch is loaded

    class VarlenAttention(torch.autograd.Function):
        """attn_varlen_forward with attn_varlen_backward as its gradient. Inputs: q, k, v
        (any may require grad), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        alibi_slopes (constants), options (the C arguments' tuple, see _call), sinks (may
        require grad). Outputs: the output and the LSE (non-differentiable)."""

        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, alibi, options, sinks):
            tt = torch.Tensor
            q, k, v, cu_q, cu_k, alibi = (_plain(x, tt) for x in (q, k, v, cu_q, cu_k, alibi))
            ctx.sinks_dtype = getattr(sinks, "dtype", None)
            sinks = None if sinks is None else _widen(_plain(sinks, tt), tt)
            half = q.dtype in (torch.float16, torch.bfloat16)
            base = _allocator(q, tt)

            # a 16-bit q: the output kept in float32 for the backward (as
            # scaled_dot_product_attention's Function does), the caller's rounded once
            def alloc(shape, which, dtype):
                if half and which == "output":
                    return torch.empty(shape, dtype=torch.float32)
                return base(shape, which, dtype)
            out, lse = _call(q, k, v, cu_q, cu_k, max_q, max_k, alibi, sinks, options, True,
                             alloc)
            inputs = (q, k, v, cu_q, cu_k, alibi, sinks)
            ctx.save_for_backward(*(x if isinstance(x, tt) else None for x in inputs),
                                  out, lse)
            ctx.others = tuple(None if isinstance(x, tt) else x for x in inputs)
            ctx.sizes = (max_q, max_k)
            ctx.options = options
            ctx.dtypes = (q.dtype, k.dtype, v.dtype)
            if half:
                out = out.to(q.dtype)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out, unused_lse):
            tt = torch.Tensor
            saved = [_plain(x, tt) for x in ctx.saved_tensors]
            q, k, v, cu_q, cu_k, alibi, sinks = (s if o is None else o
                                                 for s, o in zip(saved[:7], ctx.others))
            out, lse = saved[7:]
            grads = [torch.empty(x.shape, dtype=dt) if need else None
                     for need, x, dt in zip(ctx.needs_input_grad[:3], (q, k, v), ctx.dtypes)]
            d_sinks = (torch.empty(sinks.shape, dtype=torch.float32)
                       if sinks is not None and ctx.needs_input_grad[9] else None)
            causal, scale, align, window, softcap, path, level, threads = ctx.options[:8]
            _attn.varlen_backward(q, k, v, out, _plain(grad_out, tt), lse, grads[0],
                                  grads[1], grads[2], cu_q, cu_k, ctx.sizes[0], ctx.sizes[1],
                                  causal, scale, align, window, softcap, alibi, path, level,
                                  threads, sinks, d_sinks, **_dropout_kwargs(ctx.options))
            if d_sinks is not None and d_sinks.dtype != ctx.sinks_dtype:
                d_sinks = d_sinks.to(ctx.sinks_dtype)
            return tuple(grads) + (None,) * 6 + (d_sinks,)

    _FUNCTION = VarlenAttention
    return _FUNCTION


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, deterministic=False,
                     return_attn_probs=False, *, return_lse=False, sinks=None, seed=None,
                     threads=0, path="auto", precision="default"):
    """Attention over packed variable-length sequences, FlashAttention's
    flash_attn_varlen_func (the same names, layouts and meanings) on the CPU.

    Sequence s is query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and key rows
    [cu_seqlens_k[s], cu_seqlens_k[s+1]) of k and v; each is attended on its own, and the
    result is, sequence by sequence, bit for bit what scaled_dot_product_attention gives
    for that sequence alone (with align="bottom-right"). The cost is the sum of
    Lq_s * Lk_s, not B * max^2.

    Args:
        q: (total_q, Hq, D) — a NumPy array or a CPU torch tensor (or any DLPack tensor),
            any strides; float32, float16, bfloat16 or float64. The output has its kind
            and dtype.
        k: (total_k, Hkv, D), v: (total_k, Hkv, Dv), any strides; Hq a multiple of Hkv
            (grouped-query attention: query head h reads key/value head h // (Hq // Hkv)).
            k and v alike in dtype (float32, float16, bfloat16; float64 with a float64 q).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 or int64 (arrays, tensors or lists):
            0 first, non-decreasing, total_q (total_k) last. Empty sequences are legal;
            a query row with no key is fully masked (output 0, LSE -inf).
        max_seqlen_q, max_seqlen_k: ints at least every sequence's length (they also fix
            the dropout mask's layout, as the padded call [B, Hq, max_seqlen_q,
            max_seqlen_k]).
        dropout_p: the probability of dropping each attention weight, kept ones scaled by
            1 / (1 - p); applied whenever > 0 (pass 0.0 for inference).
        softmax_scale: the factor of q @ k^T; None = 1/sqrt(D).
        causal: keep key j for query row i when j <= i + Lk_s - Lq_s: the causal mask
            aligned to the bottom-right corner of each sequence, as FlashAttention (>= 2.1)
            does (not PyTorch's top-left is_causal; they agree when Lq_s = Lk_s).
        window_size: (left, right): keep keys i + Lk_s - Lq_s - left <= j <= i + Lk_s -
            Lq_s + right; -1 = unbounded on that side (FlashAttention's sliding window).
        softcap: > 0: logits become softcap * tanh(logits / softcap).
        alibi_slopes: (Hq,) float32 (a 16-bit or float64 one widened/rounded to float32):
            adds -slope[h] * |i + Lk_s - Lq_s - j| to the logits (FlashAttention's ALiBi).
        deterministic: accepted for FlashAttention's signature; attn is always
            deterministic (the same bits for any thread count).
        return_attn_probs: FlashAttention's flag: returns (out, softmax_lse, None) — the
            probabilities themselves (FlashAttention's S_dmask, a testing aid) are not
            computed by a packed call.
        return_lse (keyword-only): returns (out, softmax_lse).
        sinks (keyword-only): (Hq,) attention-sink logits (gpt-oss), as
            scaled_dot_product_attention's; their gradient is computed under autograd.
        seed: the dropout mask's seed (an int; None draws one as
            scaled_dot_product_attention does). threads, path, precision: as
            scaled_dot_product_attention's.

    Returns:
        out (total_q, Hq, Dv), of q's kind and dtype; with return_lse (or
        return_attn_probs) also softmax_lse (Hq, total_q), float32 (float64 for a float64
        q), the natural log-sum-exp of each row's logits (FlashAttention's layout).

    Autograd (PyTorch): when grad mode is on and q, k, v or sinks require grad, the call
    runs through a torch.autograd.Function whose backward is attn_varlen_backward: .grad
    of q, k, v in their own dtypes (computed in float32, rounded once), sinks' summed over
    the sequences. The LSE is not differentiable.

    Raises: ValueError for bad shapes, cu_seqlens (not from 0, decreasing, a last entry
    that is not total, a sequence longer than max_seqlen) or option values; TypeError for
    unsupported dtypes (cu_seqlens not int32/int64 included). The library's status is in
    the exception's `status` attribute; on error nothing is written.
    """
    dropout_p, path, level = _dropout_path_level(dropout_p, path, precision)
    window = _options.window(window_size)
    if window == (-1, -1):
        window = None
    threads = _options.threads(threads)
    causal, return_lse, return_attn_probs, _ = _options.flags(
        ("causal", "return_lse", "return_attn_probs", "deterministic"),
        (causal, return_lse, return_attn_probs, deterministic))
    scale = None if softmax_scale is None else _options.number("softmax_scale", softmax_scale)
    softcap = _options.number("softcap", softcap)
    max_q = _options.integer("max_seqlen_q", max_seqlen_q)
    max_k = _options.integer("max_seqlen_k", max_seqlen_k)
    alibi_slopes = _options.sequence("alibi_slopes", alibi_slopes, "float")
    sinks = _options.sequence("sinks", sinks, "float")

    tt = _torch_tensor_type()
    cu_q, cu_k = _cu("cu_seqlens_q", cu_seqlens_q, tt), _cu("cu_seqlens_k", cu_seqlens_k, tt)
    # refuses slopes that require grad (no gradient for them) before they are read
    grad = tt is not None and _wants_autograd(q, k, v, None, alibi_slopes, tt, sinks)
    ops = _traced_ops(tt, q, k, v, sinks)
    seed = _call_seed(seed, dropout_p, q, tt, ops)
    options = (causal, scale, _ALIGN["bottom-right"], window, softcap, _PATH[path], level,
               threads, dropout_p, seed, 0)
    want_lse = return_lse or return_attn_probs
    if ops is None and alibi_slopes is not None:
        alibi_slopes = _widen(_plain(_vector(alibi_slopes, np.float32), tt), tt)
    if ops is not None:  # torch.compile, torch.export: the custom op attn::varlen
        out, lse = ops.public_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                                     alibi_slopes, sinks, options)
    elif grad:
        out, lse = _varlen_function().apply(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes,
                                            options, sinks)
    else:
        q, k, v = _plain(q, tt), _plain(k, tt), _plain(v, tt)
        if sinks is not None:
            sinks = _widen(_plain(sinks, tt), tt)
        out, lse = _call(q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, sinks, options,
                         want_lse, _allocator(q, tt))
        out = _to_query_kind(out, q)
        lse = None if lse is None else _to_query_kind(lse, q)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out
