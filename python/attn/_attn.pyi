# Type hints of the private C extension attn._attn (see _attn.c); use attn.scaled_dot_product_attention.
from typing import Any, Callable, Dict, Optional, Tuple

def forward(query: Any, key: Any, value: Any, attn_mask: Any, is_causal: bool,
            scale: Optional[float], enable_gqa: bool, align: int,
            window: Optional[Tuple[int, int]], softcap: float, alibi_slopes: Any,
            kv_len: Any, return_lse: bool, return_weights: bool, path: int, precision: int,
            threads: int,
            alloc: Callable[[Tuple[int, ...], str, str], Any],
            sinks: Any = ..., *, dropout_p: float = ..., dropout_seed: int = ...,
            dropout_offset: int = ...) -> Tuple[Any, Any, Any]: ...
# backward: query, key/value (alike), out, grad_out and each gradient float32, float16 or
# bfloat16 (each gradient written in its own dtype, rounded once); lse float32.
def backward(query: Any, key: Any, value: Any, out: Any, grad_out: Any, lse: Any,
             grad_query: Any, grad_key: Any, grad_value: Any, attn_mask: Any,
             is_causal: bool, scale: Optional[float], enable_gqa: bool, align: int,
             window: Optional[Tuple[int, int]], softcap: float, alibi_slopes: Any,
             kv_len: Any, path: int, precision: int, threads: int, sinks: Any = ...,
             grad_sinks: Any = ..., *, dropout_p: float = ..., dropout_seed: int = ...,
             dropout_offset: int = ..., grad_attn_mask: Any = ...) -> None: ...
# packed (variable-length) batches: q (total_q, Hq, D), k, v (total_k, Hkv, D|Dv), any
# strides; cu_seqlens int32/int64 (B + 1,); returns (out (total_q, Hq, Dv), lse (Hq, total_q)
# or None)
def varlen_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                   max_seqlen_q: int, max_seqlen_k: int, is_causal: bool,
                   scale: Optional[float], align: int, window: Optional[Tuple[int, int]],
                   softcap: float, alibi_slopes: Any, return_lse: bool, path: int,
                   precision: int, threads: int,
                   alloc: Callable[[Tuple[int, ...], str, str], Any],
                   sinks: Any = ..., *, dropout_p: float = ..., dropout_seed: int = ...,
                   dropout_offset: int = ...) -> Tuple[Any, Any]: ...
# grad_q, grad_k, grad_v: written in place (None = not wanted); grad_sinks (Hq,) float32
def varlen_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any,
                    grad_q: Any, grad_k: Any, grad_v: Any, cu_seqlens_q: Any,
                    cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int,
                    is_causal: bool, scale: Optional[float], align: int,
                    window: Optional[Tuple[int, int]], softcap: float, alibi_slopes: Any,
                    path: int, precision: int, threads: int, sinks: Any = ...,
                    grad_sinks: Any = ..., *, dropout_p: float = ..., dropout_seed: int = ...,
                    dropout_offset: int = ...) -> None: ...
def _describe(obj: Any) -> Dict[str, Any]: ...
def _dlpack_counts() -> Tuple[int, int]: ...
def version() -> str: ...
def kernel_name() -> str: ...
def tune(*, quick: bool = ..., out: Optional[str] = ..., threads: int = ...) -> None: ...
