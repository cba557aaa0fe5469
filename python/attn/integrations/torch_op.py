"""attn.integrations.torch_op — attn as PyTorch custom operators (importing it imports torch).

    import attn.integrations.torch_op as op
    o = op.sdpa(q, k, v, is_causal=True)                  # torch.ops.attn.sdpa underneath
    o, w = op.sdpa(q, k, v, attn_mask=m, return_weights=True)

Two operators are defined with torch.library.custom_op:

- ``attn::sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
  window_right, softcap, return_weights) -> (out, lse, weights)``: the library's fused
  forward (attn_forward through the extension), query/key/value 4-D ``(B, H, L, D)`` CPU
  tensors (float32, float16 or bfloat16; key/value ``(B, Hkv, S, D)``, Hkv dividing H under
  enable_gqa), attn_mask bool (True = attend) or float, broadcast to ``(B, H, L, S)``.
  ``out`` is a ``(B, H, L, Dv)`` view of ``(B, L, H, Dv)`` memory (transformers' layout),
  ``lse`` is ``(B, H, L)`` float32, ``weights`` ``(B, H, L, S)`` float32 when asked and an
  empty ``(0,)`` tensor otherwise. The window is ``(window_left, window_right)`` around the
  top-left diagonal, -1 meaning unbounded (both -1: no window).
- ``attn::sdpa_backward(grad_out, query, key, value, out, lse, attn_mask, ...) -> (dq, dk,
  dv)``: the library's backward (attn_backward), registered as the forward's gradient with
  torch.library.register_autograd.

Both have fake (meta) implementations that give the output shapes and dtypes without
computing, so torch.compile(fullgraph=True) traces through a model that calls them (no
graph break), torch.export keeps them in the graph, and torch.library.opcheck passes.

Threads: each call runs on torch.get_num_threads() OpenMP threads (torch.set_num_threads
governs attn as it governs PyTorch's own kernels); results are bit-identical for any count.

Errors are raised with PyTorch's SDPA types: every error SDPA reports as RuntimeError
(a mask of the wrong shape, an unsupported dtype, heads that do not divide) is raised as
AttnShapeError or AttnDtypeError here, subclasses of RuntimeError and of the ValueError or
TypeError that attn itself raises, with the library's message and ``status``.

What it is not: the weights and LSE are not differentiable (their gradients are not
propagated: use them for inspection), there is no dropout (a helper adds ``dropout_p``)
and no double backward.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

import attn
from attn import _attn

__all__ = ["sdpa", "AttnShapeError", "AttnDtypeError"]


class AttnShapeError(RuntimeError, ValueError):
    """attn refused a shape, stride or value (ValueError to attn, RuntimeError to SDPA)."""


class AttnDtypeError(RuntimeError, TypeError):
    """attn refused a dtype (TypeError to attn, RuntimeError to SDPA)."""


def _reraise(e: Exception):
    cls = AttnDtypeError if isinstance(e, TypeError) else AttnShapeError
    err = cls(str(e))
    if hasattr(e, "status"):
        err.status = e.status
    raise err from e


def _check_rank(query: Tensor, key: Tensor, value: Tensor) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise AttnShapeError("%s: attn::sdpa takes 4-D (B, H, L, D) tensors, got %d-D"
                                 % (name, x.dim()))


def _window(left: int, right: int):
    return None if left == -1 and right == -1 else (int(left), int(right))


def _mask(m: Optional[Tensor]) -> Optional[Tensor]:
    """float16/bfloat16 masks widened (exactly) to the float32 the library reads."""
    if m is None:
        return None
    m = m.detach()
    return m.float() if m.dtype in (torch.float16, torch.bfloat16) else m


def _out_shape(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool):
    B = max(query.shape[0], key.shape[0], value.shape[0])
    H = query.shape[1] if enable_gqa else max(query.shape[1], key.shape[1])
    return B, H, query.shape[2], key.shape[2], value.shape[3]


def _alloc(shape, which, dtype):
    """The extension's allocator: the output (B, H, L, Dv) is a transposed view of a
    (B, L, H, Dv) tensor, the layout transformers wants next (attn_output.transpose(1, 2)
    is then contiguous without a copy, as after PyTorch's CPU flash kernel)."""
    dt = getattr(torch, dtype)
    if which == "output" and len(shape) == 4:
        B, H, L, D = shape
        return torch.empty((B, L, H, D), dtype=dt).transpose(1, 2)
    return torch.empty(shape, dtype=dt)


@torch.library.custom_op("attn::sdpa", mutates_args=(), device_types="cpu")
def _sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
          is_causal: bool, scale: Optional[float], enable_gqa: bool, window_left: int,
          window_right: int, softcap: float,
          return_weights: bool) -> Tuple[Tensor, Tensor, Tensor]:
    _check_rank(query, key, value)
    options = (bool(is_causal), scale, bool(enable_gqa), 0, _window(window_left, window_right),
               float(softcap), 0, 0, torch.get_num_threads())
    try:
        out, lse, weights = attn._forward(query.detach(), key.detach(), value.detach(),
                                          _mask(attn_mask), None, None, options, True,
                                          bool(return_weights), torch.Tensor, _alloc)
    except (ValueError, TypeError) as e:
        _reraise(e)
    if weights is None:
        weights = torch.empty((0,), dtype=torch.float32)
    return out, lse, weights


@_sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
               window_right, softcap, return_weights):
    _check_rank(query, key, value)
    B, H, L, S, Dv = _out_shape(query, key, value, enable_gqa)
    out = query.new_empty((B, L, H, Dv)).transpose(1, 2)  # as _alloc
    lse = query.new_empty((B, H, L), dtype=torch.float32)
    weights = query.new_empty((B, H, L, S) if return_weights else (0,), dtype=torch.float32)
    return out, lse, weights


@torch.library.custom_op("attn::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                   lse: Tensor, attn_mask: Optional[Tensor], is_causal: bool,
                   scale: Optional[float], enable_gqa: bool, window_left: int,
                   window_right: int, softcap: float) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (query, key, value))
    try:
        _attn.backward(query.detach(), key.detach(), value.detach(), out.detach(),
                       grad_out.detach(), lse.detach(), dq, dk, dv, _mask(attn_mask),
                       bool(is_causal), scale, bool(enable_gqa), 0,
                       _window(window_left, window_right), float(softcap), None, None, 0, 0,
                       torch.get_num_threads())
    except (ValueError, TypeError) as e:
        _reraise(e)
    return dq, dk, dv


@_sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
                        enable_gqa, window_left, window_right, softcap):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask = inputs[:4]
    out, lse, _ = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)
    ctx.options = tuple(inputs[4:10])  # is_causal .. softcap (not return_weights)


def _backward(ctx, grad_out, grad_lse, grad_weights):
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.attn.sdpa_backward(grad_out, query, key, value, out, lse,
                                              attn_mask, *ctx.options)
    need = ctx.needs_input_grad
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None)) + (None,) * 8


torch.library.register_autograd("attn::sdpa", _backward, setup_context=_setup_context)


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
         is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False, *,
         window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
         return_weights: bool = False):
    """torch.ops.attn.sdpa with SDPA's argument names: the output ``(B, H, L, Dv)``, or
    ``(output, weights)`` with return_weights (weights float32, not differentiable).
    Differentiable in query, key and value; traceable by torch.compile and torch.export."""
    left, right = (-1, -1) if window is None else window
    out, _, weights = torch.ops.attn.sdpa(query, key, value, attn_mask, bool(is_causal),
                                          None if scale is None else float(scale),
                                          bool(enable_gqa), int(left), int(right),
                                          float(softcap), bool(return_weights))
    return (out, weights) if return_weights else out
