"""attn — exact scaled dot-product attention (libattn) for NumPy arrays and PyTorch/JAX
tensors of float32, float16 or bfloat16, read in place whatever their strides.

    import attn, numpy as np
    q = k = v = np.random.rand(2, 8, 128, 64).astype(np.float32)    # (B, H, L, D)
    o = attn.scaled_dot_product_attention(q, k, v, is_causal=True)

attn.scaled_dot_product_attention has the signature and the meaning of PyTorch's
torch.nn.functional.scaled_dot_product_attention, plus keyword-only extras for what the
library has beyond it. PyTorch tensors that require grad get their gradients through the
library's backward pass (a torch.autograd.Function; torch itself is never imported here).
The full reference is docs/PYTHON.md; the semantics of every edge case are
docs/CONTRACT.md.
"""
from __future__ import annotations

import sys
from typing import Any, Literal, Optional, Sequence, Tuple, TypeVar, Union, overload

import numpy as np

from . import _attn, _options

__all__ = ["scaled_dot_product_attention", "kernel_name", "__version__"]

__version__: str = _attn.version()

T = TypeVar("T")
"""The kind of the query (numpy.ndarray, torch.Tensor, a JAX array): the result's kind."""

Align = Literal["top-left", "bottom-right"]
Precision = Literal["default", "fast", "float64", "float32"]
Path = Literal["auto", "fused", "reference"]

_ALIGN = {"top-left": 0, "bottom-right": 1}
_PATH = {"auto": 0, "fused": 1, "reference": 2}
# precision -> (the path it needs, or None for any; attn_precision: 0 DEFAULT, 1 FAST).
# "float32" is the name "default" had before the half-precision levels existed.
_PRECISION = {"default": (None, 0), "float32": (None, 0), "fast": ("fused", 1),
              "float64": ("reference", 0)}


def _dropout_path_level(dropout_p: Any, path: str, precision: str) -> Tuple[float, str, int]:
    """(dropout_p, path, level) of a call's dropout_p, path and precision strings, checked
    as every call takes them: dropout_p a number in [0, 1] (checked here in double: the
    library's float could round to 1); precision's path ("fast" and "float64" name one)
    agreeing with path, which it then becomes."""
    dropout_p = _options.number("dropout_p", dropout_p)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError("dropout_p=%r: expected 0 <= dropout_p <= 1 (0 = off)" % (dropout_p,))
    if path not in _PATH:
        raise ValueError("path=%r: expected 'auto', 'fused' or 'reference'" % (path,))
    if precision not in _PRECISION:
        raise ValueError("precision=%r: expected 'default', 'fast' or 'float64' ('float32' "
                         "= 'default')" % (precision,))
    wanted, level = _PRECISION[precision]
    if wanted is not None:
        if path not in ("auto", wanted):
            raise ValueError("precision=%r runs on the %s path, but path=%r" % (
                precision, wanted, path))
        path = wanted
    return dropout_p, path, level


def kernel_name() -> str:
    """The kernel family a fused call of this process runs ('generic' on the portable path)."""
    return _attn.kernel_name()


def tune(*, quick: bool = False, out: Optional[str] = None, threads: int = 0) -> None:
    """Times this machine's choices of the fused path (kernel, block sizes, decoding split)
    per shape class and writes the winners to a wisdom file: out, or $ATTN_WISDOM, else
    $XDG_CACHE_HOME/attn/wisdom, else ~/.cache/attn/wisdom. Later processes read it at their
    first call; this one keeps what it read. quick: the common classes only (about 10 s on
    2 cores). OSError when the file cannot be written, RuntimeError when ATTN_ISA or a tile
    override is set. docs/KERNELS.md, "Tuner"."""
    _attn.tune(quick=bool(quick), out=None if out is None else str(out), threads=int(threads))


def _torch_tensor_type() -> Optional[type]:
    torch = sys.modules.get("torch")  # never imported here: only if the caller has it
    return getattr(torch, "Tensor", None) if torch is not None else None


def _plain(x: Any, tensor_type: Optional[type]) -> Any:
    """A PyTorch tensor that requires grad is read through .detach() (same memory)."""
    if tensor_type is not None and isinstance(x, tensor_type) and x.requires_grad:
        return x.detach()
    return x


def _vector(x: Any, dtype: Any) -> Any:
    """kv_len and alibi_slopes may be Python sequences (copied: they are tiny)."""
    if isinstance(x, (list, tuple, range)):
        return np.asarray(x, dtype=dtype)
    return x


def _widen(x: Any, tensor_type: Optional[type]) -> Any:
    """A float16, bfloat16 or float64 attn_mask or alibi_slopes as a float32 copy: the
    library reads those two in float32 (exact for the 16-bit types; a float64 mask, as a
    float64 model passes it, is rounded to float32 once, -inf and 0 exactly, and then
    added in float64 by a float64 call). Anything else is returned as it is."""
    if tensor_type is not None and isinstance(x, tensor_type):
        torch = sys.modules["torch"]
        return x.float() if x.dtype in (torch.float16, torch.bfloat16, torch.float64) else x
    name = getattr(getattr(x, "dtype", None), "name", None)  # NumPy, ml_dtypes, JAX
    if name in ("float16", "bfloat16", "float64") and hasattr(x, "astype"):
        return x.astype(np.float32)
    return x


def _numpy_dtype(name: str) -> Any:
    """The NumPy dtype of 'float32', 'float16' or 'bfloat16'. NumPy has no bfloat16 of its
    own: ml_dtypes' (JAX's) is used where it is installed, float32 otherwise."""
    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes  # noqa: PLC0415 — optional, and only for a bfloat16 result
    except ImportError:
        return np.dtype(np.float32)
    return np.dtype(ml_dtypes.bfloat16)


_TORCH_DTYPES: dict = {}  # the extension's dtype names as torch dtypes, filled on first use


def _allocator(query: Any, tensor_type: Optional[type]):
    """alloc(shape, which, dtype) for the C extension: the result's kind follows the query.

    PyTorch query -> torch.empty (CPU); anything else -> numpy.empty. The extension asks
    for the query's dtype for the output and float32 for LSE and weights. A PyTorch
    output has the query's memory order (_query_order): transformers' [B, L, H, D] memory
    read as [B, H, L, D] gets its output so too, as from PyTorch's own CPU kernel, and the
    caller's transpose back is dense without a copy.
    """
    if tensor_type is not None and isinstance(query, tensor_type):
        torch = sys.modules["torch"]
        if not _TORCH_DTYPES:
            _TORCH_DTYPES.update(float32=torch.float32, float16=torch.float16,
                                 bfloat16=torch.bfloat16, float64=torch.float64)
        dtypes = _TORCH_DTYPES
        order = _query_order(query)

        def alloc(shape, which, dtype):
            if which != "output" or order is None or len(shape) != len(order):
                return torch.empty(shape, dtype=dtypes[dtype])
            back = sorted(range(len(order)), key=order.__getitem__)
            return torch.empty([shape[i] for i in order], dtype=dtypes[dtype]).permute(back)
        return alloc

    def alloc(shape, which, dtype):
        return np.empty(shape, dtype=_numpy_dtype(dtype))
    return alloc


def _query_order(query: Any) -> Optional[list]:
    """The order of a PyTorch query's dimensions in memory, outermost first: those longer
    than 1 by stride (ties in their own order), each size-1 one in its own place, the last
    always last; None where that is the natural order or the query has under 3 dims."""
    n = query.dim()
    if n < 3 or query.is_contiguous():  # contiguous: the natural order
        return None
    size, stride = query.shape, query.stride()
    if any(stride[i] == 0 and size[i] > 1 for i in range(n)):
        return None  # broadcast: no order of its own
    big = iter(sorted((i for i in range(n - 1) if size[i] > 1), key=lambda i: (-stride[i], i)))
    order = [i if size[i] == 1 else next(big) for i in range(n - 1)] + [n - 1]
    return None if order == list(range(n)) else order


def _to_query_kind(x: Any, query: Any) -> Any:
    """NumPy results back into the query's framework where it is not NumPy or PyTorch."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(query, getattr(jax, "Array", ())):
        return jax.numpy.asarray(x)  # JAX arrays are immutable: a JAX-owned copy
    return x


def _forward(query: Any, key: Any, value: Any, attn_mask: Any, alibi_slopes: Any,
             kv_len: Any, options: tuple, want_lse: bool, want_weights: bool,
             tensor_type: Optional[type], alloc: Any = None, sinks: Any = None
             ) -> Tuple[Any, Any, Any]:
    """_attn.forward on inputs already read as plain arrays/tensors; options is the tuple
    (is_causal, scale, enable_gqa, align, window, softcap, path, precision, threads,
    dropout_p, dropout_seed, dropout_offset) of the C arguments, as the backward takes
    them too. alloc: _allocator's by default."""
    causal, scale, gqa, align, window, softcap, path, level, threads = options[:9]
    return _attn.forward(query, key, value, attn_mask, causal, scale, gqa, align, window,
                         softcap, alibi_slopes, kv_len, want_lse, want_weights, path, level,
                         threads, alloc or _allocator(query, tensor_type), sinks,
                         **_dropout_kwargs(options))


def _dropout_kwargs(options: tuple) -> dict:
    """The extension's keyword-only dropout arguments of an options tuple: none when
    dropout is off (the calls then have the arguments they had before dropout existed)."""
    p, seed, offset = options[9:]
    return dict(dropout_p=p, dropout_seed=seed, dropout_offset=offset) if p > 0.0 else {}


_UINT64 = (1 << 64) - 1


def _dropout_seed(seed: Any, query: Any, tensor_type: Optional[type]) -> int:
    """The seed of a call with dropout: the caller's (an int; taken modulo 2^64, so a
    negative one works as well), or one drawn from the query's framework's own global
    generator so that its seeding function makes the call reproducible:
    torch.manual_seed for a PyTorch query (64 random bits from torch's default CPU
    generator), numpy.random.seed otherwise (NumPy's global RandomState)."""
    if seed is not None:
        return _options.integer("seed", seed, (-(1 << 63), _UINT64)) & _UINT64
    if tensor_type is not None and isinstance(query, tensor_type):
        torch = sys.modules["torch"]
        return int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)) & _UINT64
    return int(np.random.randint(0, 1 << 64, dtype=np.uint64))


def _call_seed(seed: Any, dropout_p: float, query: Any, tensor_type: Optional[type],
               ops: Any) -> Any:
    """The options' seed: 0 without dropout; None for a traced call with no seed (ops: see
    _traced_ops), whose op draws it in the graph (torch_op.draw_seed: a new mask per call
    of a compiled function); _dropout_seed's otherwise."""
    if dropout_p == 0.0:
        return 0
    return None if seed is None and ops is not None else _dropout_seed(seed, query,
                                                                       tensor_type)


# ---- autograd (PyTorch) ---------------------------------------------------------------------
# torch is never imported by this module: _torch_tensor_type() finds it in sys.modules, so
# a caller passing torch tensors has imported it already, and everyone else never pays for it.

def _requires_grad(x: Any, tensor_type: type) -> bool:
    return isinstance(x, tensor_type) and x.requires_grad


def _wants_autograd(query: Any, key: Any, value: Any, attn_mask: Any, alibi_slopes: Any,
                    tensor_type: type, sinks: Any = None) -> bool:
    """Whether the call goes through the autograd Function: grad mode on and query, key,
    value, sinks or a float attn_mask (a bias: T5's position bias, ALiBi-like learned
    biases) a torch tensor that requires grad. Slopes that require grad are refused there
    and then (the library has no gradient for them: silently leaving it out would leave
    them untrained)."""
    torch = sys.modules["torch"]
    if not torch.is_grad_enabled():
        return False
    if _requires_grad(alibi_slopes, tensor_type):
        raise NotImplementedError(
            "alibi_slopes requires grad, but attn computes no gradient for it (only for "
            "query, key, value, a float attn_mask and sinks); pass alibi_slopes.detach() if "
            "it is meant to be a constant")
    wants = [_requires_grad(x, tensor_type) for x in (query, key, value, sinks, attn_mask)]
    if any(wants) and not isinstance(query, tensor_type):
        which = (("key", "value", "sinks", "attn_mask")[wants.index(True, 1) - 1]
                 if not wants[0] else "query")
        raise TypeError("query: a %s, but %s requires grad: the output follows the query's "
                        "kind, so pass query as a torch tensor too (torch.from_numpy shares "
                        "its memory) for autograd" % (type(query).__name__, which))
    return any(wants)


def _traced_ops(tensor_type: Optional[type], *xs: Any) -> Any:
    """attn.integrations.torch_op (imported here, when a torch tensor arrives) when a call
    on torch tensors is traced (torch.compile, torch.export, fake tensors: torch_op.traced),
    so that it goes through a custom op the tracer keeps in the graph; None otherwise
    (eager: the extension is called directly)."""
    global _TORCH_OP
    if tensor_type is None:
        return None
    for x in xs:  # a loop, not any() over a generator: this runs on every call
        if isinstance(x, tensor_type):
            break
    else:
        return None
    if _TORCH_OP is None:
        from .integrations import torch_op  # noqa: PLC0415 — imports torch, loaded already
        _TORCH_OP = torch_op
    return _TORCH_OP if _TORCH_OP.traced(*xs) else None


_TORCH_OP = None  # attn.integrations.torch_op once a torch tensor has arrived


_FUNCTION = None


def _sdpa_function() -> Any:
    """The torch.autograd.Function behind a call that needs gradients, made on first use."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    torch = sys.modules["torch"]
    from torch.autograd.function import once_differentiable  # noqa: PLC0415 — torch is loaded

    class ScaledDotProductAttention(torch.autograd.Function):
        """attn's attention with attn_backward as its gradient. Inputs: query, key, value
        (any of them may require grad), attn_mask, alibi_slopes, kv_len (constants),
        options (the C arguments' tuple, see _forward) and want_weights. Outputs: the
        output, the LSE (always computed: the backward needs it; non-differentiable) and,
        when asked, the weights (non-differentiable)."""

        @staticmethod
        def forward(ctx, query, key, value, attn_mask, alibi_slopes, kv_len, options,
                    want_weights, sinks=None):
            tt = torch.Tensor
            q, k, v, mask, slopes, lens = (_plain(x, tt) for x in (
                query, key, value, attn_mask, alibi_slopes, kv_len))
            # the sinks (may require grad: their gradient is the backward's d_sinks), read
            # in float32 (a 16-bit one widened)
            ctx.sinks_dtype = getattr(sinks, "dtype", None)
            sinks = None if sinks is None else _widen(_plain(sinks, tt), tt)
            alloc = None
            half = q.dtype in (torch.float16, torch.bfloat16)
            if half:
                # A 16-bit query: the library writes the output in float32 and the caller
                # gets it rounded once (the same bits as a 16-bit output from the library,
                # which also rounds its float32 result once, to nearest even). The backward
                # reads the float32 one: its rowsum(dO * O) then carries no 16-bit rounding
                # of O, which would otherwise reach dQ and dK (measured up to 3.7x PyTorch's
                # own 16-bit backward error, where the gradients are small next to |dO||O|).
                def alloc(shape, which, dtype):
                    return torch.empty(shape, dtype=torch.float32 if which == "output"
                                       else getattr(torch, dtype))
            out, lse, weights = _forward(q, k, v, mask, slopes, lens, options, True,
                                         want_weights, tt, alloc, sinks)
            inputs = (q, k, v, mask, slopes, lens, sinks)
            # tensors through save_for_backward (in-place changes before backward are then
            # caught by PyTorch); anything else (a NumPy mask, a list of lengths) on ctx
            ctx.save_for_backward(*(x if isinstance(x, tt) else None for x in inputs),
                                  out, lse)
            if half:
                out = out.to(q.dtype)
            ctx.others = tuple(None if isinstance(x, tt) else x for x in inputs)
            ctx.options = options
            ctx.dtypes = tuple(getattr(x, "dtype", None) for x in (query, key, value))
            extra = (lse,) if weights is None else (lse, weights)
            ctx.mark_non_differentiable(*extra)
            return (out,) + extra

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out, *unused):
            tt = torch.Tensor
            saved = [_plain(x, tt) for x in ctx.saved_tensors]  # the library reads them
            q, k, v, mask, slopes, lens, sinks = (s if o is None else o
                                                  for s, o in zip(saved[:7], ctx.others))
            out, lse = saved[7:]
            grad_out = _plain(grad_out, tt)
            # each gradient in its input's dtype (float32, float16 or bfloat16): the library
            # computes in float32 and rounds once to it, so .grad needs no cast (a float32
            # buffer cast afterwards would round twice)
            # contiguous: in transformers' [B, L, H, D] layout the views' backward would
            # copy nothing, but the library writes them slower there (docs/PYTHON.md)
            grads = [torch.empty(x.shape, dtype=dtype)
                     if need and isinstance(x, tt) else None
                     for need, x, dtype in zip(ctx.needs_input_grad[:3], (q, k, v),
                                               ctx.dtypes)]
            causal, scale, gqa, align, window, softcap, path, level, threads = ctx.options[:9]
            d_sinks = (torch.empty(sinks.shape, dtype=torch.float32)
                       if sinks is not None and ctx.needs_input_grad[8] else None)
            # a float mask's gradient (the library's d_bias), float32 of the mask's shape
            # (the mask reaches here in float32: a 16-bit one was widened by a tracked cast)
            d_mask = (torch.empty(mask.shape, dtype=torch.float32)
                      if ctx.needs_input_grad[3] and isinstance(mask, tt)
                      and mask.dtype == torch.float32 else None)
            # the forward's dropout options: the same seed regenerates the same mask
            extra = {} if d_mask is None else {"grad_attn_mask": d_mask}
            _attn.backward(q, k, v, out, grad_out, lse, grads[0], grads[1], grads[2],
                           mask, causal, scale, gqa, align, window, softcap, slopes, lens,
                           path, level, threads, sinks, d_sinks, **extra,
                           **_dropout_kwargs(ctx.options))
            if d_sinks is not None and d_sinks.dtype != ctx.sinks_dtype:
                d_sinks = d_sinks.to(ctx.sinks_dtype)
            return tuple(grads) + (d_mask,) + (None,) * 4 + (d_sinks,)

    _FUNCTION = ScaledDotProductAttention
    return _FUNCTION


@overload
def scaled_dot_product_attention(query: T, key: Any, value: Any, attn_mask: Any = ...,
                                 dropout_p: float = ..., is_causal: bool = ...,
                                 scale: Optional[float] = ..., enable_gqa: bool = ..., *,
                                 align: Align = ..., window: Optional[Tuple[int, int]] = ...,
                                 softcap: float = ..., alibi_slopes: Any = ...,
                                 kv_len: Any = ..., return_lse: Literal[False] = ...,
                                 return_weights: Literal[False] = ...,
                                 precision: Precision = ..., threads: int = ...,
                                 path: Path = ..., sinks: Any = ...,
                                 seed: Optional[int] = ...) -> T: ...
@overload
def scaled_dot_product_attention(query: T, key: Any, value: Any, attn_mask: Any = ...,
                                 dropout_p: float = ..., is_causal: bool = ...,
                                 scale: Optional[float] = ..., enable_gqa: bool = ..., *,
                                 align: Align = ..., window: Optional[Tuple[int, int]] = ...,
                                 softcap: float = ..., alibi_slopes: Any = ...,
                                 kv_len: Any = ..., return_lse: Literal[True],
                                 return_weights: Literal[False] = ...,
                                 precision: Precision = ..., threads: int = ...,
                                 path: Path = ..., sinks: Any = ...,
                                 seed: Optional[int] = ...) -> Tuple[T, T]: ...
@overload
def scaled_dot_product_attention(query: T, key: Any, value: Any, attn_mask: Any = ...,
                                 dropout_p: float = ..., is_causal: bool = ...,
                                 scale: Optional[float] = ..., enable_gqa: bool = ..., *,
                                 align: Align = ..., window: Optional[Tuple[int, int]] = ...,
                                 softcap: float = ..., alibi_slopes: Any = ...,
                                 kv_len: Any = ..., return_lse: Literal[False] = ...,
                                 return_weights: Literal[True],
                                 precision: Precision = ..., threads: int = ...,
                                 path: Path = ..., sinks: Any = ...,
                                 seed: Optional[int] = ...) -> Tuple[T, T]: ...
@overload
def scaled_dot_product_attention(query: T, key: Any, value: Any, attn_mask: Any = ...,
                                 dropout_p: float = ..., is_causal: bool = ...,
                                 scale: Optional[float] = ..., enable_gqa: bool = ..., *,
                                 align: Align = ..., window: Optional[Tuple[int, int]] = ...,
                                 softcap: float = ..., alibi_slopes: Any = ...,
                                 kv_len: Any = ..., return_lse: Literal[True],
                                 return_weights: Literal[True],
                                 precision: Precision = ..., threads: int = ...,
                                 path: Path = ..., sinks: Any = ...,
                                 seed: Optional[int] = ...) -> Tuple[T, T, T]: ...


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 align="top-left", window=None, softcap=0.0,
                                 alibi_slopes=None, kv_len=None, return_lse=False,
                                 return_weights=False, precision="default", threads=0,
                                 path="auto", sinks=None, seed=None):
    """Exact attention: softmax(scale * query @ key^T + attn_mask) @ value, computed by libattn.

    The signature and meaning of torch.nn.functional.scaled_dot_product_attention, on the
    CPU, with float32 accumulation whatever the input dtypes, reading every input in place
    (no copy, whatever its strides).

    Args:
        query: (L, D), (H, L, D) or (B, H, L, D) — a NumPy array or any tensor with
            __dlpack__ on the CPU (PyTorch, JAX). float32, float16 or bfloat16 (NumPy has
            no bfloat16; ml_dtypes' is read where installed). The output has its dtype.
        key: (S, D), (Hkv, S, D) or (B, Hkv, S, D), same kind of rules; float32, float16
            or bfloat16, independently of the query (a float32 query over a 16-bit K/V
            cache works).
        value: (S, Dv), (Hkv, S, Dv) or (B, Hkv, S, Dv). Dv may differ from D. The same
            dtype as key.
            Leading dimensions broadcast as in PyTorch (a size-1 batch or head dimension
            is shared); the result has the broadcast leading dimensions.
        attn_mask: None, a bool mask (True = attend) or a float mask added to the logits
            (-inf allowed), broadcast to (B, H, L, S) right-aligned as in PyTorch. float32
            is read in place; a float16 or bfloat16 mask is widened to a float32 copy.
        dropout_p: the probability 0 <= p <= 1 of dropping each attention weight (0 = no
            dropout), as PyTorch: the kept weights are scaled by 1 / (1 - p) before
            @ value (p = 1 gives an output of 0). Unlike PyTorch the library applies it
            whether or not the caller is "training": pass 0.0 for inference. The mask is
            a function of (seed, b, h, i, j) (docs/CONTRACT.md, "Dropout"): the same on
            every path, kernel, thread count and machine; the backward regenerates it.
        is_causal: keep key j for query i when j <= i (top-left, PyTorch's is_causal; see
            align for the KV-cache alignment).
        scale: the factor applied to query @ key^T; None = 1/sqrt(D) (1 when D = 0).
        enable_gqa: grouped-query attention: H query heads over Hkv key/value heads,
            H % Hkv == 0, query head h reads key/value head h // (H // Hkv). Without it,
            H != Hkv (neither 1) raises ValueError, as in PyTorch.

    Keyword-only extras (the library has them, PyTorch does not):
        align: "top-left" (default, PyTorch) or "bottom-right" (the diagonal of row i is
            i + S_b - L, as KV caches and FlashAttention): the diagonal used by is_causal,
            window and alibi_slopes.
        window: (left, right): keep keys d_i - left <= j <= d_i + right; -1 = unbounded.
        softcap: > 0: logits become softcap * tanh(logits / softcap) before the mask.
        alibi_slopes: (H,) float32 (16-bit: widened): adds -slope[h] * |d_i - j| to the
            logits.
        kv_len: (B,) int32/int64 (or a list): keys j >= kv_len[b] of batch b are masked.
        return_lse: also return the natural log-sum-exp of each row's logits, (..., L),
            float32 (-inf for a fully masked row).
        return_weights: also return the attention weights, (..., L, S), float32. With
            dropout: the weights that multiplied value, dropped ones 0 and kept ones
            scaled by 1 / (1 - p) (as torch.nn.MultiheadAttention's need_weights).
        precision: "default": float32 accumulation, the probabilities kept in float32 for
            P @ value; "fast": the same, except that with a bfloat16 value P is rounded to
            bfloat16 for P @ value (on the CPU's bfloat16 dot products where it has them,
            as FlashAttention and PyTorch's CPU kernel do; fused path only; for other
            value dtypes it is "default", bit for bit); "float64": float64 throughout, the
            reference path that materializes the scores. "float32" is an alias of
            "default" (its name before the 16-bit levels existed).
        threads: OpenMP threads, 0 = the default. Results are bit-identical for any count.
        path: "auto", "fused" (streaming FlashAttention-2, memory independent of S) or
            "reference" (float64 oracle).
        sinks: (H,) one attention-sink logit per query head (gpt-oss; float32, a 16-bit one
            widened, or a list): an extra term exp(sink) in each row's softmax denominator
            with no value, so the weights sum to less than 1; 0 is the off-by-one softmax
            (add_zero_attn), -inf no sink. A fully masked row gives 0 and LSE = sink.
            A torch tensor that requires grad gets its gradient (summed over the batch and
            rows) through the autograd Function.
        seed: the dropout mask's seed, an int (modulo 2^64). None (the default) draws
            one per call: from torch's default generator for a PyTorch query (so
            torch.manual_seed makes the call reproducible), from NumPy's global
            RandomState otherwise (numpy.random.seed). Unused when dropout_p = 0.

    Returns:
        The output (..., L, Dv), of the query's kind and dtype: NumPy in, NumPy out;
        PyTorch in, PyTorch out (a new CPU tensor from torch.empty, in the query's memory
        order: transformers' [B, L, H, D] memory read as [B, H, L, D] gets its output
        so, as from PyTorch's CPU kernel); a JAX array for a JAX
        query; any other DLPack producer gets a NumPy array (float32 for a bfloat16 query
        where ml_dtypes is not installed). LSE and weights are float32. With return_lse /
        return_weights: the tuple (output, lse), (output, weights) or (output, lse,
        weights).

    Where this deliberately differs from PyTorch (docs/CONTRACT.md):
        - A fully masked row (every key masked by attn_mask, causal, window or kv_len, or
          S = 0) gives an output row of 0 (LSE -inf, weights 0), not NaN.
        - is_causal together with attn_mask is allowed and means both masks
          (PyTorch raises).
        - Masked keys are never used: NaN or Inf stored in a masked key or value row cannot
          reach the output.

    Autograd (PyTorch):
        When grad mode is on and query, key or value is a torch tensor with
        requires_grad, the call runs through a torch.autograd.Function whose backward is
        the library's attn_backward (FlashAttention-2 style, deterministic: bit-identical
        gradients for any thread count), with the same options as the forward: .grad of
        query, key and value (summed over the query heads of a group under enable_gqa,
        and over any broadcast batch or head dimension). Fully masked rows contribute 0
        to every gradient. Only query, key and value get gradients: attn_mask (bool or
        float), alibi_slopes and kv_len are constants, and a mask or slopes that require
        grad raise NotImplementedError rather than stay silently untrained. The forward
        also computes the LSE for the backward; the LSE and weights returned by
        return_lse / return_weights are non-differentiable (requires_grad=False: a loss
        on them does not reach the inputs, as with PyTorch's own fused kernels). Each
        .grad has its input's dtype: float16 and bfloat16 inputs (a float32 query over a
        16-bit K/V too) get 16-bit gradients, computed in float32 and rounded once. No
        double backward (differentiating the gradients raises). The query must then be a
        torch tensor.

    Raises:
        TypeError: an input is not an array/tensor, or has an unsupported dtype (float64,
            integers), or key and value differ in dtype. The message names the argument.
        ValueError: a wrong shape, rank, stride or option value, or a tensor on a GPU. The
            message names the argument; exceptions raised from the library's status carry
            it in their `status` attribute (e.g. "ATTN_ERR_SHAPE").
        NotImplementedError: under autograd, a mask or slopes that require grad.

    The GIL is released while the library computes (forward and backward).
    """
    dropout_p, path, level = _dropout_path_level(dropout_p, path, precision)
    if align not in _ALIGN:
        raise ValueError("align=%r: expected 'top-left' or 'bottom-right'" % (align,))
    # flags, numbers and counts as PyTorch takes them, nothing looser (_options.py)
    window = _options.window(window)
    threads = _options.threads(threads)
    is_causal, enable_gqa, return_lse, return_weights = _options.flags(
        ("is_causal", "enable_gqa", "return_lse", "return_weights"),
        (is_causal, enable_gqa, return_lse, return_weights))
    scale = None if scale is None else _options.number("scale", scale)
    softcap = _options.number("softcap", softcap)
    alibi_slopes = _options.sequence("alibi_slopes", alibi_slopes, "float")
    kv_len = _options.sequence("kv_len", kv_len, "int")
    sinks = _options.sequence("sinks", sinks, "float")

    tt = _torch_tensor_type()
    grad = tt is not None and _wants_autograd(query, key, value, attn_mask, alibi_slopes, tt,
                                              sinks)
    ops = _traced_ops(tt, query, key, value, attn_mask, sinks)
    seed = _call_seed(seed, dropout_p, query, tt, ops)
    options = (is_causal, scale, enable_gqa, _ALIGN[align], window, softcap, _PATH[path],
               level, threads, dropout_p, seed, 0)
    if ops is not None:  # torch.compile, torch.export: the custom op attn::sdpa
        return ops.public_sdpa(query, key, value, attn_mask, alibi_slopes, kv_len, options,
                               bool(return_lse), bool(return_weights), sinks)
    if grad:
        if attn_mask is not None:
            attn_mask = _widen(attn_mask, tt)
        if alibi_slopes is not None:
            alibi_slopes = _widen(_vector(alibi_slopes, np.float32), tt)
        if kv_len is not None:
            kv_len = _vector(kv_len, np.int64)
        outs = _sdpa_function().apply(query, key, value, attn_mask, alibi_slopes, kv_len,
                                      options, bool(return_weights), sinks)
        if not return_lse and not return_weights:
            return outs[0]
        return (outs[0],) + ((outs[1],) if return_lse else ()) + tuple(outs[2:])

    query, key, value = _plain(query, tt), _plain(key, tt), _plain(value, tt)
    if attn_mask is not None:
        attn_mask = _widen(_plain(attn_mask, tt), tt)
    if alibi_slopes is not None:
        alibi_slopes = _widen(_plain(_vector(alibi_slopes, np.float32), tt), tt)
    if kv_len is not None:
        kv_len = _plain(_vector(kv_len, np.int64), tt)
    if sinks is not None:
        sinks = _widen(_plain(sinks, tt), tt)

    out, lse, weights = _forward(query, key, value, attn_mask, alibi_slopes, kv_len, options,
                                 bool(return_lse), bool(return_weights), tt, sinks=sinks)

    out = _to_query_kind(out, query)
    if not return_lse and not return_weights:
        return out
    extra = tuple(_to_query_kind(x, query) for x in (lse, weights) if x is not None)
    return (out,) + extra


# Bahdanau's additive attention (python/attn/_additive.py)
from ._additive import additive_attention, additive_attention_grad  # noqa: E402,F401
__all__ += ["additive_attention", "additive_attention_grad"]

# decoding against a contiguous or paged KV cache (python/attn/_kvcache.py)
from ._kvcache import attention_with_kvcache, varlen_attention_with_kvcache  # noqa: E402
from ._kvcache import quantize_kv, quantize_kv_u4, dequantize_kv_u4  # noqa: E402
__all__ += ["attention_with_kvcache", "varlen_attention_with_kvcache", "quantize_kv",
            "quantize_kv_u4", "dequantize_kv_u4"]

# packed (variable-length) batches, FlashAttention's varlen call (python/attn/_varlen.py)
from ._varlen import varlen_attention  # noqa: E402
__all__ += ["varlen_attention"]

# merging partial results by their LSE, and shared-prefix decoding (python/attn/_merge.py)
from ._merge import cascade_attention, merge_attention_states  # noqa: E402
__all__ += ["merge_attention_states", "cascade_attention"]

# ---- the multi-head attention layer (python/attn/mha.py; attn.nn for PyTorch) -----------
from .mha import multi_head_attention, multi_head_attention_grad  # noqa: E402

__all__ += ["multi_head_attention", "multi_head_attention_grad"]

# ---- attention weights from a call's LSE, in blocks (python/attn/_grid.py) ---------------
from ._grid import weights_grid  # noqa: E402

__all__ += ["weights_grid"]

# ---- the multi-head layer's cached decoding step (python/attn/_decode.py) ---------------
from ._decode import KVCache, mha_decode  # noqa: E402

__all__ += ["KVCache", "mha_decode"]

# ---- a KV cache or page pool onto 2 MiB pages (python/attn/_huge.py) --------------------
from ._huge import huge_pages  # noqa: E402

__all__ += ["huge_pages"]

# ---- FlexAttention-shaped calls: block masks and additive score_mods (python/attn/_flex.py)
from ._flex import BlockMask, create_block_mask, flex_attention  # noqa: E402

__all__ += ["BlockMask", "create_block_mask", "flex_attention"]
