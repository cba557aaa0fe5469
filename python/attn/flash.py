"""attn.flash — FlashAttention 2's Python API (flash_attn.flash_attn_interface) on attn:
flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache with FlashAttention's
signatures, layouts ([B, L, H, D]; packed [total, H, D]) and return conventions, computed
on the CPU by the library.

What it is: three thin adapters. flash_attn_func runs through
attn.scaled_dot_product_attention (align="bottom-right") and flash_attn_varlen_func through
attn.varlen_attention, and so through their torch.autograd.Functions (q, k, v that
require grad get the library's backward); flash_attn_with_kvcache runs through
attn.attention_with_kvcache (no gradient, as FlashAttention's). What it is not: the
`flash_attn` package (no module of that name is made or shadowed), a CUDA kernel, or the
transformers loader (attn.integrations.transformers.register_flash does that, with these
three functions as its FlashAttention implementation).

Return conventions, as FlashAttention's:
- flash_attn_func: out [B, Lq, Hq, Dv]; with return_attn_probs (out, softmax_lse
  [B, Hq, Lq] float32, S_dmask).
- flash_attn_varlen_func: out [total_q, Hq, Dv]; with return_attn_probs (out,
  softmax_lse [Hq, total_q] float32, S_dmask).
- flash_attn_with_kvcache: out [B, Lq, Hq, Dv]; with return_softmax_lse (out,
  softmax_lse [B, Hq, Lq] float32).
S_dmask: FlashAttention returns the (dropout-signed) probabilities as a testing aid; attn
returns None in its place (they are not formed: a caller that wants the weights calls
attn.scaled_dot_product_attention(..., return_weights=True)). softmax_lse is the natural
log-sum-exp of each row's logits (-inf for a row with no key), not differentiable.
"""
from __future__ import annotations

import sys
from typing import Any, Tuple

import numpy as np

from . import _options, scaled_dot_product_attention
from ._kvcache import attention_with_kvcache, varlen_attention_with_kvcache
from ._varlen import varlen_attention

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "flash_mla_with_kvcache", "get_mla_metadata"]


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")  # never imported here: only if the caller has it
    return torch is not None and isinstance(x, torch.Tensor)


def _wants_grad(*xs: Any) -> bool:
    """Whether autograd would record a call on these (torch tensors that require grad,
    with grad mode on)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _swap(x: Any) -> Any:
    """[B, L, H, D] <-> [B, H, L, D]: a view (torch's transpose, NumPy's swapaxes)."""
    return x.transpose(1, 2) if _is_torch(x) else np.swapaxes(x, 1, 2)


def _shape4(name: str, x: Any) -> Tuple[int, int, int, int]:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 4:
        raise ValueError("%s: expected [B, L, H, D], got shape %s" % (name, shape))
    return shape


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_func: attention of q [B, Lq, Hq, D] over k [B, Lk, Hkv, D],
    v [B, Lk, Hkv, Dv] (Hq a multiple of Hkv: grouped-query attention).

    causal and window_size (left, right; -1 = unbounded) are aligned to the bottom-right
    corner (query row i's diagonal is key i + Lk - Lq), as FlashAttention >= 2.1;
    alibi_slopes (Hq,) float32 (FlashAttention's (B, Hq) is refused: attn's slopes are per
    head); dropout_p applied whenever > 0 (pass 0.0 for inference; the mask is attn's, see
    docs/CONTRACT.md "Dropout"); deterministic accepted (attn always is).

    It is attn.scaled_dot_product_attention on the [B, H, L, D] views of q, k, v
    (transposes: read in place through their strides, no copy) with align="bottom-right"
    and enable_gqa=True, and so, under autograd, that call's Function and gradients.

    Returns out [B, Lq, Hq, Dv] (q's kind and dtype; a [B, H, L, D]-contiguous result
    seen through a transpose); with return_attn_probs (out, softmax_lse [B, Hq, Lq], None)
    — None where FlashAttention gives S_dmask.
    """
    B, Lq, Hq, D = _shape4("q", q)
    Bk, Lk, Hkv, _ = _shape4("k", k)
    if Bk != B or tuple(v.shape[:3]) != (Bk, Lk, Hkv):
        raise ValueError("q %s, k %s, v %s: expected the same B, and k and v the same "
                         "[B, Lk, Hkv]" % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    if Hkv == 0 or Hq % Hkv:
        raise ValueError("q has %d heads, k and v %d: expected a multiple" % (Hq, Hkv))
    return_attn_probs, _ = _options.flags(("return_attn_probs", "deterministic"),
                                          (return_attn_probs, deterministic))
    window = _options.window(window_size)
    got = scaled_dot_product_attention(
        _swap(q), _swap(k), _swap(v), dropout_p=dropout_p, is_causal=causal,
        scale=softmax_scale, enable_gqa=True, align="bottom-right",
        window=None if window == (-1, -1) else window, softcap=softcap,
        alibi_slopes=alibi_slopes, return_lse=return_attn_probs)
    if not return_attn_probs:
        return _swap(got)
    out, lse = got
    return _swap(out), lse, None


def _paged_rows(cache: Any, block_table: Any, cu_k: Any) -> Any:
    """The packed rows [total_k, Hkv, D] of a paged cache [num_blocks, page, Hkv, D]:
    sequence b is pages block_table[b, :] concatenated, its first cu_k[b+1] - cu_k[b] rows
    (a gather: gradients reach the pages under autograd)."""
    tl = lambda x: x.tolist() if hasattr(x, "tolist") else list(x)  # noqa: E731
    cu = [int(c) for c in tl(cu_k)]
    table = tl(block_table)
    page = cache.shape[1]
    parts = []
    for b in range(len(cu) - 1):
        n = cu[b + 1] - cu[b]
        pages = -(-n // page)
        if pages > len(table[b]):
            raise ValueError("block_table: sequence %d has %d keys, more than its %d pages of "
                             "%d hold" % (b, n, len(table[b]), page))
        idx = [int(i) for i in table[b][:pages]]
        if any(not 0 <= i < cache.shape[0] for i in idx):
            raise ValueError("block_table: sequence %d names pages %s outside the pool's %d"
                             % (b, idx, cache.shape[0]))
        rows = cache[idx] if idx else cache[:0]
        parts.append(rows.reshape(-1, *cache.shape[2:])[:n])
    if _is_torch(cache):
        return sys.modules["torch"].cat(parts) if parts else cache.reshape(-1, *cache.shape[2:])[:0]
    return np.concatenate(parts) if parts else cache.reshape(-1, *cache.shape[2:])[:0]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           *, s_aux=None, q_descale=None, k_descale=None, v_descale=None,
                           cache_dtype=None):
    """FlashAttention 2's flash_attn_varlen_func on attn.varlen_attention (the same names and
    meanings; see its docstring): q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k,
    Hkv, Dv], cu_seqlens_q / cu_seqlens_k int32 (B + 1,), causal bottom-right per
    sequence.

    block_table (B, max_pages) int32: k and v are then page pools [num_blocks,
    page_block_size, Hkv, D]; sequence b's keys are its pages in order, the first
    cu_seqlens_k[b+1] - cu_seqlens_k[b] rows: read in place by one paged call
    (attn.varlen_attention_with_kvcache) where no gradient is wanted and dropout_p is 0
    (continuous batching), else gathered into a packed copy for the call above. s_aux (keyword-only; the name transformers passes learned sinks under, as
    FlashAttention 3's vLLM build takes them): (Hq,) attention-sink logits, varlen's
    sinks, with their gradient.

    fp8 and quantized page pools (keyword-only cache_dtype, k_descale, v_descale, as
    flash_attn_with_kvcache's): only on that in-place paged path (block_table given, no
    gradient, dropout_p 0), else NotImplementedError, as is q_descale.

    Returns out [total_q, Hq, Dv]; with return_attn_probs (out, softmax_lse [Hq, total_q],
    None) — None where FlashAttention gives S_dmask.
    """
    quantized = (cache_dtype is not None or k_descale is not None or v_descale is not None
                 or str(getattr(k, "dtype", "")).startswith("torch.float8"))
    if q_descale is not None:
        raise NotImplementedError("flash_attn_varlen_func: q_descale is not supported by attn "
                                  "(q is not quantized; pass q in float32, float16 or bfloat16)")
    if quantized and (block_table is None or dropout_p != 0 or _wants_grad(q, k, v, s_aux)):
        raise NotImplementedError("flash_attn_varlen_func: fp8 and quantized caches only as "
                                  "paged pools (block_table), without gradient or dropout")
    if block_table is not None and dropout_p == 0 and not _wants_grad(q, k, v, s_aux):
        # inference (continuous batching): the pages read in place, one call for the step
        cu = cu_seqlens_k
        seqused = (cu[1:] - cu[:-1]).to(dtype=sys.modules["torch"].int32) if _is_torch(cu) \
            else (np.asarray(cu)[1:] - np.asarray(cu)[:-1]).astype(np.int32)
        got = varlen_attention_with_kvcache(
            q, k, v, cu_seqlens_q, seqused, block_table, max_seqlen_q, max_seqlen_k,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, alibi_slopes=alibi_slopes, sinks=s_aux,
            return_softmax_lse=return_attn_probs, cache_dtype=cache_dtype,
            k_scale=_descale(k_descale, "k_descale", "flash_attn_varlen_func"),
            v_scale=_descale(v_descale, "v_descale", "flash_attn_varlen_func"))
        return (got[0], got[1], None) if return_attn_probs else got
    if block_table is not None:
        k = _paged_rows(k, block_table, cu_seqlens_k)
        v = _paged_rows(v, block_table, cu_seqlens_k)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                            window_size=window_size, softcap=softcap,
                            alibi_slopes=alibi_slopes, deterministic=deterministic,
                            return_attn_probs=return_attn_probs, sinks=s_aux)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, s_aux=None, q_descale=None,
                            k_descale=None, v_descale=None, cache_dtype=None):
    """FlashAttention 2's flash_attn_with_kvcache on attn.attention_with_kvcache (see its
    docstring): q [B, Lq, Hq, D]; k_cache, v_cache [B, Lk, Hkv, D] or, with block_table
    (B, max_pages) int32, page pools [num_blocks, page_block_size, Hkv, D]; new rows k, v
    [B, n, Hkv, D] written in place at cache_seqlens[b] .. + n - 1 (cache_seqlens is read,
    never advanced), then attended to; causal bottom-right.

    Not supported (NotImplementedError, nothing written): rotary_cos / rotary_sin (apply
    the rotary embedding to q and k before the call), cache_batch_idx and cache_leftpad.
    num_splits is accepted and ignored (attn picks its own split; the result does not
    depend on it). s_aux (keyword-only): (Hq,) attention-sink logits, read as constants.
    No gradient (FlashAttention's has none either).

    fp8 caches (torch.float8_e4m3fn / float8_e5m2, or uint8 with cache_dtype=, which also
    names "q8_0" / "q4_0" caches; see attention_with_kvcache): FlashAttention 3's
    k_descale, v_descale (keyword-only; (B, Hkv), a byte x of head g of row b standing for
    x * descale[b, g]) are attention_with_kvcache's k_scale, v_scale when every batch row
    holds the same values (or a scalar); scales that vary over the batch, and q_descale
    (q is never quantized here), are NotImplementedError.

    Returns out [B, Lq, Hq, Dv]; with return_softmax_lse (out, softmax_lse [B, Hq, Lq]).
    """
    for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                    ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if x is not None:
            raise NotImplementedError("flash_attn_with_kvcache: %s is not supported by attn"
                                      % name)
    if q_descale is not None:
        raise NotImplementedError("flash_attn_with_kvcache: q_descale is not supported by attn "
                                  "(q is not quantized; pass q in float32, float16 or bfloat16)")
    return attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                  block_table=block_table, softmax_scale=softmax_scale,
                                  causal=causal, window_size=window_size, softcap=softcap,
                                  alibi_slopes=alibi_slopes,
                                  return_softmax_lse=return_softmax_lse, sinks=s_aux,
                                  cache_dtype=cache_dtype,
                                  k_scale=_descale(k_descale, "k_descale"),
                                  v_scale=_descale(v_descale, "v_descale"))


def _descale(x, name, fn="flash_attn_with_kvcache"):
    """FlashAttention 3's descale (B, Hkv) (or a scalar) as attn's per-head scale [Hkv]:
    every batch row must hold the same values (attn's scales are per tensor or per head)."""
    if x is None:
        return None
    a = np.asarray(x.detach().float().cpu().numpy() if _is_torch(x) else x, np.float32)
    if a.ndim == 0:
        return float(a)
    if a.ndim != 2:
        raise ValueError("%s: %s: expected (B, Hkv) or a scalar, got shape %s"
                         % (fn, name, a.shape))
    if a.shape[0] == 0:
        return None
    if not (a == a[:1]).all():
        raise NotImplementedError("%s: %s varies over the batch; attn's fp8 scales are per "
                                  "tensor or per key/value head" % (fn, name))
    return a[0].copy()


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, *args, **kwargs):
    """FlashMLA's get_mla_metadata, for call compatibility: FlashMLA plans its GPU tile
    schedule here; attn splits its work inside each call and needs no plan, so this
    returns (None, None), which flash_mla_with_kvcache accepts in their place."""
    return None, None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None):
    """FlashMLA's flash_mla_with_kvcache (DeepSeek's latent attention, MLA) on
    attn.attention_with_kvcache: one latent cache row per token, [c_kv (head_dim_v),
    k_rope], read as K = the whole row (Dk = k_cache.shape[-1], 576 in DeepSeek-V2/V3) and
    V = its first head_dim_v columns (512), from the same memory (a view, no copy).

    q             [B, Lq, Hq, Dk]  queries already absorbed into the latent space
    k_cache       [num_blocks, page_block_size, Hkv, Dk]  (Hkv = 1 in DeepSeek's models)
    block_table   int32 [B, max_pages]; cache_seqlens int32 [B]: the cached tokens
    head_dim_v    Dv, the width of c_kv
    tile_scheduler_metadata, num_splits: get_mla_metadata's, accepted and ignored
    softmax_scale default 1/sqrt(Dk); causal: bottom-right (a chunk of Lq new tokens
                  sees the cache and its own earlier tokens)

    Returns (out [B, Lq, Hq, Dv], softmax_lse [B, Hq, Lq] float32), as FlashMLA. Not
    supported (NotImplementedError): is_fp8_kvcache (FlashMLA's own fp8 layout) and
    indices (its sparse attention). No gradient. docs/CONTRACT.md, "Latent attention
    (MLA)".
    """
    if is_fp8_kvcache:
        raise NotImplementedError("flash_mla_with_kvcache: is_fp8_kvcache is not supported by attn")
    if indices is not None:
        raise NotImplementedError("flash_mla_with_kvcache: indices (sparse MLA) is not "
                                  "supported by attn")
    Dk = k_cache.shape[-1]
    dv = int(head_dim_v)
    if not 0 < dv <= Dk:
        raise ValueError("flash_mla_with_kvcache: head_dim_v is %d, expected 1 .. %d (the "
                         "cache's width)" % (dv, Dk))
    v_cache = k_cache[..., :dv]
    return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                  block_table=block_table, softmax_scale=softmax_scale,
                                  causal=causal, return_softmax_lse=True)
