"""attn.integrations.torch_op — attn as PyTorch custom operators (importing it imports torch).

    import attn.integrations.torch_op as op
    o = op.sdpa(q, k, v, is_causal=True)                  # torch.ops.attn.sdpa underneath
    o, w = op.sdpa(q, k, v, attn_mask=m, return_weights=True)

The operators, defined with torch.library.custom_op (device_types="cpu"):

- ``attn::sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
  window_right, softcap, return_weights, dropout_p=0.0, seed=0, sinks=None, align=0,
  alibi_slopes=None, kv_len=None, path=0, precision=0, threads=0) -> (out, lse,
  weights)``: the library's
  forward (attn_forward through the extension), query/key/value 4-D ``(B, H, L, D)`` CPU
  tensors (float32, float16 or bfloat16; key/value ``(B, Hkv, S, D)``, Hkv dividing H under
  enable_gqa), attn_mask bool (True = attend) or float, broadcast to ``(B, H, L, S)``.
  ``out`` is a ``(B, H, L, Dv)`` view of ``(B, L, H, Dv)`` memory (transformers' layout),
  ``lse`` is ``(B, H, L)`` float32, ``weights`` ``(B, H, L, S)`` float32 when asked and an
  empty ``(0,)`` tensor otherwise. The window is ``(window_left, window_right)`` around the
  diagonal, -1 meaning unbounded (both -1: no window). dropout_p > 0 drops
  attention weights (kept ones scaled by 1 / (1 - p)) with the library's mask of ``seed``
  (a signed int64, read as the library's unsigned 64 bits: docs/CONTRACT.md, "Dropout");
  the op does not draw it (an op of the graph must be a function of its arguments): the
  callers draw it from torch's default generator (draw_seed). ``sinks``: None or ``(H,)``,
  one attention-sink logit per query head (float32; a 16-bit one widened), differentiable.
  The trailing arguments carry attn.scaled_dot_product_attention's extras, as attn's
  codes: align (0 top-left, 1 bottom-right), alibi_slopes ``(H,)`` and kv_len ``(B,)``
  (constants), path (0 auto, 1 fused, 2 reference), precision (0 default, 1 fast) and
  threads (0: torch.get_num_threads()).
- ``attn::sdpa_backward(grad_out, query, key, value, out, lse, attn_mask, ..., dropout_p,
  seed, sinks, mask_grad, align, alibi_slopes, kv_len, path, precision, threads) -> (dq,
  dk, dv, d_sinks, d_mask)``: the library's backward
  (attn_backward; the same seed regenerates the forward's mask), registered as the
  forward's gradient with torch.library.register_autograd; d_sinks has the sinks' dtype,
  ``(0,)`` without sinks; d_mask, when a float attn_mask requires grad (T5's position
  bias, a learned bias), its gradient (the library's d_bias, summed over its broadcast
  dimensions) in its dtype and shape, ``(0,)`` otherwise.
- ``attn::varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
  scale, window_left, window_right, softcap, alibi_slopes=None, dropout_p=0.0, seed=0,
  sinks=None, path=0, precision=0, threads=0) -> (out, lse)`` and
  ``attn::varlen_backward(...) -> (dq, dk, dv, d_sinks)``, its registered gradient:
  attn.varlen_attention (attn_varlen_forward / attn_varlen_backward), differentiable in
  q, k, v and sinks.
- ``attn::kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal,
  window_left, window_right, softcap, alibi_slopes, sinks) -> (out, lse)``:
  attn.attention_with_kvcache; it writes k_cache and v_cache in place (declared as
  mutated, so a compiled graph and torch.export keep the write). No gradient.
- ``attn::merge_attention_states(o_parts[], lse_parts[], threads=0) -> (o, lse)`` and
  ``attn::cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
  prefix_block_table, suffix_block_table, scale, causal, softcap, sinks, threads=0) ->
  (out, lse)``: attn.merge_attention_states and attn.cascade_attention. No gradient.

Every one has a fake (meta) implementation that gives the output shapes, strides and
dtypes without computing, so torch.compile(fullgraph=True) traces through a model that
calls them (no graph break), torch.export keeps them in the graph, and
torch.library.opcheck passes (tests/python/test_compile.py, test_torch_op.py).

attn's public calls use them: on torch tensors, attn.scaled_dot_product_attention,
attn.varlen_attention, attn.attention_with_kvcache, attn.merge_attention_states and
attn.cascade_attention go through public_sdpa, public_varlen, public_kvcache,
public_merge and public_cascade here (and so through the ops) when the call is traced (traced(): torch.compile, torch.export, a fake or
functional tensor, a torch function or dispatch mode), and call the extension directly
in eager; both give the same bits, outputs and gradients. attn imports this module (and
so torch) only when a torch tensor reaches one of those calls.

Threads: each call runs on torch.get_num_threads() OpenMP threads (torch.set_num_threads
governs attn as it governs PyTorch's own kernels); results are bit-identical for any count.

Errors are raised with PyTorch's SDPA types: every error SDPA reports as RuntimeError
(a mask of the wrong shape, an unsupported dtype, heads that do not divide) is raised as
AttnShapeError or AttnDtypeError here, subclasses of RuntimeError and of the ValueError or
TypeError that attn itself raises, with the library's message and ``status``.

What it is not: the weights and LSE are not differentiable (their gradients are not
propagated: use them for inspection), and there is no double backward.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

import attn
from attn import _attn
from attn import _options as _checks

__all__ = ["sdpa", "draw_seed", "forward_no_grad", "direct_ok", "AttnShapeError",
           "AttnDtypeError"]


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


_UINT64 = (1 << 64) - 1


def _options(is_causal, scale, enable_gqa, window_left, window_right, softcap, dropout_p,
             seed, align=0, path=0, precision=0, threads=0):
    """attn._forward's options tuple (is_causal, scale, enable_gqa, align, window, softcap,
    path, precision, threads, dropout_p, dropout_seed, dropout_offset): align, path and
    precision as attn's codes (0: top-left, "auto", "default"), threads 0 meaning torch's
    thread count; the op's signed int64 seed read as the library's unsigned 64 bits."""
    return (bool(is_causal), scale, bool(enable_gqa), int(align),
            _window(window_left, window_right), float(softcap), int(path), int(precision),
            int(threads) or torch.get_num_threads(), float(dropout_p), int(seed) & _UINT64, 0)


def _grad_out(grad: Optional[Tensor], like: Optional[Tensor]) -> Tensor:
    """An optional gradient as an op returns it: an empty (0,) float32 tensor when it was
    not computed, else in its input's dtype."""
    if grad is None:
        return torch.empty((0,), dtype=torch.float32)
    return grad if grad.dtype == like.dtype else grad.to(like.dtype)


def _sinks(sinks: Optional[Tensor]) -> Optional[Tensor]:
    """The sinks (or the ALiBi slopes) as the library reads them: float32 [H] (a 16-bit or
    float64 one widened or rounded to a float32 copy)."""
    if sinks is None:
        return None
    sinks = sinks.detach()
    return sinks if sinks.dtype == torch.float32 else sinks.float()


def _run(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
         kv_len: Optional[Tensor], is_causal: bool, scale: Optional[float], enable_gqa: bool,
         window_left: int, window_right: int, softcap: float, want_lse: bool,
         want_weights: bool, dropout_p: float, seed: int, sinks: Optional[Tensor],
         align: int = 0, alibi_slopes: Optional[Tensor] = None, path: int = 0,
         precision: int = 0, threads: int = 0):
    """The library's forward on the op's arguments (and kv_len, None or (B,) int32 or
    int64): (out, lse or None, weights or None), errors raised as the op raises them."""
    _check_rank(query, key, value)
    if not 0.0 <= dropout_p <= 1.0:  # in double: the library's float could round to 1
        raise AttnShapeError("dropout_p=%r: expected 0 <= dropout_p <= 1 (0 = off)"
                             % (dropout_p,))
    options = _options(is_causal, scale, enable_gqa, window_left, window_right, softcap,
                       dropout_p, seed, align, path, precision, threads)
    lens = None if kv_len is None else kv_len.detach()
    try:
        return attn._forward(query.detach(), key.detach(), value.detach(), _mask(attn_mask),
                             _sinks(alibi_slopes), lens, options, want_lse,
                             bool(want_weights), torch.Tensor, _alloc, _sinks(sinks))
    except (ValueError, TypeError) as e:
        _reraise(e)


@torch.library.custom_op("attn::sdpa", mutates_args=(), device_types="cpu")
def _sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
          is_causal: bool, scale: Optional[float], enable_gqa: bool, window_left: int,
          window_right: int, softcap: float, return_weights: bool, dropout_p: float = 0.0,
          seed: int = 0, sinks: Optional[Tensor] = None, align: int = 0,
          alibi_slopes: Optional[Tensor] = None, kv_len: Optional[Tensor] = None,
          path: int = 0, precision: int = 0, threads: int = 0
          ) -> Tuple[Tensor, Tensor, Tensor]:
    out, lse, weights = _run(query, key, value, attn_mask, kv_len, is_causal, scale,
                             enable_gqa, window_left, window_right, softcap, True,
                             return_weights, dropout_p, seed, sinks, align, alibi_slopes,
                             path, precision, threads)
    if weights is None:
        weights = torch.empty((0,), dtype=torch.float32)
    return out, lse, weights


def forward_no_grad(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
                    is_causal: bool, scale: Optional[float], enable_gqa: bool,
                    window_left: int, window_right: int, softcap: float,
                    return_weights: bool, dropout_p: float = 0.0, seed: int = 0,
                    sinks: Optional[Tensor] = None, kv_len: Optional[Tensor] = None
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    """What torch.ops.attn.sdpa computes, called directly, for a caller that needs no
    gradient and is not being traced (see direct_ok): (out, weights or None). No LSE is
    computed (only the backward reads it) and there is no dispatcher between the caller
    and the library. kv_len: None or (B,) int64, keys j >= kv_len[b] masked (with or
    instead of attn_mask)."""
    out, _, weights = _run(query, key, value, attn_mask, kv_len, is_causal, scale,
                           enable_gqa, window_left, window_right, softcap, False,
                           return_weights, dropout_p, seed, sinks)
    return out, weights


try:  # looked up once: an import statement in _in_mode cost a short call 0.8 us
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:
    _get_current_dispatch_mode = None


def _in_mode() -> bool:
    """Whether a torch function or dispatch mode is active (a tracer, a flop counter, a
    device context): it sees the op, so the op must run. True where torch cannot say."""
    if _get_current_dispatch_mode is None:
        return True
    try:
        return (_get_current_dispatch_mode() is not None
                or torch._C._len_torch_function_stack() > 0)
    except AttributeError:
        return True


def direct_ok(*tensors: Optional[Tensor]) -> bool:
    """Whether forward_no_grad may stand in for torch.ops.attn.sdpa on these inputs: not
    under torch.compile or torch.export, no tensor subclass (fake, functional) or dispatch
    mode that would trace the call, and no gradient wanted from any of them (grad mode off,
    or none requires grad)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    if _in_mode():
        return False
    grad = torch.is_grad_enabled()
    for x in tensors:
        if x is None:
            continue
        if type(x) is not torch.Tensor or (grad and x.requires_grad):
            return False
    return True


@_sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
               window_right, softcap, return_weights, dropout_p=0.0, seed=0, sinks=None,
               align=0, alibi_slopes=None, kv_len=None, path=0, precision=0, threads=0):
    _check_rank(query, key, value)
    B, H, L, S, Dv = _out_shape(query, key, value, enable_gqa)
    out = query.new_empty((B, L, H, Dv)).transpose(1, 2)  # as _alloc
    lse = query.new_empty((B, H, L), dtype=torch.float32)
    weights = query.new_empty((B, H, L, S) if return_weights else (0,), dtype=torch.float32)
    return out, lse, weights


def _mask_has_grad(attn_mask: Optional[Tensor]) -> bool:
    return attn_mask is not None and attn_mask.is_floating_point()


@torch.library.custom_op("attn::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                   lse: Tensor, attn_mask: Optional[Tensor], is_causal: bool,
                   scale: Optional[float], enable_gqa: bool, window_left: int,
                   window_right: int, softcap: float, dropout_p: float = 0.0, seed: int = 0,
                   sinks: Optional[Tensor] = None, mask_grad: bool = False, align: int = 0,
                   alibi_slopes: Optional[Tensor] = None, kv_len: Optional[Tensor] = None,
                   path: int = 0, precision: int = 0, threads: int = 0
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d_sinks, d_mask): d_sinks in the sinks' dtype and shape, (0,) float32
    without sinks; d_mask, with mask_grad and a float attn_mask, its gradient (the library's
    d_bias: summed over its broadcast dimensions) in its dtype and shape, (0,) float32
    otherwise. The forward's dropout_p and seed regenerate its mask; align, alibi_slopes,
    kv_len, path, precision and threads are the forward's."""
    # contiguous: in the inputs' layout (transformers' [B, L, H, D] memory read as
    # [B, H, L, D]) the views' backward would copy nothing, but the library's backward
    # writes them slower there (docs/PYTHON.md)
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (query, key, value))
    options = _options(is_causal, scale, enable_gqa, window_left, window_right, softcap,
                       dropout_p, seed, align, path, precision, threads)
    lens = None if kv_len is None else kv_len.detach()
    causal, scale, gqa, align, window, softcap, path, level, threads = options[:9]
    read = _sinks(sinks)
    d_sinks = None if read is None else torch.empty(read.shape, dtype=torch.float32)
    mask = _mask(attn_mask)
    d_mask = (torch.empty(mask.shape, dtype=torch.float32)
              if mask_grad and _mask_has_grad(attn_mask) and mask.dtype == torch.float32
              else None)
    try:
        extra = {} if d_mask is None else {"grad_attn_mask": d_mask}
        _attn.backward(query.detach(), key.detach(), value.detach(), out.detach(),
                       grad_out.detach(), lse.detach(), dq, dk, dv, mask,
                       causal, scale, gqa, align, window, softcap, _sinks(alibi_slopes), lens,
                       path, level,
                       threads, read, d_sinks, **extra, **attn._dropout_kwargs(options))
    except (ValueError, TypeError) as e:
        _reraise(e)
    return dq, dk, dv, _grad_out(d_sinks, sinks), _grad_out(d_mask, attn_mask)


@_sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
                        enable_gqa, window_left, window_right, softcap, dropout_p=0.0, seed=0,
                        sinks=None, mask_grad=False, align=0, alibi_slopes=None, kv_len=None,
                        path=0, precision=0, threads=0):
    # contiguous, as the real ones are (torch.empty_like would copy a view's strides)
    d_sinks = (sinks.new_empty(sinks.shape) if sinks is not None
               else query.new_empty((0,), dtype=torch.float32))
    d_mask = (attn_mask.new_empty(attn_mask.shape) if mask_grad and _mask_has_grad(attn_mask)
              else query.new_empty((0,), dtype=torch.float32))
    return (query.new_empty(query.shape), key.new_empty(key.shape),
            value.new_empty(value.shape), d_sinks, d_mask)


# attn::sdpa's arguments from dropout_p on, with their defaults: inputs shorter than the
# schema (a caller of the op before align .. threads existed) are padded with these
_SDPA_TAIL = (0.0, 0, None, 0, None, None, 0, 0, 0)


def _setup_context(ctx, inputs, output):
    inputs = tuple(inputs) + _SDPA_TAIL[len(inputs) - 11:]
    query, key, value, attn_mask = inputs[:4]
    out, lse, _ = output
    sinks, align, alibi_slopes, kv_len, path, precision, threads = inputs[13:]
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, sinks, alibi_slopes, kv_len)
    # is_causal .. softcap, then dropout_p and seed (not return_weights)
    ctx.options = tuple(inputs[4:10]) + tuple(inputs[11:13])
    ctx.extra = (align, path, precision, threads)


def _backward(ctx, grad_out, grad_lse, grad_weights):
    query, key, value, out, lse, attn_mask, sinks, alibi_slopes, kv_len = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask_grad = bool(need[3]) and _mask_has_grad(attn_mask)
    align, path, precision, threads = ctx.extra
    dq, dk, dv, d_sinks, d_mask = torch.ops.attn.sdpa_backward(
        grad_out, query, key, value, out, lse, attn_mask, *ctx.options, sinks, mask_grad,
        align, alibi_slopes, kv_len, path, precision, threads)
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None), (d_mask if mask_grad else None)) + (None,) * 9 + (
            (d_sinks if sinks is not None and need[13] else None),) + (None,) * 6


torch.library.register_autograd("attn::sdpa", _backward, setup_context=_setup_context)


def draw_seed(seed: Optional[int] = None) -> int:
    """The op's dropout seed, a signed int64 (the library reads its 64 bits unsigned):
    the caller's int (modulo 2^64, as attn.scaled_dot_product_attention takes it), or,
    for None, 64 random bits from torch's default CPU generator (torch.manual_seed makes
    the call reproducible), as attn.scaled_dot_product_attention draws them."""
    if seed is None:
        return int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))
    seed = _checks.integer("seed", seed, (-(1 << 63), _UINT64)) & _UINT64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
         is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False, *,
         window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
         return_weights: bool = False, dropout_p: float = 0.0, seed: Optional[int] = None,
         sinks: Optional[Tensor] = None):
    """torch.ops.attn.sdpa with SDPA's argument names: the output ``(B, H, L, Dv)``, or
    ``(output, weights)`` with return_weights (weights float32, not differentiable; with
    dropout the weights that multiplied value: dropped 0, kept scaled by 1 / (1 - p)).
    dropout_p is applied whenever it is > 0 (as torch.nn.functional's SDPA: pass 0.0 for
    inference), its mask from seed (None: drawn from torch's default generator, see
    draw_seed); sinks: None or one logit per query head, ``(H,)``, as
    attn.scaled_dot_product_attention's. Differentiable in query, key, value and sinks;
    traceable by torch.compile and torch.export."""
    left, right = (-1, -1) if window is None else _checks.window(window)
    dropout_p = float(dropout_p)
    seed = draw_seed(seed) if dropout_p > 0.0 else 0
    out, _, weights = torch.ops.attn.sdpa(query, key, value, attn_mask, bool(is_causal),
                                          None if scale is None else float(scale),
                                          bool(enable_gqa), int(left), int(right),
                                          float(softcap), bool(return_weights), dropout_p,
                                          seed, sinks)
    return (out, weights) if return_weights else out


# ---- attn's public calls on torch tensors, when they are traced ------------------------------

def traced(*tensors) -> bool:
    """Whether a call on these tensors is being traced, and must then be an op of the graph:
    under torch.compile or torch.export, with a tensor subclass other than Parameter (a
    fake or functional tensor), or with a torch function or dispatch mode active. attn's
    public calls go through the ops of this module when it is, and call the extension
    directly (the same bits, no dispatcher) when it is not."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or _in_mode():
        return True
    for x in tensors:  # a loop, not any() over a generator: this runs on every call
        if type(x) not in _PLAIN_TYPES and isinstance(x, Tensor):
            return True
    return False


_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def _as_tensor(x, dtype) -> Optional[Tensor]:
    """A list or array (kv_len, alibi_slopes, sinks, a mask) as a tensor; a tensor or None
    as it is."""
    return x if x is None or isinstance(x, Tensor) else torch.as_tensor(x, dtype=dtype)


def _signed(seed: Optional[int]) -> int:
    """attn's unsigned 64-bit seed as the op's signed int64 (the same 64 bits); None (a
    traced call with dropout and no seed: attn._call_seed) drawn here, in the graph, as
    the eager call draws it (the same generator and bits; under torch.compile a scalar of
    the graph, so each call of the compiled function has a new mask)."""
    if seed is None:
        return draw_seed()
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _lift(x: Tensor) -> Tensor:
    """(L, D) and (H, L, D) read as (1, 1, L, D) and (1, H, L, D): a view."""
    return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) if x.dim() < 4 else x


def public_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask, alibi_slopes, kv_len,
                options: tuple, want_lse: bool, want_weights: bool, sinks):
    """attn.scaled_dot_product_attention through torch.ops.attn.sdpa, for a traced call:
    its checked arguments and options (attn._forward's tuple); the result is the eager
    call's (the output, then the LSE and the weights when asked, of the inputs' rank; the
    LSE and weights not differentiable). With 16-bit inputs the
    gradients are the eager call's bits too, though the eager autograd Function keeps a
    float32 output for its backward and the op keeps the 16-bit one: the library's
    backward never reads a 16-bit O, it recomputes it in float32 (src/backward/backward.c), the
    same bits as the float32 output of the forward."""
    causal, scale, gqa, align, window, softcap, path, level, threads, p, seed, _ = options
    left, right = (-1, -1) if window is None else window
    rank = max(x.dim() for x in (query, key, value))
    mask = attn._widen(_as_tensor(attn_mask, None), Tensor)
    slopes = _as_tensor(alibi_slopes, torch.float32)
    lens = _as_tensor(kv_len, torch.int64)
    out, lse, weights = torch.ops.attn.sdpa(
        _lift(query), _lift(key), _lift(value), mask, causal, scale, gqa, left, right,
        softcap, want_weights, p, _signed(seed), _as_tensor(sinks, torch.float32), align,
        slopes, lens, path, level, threads)
    out = out.reshape(out.shape[4 - rank:])
    if not want_lse and not want_weights:
        return out
    lse = lse.detach().reshape(lse.shape[4 - rank:])
    extra = (lse,) if want_lse else ()
    if want_weights:
        extra += (weights.detach().reshape(weights.shape[4 - rank:]),)
    return (out,) + extra


# ---- attn::varlen and attn::varlen_backward: attn.varlen_attention --------------------------

def _varlen_options(causal, scale, window_left, window_right, softcap, dropout_p, seed, path,
                    precision, threads):
    """attn._varlen._call's options tuple (causal, scale, align, window, softcap, path,
    precision, threads, dropout_p, seed, offset): bottom-right, as every packed call."""
    return (bool(causal), scale, 1, _window(window_left, window_right), float(softcap),
            int(path), int(precision), int(threads) or torch.get_num_threads(),
            float(dropout_p), int(seed) & _UINT64, 0)


@torch.library.custom_op("attn::varlen", mutates_args=(), device_types="cpu")
def _varlen_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: Optional[float],
               window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0, seed: int = 0,
               sinks: Optional[Tensor] = None, path: int = 0, precision: int = 0,
               threads: int = 0) -> Tuple[Tensor, Tensor]:
    """(out (total_q, Hq, Dv), lse (Hq, total_q)): attn.varlen_attention's forward (the
    library's attn_varlen_forward); out in q's dtype, the LSE float32 (float64 for a
    float64 q)."""
    from attn import _varlen  # noqa: PLC0415 — loaded with attn

    def alloc(shape, which, dtype):
        return torch.empty(shape, dtype=getattr(torch, dtype))
    options = _varlen_options(causal, scale, window_left, window_right, softcap, dropout_p,
                              seed, path, precision, threads)
    try:
        return _varlen._call(q.detach(), k.detach(), v.detach(), cu_seqlens_q.detach(),
                             cu_seqlens_k.detach(), max_seqlen_q, max_seqlen_k,
                             _sinks(alibi_slopes), _sinks(sinks), options, True, alloc)
    except (ValueError, TypeError) as e:
        _reraise(e)


@_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 scale, window_left, window_right, softcap, alibi_slopes=None, dropout_p=0.0,
                 seed=0, sinks=None, path=0, precision=0, threads=0):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise AttnShapeError("%s: attn::varlen takes 3-D (total, H, D) tensors, got %d-D"
                                 % (name, x.dim()))
    total_q, Hq = q.shape[0], q.shape[1]
    out = q.new_empty((total_q, Hq, v.shape[2]))
    lse = q.new_empty((Hq, total_q),
                      dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    return out, lse


@torch.library.custom_op("attn::varlen_backward", mutates_args=(), device_types="cpu")
def _varlen_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                     lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                     scale: Optional[float], window_left: int, window_right: int,
                     softcap: float, alibi_slopes: Optional[Tensor] = None,
                     dropout_p: float = 0.0, seed: int = 0, sinks: Optional[Tensor] = None,
                     path: int = 0, precision: int = 0, threads: int = 0
                     ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d_sinks): attn_varlen_backward with the forward's arguments, each
    gradient in its input's dtype; d_sinks (0,) float32 without sinks."""
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype) for x in (q, k, v))
    read = _sinks(sinks)
    d_sinks = None if read is None else torch.empty(read.shape, dtype=torch.float32)
    causal, scale, align, window, softcap, path, level, threads, *drop = _varlen_options(
        causal, scale, window_left, window_right, softcap, dropout_p, seed, path, precision,
        threads)
    extra = dict(zip(("dropout_p", "dropout_seed", "dropout_offset"), drop)) if drop[0] else {}
    try:
        _attn.varlen_backward(q.detach(), k.detach(), v.detach(), out.detach(),
                              grad_out.detach(), lse.detach(), dq, dk, dv,
                              cu_seqlens_q.detach(), cu_seqlens_k.detach(), max_seqlen_q,
                              max_seqlen_k, causal, scale, align, window, softcap,
                              _sinks(alibi_slopes), path, level, threads, read, d_sinks,
                              **extra)
    except (ValueError, TypeError) as e:
        _reraise(e)
    return dq, dk, dv, _grad_out(d_sinks, sinks)


@_varlen_backward.register_fake
def _varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, max_seqlen_k, causal, scale, window_left,
                          window_right, softcap, alibi_slopes=None, dropout_p=0.0, seed=0,
                          sinks=None, path=0, precision=0, threads=0):
    d_sinks = (sinks.new_empty(sinks.shape) if sinks is not None
               else q.new_empty((0,), dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), d_sinks


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap, alibi, p, seed,
     sinks, path, precision, threads) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi, sinks)
    ctx.args = (max_q, max_k, causal, scale, left, right, softcap)
    ctx.extra = (p, seed)
    ctx.tail = (path, precision, threads)


def _varlen_grad(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_q, cu_k, alibi, sinks = ctx.saved_tensors
    dq, dk, dv, d_sinks = torch.ops.attn.varlen_backward(
        grad_out, q, k, v, out, lse, cu_q, cu_k, *ctx.args, alibi, *ctx.extra, sinks,
        *ctx.tail)
    need = ctx.needs_input_grad
    return ((dq if need[0] else None), (dk if need[1] else None),
            (dv if need[2] else None)) + (None,) * 12 + (
            (d_sinks if sinks is not None and need[15] else None),) + (None,) * 3


torch.library.register_autograd("attn::varlen", _varlen_grad,
                                setup_context=_varlen_setup_context)


def public_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, alibi_slopes, sinks, options: tuple):
    """attn.varlen_attention through torch.ops.attn.varlen, for a traced call: its checked
    arguments and options (attn._varlen._call's tuple); (out, lse), the LSE not
    differentiable (16-bit gradients the eager bits, as public_sdpa's)."""
    causal, scale, _, window, softcap, path, level, threads, p, seed, _ = options
    left, right = (-1, -1) if window is None else window
    out, lse = torch.ops.attn.varlen(
        q, k, v, _as_tensor(cu_seqlens_q, torch.int64), _as_tensor(cu_seqlens_k, torch.int64),
        max_seqlen_q, max_seqlen_k, causal, scale, left, right, softcap,
        _as_tensor(alibi_slopes, torch.float32), p, _signed(seed),
        _as_tensor(sinks, torch.float32), path, level, threads)
    return out, lse.detach()


# ---- attn::kvcache, attn::merge_attention_states, attn::cascade: no gradient (as in eager) --

@torch.library.custom_op("attn::kvcache", mutates_args=("k_cache", "v_cache"),
                         device_types="cpu")
def _kvcache_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], cache_seqlens: Optional[Tensor],
                block_table: Optional[Tensor], scale: Optional[float], causal: bool,
                window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[Tensor], sinks: Optional[Tensor]
                ) -> Tuple[Tensor, Tensor]:
    """(out [B, Lq, Hq, Dv] in q's dtype, lse [B, Hq, Lq] float32): attn.attention_with_kvcache,
    appending k, v (when given) to k_cache, v_cache in place first."""
    from attn import _kvcache  # noqa: PLC0415 — loaded with attn
    return _kvcache._attend(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale,
                            causal, (window_left, window_right), softcap, alibi_slopes, True,
                            sinks)


@_kvcache_op.register_fake
def _kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal,
                  window_left, window_right, softcap, alibi_slopes, sinks):
    if q.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("q, v_cache: expected [B, Lq, Hq, D] and [B | pages, L, Hkv, Dv]")
    B, Lq, Hq, _ = q.shape
    return (q.new_empty((B, Lq, Hq, v_cache.shape[3])),
            q.new_empty((B, Hq, Lq), dtype=torch.float32))


def public_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, return_softmax_lse, sinks):
    """attn.attention_with_kvcache through torch.ops.attn.kvcache, for a traced call; the
    eager call's result, with no gradient (q, k, v and the vectors read detached)."""
    left, right = _checks.window(window_size)
    if isinstance(cache_seqlens, (int, float)):
        cache_seqlens = torch.full((q.shape[0],), _checks.integer(
            "cache_seqlens", cache_seqlens, _checks._INT32), dtype=torch.int32)
    detached = [None if x is None else _as_tensor(x, torch.float32).detach()
                for x in (q, k, v, alibi_slopes, sinks)]
    q, k, v, alibi_slopes, sinks = detached
    out, lse = torch.ops.attn.kvcache(
        q, k_cache, v_cache, k, v, _as_tensor(cache_seqlens, None),
        _as_tensor(block_table, None), None if softmax_scale is None else float(softmax_scale),
        bool(causal), left, right, float(softcap), alibi_slopes, sinks)
    return (out, lse) if return_softmax_lse else out


@torch.library.custom_op("attn::merge_attention_states", mutates_args=(), device_types="cpu")
def _merge_op(o_parts: List[Tensor], lse_parts: List[Tensor], threads: int = 0
              ) -> Tuple[Tensor, Tensor]:
    """(o [..., D], lse [...]), float32: attn.merge_attention_states of the partials."""
    from attn import _merge  # noqa: PLC0415 — loaded with attn
    return _merge._merge(list(o_parts), list(lse_parts), threads)


@_merge_op.register_fake
def _merge_fake(o_parts, lse_parts, threads=0):
    if not o_parts or len(o_parts) != len(lse_parts):
        raise ValueError("merge_attention_states: as many LSE partials as o partials, >= 1")
    return (o_parts[0].new_empty(o_parts[0].shape, dtype=torch.float32),
            o_parts[0].new_empty(lse_parts[0].shape, dtype=torch.float32))


def public_merge(o_parts, lse_parts, threads):
    """attn.merge_attention_states through torch.ops.attn.merge_attention_states, for a
    traced call: the partials as lists (a stacked tensor unbound), read detached."""
    def parts(x):
        xs = list(x) if isinstance(x, (list, tuple)) else [x[c] for c in range(len(x))]
        return [_as_tensor(p, torch.float32).detach() for p in xs]
    return torch.ops.attn.merge_attention_states(parts(o_parts), parts(lse_parts),
                                                 _checks.threads(threads))


@torch.library.custom_op("attn::cascade", mutates_args=(), device_types="cpu")
def _cascade_op(q: Tensor, k_prefix: Optional[Tensor], v_prefix: Optional[Tensor],
                k_suffix: Optional[Tensor], v_suffix: Optional[Tensor],
                suffix_lens: Optional[Tensor], prefix_len: Optional[int],
                prefix_block_table: Optional[Tensor], suffix_block_table: Optional[Tensor],
                scale: Optional[float], causal: bool, softcap: float,
                sinks: Optional[Tensor], threads: int = 0) -> Tuple[Tensor, Tensor]:
    """(out [B, Lq, Hq, D] in q's dtype, lse [B, Hq, Lq] float32): attn.cascade_attention."""
    from attn import _merge  # noqa: PLC0415 — loaded with attn
    return _merge._cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens,
                           prefix_len, prefix_block_table, suffix_block_table, scale, causal,
                           softcap, sinks, True, threads)


@_cascade_op.register_fake
def _cascade_fake(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
                  prefix_block_table, suffix_block_table, scale, causal, softcap, sinks,
                  threads=0):
    if q.dim() != 4:
        raise ValueError("q: expected [B, Lq, Hq, D], got shape %s" % (tuple(q.shape),))
    B, Lq, Hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, Lq), dtype=torch.float32)


def public_cascade(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_len,
                   prefix_block_table, suffix_block_table, softmax_scale, causal, softcap,
                   sinks, return_lse, threads):
    """attn.cascade_attention through torch.ops.attn.cascade, for a traced call; the eager
    call's result, with no gradient (the floating inputs read detached)."""
    q, k_prefix, v_prefix, k_suffix, v_suffix, sinks = (
        None if x is None else _as_tensor(x, torch.float32).detach()
        for x in (q, k_prefix, v_prefix, k_suffix, v_suffix, sinks))
    out, lse = torch.ops.attn.cascade(
        q, k_prefix, v_prefix, k_suffix, v_suffix, _as_tensor(suffix_lens, None),
        None if prefix_len is None else _checks.integer("prefix_len", prefix_len),
        _as_tensor(prefix_block_table, None), _as_tensor(suffix_block_table, None),
        None if softmax_scale is None else float(softmax_scale), bool(causal),
        float(softcap), sinks, _checks.threads(threads))
    return (out, lse) if return_lse else out
