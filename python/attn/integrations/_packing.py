"""attn.integrations._packing — packed sequences handed to the transformers backend,
recognised so that they run as one varlen call (attn.varlen_attention) without a mask.

transformers hands an attention function packed sequences (several documents
concatenated into one row of batch 1, as DataCollatorWithFlattening makes them) in one
of two ways, the ones its own flash-attention path reads
(modeling_flash_attention_utils: ``_is_packed_sequence``,
``prepare_fa_kwargs_from_position_ids``):

- explicit keywords ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``,
  ``max_length_k`` (the collator's ``return_flash_attn_kwargs=True``);
- ``position_ids`` of shape (1, L) that restart at 0: sequence s is the rows from one 0 to
  the next (``cu_seqlens`` = the indices of the zeros, then L).

The SDPA mask builder the backend registers makes, for such a row, the block-diagonal
mask of those sequences (causal inside each block for a causal layer, and the sliding
window where the layer has one), none at all, or (transformers 5.24, sliding-window
layers) the row's plain causal sliding mask, unaware of the documents. packed_sequences()
returns the packing where running it as varlen without that mask is what transformers'
flash-attention path computes for the row: batch 1, queries and keys the same rows
(L == S), position ids that restart at 0 and otherwise count up by one, and a mask that
is None, exactly that block-diagonal mask or, for a causal layer, the plain causal
(sliding) mask of the whole row (read once per mask
tensor, remembered by identity and version counter as _padding.py does). Anything else
(a padded batch, a KV cache step, per-head masks, 3-D M-RoPE position ids, an unrelated
mask) returns None and the call takes the backend's ordinary path.
"""
from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch

__all__ = ["packed_sequences"]

# (weak reference to the last mask checked, its version, the key it was checked for, ok)
_last = (None, -1, None, False)


def _from_position_ids(pos: torch.Tensor, L: int) -> Optional[torch.Tensor]:
    """cu_seqlens (int64, B + 1) of position ids (1, L) that start at 0 and, at each row,
    either restart at 0 or count up by one, with at least one restart; else None."""
    if pos.dim() != 2 or pos.shape[0] != 1 or pos.shape[1] != L or L < 2:
        return None
    if pos.dtype not in (torch.int32, torch.int64) or pos.device.type != "cpu":
        return None
    p = pos[0].to(torch.int64)
    if int(p[0]) != 0:
        return None
    step = p[1:] - p[:-1]
    starts = p[1:] == 0
    if not bool(((step == 1) | starts).all()) or not bool(starts.any()):
        return None
    idx = torch.nonzero(p == 0).flatten()
    return torch.cat([idx, torch.tensor([L])]).to(torch.int64)


def _expected_mask(cu: Optional[torch.Tensor], L: int, causal: bool,
                   window_left: int) -> torch.Tensor:
    """The block-diagonal mask of the packing cu; cu None: the same over the whole row (the
    mask a builder that does not know of the packing makes)."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if cu is None:
        keep = torch.ones(L, L, dtype=torch.bool)
    else:
        seq = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu.diff())
        keep = seq[:, None] == seq[None, :]
    if causal:
        keep &= j <= i
    if window_left >= 0:
        keep &= j >= i - window_left
    return keep


def _mask_ok(mask: Optional[torch.Tensor], cu: torch.Tensor, L: int, causal: bool,
             window_left: int) -> bool:
    """Whether mask is None or exactly the block-diagonal mask of the packing."""
    global _last
    if mask is None:
        return True
    if (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1
            or mask.shape[2] != L or mask.shape[3] != L or mask.device.type != "cpu"):
        return False
    key = (tuple(cu.tolist()), causal, window_left)
    if not mask.is_inference():
        ref, version, k, ok = _last
        if ref is not None and ref() is mask and version == mask._version and k == key:
            return ok
    # the packing's block-diagonal mask, or the row's plain causal (sliding) mask that a
    # builder unaware of the packing makes (transformers 5's for sliding-window layers):
    # position ids that restart mark documents, which its flash-attention path runs
    # apart, as varlen does here
    ok = bool(torch.equal(mask[0, 0], _expected_mask(cu, L, causal, window_left)) or
              (causal and torch.equal(mask[0, 0], _expected_mask(None, L, causal, window_left))))
    if not mask.is_inference():
        _last = (weakref.ref(mask), mask._version, key, ok)
    return ok


def maybe_packed(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """packed_sequences' tests that need no tensor's values, first: batch 1 and either
    the four cu_seq_lens / max_length keywords, or position_ids with L = S. False: the
    call is certainly not packed (a decoding step, any batch above 1)."""
    if query.shape[0] != 1 or key.shape[0] != 1:
        return False
    if all(kwargs.get(n) is not None for n in _VARLEN_KEYWORDS):
        return True
    return query.shape[2] == key.shape[2] and isinstance(kwargs.get("position_ids"),
                                                          torch.Tensor)


_VARLEN_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def packed_sequences(query: torch.Tensor, key: torch.Tensor, mask: Optional[torch.Tensor],
                     causal: bool, window_left: int, kwargs: dict
                     ) -> Optional[Tuple[torch.Tensor, torch.Tensor, int, int]]:
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) when the call is packed
    sequences that varlen runs without the mask (module docstring), else None. query
    (1, H, L, D), key (1, Hkv, S, D); causal and window_left (-1 = none): the layer's."""
    if query.shape[0] != 1 or key.shape[0] != 1:
        return None
    L, S = query.shape[2], key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    mq, mk = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if all(x is not None for x in (cu_q, cu_k, mq, mk)):
        if not (isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor)):
            return None
        if cu_q.device.type != "cpu" or cu_k.device.type != "cpu":
            return None
        cu_q, cu_k = cu_q.flatten(), cu_k.flatten()
        same = L == S and torch.equal(cu_q.to(torch.int64), cu_k.to(torch.int64))
        if mask is not None and not (same and _mask_ok(mask, cu_q.to(torch.int64), L, causal,
                                                        window_left)):
            return None
        return cu_q, cu_k, int(mq), int(mk)
    pos = kwargs.get("position_ids")
    if not isinstance(pos, torch.Tensor) or L != S:
        return None
    cu = _from_position_ids(pos, L)
    if cu is None or not _mask_ok(mask, cu, L, causal, window_left):
        return None
    longest = int(cu.diff().max())
    return cu, cu, longest, longest
