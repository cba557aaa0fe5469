"""attn.integrations.transformers_flash — attn.flash as Hugging Face transformers'
FlashAttention implementation, so that its flash-only fast paths (packed training with
DataCollatorWithFlattening: cu_seq_lens_q/k and max_length_q/k or position ids restarting
at 0; continuous batching) run on the CPU through the library.

    from attn.integrations.transformers_flash import register_flash
    register_flash()                                  # the name "attn-flash"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attn-flash")

What transformers 5.24 accepts as a FlashAttention implementation, and why this module
goes the way it does (docs/PYTHON.md, "FlashAttention's API and transformers' flash
path", has the lines):

- "flash_attention_2/3/4" import the `flash_attn` / `flash_attn_interface` packages
  (modeling_flash_attention_utils._lazy_imports): attn never takes those names.
- A name shaped "owner/repo" is a hub kernel: transformers' hub_kernels.get_kernel asks the
  `kernels` package (>= 0.18.2, < 0.19) to download it, or to read a local build named
  by its LOCAL_KERNELS variable (a build directory with metadata and digests): not
  something a pure-Python package provides.
- Any other name containing "flash" that is registered with AttentionInterface is
  treated as a flash implementation everywhere (utils.generic.is_flash_attention_requested)
  but refused when its functions are looked up: _lazy_imports hands it to
  hub_kernels.load_and_register_attn_kernel, which returns None for a name that is not
  "owner/repo", and _lazy_imports raises ValueError ("Could not find the currently
  requested flash attention implementation").

register_flash() therefore registers the name with transformers' own flash-attention
function and mask (what a loaded hub kernel gets: ALL_ATTENTION_FUNCTIONS /
ALL_MASK_ATTENTION_FUNCTIONS of "flash_attention_2"), and answers that one look-up:
modeling_flash_attention_utils._lazy_imports is wrapped so that for this name it returns
attn.flash's three functions with transformers' own pad / unpad helpers, and for every
other name calls the original. Everything after that look-up (the kwargs each function
accepts, read from its signature; the torch.compiler.disable around the KV-cache call;
the cache of the loaded implementation) is transformers' own code. The wrapper is a
private hook: it is checked to exist (RuntimeError otherwise) and the version it was
checked against is TRANSFORMERS_CHECKED.
"""
from __future__ import annotations

from typing import Any

from .. import flash

__all__ = ["register_flash", "NAME", "TRANSFORMERS_CHECKED"]

NAME = "attn-flash"
TRANSFORMERS_CHECKED = "5.24.0"

_names: set = set()  # the names register_flash() has answered for


def _functions() -> tuple:
    import transformers.modeling_flash_attention_utils as fa  # noqa: PLC0415
    return (flash.flash_attn_func, flash.flash_attn_varlen_func, flash.flash_attn_with_kvcache,
            fa._pad_input, fa._unpad_input)


def _hook(fa: Any) -> None:
    """Wrap fa._lazy_imports once: our names get attn.flash, every other the original."""
    original = getattr(fa, "_lazy_imports", None)
    if original is None or not callable(original):
        raise RuntimeError("transformers.modeling_flash_attention_utils has no _lazy_imports "
                           "(register_flash was checked against transformers %s)"
                           % TRANSFORMERS_CHECKED)
    if getattr(original, "_attn_flash", False):
        return

    def _lazy_imports(implementation, *args, **kwargs):
        if implementation in _names:
            return _functions()
        return original(implementation, *args, **kwargs)
    _lazy_imports._attn_flash = True
    _lazy_imports.__wrapped__ = original
    fa._lazy_imports = _lazy_imports


def register_flash(name: str = NAME) -> str:
    """Make attn_implementation=name run transformers' FlashAttention path on attn.flash.

    name must contain "flash" (that is what makes transformers take its flash-only paths)
    and must not be a hub kernel ("owner/repo") or "flash_attention_<n>" (those load the
    real packages). Returns name. Call it before the model is made (transformers looks the
    functions up when the implementation is set) — again after reloading transformers.
    """
    import re  # noqa: PLC0415

    import transformers.modeling_flash_attention_utils as fa  # noqa: PLC0415
    from transformers import AttentionInterface, AttentionMaskInterface  # noqa: PLC0415
    from transformers.integrations.flash_attention import (  # noqa: PLC0415
        flash_attention_forward)
    from transformers.masking_utils import flash_attention_mask  # noqa: PLC0415

    if not isinstance(name, str) or "flash" not in name:
        raise ValueError("register_flash(%r): the name must contain 'flash' (transformers "
                         "takes its FlashAttention paths for such names only)" % (name,))
    if "/" in name or ":" in name or "|" in name or re.match(r"^flash_attention_\d", name):
        raise ValueError("register_flash(%r): a hub kernel name ('owner/repo'), a wrapper "
                         "prefix or 'flash_attention_<n>' is loaded by transformers itself"
                         % (name,))
    _hook(fa)
    _names.add(name)
    AttentionInterface.register(name, flash_attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
