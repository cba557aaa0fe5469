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
_Q8_0, _FP8_E4M3, _FP8_E5M2, _Q4_0, _U4 = 6, 8, 9, 10, 11
# cache_dtype= names (attn_dtype_name's): the attn dtype, and for a block dtype the bytes
# of one block of 32 elements (0: one byte an element)
_CACHE_DT = {"q8_0": (_Q8_0, 34), "q4_0": (_Q4_0, 18), "fp8_e4m3": (_FP8_E4M3, 0),
             "fp8_e5m2": (_FP8_E5M2, 0), "u4": (_U4, 16)}
_TORCH_FP8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
_P = ctypes.c_void_p
_lib.attn_forward.argtypes = [_P] * 5
_lib.attn_forward.restype = ctypes.c_int
_lib.attn_forward_workspace_size.argtypes = [_P] * 6
_lib.attn_forward_workspace_size.restype = ctypes.c_int
_lib.attn_kv_append.argtypes = [_P] * 7
_lib.attn_kv_append.restype = ctypes.c_int
_lib.attn_kv_append_scaled.argtypes = [_P] * 9
_lib.attn_kv_append_scaled.restype = ctypes.c_int

_NP_DT = {"float32": _F32, "float16": _F16, "bfloat16": _BF16, "int32": _I32, "int64": _I64}


def _torch():
    return sys.modules.get("torch")  # never imported here: only if the caller has it


def _is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


class _View:
    """A NumPy array or CPU torch tensor as (address, attn dtype, shape, element strides),
    without a copy; holds a reference for the call's duration."""

    def __init__(self, x: Any, name: str, writable: bool = False,
                 cache_dtype: Optional[str] = None):
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
        if cache_dtype is not None or dt in _TORCH_FP8:
            self._cache(name, dt, cache_dtype)
            return
        if dt not in _NP_DT:
            raise TypeError("%s: dtype %s is not supported (float32, float16, bfloat16; int32 "
                            "or int64 for indices; uint8 with cache_dtype=)" % (name, dt))
        self.dtype = _NP_DT[dt]

    def _cache(self, name: str, dt: str, cache_dtype: Optional[str]) -> None:
        """A quantized or fp8 cache: torch float8 tensors name their dtype; uint8 storage
        needs cache_dtype. q8_0 / q4_0 / u4: the last dimension is the row's block bytes
        (D / 32 * 34, 18 or 16), mapped to attn's logical-element strides (a row starts a
        block)."""
        if dt in _TORCH_FP8:
            if cache_dtype is not None and cache_dtype != _TORCH_FP8[dt]:
                raise ValueError("%s: a torch.%s tensor with cache_dtype=%r"
                                 % (name, dt, cache_dtype))
            cache_dtype = _TORCH_FP8[dt]
        elif cache_dtype not in _CACHE_DT:
            raise ValueError("%s: cache_dtype=%r is not one of %s" % (name, cache_dtype,
                                                                     ", ".join(_CACHE_DT)))
        elif dt != "uint8":
            raise ValueError("%s: cache_dtype=%r needs uint8 storage (or a torch float8 tensor "
                             "for fp8), got %s" % (name, cache_dtype, dt))
        self.dtype, bsz = _CACHE_DT[cache_dtype]
        if not bsz:
            return
        if len(self.shape) != 4:
            return  # bshd() refuses the shape
        nb = self.shape[3]
        if nb % bsz or nb == 0:
            raise ValueError("%s: a %s cache's last dimension is its row's block bytes, a "
                             "positive multiple of %d (D / 32 * %d), got %d"
                             % (name, cache_dtype, bsz, bsz, nb))
        if self.strides[3] != 1:
            raise ValueError("%s: a %s cache's bytes of a row must be contiguous (last stride "
                             "1), got strides %s" % (name, cache_dtype, self.strides))
        if any(st % bsz for st, n in zip(self.strides[:3], self.shape[:3]) if n > 1):
            raise ValueError("%s: a %s cache's strides %s must be multiples of %d bytes (each "
                             "row starts a block)" % (name, cache_dtype, self.strides, bsz))
        self.shape = self.shape[:3] + (nb // bsz * 32,)
        self.strides = tuple(st // bsz * 32 for st in self.strides[:3]) + (1,)

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


def _scale(x: Any, name: str, Hkv: int, keep: list) -> int:
    """An fp8 cache's scale: a float, or a float32 [Hkv] (or [1]) array / tensor, as an
    attn_tensor {1 or Hkv, 1, 1, 1}: its address (the arrays kept alive in keep)."""
    a = np.ascontiguousarray(x.detach().float().cpu().numpy() if _is_torch(x) else x,
                             np.float32).reshape(-1) if not isinstance(x, (int, float)) \
        else np.array([x], np.float32)
    if a.shape not in ((1,), (Hkv,)) or (np.ndim(x) > 1 if not _is_torch(x) else x.dim() > 1):
        raise ValueError("%s: a float or a [%d] (one per key/value head) array is expected, "
                         "got shape %s" % (name, Hkv, tuple(np.shape(x))))
    if not (np.isfinite(a).all() and (a > 0).all()):
        raise ValueError("%s: every scale must be finite and > 0, got %s" % (name, a))
    t = _Tensor(a.ctypes.data, _F32, (ctypes.c_int64 * 4)(a.shape[0], 1, 1, 1),
                (ctypes.c_int64 * 4)(1, 0, 0, 0))
    keep += [a, t]
    return ctypes.addressof(t)


def _scales(opt: Any, tk: Any, k_scale: Any, v_scale: Any, keep: list) -> None:
    """attn_options.k_scale, v_scale of an fp8 cache (refused with any other cache)."""
    if k_scale is None and v_scale is None:
        return
    if tk.dtype not in (_FP8_E4M3, _FP8_E5M2):
        raise ValueError("k_scale, v_scale: only an fp8 cache takes scales")
    Hkv = tk.shape[1]
    if k_scale is not None:
        opt.k_scale = _scale(k_scale, "k_scale", Hkv, keep)
    if v_scale is not None:
        opt.v_scale = _scale(v_scale, "v_scale", Hkv, keep)


def _f32_array(x: Any, name: str, shape: Tuple[int, ...], keep: list) -> int:
    """A float32 array / tensor of exactly `shape` (a 16-bit or float64 one converted; a
    copy when not contiguous float32 already) as an attn_tensor: its address (the arrays
    kept alive in keep)."""
    if _is_torch(x):
        x = x.detach().cpu().float().numpy()
    a = np.ascontiguousarray(x, np.float32)
    if a.shape != tuple(shape):
        raise ValueError("%s: expected shape %s, got %s" % (name, tuple(shape), a.shape))
    st = [1] * 4
    for i in (2, 1, 0):
        st[i] = st[i + 1] * shape[i + 1]
    t = _Tensor(a.ctypes.data if a.size else None, _F32, (ctypes.c_int64 * 4)(*shape),
                (ctypes.c_int64 * 4)(*st))
    keep += [a, t]
    return ctypes.addressof(t)


def _u4_options(opt: Any, tk: Any, tv: Any, k_scale: Any, v_scale: Any, k_zero: Any,
                v_zero: Any, kv_group: Any, keep: list) -> bool:
    """attn_options.k_scale, v_scale, k_zero, v_zero, kv_group of a u4 cache (attn's
    [B, Hkv, ...] order, as the C call takes them); False (nothing set) for another cache,
    which takes none of k_zero, v_zero, kv_group."""
    if tk.dtype != _U4 and tv.dtype != _U4:
        if k_zero is not None or v_zero is not None or kv_group is not None:
            raise ValueError("k_zero, v_zero, kv_group: only a u4 cache (cache_dtype=\"u4\") "
                             "takes them")
        return False
    missing = [n for n, x in (("k_scale", k_scale), ("v_scale", v_scale), ("k_zero", k_zero),
                              ("v_zero", v_zero)) if x is None]
    if missing:
        raise ValueError("cache_dtype=\"u4\": k_scale, v_scale, k_zero and v_zero are all "
                         "required (missing %s)" % ", ".join(missing))
    G = 0 if kv_group is None else integer("kv_group", kv_group)
    if G < 0:
        raise ValueError("kv_group: 0 (= 32) or a positive number of keys, got %d" % G)
    B, Hkv, Lk, Dk = tk.shape
    Dv = tv.shape[3]
    g = G or 32
    kshape = (B, Hkv, -(-Lk // g), Dk)
    vshape = (B, Hkv, Lk, Dv // 32)
    opt.k_scale = _f32_array(k_scale, "k_scale", kshape, keep)
    opt.k_zero = _f32_array(k_zero, "k_zero", kshape, keep)
    opt.v_scale = _f32_array(v_scale, "v_scale", vshape, keep)
    opt.v_zero = _f32_array(v_zero, "v_zero", vshape, keep)
    opt.kv_group = G
    return True


def _u4_refused(call: str, what: str) -> NotImplementedError:
    return NotImplementedError("%s: a u4 cache with %s is not supported (the C library "
                               "refuses it: only attn_forward over a contiguous u4 cache reads "
                               "u4; docs/CONTRACT.md, \"The u4 cache (KIVI)\")" % (call, what))


def _cache_options(opt: Any, keep: list, Hq: int, softmax_scale: Optional[float],
                   causal: bool, window_size: Tuple[int, int], softcap: float,
                   alibi_slopes: Any, sinks: Any) -> None:
    """The options both cache calls share, into opt (the arrays kept alive in keep):
    the scale, causal and the window aligned bottom-right (what a cache needs:
    FlashAttention's convention), softcap, ALiBi slopes and sinks [Hq]."""
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


def attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any = None, v: Any = None,
                           cache_seqlens: Any = None, block_table: Any = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Any = None, return_softmax_lse: bool = False,
                           sinks: Any = None, return_key_scores: bool = False, *,
                           cache_dtype: Optional[str] = None, k_scale: Any = None,
                           v_scale: Any = None, k_zero: Any = None, v_zero: Any = None,
                           kv_group: Optional[int] = None):
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
    cache_dtype  (keyword-only) "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0" or "u4": the
                 caches are uint8 storage of that dtype (torch.float8_e4m3fn / float8_e5m2
                 tensors say fp8 themselves). fp8: one byte an element, [..., D]. q8_0 /
                 q4_0 (llama.cpp's blocks) / u4: the last dimension is the row's bytes,
                 D / 32 * 34, D / 32 * 18 or D / 32 * 16 (= D / 2), contiguous, every row
                 starting a block. u4 (KIVI's / OpenVINO's 4-bit cache): element i of a
                 row is the low nibble of byte i / 2 when i is even, the high one when odd;
                 a code c stands for fmaf(c, scale, zero) with the scales and zeros below
                 (attn.quantize_kv_u4 writes all three). A u4 cache is read only as a whole
                 contiguous cache: with block_table, new rows k, v or return_key_scores
                 it is refused (NotImplementedError; the C library refuses them)
    k_scale, v_scale  (keyword-only) an fp8 cache's scales: a float or float32 [Hkv]
                 (vLLM's k_scale, v_scale; attn_options.k_scale): a byte x stands for
                 fl32(fp8(x) * scale). New rows k, v are written as
                 attn_kv_append_scaled writes them with the same scales.
                 A u4 cache's scales (with k_zero, v_zero; all four required), float32
                 arrays / tensors in attn's head-major order (what the C call takes, and
                 what quantize_kv_u4 returns), not the caches' [B, Lk, Hkv, ...] order:
                   k_scale, k_zero  [B, Hkv, ceil(Lk / G), D]  per key channel over each
                                    group of G = kv_group keys (key j reads row j // G)
                   v_scale, v_zero  [B, Hkv, Lk, Dv / 32]  per token over each 32 channels
    k_zero, v_zero  (keyword-only) a u4 cache's zeros (attn_options.k_zero, v_zero), shapes
                 as k_scale, v_scale above; refused with any other cache
    kv_group     (keyword-only) a u4 cache's key group G (attn_options.kv_group): None or
                 0 = 32; refused with any other cache
    Returns out [B, Lq, Hq, D] (q's dtype), and with return_softmax_lse also the
    natural-log LSE [B, Hq, Lq] float32, then with return_key_scores the scores.
    NumPy in, NumPy out; torch in, torch out.
    Under torch.compile and torch.export the call is the custom op attn::kvcache (which
    writes k_cache and v_cache in place); as in eager, no gradient flows through it.
    """
    quantized = (cache_dtype is not None or k_scale is not None or v_scale is not None
                 or k_zero is not None or v_zero is not None or kv_group is not None
                 or str(getattr(k_cache, "dtype", "")).replace("torch.", "") in _TORCH_FP8)
    ops = None if return_key_scores else _traced_ops(_torch_tensor_type(), q, k_cache, v_cache, k, v)
    if ops is not None and quantized:
        raise NotImplementedError("attention_with_kvcache: quantized and fp8 caches are not "
                                  "supported under torch.compile / torch.export")
    if ops is not None:  # torch.compile, torch.export: the custom op attn::kvcache
        return ops.public_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  return_softmax_lse, sinks)
    return _attend(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, return_softmax_lse, sinks,
                   return_key_scores, cache_dtype, k_scale, v_scale, k_zero, v_zero, kv_group)


def _attend(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
            window_size, softcap, alibi_slopes, return_softmax_lse, sinks,
            return_key_scores=False, cache_dtype=None, k_scale=None, v_scale=None,
            k_zero=None, v_zero=None, kv_group=None):
    """attention_with_kvcache's work, on NumPy arrays or CPU torch tensors (eager, or the
    real implementation of attn::kvcache)."""
    qv = _View(q, "q")
    if (k is None) != (v is None):
        raise ValueError("k and v: give both or neither")
    # the caches are written only when there are rows to append: a read-only (say
    # memory-mapped) cache is fine for k = v = None
    kc = _View(k_cache, "k_cache", k is not None, cache_dtype)
    vc = _View(v_cache, "v_cache", k is not None, cache_dtype)
    if kc.dtype != vc.dtype and max(kc.dtype, vc.dtype) >= _Q8_0:
        raise ValueError("k_cache, v_cache: one cache dtype for both")
    if len(qv.shape) != 4:
        raise ValueError("q: expected [B, Lq, Hq, D], got shape %s" % (qv.shape,))
    B, Lq, Hq, D = qv.shape
    tk, tv = kc.bshd("k_cache"), vc.bshd("v_cache")  # (B | num_pages, Hkv, Lk | page_size, D)
    keep = [qv, kc, vc]
    if _U4 in (kc.dtype, vc.dtype):
        for what, given in (("block_table (a paged cache)", block_table is not None),
                            ("new rows k, v (attn_kv_append)", k is not None),
                            ("return_key_scores", return_key_scores)):
            if given:
                raise _u4_refused("attention_with_kvcache", what)
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
    if not _u4_options(opt, tk, tv, k_scale, v_scale, k_zero, v_zero, kv_group, keep):
        _scales(opt, tk, k_scale, v_scale, keep)
    if tlen is not None:
        lens = (np.asarray(lx.cpu().numpy() if _is_torch(lx) else lx, np.int64).reshape(-1) + n)
        keep.append(lens)
        tl2 = _Tensor(lens.ctypes.data if lens.size else None, _I64,
                      (ctypes.c_int64 * 4)(lens.shape[0], 1, 1, 1), (ctypes.c_int64 * 4)(1, 0, 0, 0))
        keep.append(tl2)
        opt.kv_len = ctypes.addressof(tl2)
    if tbt is not None:
        opt.block_table = ctypes.addressof(tbt)
    _cache_options(opt, keep, Hq, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   sinks)
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
        # the scales given to the attention are the append's (NULL = 1, as attn_kv_append)
        _check(_lib.attn_kv_append_scaled(ctypes.byref(tkn), ctypes.byref(tvn),
                                          ctypes.byref(tk), ctypes.byref(tv), None,
                                          ctypes.byref(tbt) if tbt is not None else None,
                                          ctypes.byref(tlen), opt.k_scale, opt.v_scale),
               "attention_with_kvcache (append)")
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
                                  return_softmax_lse: bool = False, *,
                                  cache_dtype: Optional[str] = None, k_scale: Any = None,
                                  v_scale: Any = None):
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
    cache_dtype, k_scale, v_scale (keyword-only): quantized and fp8 page pools, as
                 attention_with_kvcache's
    Returns out [total_q, Hq, Dv] (q's dtype); with return_softmax_lse also the LSE
    [Hq, total_q] float32. Bit for bit the requests as separate attention_with_kvcache
    calls. No gradient (inference). docs/CONTRACT.md, "Many requests in one call".
    """
    qv = _View(q, "q")
    if len(qv.shape) != 3:
        raise ValueError("q: expected [total_q, Hq, D], got shape %s" % (qv.shape,))
    total_q, Hq, D = qv.shape
    kc, vc = _View(k_cache, "k_cache", False, cache_dtype), _View(v_cache, "v_cache", False,
                                                                  cache_dtype)
    if kc.dtype != vc.dtype and max(kc.dtype, vc.dtype) >= _Q8_0:
        raise ValueError("k_cache, v_cache: one cache dtype for both")
    if _U4 in (kc.dtype, vc.dtype):
        raise _u4_refused("varlen_attention_with_kvcache", "a paged pool (attn_varlen_forward)")
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
    _scales(opt, tk, k_scale, v_scale, keep)
    opt.block_table = ctypes.addressof(tbt)
    opt.kv_len = ctypes.addressof(tlen)
    _cache_options(opt, keep, Hq, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   sinks)
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


_lib.attn_quantize_q8_0.argtypes = [_P] * 2
_lib.attn_quantize_q8_0.restype = ctypes.c_int
_lib.attn_quantize_q4_0.argtypes = [_P] * 2
_lib.attn_quantize_q4_0.restype = ctypes.c_int


def quantize_kv(x: Any, dtype: str, scale: Any = None):
    """The cache bytes the library writes for the float values x [..., D] (at most 4
    dimensions): what attention_with_kvcache's append stores, for caches made ahead.

    dtype "q8_0" / "q4_0": attn_quantize_q8_0 / q4_0 (llama.cpp's reference rounding; D a
    multiple of 32), uint8 [..., D / 32 * 34] or [..., D / 32 * 18]; scale must be None.
    dtype "fp8_e4m3" / "fp8_e5m2": the bytes attn_kv_append_scaled writes, fp8(fl32(x /
    scale)) nearest even and saturating, with scale a float (None = 1) or a float32 [H]
    vector of x's heads, x [..., H, D]. Returns uint8 (NumPy) or, for torch input, a uint8
    tensor (q8_0, q4_0) or torch.float8_e4m3fn / float8_e5m2 (fp8), on the CPU.
    """
    if dtype == "u4":
        raise ValueError("quantize_kv: a u4 cache's scales and zeros are outside its bytes; "
                         "use attn.quantize_kv_u4(x, kind=\"keys\" | \"values\")")
    if dtype not in _CACHE_DT:
        raise ValueError("quantize_kv: dtype %r is not one of %s" % (dtype, ", ".join(_CACHE_DT)))
    torch_in = _is_torch(x)
    a = np.ascontiguousarray(x.detach().float().cpu().numpy() if torch_in else x, np.float32)
    if not 1 <= a.ndim <= 4:
        raise ValueError("quantize_kv: x of 1 to 4 dimensions expected, got shape %s" % (a.shape,))
    code, bsz = _CACHE_DT[dtype]
    keep = [a]
    if bsz:
        if scale is not None:
            raise ValueError("quantize_kv: %s takes no scale (its blocks carry their own)" % dtype)
        D = a.shape[-1]
        if D % 32:
            raise ValueError("quantize_kv: %s needs the last dimension a multiple of 32, got %d"
                             % (dtype, D))
        out = np.zeros(a.shape[:-1] + (D // 32 * bsz,), np.uint8)
        if a.size:
            shape = (1,) * (4 - a.ndim) + a.shape
            strides = [1] * 4
            for i in (2, 1, 0):
                strides[i] = strides[i + 1] * shape[i + 1]
            src = _Tensor(a.ctypes.data, _F32, (ctypes.c_int64 * 4)(*shape),
                          (ctypes.c_int64 * 4)(*strides))
            dst = _Tensor(out.ctypes.data, code, (ctypes.c_int64 * 4)(*shape),
                          (ctypes.c_int64 * 4)(*strides))
            fn = _lib.attn_quantize_q8_0 if code == _Q8_0 else _lib.attn_quantize_q4_0
            _check(fn(ctypes.byref(src), ctypes.byref(dst)), "quantize_kv")
        return _torch().from_numpy(out) if torch_in else out
    # fp8: attn_kv_append_scaled into a contiguous cache [1, H, N, D] (H = 1 per tensor)
    per_head = scale is not None and not isinstance(scale, (int, float)) and \
        int(np.prod(np.shape(scale.detach().cpu() if _is_torch(scale) else scale))) != 1
    if per_head:
        if a.ndim < 2:
            raise ValueError("quantize_kv: a per-head scale needs x [..., H, D]")
        H, D = a.shape[-2], a.shape[-1]
    else:
        H, D = 1, a.shape[-1]
    N = a.size // max(H * D, 1)
    out = np.zeros(a.shape, np.uint8)
    if a.size:
        spare = np.zeros(a.shape, np.uint8)  # v_cache: the same rows, again
        st = (ctypes.c_int64 * 4)(0, D, H * D, 1)
        sh = (ctypes.c_int64 * 4)(1, H, N, D)
        tx = _Tensor(a.ctypes.data, _F32, sh, st)
        tk = _Tensor(out.ctypes.data, code, sh, st)
        tv = _Tensor(spare.ctypes.data, code, sh, st)
        zero = np.zeros(1, np.int32)
        tl = _Tensor(zero.ctypes.data, _I32, (ctypes.c_int64 * 4)(1, 1, 1, 1),
                     (ctypes.c_int64 * 4)(1, 0, 0, 0))
        keep += [spare, zero, tx, tk, tv, tl]
        ts = _scale(scale, "scale", H, keep) if scale is not None else None
        _check(_lib.attn_kv_append_scaled(ctypes.byref(tx), ctypes.byref(tx), ctypes.byref(tk),
                                          ctypes.byref(tv), None, None, ctypes.byref(tl),
                                          ts, ts), "quantize_kv")
    del keep
    if torch_in:
        torch = _torch()
        return torch.from_numpy(out).view(
            torch.float8_e4m3fn if code == _FP8_E4M3 else torch.float8_e5m2)
    return out


_U4_CALLS = {"keys": ("attn_quantize_u4_keys", "attn_dequantize_u4_keys"),
             "values": ("attn_quantize_u4_values", "attn_dequantize_u4_values")}
for _name in ("attn_quantize_u4_keys", "attn_quantize_u4_values", "attn_dequantize_u4_keys",
              "attn_dequantize_u4_values"):
    getattr(_lib, _name).restype = ctypes.c_int
    getattr(_lib, _name).argtypes = [_P] * 4 + ([ctypes.c_int64] if "keys" in _name else [])


def _u4_layout(shape: Tuple[int, ...], kind: str, group: int, fn: str):
    """For x [B, L, H, D]: attn's [B, H, L, D] shape and element strides of x (and of the
    u4 bytes [B, L, H, D / 2], in logical elements), and the scales' shape [B, H, ...]."""
    if kind not in _U4_CALLS:
        raise ValueError("%s: kind must be \"keys\" or \"values\", got %r" % (fn, kind))
    if len(shape) != 4:
        raise ValueError("%s: x [B, L, Hkv, D] (4 dimensions) expected, got shape %s"
                         % (fn, tuple(shape)))
    B, L, H, D = shape
    if D % 32 or D == 0:
        raise ValueError("%s: u4 needs D a positive multiple of 32, got %d" % (fn, D))
    if group < 0:
        raise ValueError("%s: group must be >= 0 (0 = 32), got %d" % (fn, group))
    g = group or 32
    sshape = (B, H, -(-L // g), D) if kind == "keys" else (B, H, L, D // 32)
    return (B, H, L, D), (L * H * D, D, H * D, 1), sshape


def _contiguous_tensor(a: np.ndarray, dtype: int, keep: list) -> _Tensor:
    st = [1] * 4
    for i in (2, 1, 0):
        st[i] = st[i + 1] * a.shape[i + 1]
    t = _Tensor(a.ctypes.data if a.size else None, dtype, (ctypes.c_int64 * 4)(*a.shape),
                (ctypes.c_int64 * 4)(*st))
    keep.append(t)
    return t


def quantize_kv_u4(x: Any, kind: str = "keys", group: int = 32):
    """A u4 cache (KIVI's / OpenVINO's 4-bit cache) of the float values x [B, L, Hkv, D]
    (FlashAttention's cache layout, D a multiple of 32), through the C library's
    attn_quantize_u4_keys (kind="keys": per channel over each group of `group` keys, 0 =
    32) or attn_quantize_u4_values (kind="values": per token over each 32 channels).

    Returns (codes, scale, zero): codes uint8 [B, L, Hkv, D / 2] (the bytes
    attention_with_kvcache(..., cache_dtype="u4") reads: element i of a row is the low
    nibble of byte i / 2 when i is even, the high one when odd), and scale, zero float32 in
    attn's head-major order, as attention_with_kvcache takes them:
        keys    [B, Hkv, ceil(L / group), D]      (its k_scale, k_zero; kv_group=group)
        values  [B, Hkv, L, D / 32]               (its v_scale, v_zero)
    A code c stands for fmaf(c, scale, zero); zero is the set's least value, scale
    (max - min) / 15 (1 where that is 0). NaN or infinite input: ValueError, nothing
    returned. NumPy in, NumPy out; a torch tensor in, CPU torch tensors out.
    docs/CONTRACT.md, "The u4 cache (KIVI)".
    """
    group = integer("group", group)
    torch_in = _is_torch(x)
    a = np.ascontiguousarray(x.detach().float().cpu().numpy() if torch_in else x, np.float32)
    shape4, st4, sshape = _u4_layout(a.shape, kind, group, "quantize_kv_u4")
    B, L, H, D = a.shape
    codes = np.zeros((B, L, H, D // 2), np.uint8)
    scale = np.zeros(sshape, np.float32)
    zero = np.zeros(sshape, np.float32)
    if a.size:
        keep: list = []
        src = _Tensor(a.ctypes.data, _F32, (ctypes.c_int64 * 4)(*shape4),
                      (ctypes.c_int64 * 4)(*st4))
        dst = _Tensor(codes.ctypes.data, _U4, (ctypes.c_int64 * 4)(*shape4),
                      (ctypes.c_int64 * 4)(*st4))
        ts, tz = _contiguous_tensor(scale, _F32, keep), _contiguous_tensor(zero, _F32, keep)
        args = [ctypes.byref(src), ctypes.byref(dst), ctypes.byref(ts), ctypes.byref(tz)]
        fn = _U4_CALLS[kind][0]
        _check(getattr(_lib, fn)(*(args + ([group] if kind == "keys" else []))), "quantize_kv_u4")
        del keep
    if torch_in:
        torch = _torch()
        return torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero)
    return codes, scale, zero


def dequantize_kv_u4(codes: Any, scale: Any, zero: Any, kind: str = "keys", group: int = 32):
    """The float32 values [B, L, Hkv, D] a u4 cache holds, fmaf(c, scale, zero), through
    attn_dequantize_u4_keys / _values: codes uint8 [B, L, Hkv, D / 2], scale and zero as
    quantize_kv_u4 returns them (kind and group as there). NumPy in, NumPy out; torch in,
    torch out."""
    group = integer("group", group)
    torch_in = _is_torch(codes)
    c = np.ascontiguousarray(codes.detach().cpu().numpy() if torch_in else codes)
    if c.dtype != np.uint8:
        raise ValueError("dequantize_kv_u4: codes must be uint8 [B, L, Hkv, D / 2], got %s"
                         % c.dtype)
    if c.ndim != 4:
        raise ValueError("dequantize_kv_u4: codes [B, L, Hkv, D / 2] expected, got shape %s"
                         % (c.shape,))
    shape4, st4, sshape = _u4_layout(c.shape[:3] + (c.shape[3] * 2,), kind, group,
                                     "dequantize_kv_u4")
    out = np.zeros(c.shape[:3] + (c.shape[3] * 2,), np.float32)
    keep: list = []
    ts = _f32_array(scale, "scale", sshape, keep)
    tz = _f32_array(zero, "zero", sshape, keep)
    if out.size:
        src = _Tensor(c.ctypes.data, _U4, (ctypes.c_int64 * 4)(*shape4),
                      (ctypes.c_int64 * 4)(*st4))
        dst = _Tensor(out.ctypes.data, _F32, (ctypes.c_int64 * 4)(*shape4),
                      (ctypes.c_int64 * 4)(*st4))
        args = [ctypes.byref(src), ctypes.byref(dst), ctypes.c_void_p(ts), ctypes.c_void_p(tz)]
        fn = _U4_CALLS[kind][1]
        _check(getattr(_lib, fn)(*(args + ([group] if kind == "keys" else []))), "dequantize_kv_u4")
    del keep
    return _torch().from_numpy(out) if torch_in else out
