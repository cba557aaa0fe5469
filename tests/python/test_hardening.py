"""test_hardening.py — legal calls that must not crash and option values that must not be
taken loosely: empty batches with long keys (the workspace query divided by zero), flags,
numbers and counts as PyTorch accepts them and nothing else (a string is no flag,
out-of-range counts raise ValueError naming the argument, never a bare OverflowError), and
outputs that share memory with an input refused by the library (ATTN_ERR_STRIDE).
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import attn
from attn import _attn

sdpa = attn.scaled_dot_product_attention


def qkv(rng, B=1, H=2, L=4, S=6, D=8):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return f(B, H, L, D), f(B, H, S, D), f(B, H, S, D)


# ---- empty shapes ---------------------------------------------------------------------------

@pytest.mark.parametrize("qshape,kshape", [
    ((0, 1, 1, 4), (0, 1, 2048, 4)),
    ((0, 1, 16, 4), (0, 1, 4096, 4)),
    ((2, 0, 1, 4), (2, 0, 2048, 4)),
    ((2, 1, 0, 4), (2, 1, 2048, 4)),
])
def test_empty_batch_long_keys_in_a_child(qshape, kshape):
    """In a child process: the crash was SIGFPE, which would kill the test runner."""
    code = textwrap.dedent("""
        import numpy as np, attn
        q = np.zeros(%r, np.float32); k = np.zeros(%r, np.float32)
        o, lse = attn.scaled_dot_product_attention(q, k, k, return_lse=True)
        assert o.shape == q.shape and lse.shape == q.shape[:3], (o.shape, lse.shape)
        print("ok")
    """ % (qshape, kshape))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


# ---- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,exc,pattern", [
    (dict(is_causal="no"), TypeError, r"^is_causal='no': expected a bool"),
    (dict(is_causal="yes"), TypeError, r"^is_causal="),
    (dict(is_causal=1), TypeError, r"^is_causal=1"),
    (dict(is_causal=None), TypeError, r"^is_causal=None"),
    (dict(enable_gqa="True"), TypeError, r"^enable_gqa="),
    (dict(return_lse="False"), TypeError, r"^return_lse="),
    (dict(return_weights=[]), TypeError, r"^return_weights="),
    (dict(scale="2"), TypeError, r"^scale='2': expected a number"),
    (dict(scale=True), TypeError, r"^scale=True"),
    (dict(scale=1j), TypeError, r"^scale=1j"),
    (dict(softcap="3"), TypeError, r"^softcap='3': expected a number"),
    (dict(softcap=None), TypeError, r"^softcap=None"),
    (dict(scale=10 ** 400), ValueError, r"^scale="),
    (dict(window=(1.5, 2)), TypeError, r"^window=1.5"),
    (dict(window=("1", 2)), TypeError, r"^window='1'"),
    (dict(window=(2 ** 63, 0)), ValueError, r"^window=9223372036854775808: out of range"),
    (dict(window=(0, -2 ** 63 - 1)), ValueError, r"^window=-9223372036854775809: out of range"),
    (dict(threads=2 ** 31), ValueError, r"^threads=2147483648: out of range"),
    (dict(threads=2 ** 80), ValueError, r"^threads="),
    (dict(threads=-2 ** 40), ValueError, r"^threads="),
    (dict(threads="2"), TypeError, r"^threads='2'"),
    (dict(threads=True), TypeError, r"^threads=True"),
    (dict(kv_len=[2 ** 63, 1]), ValueError, r"^kv_len=9223372036854775808: out of range"),
    (dict(kv_len=["1"]), TypeError, r"^kv_len='1'"),
    (dict(kv_len=[1.5]), TypeError, r"^kv_len=1.5"),
    (dict(alibi_slopes=["0.5", "0.5"]), TypeError, r"^alibi_slopes='0.5'"),
])
def test_option_refused(rng, kw, exc, pattern):
    q, k, v = qkv(rng)
    with pytest.raises(exc, match=pattern):
        sdpa(q, k, v, **kw)


def test_no_bare_overflow_error(rng):
    q, k, v = qkv(rng)
    for kw in (dict(window=(10 ** 30, 0)), dict(threads=10 ** 30), dict(kv_len=[10 ** 30]),
               dict(scale=10 ** 400), dict(softcap=10 ** 400)):
        try:
            sdpa(q, k, v, **kw)
        except OverflowError as e:  # a ValueError subclass would not be caught here first
            pytest.fail("%r raised a bare OverflowError: %s" % (kw, e))
        except (ValueError, TypeError) as e:
            assert str(e).startswith(next(iter(kw))), str(e)


def test_option_accepted_like_pytorch(rng):
    """Python bools, ints and floats, NumPy scalars and 0-d arrays: the same answer as the
    plain values."""
    q, k, v = qkv(rng)
    want = sdpa(q, k, v, is_causal=True, scale=0.5, softcap=3.0, window=(2, 1), threads=2)
    variants = [
        dict(is_causal=np.bool_(True), scale=np.float32(0.5), softcap=np.float64(3.0),
             window=(np.int64(2), np.int32(1)), threads=np.int16(2)),
        dict(is_causal=np.array(True), scale=np.array(0.5), softcap=np.array(3, np.int32),
             window=(np.array(2), 1), threads=np.array(2)),
        dict(is_causal=True, scale=0.5, softcap=3, window=[2, 1], threads=2),
    ]
    for kw in variants:
        got = sdpa(q, k, v, **kw)
        assert np.array_equal(got, want), kw
    # kv_len and alibi_slopes as lists of NumPy scalars
    a = sdpa(q, k, v, kv_len=[np.int64(3)], alibi_slopes=[np.float32(0.5), 0.25])
    b = sdpa(q, k, v, kv_len=np.array([3]), alibi_slopes=np.array([0.5, 0.25], np.float32))
    assert np.array_equal(a, b)


def test_option_accepted_torch_scalars(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: 0-d tensors untested")
    q, k, v = qkv(rng)
    want = sdpa(q, k, v, is_causal=True, scale=0.5, threads=2)
    got = sdpa(q, k, v, is_causal=torch.tensor(True), scale=torch.tensor(0.5),
               threads=torch.tensor(2))
    assert np.array_equal(got, want)


# ---- outputs over inputs -------------------------------------------------------------------

def test_forward_output_over_an_input_refused(rng):
    """The extension's alloc hook hands the library an output that is an input's memory:
    the library refuses it (before anything is written) instead of computing garbage."""
    q, k, v = qkv(rng, L=6)
    v_before = v.copy()
    for which_input, arr in (("value", v), ("query", q)):
        def alloc(shape, which, dtype, arr=arr):
            if which == "output":
                return arr
            return np.empty(shape, dtype)
        with pytest.raises(ValueError, match=r"^output: overlaps the input") as e:
            _attn.forward(q, k, v, None, False, None, False, 0, None, 0.0, None, None, False,
                          False, 0, 0, 0, alloc)
        assert getattr(e.value, "status", None) == "ATTN_ERR_STRIDE"
    assert np.array_equal(v, v_before)


def test_backward_gradients_over_each_other_refused(rng):
    q, k, v = qkv(rng, S=4)
    o, lse = sdpa(q, k, v, return_lse=True)
    do = rng.standard_normal(o.shape).astype(np.float32)
    dq, dk, dv = (np.empty_like(x) for x in (q, k, v))
    cases = [(dq, dq, dv, r"^grad_key: overlaps the output"),
             (q, dk, dv, r"^grad_query: overlaps the input"),
             (dq, dk, do, r"^grad_value: overlaps the input")]
    for a, b, c, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as e:
            _attn.backward(q, k, v, o, do, lse, a, b, c, None, False, None, False, 0, None,
                           0.0, None, None, 0, 0, 0)
        assert getattr(e.value, "status", None) == "ATTN_ERR_STRIDE"
    # one packed (B, L, 3, H, D) gradient, the three slices interleaved: accepted, the same
    # bits as separate buffers
    _attn.backward(q, k, v, o, do, lse, dq, dk, dv, None, False, None, False, 0, None, 0.0,
                   None, None, 0, 0, 0)
    packed = np.zeros((1, 4, 3, 2, 8), np.float32)
    views = [packed[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    _attn.backward(q, k, v, o, do, lse, views[0], views[1], views[2], None, False, None,
                   False, 0, None, 0.0, None, None, 0, 0, 0)
    for got, want in zip(views, (dq, dk, dv)):
        assert np.array_equal(got, want)
