"""_kvcache.py — attn.attention_with_kvcache: decoding against a key/value cache, contiguous
or paged (attn_options.block_table, attn_kv_append; docs/CONTRACT.md "A paged KV cache"),
with FlashAttention's flash_attn_with_kvcache argument names and layouts.

It calls the C library through ctypes on the extension module's own shared object (as
_additive.py does), so the extension's C code is untouched. The caches, q and the
output are read and written in place through their strides (NumPy arrays and, where the
caller has imported PyTorch, CPU torch tensors); only the new rows k, v are converted
to float32 when they are not already (attn_kv_append reads float32). What it is not: a
cache manager — the caller owns the pages, the block table and the lengths, and
cache_seqlens is read, never advanced (FlashAttention's convention).
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _torch_tensor_type, _traced_ops
from ._additive import _Options, _Tensor, _check, _lib
from ._options import _INT32, integer, integers, window

_F32, _F16, _BF16, _BOOL, _I32, _I64 = 0, 1, 2, 3, 4, 5
_P = ctypes.c_void_p
_lib.attn_forward.argtypes = [_P] * 5
_lib.attn_forward.restype = ctypes.c_int
_lib.attn_forward_workspace_size.argtypes = [_P] * 6
_lib.attn_forward_workspace_size.restype = ctypes.c_int
_lib.attn_kv_append.argtypes = [_P] * 7
_lib.attn_kv_append.restype = ctypes.c_int

_NP_DT = {"float32": _F32, "float16": _F16, "bfloat16": _BF16, "int32": _I32, "int64": _I64}


def _torch():
    return sys.modules.get("torch")  # never imported here: only if the caller has it


def _is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


class _View:
    """A NumPy array or CPU torch tensor as (address, attn dtype, shape, element strides),
    without a copy; holds a reference for the call's duration."""

    def __init__(self, x: Any, name: str, writable: bool = False):
        self.obj = x
        if _is_torch(x):
            if x.device.type != "cpu":
                raise ValueError("%s: a CPU tensor is expected, got device %s" % (name, x.device))
            dt = str(x.dtype).replace("torch.", "")
            self.addr, self.shape, self.strides = x.data_ptr(), tuple(x.shape), tuple(x.stride())
        else:
            if not isinstance(x, np.ndarray):
                raise TypeError("%s: a NumPy array or torch tensor is expected, got %s"
                                % (name, type(x).__name__))
            if writable and not x.flags.writeable:
                raise ValueError("%s: the array is read-only and is written in place" % name)
            dt = x.dtype.name
            isz = x.dtype.itemsize
            if any(s % isz for s in x.strides):
                raise ValueError("%s: strides %s are not whole elements" % (name, x.strides))
            self.addr = x.ctypes.data
            self.shape, self.strides = x.shape, tuple(s // isz for s in x.strides)
        if dt not in _NP_DT:
            raise TypeError("%s: dtype %s is not supported (float32, float16, bfloat16; int32 "
                            "or int64 for indices)" % (name, dt))
        self.dtype = _NP_DT[dt]

    def tensor(self, shape4, strides4) -> _Tensor:
        return _Tensor(self.addr if all(shape4) else None, self.dtype,
                       (ctypes.c_int64 * 4)(*shape4), (ctypes.c_int64 * 4)(*strides4))

    def bshd(self, name: str) -> _Tensor:
        """[B, L, H, D] read as attn's [B, H, L, D] through strides."""
        if len(self.shape) != 4:
            raise ValueError("%s: expected 4 dimensions [B, L, H, D], got shape %s"
                             % (name, self.shape))
        s, st = self.shape, self.strides
        return self.tensor((s[0], s[2], s[1], s[3]), (st[0], st[2], st[1], st[3]))


def _index(x: Any, name: str, ndim: int) -> Tuple[_View, Any]:
    """An int32 / int64 index array (copied to int32 when it is another integer type)."""
    dt = str(getattr(x, "dtype", "")).replace("torch.", "")
    if dt not in ("int32", "int64"):  # other integer types converted, within int32 only
        x = integers(name, x, _INT32, np.int32)
    v = _View(x, name)
    if v.dtype not in (_I32, _I64) or len(v.shape) != ndim:
        raise ValueError("%s: an int32 array of %d dimension(s) is expected" % (name, ndim))
    return v, x


def _f32_rows(x: Any, name: str) -> _View:
    """New K or V rows [B, n, Hkv, D] as float32 (a copy only when they are not)."""
    if _is_torch(x):
        if x.dtype != _torch().float32:
            x = x.float()
    elif not (isinstance(x, np.ndarray) and x.dtype == np.float32):
        x = np.asarray(x, dtype=np.float32)
    return _View(x, name)


def _head_vector(x: Any, name: str, Hq: int, keep: list) -> int:
    """A float32 [Hq] vector (a list, NumPy array or torch tensor, read as a constant) as an
    attn_tensor {Hq, 1, 1, 1}: its address (the arrays kept alive in keep)."""
    a = np.ascontiguousarray(x.detach().float().cpu().numpy() if _is_torch(x) else x, np.float32)
    if a.shape != (Hq,):
        raise ValueError("%s: expected shape (%d,), got %s" % (name, Hq, a.shape))
    t = _Tensor(a.ctypes.data, _F32, (ctypes.c_int64 * 4)(Hq, 1, 1, 1),
                (ctypes.c_int64 * 4)(1, 0, 0, 0))
    keep += [a, t]
    return ctypes.addressof(t)


def attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any = None, v: Any = None,
                           cache_seqlens: Any = None, block_table: Any = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Any = None, return_softmax_lse: bool = False,
                           sinks: Any = None, return_key_scores: bool = False):
    """out = attention of q over the cache, FlashAttention's flash_attn_with_kvcache.

    q            [B, Lq, Hq, D]  float32, float16 or bfloat16
    k_cache      [B, Lk, Hkv, D], or with block_table the page pool
                 [num_pages, page_size, Hkv, D] (any strides: a [num_pages, Hkv,
                 page_size, D] pool passed as its transpose(1, 2) view works too)
    v_cache      the same for V
    k, v         optional new rows [B, n, Hkv, D]: written in place into the cache at
                 positions cache_seqlens[b] .. + n - 1 (through block_table when given),
                 converted to the cache's dtype; then attended to with the others
    cache_seqlens int32 [B] (or an int): the tokens already in the cache; None = all Lk
                 (no k, v)
    block_table  int32 [B, max_pages]: page p of sequence b is pool page block_table[b, p]
    causal       bottom-right causal (query row i sees keys up to Lk_b - Lq + i)
    window_size  (left, right), -1 = unbounded; alibi_slopes float32 [Hq]
    sinks        float32 [Hq] (or a list; a 16-bit tensor widened): attention sinks, one
                 logit per query head in each row's denominator with no value
                 (attn_options.sinks; docs/CONTRACT.md, "Attention sinks"); the LSE
                 includes them. Read as constants here (no gradient through this call)
    return_key_scores  also return the eviction scores [B, Hkv, Lk] float32: the attention
                 mass each cached key received over the call's rows and the query heads
                 of its key/value head (attn_options.key_scores; docs/CONTRACT.md,
                 "Eviction scores"); Lk = the cache's rows (max_pages * page_size paged)
    Returns out [B, Lq, Hq, D] (q's dtype), and with return_softmax_lse also the
    natural-log LSE [B, Hq, Lq] float32, then with return_key_scores the scores.
    NumPy in, NumPy out; torch in, torch out.
    Under torch.compile and torch.export the call is the custom op attn::kvcache (which
    writes k_cache and v_cache in place); as in eager, no gradient flows through it.
    """
    ops = None if return_key_scores else _traced_ops(_torch_tensor_type(), q, k_cache, v_cache, k, v)
    if ops is not None:  # torch.compile, torch.export: the custom op attn::kvcache
        return ops.public_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  return_softmax_lse, sinks)
    return _attend(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, return_softmax_lse, sinks,
                   return_key_scores)


def _attend(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
            window_size, softcap, alibi_slopes, return_softmax_lse, sinks,
            return_key_scores=False):
    """attention_with_kvcache's work, on NumPy arrays or CPU torch tensors (eager, or the
    real implementation of attn::kvcache)."""
    qv = _View(q, "q")
    if (k is None) != (v is None):
        raise ValueError("k and v: give both or neither")
    # the caches are written only when there are rows to append: a read-only (say
    # memory-mapped) cache is fine for k = v = None
    kc = _View(k_cache, "k_cache", k is not None)
    vc = _View(v_cache, "v_cache", k is not None)
    if len(qv.shape) != 4:
        raise ValueError("q: expected [B, Lq, Hq, D], got shape %s" % (qv.shape,))
    B, Lq, Hq, D = qv.shape
    tk, tv = kc.bshd("k_cache"), vc.bshd("v_cache")  # (B | num_pages, Hkv, Lk | page_size, D)
    keep = [qv, kc, vc]
    tbt = None
    if block_table is not None:
        bv, bx = _index(block_table, "block_table", 2)
        keep += [bv, bx]
        tbt = bv.tensor((bv.shape[0], bv.shape[1], 1, 1), (bv.strides[0], bv.strides[1], 0, 0))
    Lk = tk.shape[2] * (tbt.shape[1] if tbt is not None else 1)
    n = 0
    tlen = None
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, (int, float, np.number)):
            cache_seqlens = np.full((B,), integer("cache_seqlens", cache_seqlens, _INT32),
                                    np.int32)
        lv, lx = _index(cache_seqlens, "cache_seqlens", 1)
        keep += [lv, lx]
        tlen = lv.tensor((lv.shape[0], 1, 1, 1), (lv.strides[0], 0, 0, 0))
    if k is not None:
        if tlen is None:
            raise ValueError("k, v: cache_seqlens is required to append")
        kn, vn = _f32_rows(k, "k"), _f32_rows(v, "v")
        keep += [kn, vn]
        tkn, tvn = kn.bshd("k"), vn.bshd("v")
        n = tkn.shape[2]
    opt = _Options()
    if tlen is not None:
        lens = (np.asarray(lx.cpu().numpy() if _is_torch(lx) else lx, np.int64).reshape(-1) + n)
        keep.append(lens)
        tl2 = _Tensor(lens.ctypes.data if lens.size else None, _I64,
                      (ctypes.c_int64 * 4)(lens.shape[0], 1, 1, 1), (ctypes.c_int64 * 4)(1, 0, 0, 0))
        keep.append(tl2)
        opt.kv_len = ctypes.addressof(tl2)
    if tbt is not None:
        opt.block_table = ctypes.addressof(tbt)
    if softmax_scale is not None:
        opt.has_scale, opt.scale = True, float(softmax_scale)
    opt.causal = bool(causal)
    opt.align = 1  # bottom-right: what a cache needs (FlashAttention's convention)
    left, right = window(window_size)
    if left != -1 or right != -1:
        opt.has_window, opt.window_left, opt.window_right = True, left, right
    opt.softcap = float(softcap)
    if alibi_slopes is not None:
        opt.alibi_slopes = _head_vector(alibi_slopes, "alibi_slopes", Hq, keep)
    if sinks is not None:
        opt.sinks = _head_vector(sinks, "sinks", Hq, keep)
    Dv = tv.shape[3]
    if _is_torch(q):
        torch = _torch()
        out = torch.empty((B, Lq, Hq, Dv), dtype=q.dtype)
        lse = torch.empty((B, Hq, Lq), dtype=torch.float32)
    else:
        out = np.empty((B, Lq, Hq, Dv), q.dtype)
        lse = np.empty((B, Hq, Lq), np.float32)
    ov, lsv = _View(out, "out", True), _View(lse, "lse", True)
    to = ov.bshd("out")
    tls = lsv.tensor((B, Hq, Lq, 1), (lsv.strides[0], lsv.strides[1], lsv.strides[2], 1))
    if return_softmax_lse:
        opt.lse = ctypes.addressof(tls)
    if return_key_scores:
        Hkv = tk.shape[1]
        ks = (_torch().empty((B, Hkv, Lk), dtype=_torch().float32) if _is_torch(q)
              else np.empty((B, Hkv, Lk), np.float32))
        ksv = _View(ks, "key_scores", True)
        tks = ksv.tensor((B, Hkv, Lk, 1), (ksv.strides[0], ksv.strides[1], ksv.strides[2], 1))
        keep += [ksv, tks]
        opt.key_scores = ctypes.addressof(tks)
    tq = qv.bshd("q")
    if k is not None:
        # Every check of the attention before the append writes the cache (on error
        # nothing is written): the workspace query checks the shapes and options, and a
        # call with no query row (which writes nothing) the data the query does not read,
        # the key lengths after the append and the pages they reach.
        size = ctypes.c_size_t(0)
        _check(_lib.attn_forward_workspace_size(ctypes.byref(tq), ctypes.byref(tk),
                                                ctypes.byref(tv), ctypes.byref(to),
                                                ctypes.byref(opt), ctypes.byref(size)),
               "attention_with_kvcache")
        tq0 = _Tensor(None, tq.dtype, (ctypes.c_int64 * 4)(B, Hq, 0, D), tq.stride)
        to0 = _Tensor(None, to.dtype, (ctypes.c_int64 * 4)(B, Hq, 0, Dv), to.stride)
        dry = _Options.from_buffer_copy(opt)
        dry.lse = None
        dry.key_scores = None
        _check(_lib.attn_forward(ctypes.byref(tq0), ctypes.byref(tk), ctypes.byref(tv),
                                 ctypes.byref(to0), ctypes.byref(dry)), "attention_with_kvcache")
        _check(_lib.attn_kv_append(ctypes.byref(tkn), ctypes.byref(tvn), ctypes.byref(tk),
                                   ctypes.byref(tv), None,
                                   ctypes.byref(tbt) if tbt is not None else None,
                                   ctypes.byref(tlen)), "attention_with_kvcache (append)")
    _check(_lib.attn_forward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                             ctypes.byref(to), ctypes.byref(opt)), "attention_with_kvcache")
    del keep
    got = (out,) + ((lse,) if return_softmax_lse else ()) + ((ks,) if return_key_scores else ())
    return got if len(got) > 1 else out


_lib.attn_varlen_forward.argtypes = [_P] * 6 + [ctypes.c_int64, ctypes.c_int64, _P]
_lib.attn_varlen_forward.restype = ctypes.c_int


def varlen_attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, cu_seqlens_q: Any,
                                  seqused_k: Any, block_table: Any, max_seqlen_q: int,
                                  max_seqlen_k: int, softmax_scale: Optional[float] = None,
                                  causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                                  softcap: float = 0.0, alibi_slopes: Any = None,
                                  sinks: Any = None, mask: Any = None,
                                  return_softmax_lse: bool = False):
    """A server's whole step in one call: B requests, request b bringing the query rows
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) (1 for a decode, many for a chunk of prefill)
    against its own paged cache of seqused_k[b] keys (the new rows already appended),
    as vLLM's flash_attn_varlen_func(..., seqused_k=, block_table=) with cu_seqlens_k None.

    q            [total_q, Hq, D]  float32, float16 or bfloat16
    k_cache      page pool [num_pages, page_size, Hkv, D] (any strides; float32, float16,
                 bfloat16); v_cache the same with Dv
    cu_seqlens_q int32 (B + 1,); seqused_k int32 (B,): each request's keys
    block_table  int32 [B, max_pages]
    max_seqlen_q, max_seqlen_k   at least every request's rows, keys
    causal       bottom-right per request: row i of request b sees keys up to
                 seqused_k[b] - Lq_b + i
    mask         bool [B, 1 or Hq, max_seqlen_q, max_pages * page_size] (True = attend),
                 request b's rows are its first Lq_b rows: a speculative-decoding tree
                 (each draft token sees the cache and its ancestors) is this mask
    window_size, softcap, alibi_slopes [Hq], sinks [Hq]: as attention_with_kvcache's
    Returns out [total_q, Hq, Dv] (q's dtype); with return_softmax_lse also the LSE
    [Hq, total_q] float32. Bit for bit the requests as separate attention_with_kvcache
    calls. No gradient (inference). docs/CONTRACT.md, "Many requests in one call".
    """
    qv = _View(q, "q")
    if len(qv.shape) != 3:
        raise ValueError("q: expected [total_q, Hq, D], got shape %s" % (qv.shape,))
    total_q, Hq, D = qv.shape
    kc, vc = _View(k_cache, "k_cache"), _View(v_cache, "v_cache")
    tk, tv = kc.bshd("k_cache"), vc.bshd("v_cache")  # (num_pages, Hkv, page_size, D)
    cv, cx = _index(cu_seqlens_q, "cu_seqlens_q", 1)
    sv, sx = _index(seqused_k, "seqused_k", 1)
    bv, bx = _index(block_table, "block_table", 2)
    keep = [qv, kc, vc, cv, cx, sv, sx, bv, bx]
    B = cv.shape[0] - 1
    tcu = cv.tensor((cv.shape[0], 1, 1, 1), (cv.strides[0], 0, 0, 0))
    tlen = sv.tensor((sv.shape[0], 1, 1, 1), (sv.strides[0], 0, 0, 0))
    tbt = bv.tensor((bv.shape[0], bv.shape[1], 1, 1), (bv.strides[0], bv.strides[1], 0, 0))
    keep += [tcu, tlen, tbt]
    opt = _Options()
    opt.block_table = ctypes.addressof(tbt)
    opt.kv_len = ctypes.addressof(tlen)
    if softmax_scale is not None:
        opt.has_scale, opt.scale = True, float(softmax_scale)
    opt.causal = bool(causal)
    opt.align = 1  # bottom-right
    left, right = window(window_size)
    if left != -1 or right != -1:
        opt.has_window, opt.window_left, opt.window_right = True, left, right
    opt.softcap = float(softcap)
    if alibi_slopes is not None:
        opt.alibi_slopes = _head_vector(alibi_slopes, "alibi_slopes", Hq, keep)
    if sinks is not None:
        opt.sinks = _head_vector(sinks, "sinks", Hq, keep)
    if mask is not None:
        m = mask.numpy() if _is_torch(mask) else np.asarray(mask)
        if m.dtype != np.bool_ or m.ndim != 4:
            raise ValueError("mask: a bool array [B, 1 or Hq, max_seqlen_q, max_pages * "
                             "page_size] is expected, got %s %s" % (m.dtype, m.shape))
        tm = _Tensor(m.ctypes.data if m.size else None, _BOOL, (ctypes.c_int64 * 4)(*m.shape),
                     (ctypes.c_int64 * 4)(*m.strides))  # one byte an element
        keep += [m, tm]
        opt.mask = ctypes.addressof(tm)
    Dv = tv.shape[3]
    if _is_torch(q):
        torch = _torch()
        out = torch.empty((total_q, Hq, Dv), dtype=q.dtype)
        lse = torch.empty((Hq, total_q), dtype=torch.float32)
    else:
        out = np.empty((total_q, Hq, Dv), q.dtype)
        lse = np.empty((Hq, total_q), np.float32)
    ov, lsv = _View(out, "out", True), _View(lse, "lse", True)
    to = ov.tensor((1, Hq, total_q, Dv), (0, ov.strides[1], ov.strides[0], ov.strides[2]))
    tq = qv.tensor((1, Hq, total_q, D), (0, qv.strides[1], qv.strides[0], qv.strides[2]))
    tls = lsv.tensor((1, Hq, total_q, 1), (0, lsv.strides[0], lsv.strides[1], 1))
    keep += [ov, lsv, to, tq, tls]
    if return_softmax_lse:
        opt.lse = ctypes.addressof(tls)
    _check(_lib.attn_varlen_forward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                                    ctypes.byref(to), ctypes.byref(tcu), None,
                                    int(max_seqlen_q), int(max_seqlen_k), ctypes.byref(opt)),
           "varlen_attention_with_kvcache")
    del keep
    return (out, lse) if return_softmax_lse else out
