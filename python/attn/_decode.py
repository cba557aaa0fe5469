"""_decode.py — attn.mha_decode and attn.KVCache: the multi-head layer's cached decoding
step (attn_mha_decode, docs/CONTRACT.md "The multi-head attention module") for NumPy
arrays and CPU torch tensors, over a contiguous or paged cache the caller owns.

    cache = attn.KVCache.empty(batch=2, max_len=64, num_kv_heads=2, head_dim=16)
    for x in chunks:                      # x [B, n, E]: the new tokens of each sequence
        y = attn.mha_decode(x, cache, num_heads=4, w_q=wq, w_k=wk, w_v=wv, w_o=wo)

Each step projects the new tokens, rotates them at their positions (cache.len[b] + i),
writes their K and V into the cache (rounded to its dtype), attends with bottom-right
causal alignment to every row the cache holds for that sequence, projects the output and
advances cache.len by n: a loop of steps gives one causal call's result over the whole
sequence.

It calls the C library through ctypes on the extension module's own shared object (as
_kvcache.py does), so the extension's C code is untouched. What it is not: a cache
manager (the caller owns the pages and the block table; the cache holds the lengths and
the step advances them), autograd (decoding is inference; no gradient flows), or a
second implementation (every number is the C library's, in float32).
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np

from ._additive import _Tensor, _lib
from ._huge import huge_pages
from ._kvcache import (_F32, _FP8_E4M3, _FP8_E5M2, _I32, _Q8_0, _U4, _View, _index, _is_torch,
                       _scale, _torch, _u4_refused)
from ._options import _INT32, integer, integers

__all__ = ["KVCache", "mha_decode"]

_ROPE = {None: 0, "none": 0, "half": 1, "neox": 1, "interleaved": 2, "gptj": 2}
_CONTIGUOUS, _PAGED = 0, 1
_P = ctypes.c_void_p


class _Rope(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("rotary_dim", ctypes.c_int64),
                ("base", ctypes.c_double), ("offset", ctypes.c_int64)]


class _Mha(ctypes.Structure):
    """attn_mha of include/attn.h, field for field."""
    _fields_ = [("Hq", ctypes.c_int64), ("Hkv", ctypes.c_int64),
                ("w_q", _P), ("w_k", _P), ("w_v", _P), ("w_o", _P),
                ("b_q", _P), ("b_k", _P), ("b_v", _P), ("b_o", _P), ("rope", _Rope)]


class _Cache(ctypes.Structure):
    """attn_kv_cache of include/attn.h, field for field (block_table: the field added
    for the paged kind; k_scale, v_scale: an fp8 cache's, added after it)."""
    _fields_ = [("kind", ctypes.c_int), ("k", _Tensor), ("v", _Tensor),
                ("len", ctypes.POINTER(ctypes.c_int64)), ("block_table", _P),
                ("k_scale", _P), ("v_scale", _P)]


_lib.attn_mha_decode.argtypes = [_P] * 5
_lib.attn_mha_decode.restype = ctypes.c_int

# status -> exception, as python/attn/_mha.c raises them
_ERRORS = {2: TypeError, 10: MemoryError, 11: NotImplementedError}


def _raise(status: int, call: str) -> None:
    msg = _lib.attn_status_string(status).decode()
    detail = _lib.attn_last_error().decode()
    raise _ERRORS.get(status, ValueError)("%s: %s: %s" % (call, msg, detail))


class KVCache:
    """A key/value cache for attn.mha_decode; k, v and the block table are read and
    written in place (NumPy arrays or CPU torch tensors of float32, float16 or bfloat16,
    any strides).

    Contiguous: k [B, max_len, Hkv, Dk], v [B, max_len, Hkv, Dv].
    Paged (block_table given): page pools k [num_pages, page_size, Hkv, Dk] and
    v [num_pages, page_size, Hkv, Dv] (FlashAttention's / vLLM's layout), block_table
    int32 [B, max_pages]: position t of sequence b is row t % page_size of pool page
    block_table[b, t // page_size].
    lengths [B]: the tokens each sequence already holds (default 0); kept as the int64
    array `len`, which every step advances.
    cache_dtype, k_scale, v_scale (keyword-only): a q8_0, q4_0 or fp8 cache, as
    attn.attention_with_kvcache takes them (uint8 storage named by cache_dtype, or torch
    float8 tensors; an fp8 cache's scales a float or float32 [Hkv]: attn_kv_cache.k_scale,
    v_scale, read by the attention and used by the step's appends).
    """

    def __init__(self, k: Any, v: Any, lengths: Any = None, block_table: Any = None, *,
                 cache_dtype: Optional[str] = None, k_scale: Any = None, v_scale: Any = None):
        self.k, self.v = k, v
        self._kv = _View(k, "k", True, cache_dtype)
        self._vv = _View(v, "v", True, cache_dtype)
        if self._kv.dtype != self._vv.dtype and max(self._kv.dtype, self._vv.dtype) >= _Q8_0:
            raise ValueError("k, v: one cache dtype for both")
        if _U4 in (self._kv.dtype, self._vv.dtype):
            raise _u4_refused("KVCache", "attn_mha_decode (its appends and decoding step)")
        self._scale_keep: list = []
        self._k_scale = self._v_scale = None
        if k_scale is not None or v_scale is not None:
            if self._kv.dtype not in (_FP8_E4M3, _FP8_E5M2):
                raise ValueError("k_scale, v_scale: only an fp8 cache takes scales")
            Hkv = self._kv.shape[2]
            if k_scale is not None:
                self._k_scale = _scale(k_scale, "k_scale", Hkv, self._scale_keep)
            if v_scale is not None:
                self._v_scale = _scale(v_scale, "v_scale", Hkv, self._scale_keep)
        for name, view in (("k", self._kv), ("v", self._vv)):
            if len(view.shape) != 4:
                raise ValueError("%s: expected 4 dimensions ([B, max_len, Hkv, D] or [num_pages, "
                                 "page_size, Hkv, D]), got shape %s" % (name, view.shape))
        self.block_table = None
        self._bt = None
        B = self._kv.shape[0]
        if block_table is not None:
            bv, bx = _index(block_table, "block_table", 2)
            if bv.dtype != _I32:
                raise TypeError("block_table: int32 expected (attn_options.block_table's dtype)")
            self.block_table, self._bt = bx, bv
            B = bv.shape[0]
        if lengths is None:
            lengths = np.zeros(B, np.int64)
        self.len = np.array(integers("lengths", lengths), dtype=np.int64).reshape(-1)  # owned: the C call advances it
        if self.len.shape != (B,):
            raise ValueError("lengths: %d entries, expected B = %d" % (self.len.size, B))

    @classmethod
    def empty(cls, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
              v_head_dim: Optional[int] = None, dtype: Any = np.float32) -> "KVCache":
        """A zeroed contiguous NumPy cache [batch, max_len, num_kv_heads, head_dim] (v's
        last dimension v_head_dim, default head_dim) of dtype float32 or float16, on 2 MiB
        pages where the system gives them (attn.huge_pages: the decoding step reads every
        row on every step)."""
        dv = head_dim if v_head_dim is None else v_head_dim
        k = np.zeros((batch, max_len, num_kv_heads, head_dim), dtype)
        v = np.zeros((batch, max_len, num_kv_heads, dv), dtype)
        huge_pages(k), huge_pages(v)
        return cls(k, v)

    @property
    def paged(self) -> bool:
        return self._bt is not None

    def _struct(self, keep: list) -> _Cache:
        c = _Cache()
        c.kind = _PAGED if self.paged else _CONTIGUOUS
        c.k, c.v = self._kv.bshd("k"), self._vv.bshd("v")  # [.., L, H, D] as [.., H, L, D]
        c.len = self.len.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
        c.k_scale, c.v_scale = self._k_scale, self._v_scale
        if self.paged:
            bv = self._bt
            tbt = bv.tensor((bv.shape[0], bv.shape[1], 1, 1), (bv.strides[0], bv.strides[1], 0, 0))
            keep.append(tbt)
            c.block_table = ctypes.addressof(tbt)
        return c


def _f32_array(x: Any, name: str) -> Optional[np.ndarray]:
    """x as a float32 NumPy array (a copy only when it is not one already)."""
    if x is None:
        return None
    if _is_torch(x):
        x = x.detach()
        if x.device.type != "cpu":
            raise ValueError("%s: a CPU tensor is expected, got device %s" % (name, x.device))
        x = x.to(_torch().float32).numpy()
    return np.asarray(x, dtype=np.float32)


def _rows(a: np.ndarray, name: str, ndim: int, transpose: bool = False) -> _Tensor:
    """A float32 array as attn_tensor: [B, L, C] (ndim 3) as {B, L, C, 1}, a weight [in,
    out] (transpose: PyTorch's [out, in], read transposed), a bias [out]."""
    if a.ndim != ndim:
        raise ValueError("%s: expected %d dimensions, got shape %s" % (name, ndim, a.shape))
    if any(s % 4 for s in a.strides):
        a = np.ascontiguousarray(a)
    shape, st = list(a.shape), [s // 4 for s in a.strides]
    if transpose:
        shape, st = shape[::-1], st[::-1]
    shape += [1] * (4 - ndim)
    st += [0] * (4 - ndim)
    return _Tensor(a.ctypes.data if a.size else None, _F32, (ctypes.c_int64 * 4)(*shape),
                   (ctypes.c_int64 * 4)(*st))


def mha_decode(x: Any, cache: KVCache, *, num_heads: int, w_q: Any, w_k: Any, w_v: Any,
               w_o: Any, b_q: Any = None, b_k: Any = None, b_v: Any = None, b_o: Any = None,
               num_kv_heads: Optional[int] = None, weight_layout: str = "in_out",
               rope: Optional[str] = None, rotary_dim: int = 0, rope_base: float = 10000.0,
               rope_offset: int = 0, scale: Optional[float] = None, sinks: Any = None,
               threads: int = 0) -> np.ndarray:
    """One decoding step of the self-attention layer on x [B, n, E] (n new tokens per
    sequence): returns y [B, n, E] float32 (NumPy) and advances cache.len by n.

    Weights and biases as attn.multi_head_attention (weight_layout "in_out" [in, out] or
    "out_in", PyTorch's nn.Linear [out, in], read in place). rope: None, "half" or
    "interleaved", the new tokens rotated at positions rope_offset + cache.len[b] + i.
    sinks: (num_heads,) attention-sink logits (0 = add_zero_attn's off-by-one softmax).
    Errors raise ValueError (TypeError for dtypes, NotImplementedError for what the
    library does not do) naming the argument, with nothing written: a step whose tokens
    do not fit (cache.len[b] + n > the cache's rows) leaves the cache and cache.len as
    they were.
    """
    if weight_layout not in ("in_out", "out_in"):
        raise ValueError("weight_layout: %r, expected 'in_out' or 'out_in'" % (weight_layout,))
    if rope not in _ROPE:
        raise ValueError("rope: %r, expected None, 'half' or 'interleaved'" % (rope,))
    if not isinstance(cache, KVCache):
        raise TypeError("cache: an attn.KVCache is expected, got %s" % type(cache).__name__)
    keep: list = []
    xa = _f32_array(x, "x")
    keep.append(xa)
    tx = _rows(xa, "x", 3)
    B, n, E = xa.shape
    torch_layout = weight_layout == "out_in"
    ws = [_f32_array(a, name) for a, name in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v"), (w_o, "w_o"))]
    bs = [_f32_array(a, name) for a, name in ((b_q, "b_q"), (b_k, "b_k"), (b_v, "b_v"), (b_o, "b_o"))]
    keep += ws + bs
    tw = [_rows(a, name, 2, torch_layout) for a, name in zip(ws, ("w_q", "w_k", "w_v", "w_o"))]
    tb = [None if a is None else _rows(a, name, 1) for a, name in zip(bs, ("b_q", "b_k", "b_v", "b_o"))]
    keep += tw + tb
    m = _Mha()
    m.Hq = integer("num_heads", num_heads)
    m.Hkv = 0 if num_kv_heads is None else integer("num_kv_heads", num_kv_heads)
    m.w_q, m.w_k, m.w_v, m.w_o = (ctypes.addressof(t) for t in tw)
    m.b_q, m.b_k, m.b_v, m.b_o = (None if t is None else ctypes.addressof(t) for t in tb)
    m.rope = _Rope(_ROPE[rope], integer("rotary_dim", rotary_dim), float(rope_base),
                   integer("rope_offset", rope_offset))
    E_out = (ws[3].shape[0] if torch_layout else ws[3].shape[1]) if ws[3].ndim == 2 else E
    y = np.empty((B, n, E_out), np.float32)
    ty = _rows(y, "y", 3)
    from ._additive import _Options  # noqa: PLC0415 — the one ctypes mirror of attn_options
    opt = _Options()
    opt.threads = integer("threads", threads, _INT32)
    if scale is not None:
        opt.has_scale, opt.scale = True, float(scale)
    if sinks is not None:
        s = _f32_array(sinks, "sinks").reshape(-1)
        s = np.ascontiguousarray(s)
        ts = _Tensor(s.ctypes.data if s.size else None, _F32,
                     (ctypes.c_int64 * 4)(s.shape[0], 1, 1, 1), (ctypes.c_int64 * 4)(1, 0, 0, 0))
        keep += [s, ts]
        opt.sinks = ctypes.addressof(ts)
    c = cache._struct(keep)
    st = _lib.attn_mha_decode(ctypes.byref(m), ctypes.byref(tx), ctypes.byref(c),
                              ctypes.byref(ty), ctypes.byref(opt))
    del keep
    if st != 0:
        _raise(st, "mha_decode")
    return y
