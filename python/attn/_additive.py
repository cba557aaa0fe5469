"""_additive.py — attn.additive_attention: Bahdanau's additive attention of libattn
(attn_additive_forward / attn_additive_backward, docs/CONTRACT.md) for NumPy arrays and,
where PyTorch is present, torch tensors with autograd.

It calls the C library through ctypes on the extension module's own shared object (the
library's public symbols are exported from it), so the extension's C code is untouched.
What it is not: a second implementation — every number comes from the C library; inputs
are copied to dense float32 first (the weights are small, and the C call's gather of
strided inputs would cost the same copy).
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Tuple

import numpy as np

from . import _attn
from ._options import integers

_F32, _BOOL, _I64 = 0, 3, 5
_OK = 0


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class _Options(ctypes.Structure):
    """attn_options of include/attn.h, field for field (tests/python/test_additive.py holds
    its size to the C struct's, _attn.OPTIONS_SIZE)."""
    _fields_ = [("has_scale", ctypes.c_bool), ("scale", ctypes.c_float),
                ("softcap", ctypes.c_float), ("causal", ctypes.c_bool),
                ("align", ctypes.c_int), ("has_window", ctypes.c_bool),
                ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("mask", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("kv_len", ctypes.c_void_p), ("alibi_slopes", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("path", ctypes.c_int), ("precision", ctypes.c_int),
                ("threads", ctypes.c_int32), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_size_t), ("sinks", ctypes.c_void_p),
                ("d_sinks", ctypes.c_void_p), ("scale_f64", ctypes.c_double),
                # attn_options' dropout fields (0: off; additive attention refuses dropout)
                ("dropout_p", ctypes.c_float), ("dropout_seed", ctypes.c_uint64),
                ("dropout_offset", ctypes.c_uint64),
                # every field attn.h appends must be here too, or the C call reads past this
                # structure (test_additive holds the size to the C struct's)
                ("block_table", ctypes.c_void_p), ("d_bias", ctypes.c_void_p),
                ("block_mask", ctypes.c_void_p), ("score_mod", ctypes.c_void_p),
                ("score_mod_grad", ctypes.c_void_p), ("score_mod_ctx", ctypes.c_void_p),
                ("key_scores", ctypes.c_void_p), ("k_scale", ctypes.c_void_p),
                ("v_scale", ctypes.c_void_p), ("k_zero", ctypes.c_void_p),
                ("v_zero", ctypes.c_void_p), ("kv_group", ctypes.c_int64)]


class _Weights(ctypes.Structure):
    _fields_ = [("units", ctypes.c_int64), ("w_query", ctypes.c_void_p),
                ("w_key", ctypes.c_void_p), ("v", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("normalize", ctypes.c_bool), ("g", ctypes.c_float)]


class _Grads(ctypes.Structure):
    _fields_ = [("d_w_query", ctypes.c_void_p), ("d_w_key", ctypes.c_void_p),
                ("d_v", ctypes.c_void_p), ("d_bias", ctypes.c_void_p), ("d_g", ctypes.c_void_p)]


_lib = ctypes.CDLL(_attn.__file__)
_P = ctypes.c_void_p
_lib.attn_additive_forward.argtypes = [_P] * 6
_lib.attn_additive_forward.restype = ctypes.c_int
_lib.attn_additive_backward.argtypes = [_P] * 12
_lib.attn_additive_backward.restype = ctypes.c_int
_lib.attn_last_error.restype = ctypes.c_char_p
_lib.attn_status_string.argtypes = [ctypes.c_int]
_lib.attn_status_string.restype = ctypes.c_char_p


def _dense(x: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def _tensor(a: np.ndarray, dtype: int, shape4: Tuple[int, ...]) -> _Tensor:
    """A dense C-order view of a as the 4-D shape shape4 (with the same element count)."""
    st, acc = [0] * 4, 1
    for d in range(3, -1, -1):
        st[d] = acc
        acc *= shape4[d]
    return _Tensor(a.ctypes.data if a.size else None, dtype, (ctypes.c_int64 * 4)(*shape4),
                   (ctypes.c_int64 * 4)(*st))


def _check(status: int, call: str) -> None:
    if status != _OK:
        msg = _lib.attn_status_string(status).decode()
        detail = _lib.attn_last_error().decode()
        raise (ValueError if status != 11 else RuntimeError)(
            "%s: %s (%s)" % (call, msg, detail) if detail else "%s: %s" % (call, msg))


class _Call:
    """The C call's arguments built from NumPy arrays, kept alive for its duration."""

    def __init__(self, query, key, value, w_query, w_key, v, bias, key_lengths, attn_mask,
                 normalize, g):
        self.q, self.k, self.val = _dense(query), _dense(key), _dense(value)
        for name, x in (("query", self.q), ("key", self.k), ("value", self.val)):
            if x.ndim != 3:
                raise ValueError("%s: expected a [B, L, D] array, got shape %s" % (name, x.shape))
        self.W, self.U, self.v = _dense(w_query), _dense(w_key), _dense(v)
        if self.v.ndim != 1 or self.W.ndim != 2 or self.U.ndim != 2:
            raise ValueError("w_query [Dq, A], w_key [Dk, A] and v [A] expected")
        self.A = self.v.shape[0]
        if self.W.shape != (self.q.shape[2], self.A) or self.U.shape != (self.k.shape[2], self.A):
            raise ValueError("w_query %s / w_key %s do not match Dq=%d, Dk=%d, A=%d"
                             % (self.W.shape, self.U.shape, self.q.shape[2], self.k.shape[2],
                                self.A))
        self.b = None if bias is None else _dense(bias)
        if self.b is not None and self.b.shape != (self.A,):
            raise ValueError("bias: expected shape (%d,), got %s" % (self.A, self.b.shape))
        self.normalize = bool(normalize)
        # TF-Addons' initial g is sqrt(1 / units)
        self.g = float(g) if g is not None else (math.sqrt(1.0 / self.A) if self.A else 0.0)
        B, Lq, Dq = self.q.shape
        _, Lk, Dk = self.k.shape
        self.B, self.Lq, self.Lk, self.Dv = B, Lq, Lk, self.val.shape[2]
        self.tq = _tensor(self.q, _F32, (B, 1, Lq, Dq))
        self.tk = _tensor(self.k, _F32, (self.k.shape[0], 1, Lk, Dk))
        self.tv = _tensor(self.val, _F32, (self.val.shape[0], 1, self.val.shape[1], self.Dv))
        self.wt = _Weights(self.A, self.W.ctypes.data, self.U.ctypes.data, self.v.ctypes.data,
                           None if self.b is None else self.b.ctypes.data, self.normalize,
                           self.g)
        self.opt = _Options()
        self.keep = []
        if key_lengths is not None:
            kl = _dense(integers("key_lengths", key_lengths), np.int64).reshape(-1)
            self.keep.append(kl)
            self.tkl = _tensor(kl, _I64, (kl.shape[0], 1, 1, 1))
            self.opt.kv_len = ctypes.addressof(self.tkl)
        if attn_mask is not None:
            m = np.asarray(attn_mask)
            if m.dtype != np.bool_:
                raise ValueError("attn_mask: a bool array (True = attend) is expected")
            m = _dense(m.reshape((1,) * (3 - m.ndim) + m.shape), np.bool_)
            self.keep.append(m)
            self.tm = _tensor(m, _BOOL, (m.shape[0], 1, m.shape[1], m.shape[2]))
            self.opt.mask = ctypes.addressof(self.tm)

    def forward(self, return_weights: bool):
        out = np.empty((self.B, self.Lq, self.Dv), np.float32)
        lse = np.empty((self.B, self.Lq), np.float32)
        self.to = _tensor(out, _F32, (self.B, 1, self.Lq, self.Dv))
        self.tl = _tensor(lse, _F32, (self.B, 1, self.Lq, 1))
        self.opt.lse = ctypes.addressof(self.tl)
        w = None
        if return_weights:
            w = np.empty((self.B, self.Lq, self.Lk), np.float32)
            self.tw = _tensor(w, _F32, (self.B, 1, self.Lq, self.Lk))
            self.opt.weights = ctypes.addressof(self.tw)
        st = _lib.attn_additive_forward(ctypes.addressof(self.tq), ctypes.addressof(self.tk),
                                        ctypes.addressof(self.tv), ctypes.addressof(self.wt),
                                        ctypes.addressof(self.to), ctypes.addressof(self.opt))
        self.opt.lse = self.opt.weights = None
        _check(st, "additive_attention")
        self.out, self.lse = out, lse
        return out, lse, w

    def backward(self, grad_out):
        """(dq, dk, dv, dW, dU, dv_units, dbias or None, dg or None) after forward()."""
        d_o = _dense(grad_out)
        if d_o.shape != self.out.shape:
            raise ValueError("grad_output: shape %s, expected %s" % (d_o.shape, self.out.shape))
        tdo = _tensor(d_o, _F32, (self.B, 1, self.Lq, self.Dv))
        outs = [np.empty_like(self.q), np.empty_like(self.k), np.empty_like(self.val)]
        touts = [_tensor(x, _F32, (x.shape[0], 1, x.shape[1], x.shape[2])) for x in outs]
        gw, gu, gv = np.empty_like(self.W), np.empty_like(self.U), np.empty_like(self.v)
        gb, gg = np.empty(self.A, np.float32), np.zeros(1, np.float32)
        gr = _Grads(gw.ctypes.data, gu.ctypes.data, gv.ctypes.data, gb.ctypes.data,
                    gg.ctypes.data)
        st = _lib.attn_additive_backward(
            ctypes.addressof(self.tq), ctypes.addressof(self.tk), ctypes.addressof(self.tv),
            ctypes.addressof(self.wt), ctypes.addressof(self.to), ctypes.addressof(tdo),
            ctypes.addressof(self.tl), ctypes.addressof(touts[0]), ctypes.addressof(touts[1]),
            ctypes.addressof(touts[2]), ctypes.addressof(gr), ctypes.addressof(self.opt))
        _check(st, "additive_attention backward")
        return (outs[0], outs[1], outs[2], gw, gu, gv, gb if self.b is not None else None,
                float(gg[0]) if self.normalize else None)


def _torch():
    import sys
    return sys.modules.get("torch")


def additive_attention(query, key, value, w_query, w_key, v, bias=None, key_lengths=None,
                       attn_mask=None, normalize=False, g=None, return_weights=False):
    """Bahdanau's additive attention, e_ij = ṽ · tanh(query_i W + key_j U + bias),
    out = softmax_j(e) value, with ṽ = v, or g v / ‖v‖ when normalize (TF-Addons; g
    defaults to sqrt(1 / units) as there).

    query [B, Lq, Dq], key [B, Lk, Dk], value [B, Lk, Dv]; w_query [Dq, A], w_key [Dk, A],
    v [A], bias [A]; key_lengths [B] ints (keys j >= key_lengths[b] are masked);
    attn_mask bool [B|1, Lq|1, Lk], True = attend. A fully masked row gives 0.
    Returns out [B, Lq, Dv] float32, and the weights [B, Lq, Lk] with return_weights.
    NumPy inputs give NumPy outputs; torch tensors give torch tensors, with gradients
    for every input, weight and g that requires them (through attn_additive_backward)."""
    torch = _torch()
    if torch is not None and isinstance(query, torch.Tensor):
        return _torch_call(torch, query, key, value, w_query, w_key, v, bias, key_lengths,
                           attn_mask, normalize, g, return_weights)
    call = _Call(query, key, value, w_query, w_key, v, bias, key_lengths, attn_mask,
                 normalize, g)
    out, _, w = call.forward(return_weights)
    return (out, w) if return_weights else out


def additive_attention_grad(query, key, value, w_query, w_key, v, grad_output, bias=None,
                            key_lengths=None, attn_mask=None, normalize=False, g=None):
    """The gradients of sum(grad_output * additive_attention(...)) with respect to query,
    key, value, w_query, w_key, v, bias (None without one) and g (None unless normalize),
    as a tuple in that order, on NumPy arrays."""
    call = _Call(query, key, value, w_query, w_key, v, bias, key_lengths, attn_mask,
                 normalize, g)
    call.forward(False)
    return call.backward(grad_output)


def _torch_call(torch, query, key, value, w_query, w_key, v, bias, key_lengths, attn_mask,
                normalize, g, return_weights):
    """torch tensors: the NumPy call on CPU copies, wrapped in an autograd Function."""
    def np_of(x):
        return None if x is None else (x.detach().cpu().numpy() if isinstance(x, torch.Tensor)
                                       else np.asarray(x))

    g_t = g if isinstance(g, torch.Tensor) else None
    g_val = None if g is None else float(np_of(g).reshape(-1)[0])

    class Additive(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, val, W, U, vv, b, gt):
            call = _Call(np_of(q), np_of(k), np_of(val), np_of(W), np_of(U), np_of(vv),
                         np_of(b), np_of(key_lengths), np_of(attn_mask), normalize, g_val)
            out, _, w = call.forward(return_weights)
            ctx.call = call
            res = torch.from_numpy(out).to(q.device)
            if return_weights:
                w_t = torch.from_numpy(w).to(q.device)
                ctx.mark_non_differentiable(w_t)
                return res, w_t
            return res

        @staticmethod
        def backward(ctx, grad_out, *unused):
            grads = ctx.call.backward(grad_out.detach().cpu().numpy())
            dev = grad_out.device
            res = [torch.from_numpy(x).to(dev) if x is not None else None for x in grads[:7]]
            res.append(torch.tensor(grads[7], device=dev) if grads[7] is not None and g_t is not None
                       else None)
            return tuple(res)

    return Additive.apply(query, key, value, w_query, w_key, v, bias, g_t)
