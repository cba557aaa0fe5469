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

Two ways follow from that, both giving transformers the same three functions:

- write_local_kernel(path): the supported one where the `kernels` package is installed
  (pip install "kernels>=0.18.2,<0.19"): writes a local kernel build (metadata.json and
  an __init__.py that re-exports attn.flash's functions) for its LOCAL_KERNELS variable;
  with LOCAL_KERNELS="attn/flash-attn=<path>" the name attn_implementation=
  "attn/flash-attn" loads it through transformers' own hub-kernel path, nothing
  downloaded (set HF_HUB_OFFLINE=1 to be sure nothing is asked of the Hub).
- register_flash(): no extra package, through a private hook (below).

register_flash() registers the name with transformers' own flash-attention
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

__all__ = ["register_flash", "write_local_kernel", "NAME", "KERNEL_NAME",
           "TRANSFORMERS_CHECKED"]

NAME = "attn-flash"
KERNEL_NAME = "attn/flash-attn"  # the repo id write_local_kernel's build stands in for
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


_KERNEL_INIT = (
    '"""attn.flash as a local kernel build of the `kernels` package (written by\n'
    'attn.integrations.transformers_flash.write_local_kernel): FlashAttention 2\'s three\n'
    'functions on the attn library, for transformers\' hub-kernel path."""\n'
    "from attn.flash import flash_attn_func, flash_attn_varlen_func, "
    "flash_attn_with_kvcache  # noqa: F401\n")


def write_local_kernel(path: Any, repo_id: str = KERNEL_NAME) -> str:
    """Write a local kernel build of attn.flash into the folder path (made if absent) for
    the `kernels` package (>= 0.18.2, < 0.19, what transformers 5.24 accepts): its
    metadata.json (a CPU build, no digest: `kernels` warns that it cannot verify it) and
    an __init__.py that re-exports attn.flash's three functions (the attn package is
    imported from wherever Python finds it). Returns the LOCAL_KERNELS entry,
    "<repo_id>=<path>": set os.environ["LOCAL_KERNELS"] to it (joined with ':' to others)
    before the model is made with attn_implementation=repo_id. repo_id must be
    "owner/name" with "flash" in it (transformers' kernel-name and flash tests)."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import re  # noqa: PLC0415

    from .. import __version__  # noqa: PLC0415

    if not (isinstance(repo_id, str) and re.fullmatch(r"[^/:@|=]+/[^/:@|=]+", repo_id)
            and "flash" in repo_id):
        raise ValueError("write_local_kernel: repo_id=%r: expected 'owner/name' containing "
                         "'flash'" % (repo_id,))
    path = os.path.abspath(os.fspath(path))
    if ":" in path or "=" in path:
        raise ValueError("write_local_kernel: %r: LOCAL_KERNELS cannot name a path with "
                         "':' or '='" % path)
    os.makedirs(path, exist_ok=True)
    build = "attn_flash_" + re.sub(r"[^0-9A-Za-z]", "_", __version__)
    metadata = {"id": build, "name": "attn-flash", "version": 1,
                "license": "see the attn package", "python-depends": [],
                "backend": {"type": "cpu"}}
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump(metadata, f, indent=2)
    with open(os.path.join(path, "__init__.py"), "w") as f:
        f.write(_KERNEL_INIT)
    return "%s=%s" % (repo_id, path)
