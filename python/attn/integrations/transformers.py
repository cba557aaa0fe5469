"""attn.integrations.transformers — attn as a Hugging Face transformers attention backend.

    import attn.integrations.transformers              # registers "attn"
    model = AutoModel.from_pretrained(name, attn_implementation="attn")

Importing the module registers the attention function ``attention_forward`` under the name
"attn" with ``transformers.AttentionInterface``, and transformers' SDPA mask builder
(``masking_utils.sdpa_mask``: a 4-D bool mask, True = attend, or None where ``is_causal``
says it all) under the same name with ``transformers.AttentionMaskInterface`` — without
that second registration transformers builds no mask at all for a backend it does not
know, and padded batches would attend to their padding. ``register(name)`` does both again
(under another name too).

Every attention layer then runs through ``torch.ops.attn.sdpa`` (attn.integrations.torch_op:
the library's fused forward and backward as a custom op, so torch.compile and torch.export
keep it) wherever a gradient is wanted or the call is traced. Where neither is (inference:
torch.no_grad() or no input requiring grad, not under torch.compile or torch.export), the
layer calls the library directly (torch_op.forward_no_grad: the same forward, without the
dispatcher and without the LSE only the backward reads), and a right-padding bool mask
(a padded encoder batch's) is passed as per-batch key lengths instead (_padding.py: read
once per mask tensor, not once per layer). What transformers passes is taken as its SDPA
backend takes it:

- ``attention_mask``: 4-D bool (True = attend) or float (added to the logits), broadcast
  over heads; None with ``is_causal`` (the module's, or the keyword) for a causal layer.
- ``scaling``; GQA through the library's own grouped heads (no ``repeat_kv``: K and V are
  read once per group, not copied per query head).
- ``sliding_window`` (Mistral, Gemma 2): the mask transformers builds carries the window;
  where it built none (a causal layer whose window covers every key), the window is passed
  to the library as ``(sliding_window - 1, 0)``, which is what that mask would have been.
- ``softcap`` (Gemma 2's ``attn_logit_softcapping``): ``softcap * tanh(logits / softcap)``
  before the mask, as its eager path.
- ``position_bias`` (added to the mask as SDPA's backend does).
- Attention weights when the model is asked for them (``output_attentions=True``): the
  library writes them from its LSE in the same pass (no second softmax, no eager path).
  They are float32 from the library, cast to the query's dtype, and not differentiable.

- ``dropout`` (what transformers passes while the module is training: the config's
  attention dropout; 0.0 in eval mode) as the library's dropout on the attention weights
  (docs/CONTRACT.md, "Dropout"), kept weights scaled by 1 / (1 - p) as SDPA and eager. The
  mask's seed is drawn from torch's default CPU generator per call (torch.manual_seed
  makes a training step reproducible) and passed to the op as an int; the mask is the
  library's Philox one, not torch's: the same statistics, not the same draws as eager or
  SDPA. With output_attentions the weights returned are the dropped ones (eager's too).
- Packed sequences (batch 1 holding several documents, as DataCollatorWithFlattening makes
  them: ``position_ids`` restarting at 0, or explicit ``cu_seq_lens_q/k`` and
  ``max_length_q/k``, which transformers' flash-attention path reads too) run as one
  ``attn.varlen_attention`` call without a mask, each document attending to itself only
  (_packing.py: only where the mask transformers built is None or exactly the
  block-diagonal mask of those documents; anything else takes the path above). Its
  gradient is attn_varlen_backward's; under torch.compile / torch.export, or with
  output_attentions, the ordinary path (the block-diagonal mask) is taken instead.
- ``s_aux`` (gpt-oss's learned attention sinks, one logit per query head) as the
  library's ``sinks``: an extra term exp(sink) in each row's softmax denominator, which
  is gpt-oss's eager formula (the sink appended as a logit column, dropped after the
  softmax) and its flex path's LSE renormalisation. Their gradient reaches the parameter.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .. import _options
from .._varlen import varlen_attention
from . import _packing, _padding, torch_op

__all__ = ["attention_forward", "register", "NAME"]

NAME = "attn"


def _module_attr(module: Any, name: str, default: Any = None) -> Any:
    """getattr(module, name, default) for a plain attribute of the layer (sliding_window,
    is_causal), without torch.nn.Module.__getattr__ where that is all a miss would reach:
    it looks only in the parameters, buffers and submodules, and its AttributeError took
    2 us of every decoding call (a Llama layer has no sliding_window). A class with a
    __getattr__ of its own (a wrapper that forwards) is asked as getattr asks it, and so
    is every module under torch.compile (dynamo does not trace object.__getattribute__)."""
    if torch.compiler.is_compiling():
        return getattr(module, name, default)
    try:
        return object.__getattribute__(module, name)
    except AttributeError:
        pass
    if getattr(type(module), "__getattr__", None) in (None, torch.nn.Module.__getattr__):
        return default
    return getattr(module, name, default)


def _want_weights(kwargs) -> bool:
    """Whether the model asked for the attention weights: output_attentions in the call's
    keywords, or transformers' output collector (v5's capture_outputs hooks) recording
    "attentions" for this forward."""
    global _COLLECTOR
    if kwargs.get("output_attentions"):
        return True
    if torch.compiler.is_compiling():
        return False
    if _COLLECTOR is None:  # looked up once (an import statement on every call cost 1 us)
        try:
            from transformers.utils.output_capturing import _active_collector  # noqa: PLC0415
            _COLLECTOR = _active_collector
        except (ImportError, AttributeError):
            _COLLECTOR = False
    if _COLLECTOR is False:
        return False
    try:
        collected = _COLLECTOR.get()
    except (LookupError, AttributeError):
        return False
    return isinstance(collected, dict) and "attentions" in collected


_COLLECTOR = None  # transformers' output collector (a ContextVar), False where it has none


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None,
                      position_bias: Optional[torch.Tensor] = None,
                      **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """transformers' attention-function signature: query ``(B, H, L, D)``, key and value
    ``(B, Hkv, S, D)``; returns ``(attn_output (B, L, H, Dv), attn_weights or None)``."""
    # transformers passes dropout = 0.0 unless the module is training (its attention_dropout
    # then): as its SDPA backend passes it on as dropout_p, the mask drawn here from a seed
    # of torch's default generator (torch.manual_seed makes a training step reproducible)
    dropout = float(dropout or 0.0)
    seed = torch_op.draw_seed() if dropout > 0.0 else 0
    # gpt-oss's learned sinks (s_aux, one logit per query head): an extra logit column in
    # the softmax that is dropped afterwards (its eager path), i.e. exp(sink) added to each
    # row's denominator; their gradient flows through the op
    sinks = kwargs.get("s_aux")

    L, S = query.shape[2], key.shape[2]
    if is_causal is None:
        is_causal = _module_attr(module, "is_causal", True)
    if position_bias is None:
        out = _packed_forward(module, query, key, value, attention_mask, bool(is_causal),
                              scaling, dropout, seed, sinks, kwargs)
        if out is not None:
            return out, None
    # SDPA's rule (transformers/integrations/sdpa_attention.py): the causal flag only where
    # no mask was built and more than one query row; top-left, as SDPA
    is_causal = bool(L > 1 and attention_mask is None and is_causal)
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import (  # noqa: PLC0415
            create_position_bias_mask)
        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal,
                                                   query, key)
        is_causal = False

    window = (-1, -1)
    sliding = (kwargs["sliding_window"] if "sliding_window" in kwargs
               else _module_attr(module, "sliding_window"))
    if sliding and is_causal and L == S:
        window = (_options.integer("sliding_window", sliding) - 1, 0)  # keep j > i - sliding_window, as sdpa_mask's

    softcap = kwargs.get("softcap")
    want = _want_weights(kwargs)
    args = (None if scaling is None else float(scaling), query.shape[1] != key.shape[1],
            window[0], window[1], float(softcap) if softcap else 0.0, want, dropout, seed,
            sinks)
    if torch_op.direct_ok(query, key, value, attention_mask, sinks):
        # no gradient and no tracer: the library directly (no dispatcher, no LSE), a
        # right-padding mask as key lengths (read once per mask tensor, _padding.py)
        kv_len = _padding.padding_lengths(attention_mask, max(query.shape[0], key.shape[0]),
                                          S)
        mask = attention_mask if kv_len is None else None
        out, weights = torch_op.forward_no_grad(query, key, value, mask, is_causal, *args,
                                                kv_len=kv_len)
    else:
        out, _, weights = torch.ops.attn.sdpa(query, key, value, attention_mask, is_causal,
                                              *args)
    out = out.transpose(1, 2).contiguous()  # (B, L, H, Dv) memory already: no copy
    return out, (weights.to(query.dtype) if want else None)


def _packed_forward(module, query, key, value, attention_mask, causal, scaling, dropout,
                    seed, sinks, kwargs) -> Optional[torch.Tensor]:
    """Packed sequences (batch 1: cu_seq_lens_q/k and max_length_q/k, or position_ids
    restarting at 0; _packing.py) as one attn.varlen_attention call without the mask:
    (1, L, H, Dv), or None where the call is not such a call (or wants the weights, or is
    traced: the varlen call is not a custom op) and takes the ordinary path."""
    if not _packing.maybe_packed(query, key, kwargs):  # the cheap tests first
        return None
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch_op._in_mode():
        return None
    tensors = (query, key, value, attention_mask, sinks)
    if any(x is not None and type(x) is not torch.Tensor for x in tensors):
        return None
    if query.device.type != "cpu" or _want_weights(kwargs):
        return None
    sliding = (kwargs["sliding_window"] if "sliding_window" in kwargs
               else _module_attr(module, "sliding_window"))
    if sliding and not causal:
        return None
    window_left = _options.integer("sliding_window", sliding) - 1 if sliding else -1
    packing = _packing.packed_sequences(query, key, attention_mask, causal, window_left,
                                        kwargs)
    if packing is None:
        return None
    cu_q, cu_k, max_q, max_k = packing
    softcap = kwargs.get("softcap")
    # (1, H, L, D) -> FlashAttention's (L, H, D), a view; causal bottom-right per sequence
    # (the same as transformers' top-left block mask where Lq_s = Lk_s)
    out = varlen_attention(query[0].transpose(0, 1), key[0].transpose(0, 1),
                           value[0].transpose(0, 1), cu_q, cu_k, max_q, max_k,
                           dropout_p=dropout, softmax_scale=scaling, causal=causal,
                           window_size=(window_left, 0) if sliding else (-1, -1),
                           softcap=float(softcap) if softcap else 0.0, sinks=sinks,
                           seed=seed if dropout > 0.0 else None)
    return out[None]


def register(name: str = NAME) -> None:
    """Register attention_forward (and transformers' SDPA mask builder) under name."""
    from transformers import AttentionInterface, AttentionMaskInterface  # noqa: PLC0415
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


register()
from .transformers_flash import register_flash  # noqa: E402,F401  (the FlashAttention path)
