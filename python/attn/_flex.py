"""FlexAttention-shaped calls on top of attn.scaled_dot_product_attention (pure Python).

    bm = attn.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 1024, 1024)
    out = attn.flex_attention(q, k, v, score_mod=lambda s, b, h, q, kv: s + table[q - kv],
                              block_mask=bm)

The names and meanings of torch.nn.attention.flex_attention's create_block_mask and
flex_attention. A mask_mod is evaluated once, vectorized on broadcast index arrays, into a
dense bool mask, made at once into the library's block mask (attn_block_mask: full, empty
or partial per 64 rows x 16 keys, the partial blocks' elements) and kept on the BlockMask
with its per-block classification at BLOCK_SIZE; flex_attention passes the library's
block mask, so a call reads no dense mask and computes only the blocks that are not
empty. A score_mod is evaluated into a float bias — only an additive one (score + f(b, h,
q, kv)), checked at probe scores; a torch parameter it reads gets its gradient through the
library's d_bias (with a block mask, the bias carries -inf where it masks). See
docs/PYTHON.md.
"""
from __future__ import annotations

import math
import operator
import sys
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np

__all__ = ["BlockMask", "create_block_mask", "flex_attention"]


def _torch() -> Any:
    return sys.modules.get("torch")  # never imported here: only if the caller has it


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _size(name: str, x: Any, allow_none: bool = False) -> int:
    if x is None and allow_none:
        return 1
    if isinstance(x, bool):
        raise ValueError("%s=%r: expected a positive int" % (name, x))
    try:
        n = operator.index(x)
    except TypeError:
        raise ValueError("%s=%r: expected a positive int%s" % (
            name, x, " or None" if allow_none else "")) from None
    if n < 1:
        raise ValueError("%s=%r: expected a positive int%s" % (
            name, x, " or None (broadcast)" if allow_none else ""))
    return n


def _index_grids(shape: Tuple[int, int, int, int], kind: str) -> Tuple[Any, ...]:
    """b, h, q, kv as broadcast int64 index arrays (NumPy) or tensors (torch)."""
    views = ((-1, 1, 1, 1), (1, -1, 1, 1), (1, 1, -1, 1), (1, 1, 1, -1))
    if kind == "numpy":
        return tuple(np.arange(n, dtype=np.int64).reshape(v) for n, v in zip(shape, views))
    torch = _torch()
    return tuple(torch.arange(n, dtype=torch.int64).reshape(v) for n, v in zip(shape, views))


def _as_numpy(x: Any) -> np.ndarray:
    if _is_tensor(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _eval_mask_mod(mask_mod: Callable, shape: Tuple[int, int, int, int]) -> np.ndarray:
    """mask_mod on NumPy index arrays; where that raises and torch is loaded, on torch
    int64 tensors. The result as a C-contiguous bool array of `shape`."""
    try:
        out = mask_mod(*_index_grids(shape, "numpy"))
    except Exception as numpy_error:   # a mask_mod written with torch ops
        if _torch() is None:
            raise
        try:
            out = mask_mod(*_index_grids(shape, "torch"))
        except Exception:
            raise numpy_error from None
    out = _as_numpy(out)
    if out.dtype != np.bool_:
        raise ValueError("mask_mod returned %s values: expected bool (True = attend)"
                         % (out.dtype,))
    try:
        out = np.broadcast_to(out, shape)
    except ValueError:
        raise ValueError("mask_mod returned shape %s, which does not broadcast to (B, H, "
                         "Q_LEN, KV_LEN) = %s" % (out.shape, shape)) from None
    return np.array(out, order="C", copy=True)   # our own, writable (torch shares it)


class BlockMask:
    """A mask_mod evaluated once: the dense bool mask `mask` [B|1, H|1, Q_LEN, KV_LEN]
    (True = attend) and its blocks of Q_BLOCK x KV_BLOCK elements (the last ones of each
    axis clipped) classified as empty (no True: nothing to compute), full (all True) or
    partial. Made by create_block_mask; passed to flex_attention, any number of times."""

    EMPTY, PARTIAL, FULL = 0, 1, 2

    def __init__(self, mask: np.ndarray, shape: Tuple[int, int, int, int],
                 block_size: Tuple[int, int], mask_mod: Optional[Callable] = None):
        self._base = mask                 # writable: torch.from_numpy shares it
        self.mask = mask.view()           # what callers see: read-only
        self.mask.setflags(write=False)
        self.shape = shape
        self.BLOCK_SIZE = block_size
        self.mask_mod = mask_mod
        qb, kb = block_size
        _, _, L, S = mask.shape
        qs, ks = np.arange(0, L, qb), np.arange(0, S, kb)
        any_ = np.logical_or.reduceat(np.logical_or.reduceat(mask, qs, axis=2), ks, axis=3)
        all_ = np.logical_and.reduceat(np.logical_and.reduceat(mask, qs, axis=2), ks, axis=3)
        kind = np.full(any_.shape, self.PARTIAL, np.int8)
        kind[~any_] = self.EMPTY
        kind[all_] = self.FULL
        kind.setflags(write=False)
        self.block_kind = kind
        self._torch_mask = None
        # the library's block mask (its structure and partial blocks), made once here
        from . import _attn   # noqa: PLC0415 — the package's extension, loaded by now
        self._library = _attn._block_mask(mask)

    def library_blocks(self) -> dict:
        """What the library's block mask holds: {"B", "H", "Lq", "Lk", "block_rows" (64),
        "block_keys" (16), "empty", "full", "partial" (its blocks by kind, over B x H),
        "bytes"}. Its blocks, not BLOCK_SIZE's, decide what a call computes."""
        from . import _attn   # noqa: PLC0415
        return _attn._block_mask_info(self._library)

    @property
    def empty_blocks(self) -> np.ndarray:
        return self.block_kind == self.EMPTY

    @property
    def full_blocks(self) -> np.ndarray:
        return self.block_kind == self.FULL

    @property
    def partial_blocks(self) -> np.ndarray:
        return self.block_kind == self.PARTIAL

    def block_counts(self) -> dict:
        """{"empty": n, "partial": n, "full": n} over every (b, h, q block, kv block)."""
        k = self.block_kind
        return {"empty": int((k == self.EMPTY).sum()), "partial": int((k == self.PARTIAL).sum()),
                "full": int((k == self.FULL).sum())}

    def sparsity(self) -> float:
        """The percentage of blocks that are empty (not computed), as FlexAttention's."""
        return 100.0 * float(self.empty_blocks.sum()) / self.block_kind.size

    def to_dense(self) -> np.ndarray:
        """As FlexAttention's BlockMask.to_dense: the block-level mask, [B|1, H|1,
        Q blocks, KV blocks] int32, 1 where a block is computed (partial or full). The
        element-level bool mask is `.mask`."""
        return (self.block_kind != self.EMPTY).astype(np.int32)

    def dense_mask(self, like: Any = None) -> Any:
        """The element-level bool mask in the kind it is passed with: a torch bool tensor
        (made once, cached) when `like` is a torch tensor, else the NumPy array."""
        if _is_tensor(like):
            if self._torch_mask is None:
                self._torch_mask = _torch().from_numpy(self._base)
            return self._torch_mask
        return self.mask

    def __repr__(self) -> str:
        c = self.block_counts()
        return ("BlockMask(shape=%s, BLOCK_SIZE=%s, blocks=%s (empty %d, partial %d, "
                "full %d), sparsity=%.2f%%)" % (self.shape, self.BLOCK_SIZE,
                                               self.block_kind.shape, c["empty"],
                                               c["partial"], c["full"], self.sparsity()))


def create_block_mask(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                      KV_LEN: int, BLOCK_SIZE: Union[int, Tuple[int, int]] = 128,
                      device: Any = None) -> BlockMask:
    """FlexAttention's create_block_mask: mask_mod(b, h, q_idx, kv_idx) -> bool (True =
    attend), evaluated once on broadcast int64 index arrays — NumPy ones, or torch ones
    when it raises on NumPy input and torch is loaded. B or H None: shared (1).
    BLOCK_SIZE: an int or (Q_BLOCK, KV_BLOCK). device: accepted for FlexAttention's
    signature; only the CPU exists here ("cpu" or None)."""
    if not callable(mask_mod):
        raise ValueError("mask_mod=%r: expected a callable (b, h, q_idx, kv_idx) -> bool"
                         % (mask_mod,))
    if device is not None and str(device) != "cpu":
        raise ValueError("device=%r: attn runs on the CPU only" % (device,))
    shape = (_size("B", B, True), _size("H", H, True), _size("Q_LEN", Q_LEN),
             _size("KV_LEN", KV_LEN))
    bs = BLOCK_SIZE if isinstance(BLOCK_SIZE, (tuple, list)) else (BLOCK_SIZE, BLOCK_SIZE)
    if len(bs) != 2:
        raise ValueError("BLOCK_SIZE=%r: expected an int or (Q_BLOCK, KV_BLOCK)" % (BLOCK_SIZE,))
    bs = (_size("BLOCK_SIZE", bs[0]), _size("BLOCK_SIZE", bs[1]))
    return BlockMask(_eval_mask_mod(mask_mod, shape), shape, bs, mask_mod)


# ---- score_mod: an additive one, evaluated into a bias -----------------------------------

_PROBES = (1.0, -2.5, 7.25)   # scores at which score_mod(s) - score_mod(0) must be s


def _score_bias(score_mod: Callable, shape: Tuple[int, int, int, int], torch_kind: bool) -> Any:
    """score_mod(0, b, h, q, kv): the bias (a torch tensor that may require grad, or a
    NumPy float64 array) of a shape broadcasting to `shape`, after checking at the probe
    scores that score_mod(s) = s + score_mod(0) (NotImplementedError otherwise)."""
    idx = _index_grids(shape, "torch" if torch_kind else "numpy")
    if torch_kind:
        torch = _torch()
        def score(t):
            return torch.full((1, 1, 1, 1), t, dtype=torch.float32)
    else:
        def score(t):
            return np.full((1, 1, 1, 1), t, dtype=np.float64)
    bias = score_mod(score(0.0), *idx)
    if torch_kind:
        if not _is_tensor(bias):
            bias = _torch().as_tensor(np.asarray(bias))
        if not bias.is_floating_point():
            raise ValueError("score_mod returned %s values: expected floats" % (bias.dtype,))
    else:
        if _is_tensor(bias):
            raise TypeError("score_mod returned a torch tensor for a NumPy query: pass the "
                            "query as a torch tensor (torch.from_numpy shares its memory)")
        bias = np.asarray(bias)
        if bias.dtype.kind != "f":
            raise ValueError("score_mod returned %s values: expected floats" % (bias.dtype,))
    if bias.ndim > 4:
        raise ValueError("score_mod returned shape %s: more than 4 dimensions"
                         % (tuple(bias.shape),))
    try:
        np.broadcast_shapes(tuple(bias.shape), shape)
    except ValueError:
        raise ValueError("score_mod returned shape %s, which does not broadcast to (B, H, "
                         "Q_LEN, KV_LEN) = %s" % (tuple(bias.shape), shape)) from None
    b0 = _as_numpy(bias).astype(np.float64)
    grad_off = _torch().no_grad() if torch_kind else None
    if grad_off is not None:
        grad_off.__enter__()
    try:
        for t in _PROBES:
            got = _as_numpy(score_mod(score(t), *idx)).astype(np.float64)
            with np.errstate(invalid="ignore"):
                d = got - b0 - t
                # the additions in float32 round: a few ulps of |s| + |bias|
                ok = np.abs(d) <= 8 * np.finfo(np.float32).eps * (abs(t) + np.abs(b0))
                ok |= np.isneginf(b0) & np.isneginf(got)   # a -inf bias (a masked score)
            if not np.all(ok):
                raise NotImplementedError(
                    "score_mod is not additive: score_mod(%g) - score_mod(0) != %g (max "
                    "deviation %.3g). attn evaluates a score_mod into a bias added to the "
                    "scores (relative position biases, ALiBi, document offsets); "
                    "soft-capping and other functions of the score are not supported here "
                    "(attn.scaled_dot_product_attention has softcap=)" % (
                        t, t, float(np.nanmax(np.where(ok, 0.0, np.abs(d))))))
    finally:
        if grad_off is not None:
            grad_off.__exit__(None, None, None)
    return bias


def flex_attention(query: Any, key: Any, value: Any, score_mod: Optional[Callable] = None,
                   block_mask: Optional[BlockMask] = None, scale: Optional[float] = None,
                   enable_gqa: bool = False, return_lse: bool = False) -> Any:
    """FlexAttention's flex_attention on attn: query (B, H, L, E), key (B, Hkv, S, E),
    value (B, Hkv, S, Ev), NumPy or torch (float32, float16, bfloat16). score_mod(score,
    b, h, q_idx, kv_idx) -> score must be additive (score + a function of the indices):
    it is evaluated into a float bias; a torch parameter it reads gets its gradient.
    block_mask: a BlockMask from attn.create_block_mask of shape (B|1, H|1, L, S).
    return_lse: also return the natural-log LSE (B, H, L), float32 (FlexAttention's eager
    and compiled calls return it in natural log too; -inf for a fully masked row)."""
    from . import scaled_dot_product_attention as sdpa   # noqa: PLC0415 — circular import
    q_shape, k_shape = tuple(query.shape), tuple(key.shape)
    if len(q_shape) != 4 or len(k_shape) != 4 or len(tuple(value.shape)) != 4:
        raise ValueError("flex_attention: query, key and value must be 4-D (B, H, L, E), "
                         "got %s, %s, %s" % (q_shape, k_shape, tuple(value.shape)))
    B, H, L = max(q_shape[0], k_shape[0]), q_shape[1], q_shape[2]
    S = k_shape[2]
    shape = (B, H, L, S)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise ValueError("block_mask: expected an attn.BlockMask (attn.create_block_mask), "
                             "got %s" % (type(block_mask).__name__,))
        mb, mh, ml, ms = block_mask.mask.shape
        if ml != L or ms != S or mb not in (1, B) or mh not in (1, H):
            raise ValueError("block_mask of shape %s does not fit the call's (B, H, Q_LEN, "
                             "KV_LEN) = %s (B and H may be 1)" % (block_mask.shape, shape))
    if score_mod is not None and not callable(score_mod):
        raise ValueError("score_mod=%r: expected a callable (score, b, h, q_idx, kv_idx)"
                         % (score_mod,))
    torch_kind = _is_tensor(query)
    mask = None
    if score_mod is not None:
        bias = _score_bias(score_mod, shape, torch_kind)
        if torch_kind:
            torch = _torch()
            bias = bias.to(torch.float32)
            if block_mask is not None:
                bias = torch.where(block_mask.dense_mask(query), bias,
                                   torch.tensor(-math.inf, dtype=torch.float32))
        else:
            if block_mask is not None:
                bias = np.where(block_mask.mask, bias, -np.inf)
            bias = np.ascontiguousarray(bias, dtype=np.float32)
        mask = bias
    elif block_mask is not None:
        mask = block_mask._library   # the library's block mask: options.block_mask
    return sdpa(query, key, value, attn_mask=mask, scale=scale, enable_gqa=enable_gqa,
                return_lse=return_lse)
