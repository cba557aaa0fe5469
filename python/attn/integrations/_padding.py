"""attn.integrations._padding — a key-padding mask recognised as per-batch key lengths.

transformers gives a padded batch to a bidirectional encoder (BERT, MiniLM) as a 4-D bool
mask ``(B, 1, L, S)`` whose every query row of batch b keeps the keys ``j < n_b`` (right
padding), and passes that same tensor to every layer of the forward. The library runs such
a call faster with ``kv_len = (n_0, ..., n_{B-1})`` and no mask: the keys past n_b are
outside every row's range by structure (never read, no per-logit mask test) instead of
being found from the mask's bytes at each call. Both mean the same keys masked, so the
results agree (docs/CONTRACT.md: a key masked either way is never used; a batch with n_b = 0
gives fully masked rows of 0 either way).

padding_lengths(mask, batch, keys) says whether a mask is such a mask and returns the
lengths. The answer for a tensor is remembered until the next different mask: keyed on the
tensor's identity (a weak reference, so a freed mask's id reused by a new tensor is not
mistaken for it) and its version counter (an in-place change of the mask, or of a tensor it
is a view of, is seen and the mask is read again). Inference tensors have no version
counter: theirs is read at every call. What the version counter does not see (a write
through ``.data`` or through a NumPy array sharing the memory) is not seen here either, as
autograd's own checks of saved tensors do not see it.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

__all__ = ["padding_lengths"]

# (weak reference to the last mask read, its version, its lengths or None)
_last = (None, -1, None)


def _read(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """The (B', ) int64 key lengths of a right-padding bool mask (B', 1, L', S), or None."""
    row = mask[:, 0, 0, :]
    lens = row.sum(-1, dtype=torch.int64)
    keep = torch.arange(mask.shape[3]) < lens[:, None]
    return lens if torch.equal(mask, keep[:, None, None, :].expand(mask.shape)) else None


def padding_lengths(mask: Optional[torch.Tensor], batch: int, keys: int
                    ) -> Optional[torch.Tensor]:
    """kv_len, ``(batch,)`` int64, when mask is a bool ``(B, 1, L, S)`` (B = batch or 1,
    S = keys) whose every query row of batch b keeps exactly the keys ``j < n_b``; None
    otherwise (any other mask, dtype or shape: pass the mask itself)."""
    global _last
    if (mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1
            or mask.shape[3] != keys or mask.shape[0] not in (1, batch)
            or mask.numel() == 0 or mask.device.type != "cpu"):
        return None
    if mask.is_inference():
        lens = _read(mask)
    else:
        ref, version, lens = _last
        if ref is None or ref() is not mask or version != mask._version:
            lens = _read(mask)
            _last = (weakref.ref(mask), mask._version, lens)
    if lens is not None and lens.shape[0] != batch:
        lens = lens.expand(batch).contiguous()
    return lens
