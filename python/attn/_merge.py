"""_merge.py — attn.merge_attention_states (attn_merge) and attn.cascade_attention
(attn_cascade_forward): partial attention results merged by their log-sum-exp, and
shared-prefix decoding (docs/CONTRACT.md, "Merging partial results" and "Shared-prefix
(cascade) attention").

It calls the C library through ctypes on the extension module's own shared object (as
_additive.py and _kvcache.py do), so the extension's C code is untouched. NumPy arrays
and, where the caller has imported PyTorch, CPU torch tensors are read through their
strides; partials that are not float32 are converted first (attn_merge reads float32).
What it is not: a second implementation — every number comes from the C library.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _torch_tensor_type, _traced_ops
from ._additive import _Options, _Tensor, _check, _lib
from ._kvcache import _I32, _index, _is_torch, _torch, _View
from ._options import _INT32, integer, integers

_P = ctypes.c_void_p
_lib.attn_merge.argtypes = [ctypes.c_int64, _P, _P, _P, _P, ctypes.c_int32]
_lib.attn_merge.restype = ctypes.c_int
_lib.attn_cascade_forward.argtypes = [_P] * 5
_lib.attn_cascade_forward.restype = ctypes.c_int


class _CascadeKV(ctypes.Structure):
    """attn_cascade_kv of include/attn.h."""
    _fields_ = [("k", _P), ("v", _P), ("block_table", _P), ("kv_len", _P)]


def _f32(x: Any, name: str) -> _View:
    """x as float32 (a copy only when it is not), read through its strides."""
    if _is_torch(x):
        x = x.detach()
        if x.dtype != _torch().float32:
            x = x.float()
    elif not (isinstance(x, np.ndarray) and x.dtype == np.float32):
        x = np.asarray(x, dtype=np.float32)
    return _View(x, name)


def _rows4(v: _View, name: str, lead: Tuple[int, ...], last: Optional[int]) -> _Tensor:
    """A [*lead, last] view (last None: [*lead]) as a 4-D tensor {l0, l1, l2, last|1}."""
    want = lead + (() if last is None else (last,))
    if tuple(v.shape) != want:
        raise ValueError("%s: shape %s, expected %s" % (name, tuple(v.shape), want))
    st = list(v.strides[:len(lead)])
    pad = 3 - len(lead)
    shape4 = (1,) * pad + lead + (1 if last is None else last,)
    st4 = [0] * pad + st + [1 if last is None else v.strides[-1]]
    return v.tensor(shape4, st4)


def merge_attention_states(o_parts: Union[Sequence[Any], Any], lse_parts: Union[Sequence[Any], Any],
                           threads: int = 0):
    """(o, lse) of attention over the union of the keys of n partial results of the same rows.

    o_parts    n arrays [..., D] (a list, or one stacked array [n, ..., D]): each partial's
               normalized output over its own keys, e.g. attention with return_lse over a
               prefix, then over a suffix (vLLM's prefix_output / suffix_output)
    lse_parts  n arrays [...] (list or stacked [n, ...]): each partial's natural-log
               log-sum-exp, in the same row layout as o without D (vLLM's [H, T] LSE is
               passed as its .T view; FlashInfer's base-2 LSE times ln 2)
    Returns o [..., D] and lse [...], float32 (torch tensors when o_parts are). Up to
    three leading dimensions are read through their strides; more are reshaped. A
    partial with LSE -inf is empty (its o is not read); a row whose partials are all
    empty gives o 0 and lse -inf. Under torch.compile and torch.export the call is the
    custom op attn::merge_attention_states; as in eager, no gradient flows through it.
    """
    first = o_parts[0] if isinstance(o_parts, (list, tuple)) and o_parts else o_parts
    ops = _traced_ops(_torch_tensor_type(), first)
    if ops is not None:  # torch.compile, torch.export: the custom op
        return ops.public_merge(o_parts, lse_parts, threads)
    return _merge(o_parts, lse_parts, threads)


def _merge(o_parts, lse_parts, threads):
    """merge_attention_states' work, on NumPy arrays or CPU torch tensors (eager, or the
    real implementation of attn::merge_attention_states)."""
    was_torch = _is_torch(o_parts) or (isinstance(o_parts, (list, tuple)) and o_parts and
                                       _is_torch(o_parts[0]))
    op = list(o_parts) if isinstance(o_parts, (list, tuple)) else [o_parts[c] for c in range(len(o_parts))]
    lp = list(lse_parts) if isinstance(lse_parts, (list, tuple)) else [lse_parts[c] for c in range(len(lse_parts))]
    if len(op) != len(lp):
        raise ValueError("o_parts has %d partials, lse_parts %d" % (len(op), len(lp)))
    if not op:
        raise ValueError("merge_attention_states: at least one partial is needed (for the shape)")
    ov = [_f32(x, "o_parts[%d]" % c) for c, x in enumerate(op)]
    lv = [_f32(x, "lse_parts[%d]" % c) for c, x in enumerate(lp)]
    shape = tuple(ov[0].shape)
    if len(shape) < 1:
        raise ValueError("o_parts[0]: expected [..., D], got a scalar")
    lead, D = shape[:-1], shape[-1]
    # every partial's shape, for any number of leading dimensions (before any reshape,
    # which would pair rows by their count alone)
    for c, (o_c, l_c) in enumerate(zip(ov, lv)):
        if tuple(o_c.shape) != shape:
            raise ValueError("o_parts[%d]: shape %s, expected %s" % (c, tuple(o_c.shape), shape))
        if tuple(l_c.shape) != lead:
            raise ValueError("lse_parts[%d]: shape %s, expected %s (o's without D)"
                             % (c, tuple(l_c.shape), lead))
    if len(lead) > 3:  # more leading dimensions than attn's three: as [prod, D] rows
        rows = int(np.prod(lead))
        ov = [_f32(np.reshape(np.asarray(v.obj), (rows, D)) if not _is_torch(v.obj)
                   else v.obj.reshape(rows, D), "o_parts") for v in ov]
        lv = [_f32(np.reshape(np.asarray(v.obj), (rows,)) if not _is_torch(v.obj)
                   else v.obj.reshape(rows), "lse_parts") for v in lv]
        lead_c = (rows,)
    else:
        lead_c = lead
    n = len(ov)
    to = (_Tensor * n)(*[_rows4(v, "o_parts[%d]" % c, lead_c, D) for c, v in enumerate(ov)])
    tl = (_Tensor * n)(*[_rows4(v, "lse_parts[%d]" % c, lead_c, None) for c, v in enumerate(lv)])
    out = np.empty(lead_c + (D,), dtype=np.float32)
    lse = np.empty(lead_c, dtype=np.float32)
    t_out = _rows4(_View(out, "o"), "o", lead_c, D)
    t_lse = _rows4(_View(lse, "lse"), "lse", lead_c, None)
    _check(_lib.attn_merge(n, ctypes.cast(to, _P), ctypes.cast(tl, _P), ctypes.byref(t_out),
                           ctypes.byref(t_lse), integer("threads", threads, _INT32)),
           "attn_merge")
    out, lse = out.reshape(shape), lse.reshape(lead)
    if was_torch:
        t = _torch()
        return t.from_numpy(out), t.from_numpy(lse)
    return out, lse


def cascade_attention(q: Any, k_prefix: Any, v_prefix: Any, k_suffix: Any = None,
                      v_suffix: Any = None, suffix_lens: Any = None, prefix_len: Optional[int] = None,
                      prefix_block_table: Any = None, suffix_block_table: Any = None,
                      softmax_scale: Optional[float] = None, causal: bool = False,
                      softcap: float = 0.0, sinks: Any = None, return_lse: bool = False,
                      threads: int = 0):
    """Shared-prefix (cascade) attention: each sequence b over [prefix; suffix b].

    q                   [B, Lq, Hq, D]  float32, float16 or bfloat16 (FlashAttention's layout)
    k_prefix, v_prefix  [P, Hkv, D], or with prefix_block_table (int32 [max_pages]) a
                        page pool [num_pages, page_size, Hkv, D]; None = no prefix
    k_suffix, v_suffix  [B, S, Hkv, D], or with suffix_block_table (int32 [B, max_pages])
                        a pool; None = no suffixes
    suffix_lens         int32 [B]: the valid suffix keys (None = all); prefix_len an int
    causal              bottom-right, over the concatenated keys (each suffix then holds
                        at least Lq - 1 keys); softcap, sinks (float32 [Hq]) as in
                        attention; every prefix key is read once for all B sequences
    Returns out [B, Lq, Hq, D] in q's dtype, and with return_lse the float32 LSE
    [B, Hq, Lq] (natural log). Under torch.compile and torch.export the call is the
    custom op attn::cascade; as in eager, no gradient flows through it.
    """
    ops = _traced_ops(_torch_tensor_type(), q, k_prefix, v_prefix, k_suffix, v_suffix)
    if ops is not None:  # torch.compile, torch.export: the custom op attn::cascade
        return ops.public_cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens,
                                  prefix_len, prefix_block_table, suffix_block_table,
                                  softmax_scale, causal, softcap, sinks, return_lse, threads)
    return _cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
                    prefix_block_table, suffix_block_table, softmax_scale, causal, softcap,
                    sinks, return_lse, threads)


def _cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
             prefix_block_table, suffix_block_table, softmax_scale, causal, softcap, sinks,
             return_lse, threads):
    """cascade_attention's work, on NumPy arrays or CPU torch tensors (eager, or the real
    implementation of attn::cascade)."""
    qv = _View(q, "q")
    if len(qv.shape) != 4:
        raise ValueError("q: expected [B, Lq, Hq, D], got shape %s" % (qv.shape,))
    B, Lq, Hq, D = qv.shape
    keep = [qv]

    def part(k, v, table, lens, prefix):
        if k is None and v is None:
            return None
        kv_, vv_ = _View(k, "k"), _View(v, "v")
        keep.extend([kv_, vv_])
        kv = _CascadeKV()
        paged = table is not None
        nd = 4 if paged or not prefix else 3
        for vw, nm in ((kv_, "k"), (vv_, "v")):
            if len(vw.shape) != nd:
                raise ValueError("%s_%s: expected %d dimensions, got shape %s"
                                 % (nm, "prefix" if prefix else "suffix", nd, vw.shape))

        def tens(vw):
            s, st = vw.shape, vw.strides
            if nd == 3:  # [P, Hkv, D] -> [1, Hkv, P, D]
                return vw.tensor((1, s[1], s[0], s[2]), (0, st[1], st[0], st[2]))
            return vw.tensor((s[0], s[2], s[1], s[3]), (st[0], st[2], st[1], st[3]))
        kv.tk, kv.tv = tens(kv_), tens(vv_)
        kv.k, kv.v = ctypes.addressof(kv.tk), ctypes.addressof(kv.tv)
        if paged:
            tv, tobj = _index(table, "block_table", 1 if prefix else 2)
            if tv.dtype != _I32:
                raise ValueError("block_table: int32 expected")
            keep.extend([tv, tobj])
            s, st = tv.shape, tv.strides
            kv.tt = tv.tensor((1, s[0], 1, 1), (0, st[0], 0, 0)) if prefix else \
                tv.tensor((s[0], s[1], 1, 1), (st[0], st[1], 0, 0))
            kv.block_table = ctypes.addressof(kv.tt)
        if lens is not None:
            arr = np.ascontiguousarray(
                np.asarray([integer("prefix_len", lens)], np.int64) if prefix
                else integers("suffix_lens", lens))
            keep.append(arr)
            kv.tl = _View(arr, "lens").tensor((arr.shape[0], 1, 1, 1), (1, 0, 0, 0))
            kv.kv_len = ctypes.addressof(kv.tl)
        keep.append(kv)
        return kv

    pre = part(k_prefix, v_prefix, prefix_block_table, prefix_len, True)
    suf = part(k_suffix, v_suffix, suffix_block_table, suffix_lens, False)
    if _is_torch(q):
        out = _torch().empty((B, Lq, Hq, D), dtype=q.dtype)
    else:
        out = np.empty((B, Lq, Hq, D), dtype=qv.obj.dtype)
    ov = _View(out, "out", writable=True)
    t_q, t_o = qv.bshd("q"), ov.bshd("out")
    opt = _Options()
    opt.threads = integer("threads", threads, _INT32)
    if softmax_scale is not None:
        opt.has_scale, opt.scale = True, float(softmax_scale)
    opt.softcap = float(softcap)
    if causal:
        opt.causal, opt.align = True, 1
    lse = None
    if return_lse:
        lse = np.empty((B, Hq, Lq), dtype=np.float32)
        t_lse = _View(lse, "lse").tensor((B, Hq, Lq, 1), (Hq * Lq, Lq, 1, 1))
        opt.lse = ctypes.addressof(t_lse)
    if sinks is not None:
        sv = _f32(sinks, "sinks")
        keep.append(sv)
        if len(sv.shape) != 1:
            raise ValueError("sinks: expected [Hq], got shape %s" % (sv.shape,))
        t_s = sv.tensor((sv.shape[0], 1, 1, 1), (sv.strides[0], 0, 0, 0))
        opt.sinks = ctypes.addressof(t_s)
    _check(_lib.attn_cascade_forward(ctypes.byref(t_q), ctypes.byref(pre) if pre else None,
                                     ctypes.byref(suf) if suf else None, ctypes.byref(t_o),
                                     ctypes.byref(opt)), "attn_cascade_forward")
    if return_lse:
        return out, (_torch().from_numpy(lse) if _is_torch(q) else lse)
    return out
