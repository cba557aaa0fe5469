"""test_jax.py — JAX arrays in, JAX arrays out: read in place (JAX CPU arrays export a
buffer; DLPack otherwise — bfloat16 does), compared with the float64 oracle (float16 and
bfloat16 under the half-precision rule). Skipped, with the reason, where JAX is not
installed (CI does not install it).
"""
import numpy as np
import pytest

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    pytest.skip("JAX is not installed: the JAX round trip is skipped", allow_module_level=True)

import attn
from attn import _attn
from oracle import assert_close, assert_half_close, naive, reference


def test_jax_in_jax_out():
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal(s, dtype=np.float32))
               for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 6)))
    mask = jnp.asarray(rng.random((5, 7)) < 0.7)
    out, lse = attn.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True,
                                                 return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    ref = reference(np.asarray(q), np.asarray(k), np.asarray(v), mask=np.asarray(mask),
                    gqa=True)
    assert_close(np.asarray(out), ref[0])
    assert_close(np.asarray(lse), ref[1])


def test_jax_arrays_read_in_place():
    x = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4)
    d = _attn._describe(x)
    assert d["data"] == x.unsafe_buffer_pointer()
    assert d["shape"] == (2, 3, 4) and d["strides"] == (12, 4, 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("precision", ["default", "fast"])
def test_jax_16_bit(dtype, precision):
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.uniform(-1, 1, s), dtype=dtype)
               for s in ((2, 4, 9, 16), (2, 2, 30, 16), (2, 2, 30, 8)))
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                            precision=precision)
    assert isinstance(out, jax.Array) and out.dtype == q.dtype
    d = _attn._describe(k)
    assert d["dtype"] == dtype and d["data"] == k.unsafe_buffer_pointer()
    ins = [np.asarray(x, np.float32) for x in (q, k, v)]
    assert_half_close(np.asarray(out), reference(*ins, causal=True, gqa=True)[0],
                      naive(*ins, dtype, causal=True, gqa=True))
    # a float32 query over the 16-bit cache: float32 out, the float32 tolerance
    o32 = attn.scaled_dot_product_attention(q.astype(jnp.float32), k, v, enable_gqa=True)
    assert o32.dtype == jnp.float32
    assert_close(np.asarray(o32), reference(*ins, gqa=True)[0])
