"""test_api.py — the Python surface of attn: errors that name the argument, the DLPack
protocol (capsule renamed, deleter called once, devices refused), zero-copy reads checked
against the producers' own addresses and the process's peak memory, the GIL released
during the call, and the docstrings help() shows.
"""
import ctypes
import inspect
import pydoc
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import attn
from attn import _attn
from oracle import assert_close, assert_half_close, naive, randn, reference, round_to

sdpa = attn.scaled_dot_product_attention


# ---- DLPack producers made here -----------------------------------------------------------

class NumpyDLPack:
    """A foreign tensor type: exports a NumPy array through NumPy's own __dlpack__."""

    def __init__(self, a):
        self.a = a
        self.shape = a.shape

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR = b"dltensor"


class CtypesDLPack:
    """A DLPack producer written against the spec with ctypes: a float32 array described
    by hand (element strides, a byte offset, any device), whose deleter counts its calls."""

    def __init__(self, base, shape, strides, byte_offset=0, device=1, code=2, bits=32,
                 compact=False, announce_device=False):
        self.base, self.deleted, self.exported = base, 0, 0
        self.shape = tuple(shape)
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides)
        self._deleter = DELETER(self._delete)
        self.device, self.announce = device, announce_device
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = base.ctypes.data
        t.device = DLDevice(device, 0)
        t.ndim = len(shape)
        t.dtype = DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = None if compact else self._strides
        t.byte_offset = byte_offset
        self.managed.deleter = self._deleter

    def _delete(self, ptr):
        assert ctypes.addressof(ptr.contents) == ctypes.addressof(self.managed)
        self.deleted += 1

    def __dlpack__(self, stream=None):
        self.exported += 1
        return _capsule_new(ctypes.addressof(self.managed), _DLTENSOR, None)

    def __getattr__(self, name):
        if name == "__dlpack_device__" and self.announce:
            return lambda: (self.device, 0)
        raise AttributeError(name)


def elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


# ---- zero-copy, checked ------------------------------------------------------------------

@pytest.mark.parametrize("view", ["dense", "transposed", "sliced", "reversed", "broadcast",
                                  "fortran", "readonly"])
def test_numpy_views_are_read_in_place(rng, view):
    base = randn(rng, 3, 4, 10, 16)
    a = {"dense": base, "transposed": base.transpose(0, 2, 1, 3),
         "sliced": base[1:, ::2, 3:9, ::3], "reversed": base[:, ::-1, ::-2],
         "broadcast": np.broadcast_to(base[:1, :1], (5, 7, 10, 16)),
         "fortran": np.asfortranarray(base), "readonly": base.copy()}[view]
    if view == "readonly":
        a.flags.writeable = False
    d = _attn._describe(a)
    assert d["via"] == "buffer"
    assert d["data"] == a.__array_interface__["data"][0]   # the array's own first element
    assert d["shape"] == a.shape and d["strides"] == elem_strides(a)


def test_dlpack_views_are_read_in_place(rng):
    base = randn(rng, 2, 6, 4, 8)
    a = base.transpose(0, 2, 1, 3)[:, :, 1:5]
    d = _attn._describe(NumpyDLPack(a))
    assert d["via"] == "dlpack"
    assert d["data"] == a.__array_interface__["data"][0]
    assert d["shape"] == a.shape and d["strides"] == elem_strides(a)
    p = CtypesDLPack(base, (2, 4, 3, 8), (192, 8, 32, 1), byte_offset=4 * 40)
    assert _attn._describe(p)["data"] == base.ctypes.data + 160


def test_forward_copies_nothing(tmp_path):
    """A copy of K or V would be 1 GiB each: the call's peak memory must not grow by that.
    (A fresh interpreter, so that the peak is this call's.)"""
    script = textwrap.dedent("""
        import resource, numpy as np, attn
        Lk, D = 1 << 22, 64
        rng = np.random.default_rng(0)
        k = np.broadcast_to(rng.standard_normal((1, 1, 1, D)).astype(np.float32), (1, 1, Lk, D))
        # small integers: every sum of the fused path is exact, so the output is too
        v = np.broadcast_to(rng.integers(-2, 3, (1, 1, 1, D)).astype(np.float32), (1, 1, Lk, D))
        q = rng.standard_normal((1, 1, 2, D)).astype(np.float32)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        o = attn.scaled_dot_product_attention(q, k, v, threads=1)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert (o == v[0, 0, :2]).all(), "every key is the same: the output is that value"
        print((after - before) // 1024)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    grew_mib = int(r.stdout.split()[-1])
    print("peak memory grew by %d MiB while reading 2 x 1 GiB of broadcast K/V" % grew_mib)
    assert grew_mib < 64


# ---- the DLPack protocol ------------------------------------------------------------------

def test_dlpack_input_matches_oracle_and_deleter_runs_once(rng):
    base = randn(rng, 2, 5, 3, 8)                   # stored (B, L, H, D)
    strides = (120, 8, 24, 1)                       # read as (B, H, L, D), in elements
    q = CtypesDLPack(base, (2, 3, 5, 8), strides)
    k = CtypesDLPack(base, (2, 3, 4, 8), strides, byte_offset=4 * 24)  # rows 1..4
    v = CtypesDLPack(base, (2, 3, 4, 8), strides, byte_offset=4 * 24)
    taken0, released0 = _attn._dlpack_counts()
    out = sdpa(q, k, v)
    view = base.transpose(0, 2, 1, 3)
    assert isinstance(out, np.ndarray)              # an unknown producer gets NumPy back
    assert_close(out, reference(view, view[:, :, 1:], view[:, :, 1:])[0])
    assert (q.exported, q.deleted, k.deleted, v.deleted) == (1, 1, 1, 1)
    taken, released = _attn._dlpack_counts()
    assert taken - taken0 == 3 and released - released0 == 3


def test_dlpack_compact_strides_null(rng):
    base = randn(rng, 2, 3, 4)
    t = CtypesDLPack(base, (2, 3, 4), (0, 0, 0), compact=True)
    out = sdpa(t, t, t)
    assert_close(out, reference(base, base, base)[0])
    assert t.exported == t.deleted == 3


def test_numpy_dlpack_producer_is_released(rng):
    a = randn(rng, 2, 3, 16, 8).transpose(0, 1, 3, 2)
    w = NumpyDLPack(a)
    refs = sys.getrefcount(a)
    out = sdpa(w, w, w)
    assert_close(out, reference(a, a, a)[0])
    # NumPy's capsule holds a reference to the array until its deleter runs
    assert sys.getrefcount(a) == refs


def test_gpu_tensor_refused_before_export(rng):
    base = randn(rng, 2, 4)
    gpu = CtypesDLPack(base, (2, 4), (4, 1), device=2, announce_device=True)
    with pytest.raises(ValueError, match=r"^key: .*CUDA device 0.*CPU"):
        sdpa(base, gpu, base)
    assert gpu.exported == 0


def test_gpu_tensor_in_capsule_refused_and_deleted(rng):
    base = randn(rng, 2, 4)
    gpu = CtypesDLPack(base, (2, 4), (4, 1), device=2)
    taken0, released0 = _attn._dlpack_counts()
    with pytest.raises(ValueError, match=r"^value: .*CUDA"):
        sdpa(base, base, gpu)
    assert (gpu.exported, gpu.deleted) == (1, 1)
    taken, released = _attn._dlpack_counts()
    assert taken - taken0 == released - released0 == 1


def test_dlpack_unsupported_dtype_deleted(rng):
    base = rng.standard_normal((2, 4))
    t = CtypesDLPack(base, (2, 4), (4, 1), bits=64)
    # a float64 query is read (CONTRACT "float64"); with float32 key and value it is refused
    with pytest.raises(TypeError, match=r"^key: dtype is float32, expected float64"):
        sdpa(t, base.astype(np.float32), base.astype(np.float32))
    assert t.deleted == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dlpack_16_bit_tensors(rng, dtype):
    """kDLFloat 16 and kDLBfloat 16 from a producer written here (no framework needed):
    read in place, the half-precision rule against the oracle, mixed key/value refused.
    The result is NumPy of the query's dtype — for bfloat16, ml_dtypes' where it is
    installed, else float32 (NumPy has no bfloat16 of its own)."""
    code = {"float16": 2, "bfloat16": 4}[dtype]
    vals = [round_to(rng.uniform(-1, 1, s), dtype) for s in ((2, 3, 6, 8), (2, 3, 9, 8),
                                                            (2, 3, 9, 5))]
    if dtype == "float16":
        bits = [x.astype(np.float16).view(np.uint16) for x in vals]
    else:
        bits = [(x.view(np.uint32) >> 16).astype(np.uint16) for x in vals]
    q, k, v = (CtypesDLPack(b, b.shape, elem_strides(b), code=code, bits=16) for b in bits)
    d = _attn._describe(q)
    assert d["dtype"] == dtype and d["data"] == bits[0].ctypes.data
    out, lse = sdpa(q, k, v, is_causal=True, return_lse=True)
    assert isinstance(out, np.ndarray) and lse.dtype == np.float32
    try:
        import ml_dtypes
        want = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    except ImportError:
        want = np.dtype(np.float32) if dtype == "bfloat16" else np.dtype(np.float16)
    assert out.dtype == want
    ref = reference(*vals, causal=True)
    assert_half_close(out, ref[0], naive(*vals, dtype, causal=True))
    assert_close(lse, ref[1], "lse")
    assert (q.deleted, k.deleted, v.deleted) == (2, 1, 1)       # _describe took q once too
    with pytest.raises(TypeError, match=r"^value: dtype is float32, expected %s like key" % dtype):
        sdpa(q, k, vals[2].astype(np.float32))


# ---- errors name the argument -------------------------------------------------------------

def call(rng, **over):
    a = dict(query=randn(rng, 2, 4, 5, 8), key=randn(rng, 2, 4, 6, 8),
             value=randn(rng, 2, 4, 6, 8))
    a.update(over)
    return sdpa(**a)


@pytest.mark.parametrize("over, exc, pattern, status", [
    (dict(query=np.zeros((2, 4, 5, 8))), TypeError, r"^key: dtype is float32, expected float64",
     "ATTN_ERR_DTYPE"),
    (dict(key=np.zeros((2, 4, 6, 8), np.float16)), TypeError,
     r"^value: dtype is float32, expected float16 like key \(key and value must", "ATTN_ERR_DTYPE"),
    (dict(value=np.zeros((2, 4, 6, 8), np.float16)), TypeError,
     r"^value: dtype is float16, expected float32 like key", "ATTN_ERR_DTYPE"),
    (dict(value=np.zeros((2, 4, 6, 8), np.int32)), TypeError, r"^value: dtype is int32",
     "ATTN_ERR_DTYPE"),
    (dict(query=[[1.0]]), TypeError, r"^query: expected a NumPy array", None),
    (dict(key=np.zeros((2, 4, 6, 7), np.float32)), ValueError,
     r"^key: shape\[3\] \(Dk, as query\) is 7",
     "ATTN_ERR_SHAPE"),
    (dict(value=np.zeros((2, 4, 7, 8), np.float32)), ValueError, r"^value: shape\[2\] \(Lk",
     "ATTN_ERR_SHAPE"),
    (dict(query=np.zeros((5, 8), np.float32).ravel()), ValueError, r"^query: rank 1", None),
    (dict(query=np.zeros((1, 2, 4, 5, 8), np.float32)), ValueError, r"^query: rank 5", None),
    (dict(key=np.zeros((3, 4, 6, 8), np.float32)), ValueError, r"^key: batch size 3", None),
    (dict(key=np.zeros((2, 2, 6, 8), np.float32), value=np.zeros((2, 2, 6, 8), np.float32)),
     ValueError, r"^key: 2 heads .*enable_gqa=True", None),
    (dict(key=np.zeros((2, 3, 6, 8), np.float32), value=np.zeros((2, 3, 6, 8), np.float32),
          enable_gqa=True), ValueError, r"^query: 4 heads .*not a multiple", None),
    (dict(attn_mask=np.ones((5, 7), bool)), ValueError, r"^attn_mask: shape \(5, 7\)", None),
    (dict(attn_mask=np.ones((5, 6), np.int64)), TypeError, r"^attn_mask: dtype int64", None),
    (dict(attn_mask=np.ones((5, 7), np.float16)), ValueError, r"^attn_mask: shape \(5, 7\)",
     None),
    (dict(attn_mask=np.ones((5, 6), np.complex64)), TypeError, r"^attn_mask: dtype", None),
    (dict(scale=float("nan")), ValueError, r"^scale is nan", "ATTN_ERR_VALUE"),
    (dict(softcap=-1.0), ValueError, r"^softcap is -1", "ATTN_ERR_VALUE"),
    (dict(window=(-2, 0)), ValueError, r"^window = \(-2, 0\)", "ATTN_ERR_VALUE"),
    (dict(window=3), ValueError, r"^window=3", None),
    (dict(threads=-1), ValueError, r"^threads is -1", "ATTN_ERR_VALUE"),
    (dict(threads=1.5), TypeError, r"^threads=1.5", None),
    (dict(kv_len=[6, 7]), ValueError, r"^kv_len\[1\] = 7", "ATTN_ERR_VALUE"),
    (dict(kv_len=[6, 6, 6]), ValueError, r"^kv_len: shape", "ATTN_ERR_SHAPE"),
    (dict(kv_len=np.array([1.0, 2.0], np.float32)), TypeError, r"^kv_len: dtype float32", None),
    (dict(alibi_slopes=[0.5, 0.5]), ValueError, r"^alibi_slopes: shape", "ATTN_ERR_SHAPE"),
    (dict(alibi_slopes=np.ones((4, 1), np.float32)), ValueError, r"^alibi_slopes: rank 2", None),
    (dict(align="bottom"), ValueError, r"^align=", None),
    (dict(path="fast"), ValueError, r"^path=", None),
    (dict(precision="half"), ValueError, r"^precision=", None),
    (dict(precision="float64", path="fused"), ValueError, r"^precision='float64'", None),
    (dict(precision="fast", path="reference"), ValueError, r"^precision='fast' runs on the fused",
     None),
    (dict(dropout_p=1.5), ValueError, r"^dropout_p=1.5", None),
    (dict(dropout_p="0.1"), TypeError, r"^dropout_p=", None),
    (dict(dropout_p=0.1, seed=1.5), TypeError, r"^seed=1.5", None),
])
def test_errors_name_the_argument(rng, over, exc, pattern, status):
    with pytest.raises(exc, match=pattern) as info:
        call(rng, **over)
    assert getattr(info.value, "status", None) == status


def test_bad_memory_layouts_refused(rng):
    buf = np.zeros(400, np.uint8)
    odd = np.ndarray((4, 4), np.float32, buffer=buf, strides=(24, 6))   # 6-byte stride
    with pytest.raises(ValueError, match=r"^query: stride 6 bytes .*not a multiple"):
        sdpa(odd, odd, odd)
    unaligned = np.frombuffer(buf.data, np.float32, count=16, offset=1).reshape(4, 4)
    with pytest.raises(ValueError, match=r"^key: data at .* not aligned"):
        sdpa(randn(rng, 4, 4), unaligned, unaligned)
    swapped = randn(rng, 4, 4).astype(">f4")
    with pytest.raises(TypeError, match=r"^value: .*byte order"):
        sdpa(randn(rng, 4, 4), randn(rng, 4, 4), swapped)


def test_failed_call_releases_everything(rng):
    a = randn(rng, 2, 3, 4)
    refs = sys.getrefcount(a)
    for _ in range(3):
        with pytest.raises(ValueError):
            sdpa(a, a, a, attn_mask=np.ones((5, 5), bool))
    assert sys.getrefcount(a) == refs


# ---- the GIL -----------------------------------------------------------------------------

def test_gil_released_during_the_call(rng):
    """While one thread computes (one OpenMP thread), the main thread keeps running Python:
    with the GIL held, its longest pause would be the whole call."""
    q, k, v = randn(rng, 1, 8, 2048, 64), randn(rng, 1, 8, 4096, 64), randn(rng, 1, 8, 4096, 64)
    t0 = time.perf_counter()
    sdpa(q, k, v, threads=1)
    single = time.perf_counter() - t0
    done = threading.Event()

    def work():
        sdpa(q, k, v, threads=1)
        done.set()

    th = threading.Thread(target=work)
    gaps, last = [], time.perf_counter()
    th.start()
    while not done.is_set():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    th.join()
    print("call %.3f s, longest pause of the main thread %.4f s" % (single, max(gaps)))
    assert single > 0.05, "the call is too short to tell"
    assert max(gaps) < single / 2


# ---- the documented surface ----------------------------------------------------------------

def test_signature_is_pytorchs():
    params = list(inspect.signature(sdpa).parameters.values())
    names = [p.name for p in params]
    assert names[:8] == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                         "scale", "enable_gqa"]
    assert [p.default for p in params[3:8]] == [None, 0.0, False, None, False]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[8:])
    assert names[8:] == ["align", "window", "softcap", "alibi_slopes", "kv_len", "return_lse",
                         "return_weights", "precision", "threads", "path", "sinks", "seed"]


def test_help_shows_the_docstrings():
    text = pydoc.render_doc(attn, renderer=pydoc.plaintext)
    assert "scaled_dot_product_attention(query, key, value, attn_mask=None" in text
    doc = pydoc.render_doc(sdpa, renderer=pydoc.plaintext)
    for phrase in ("fully masked row", "not NaN", "is_causal together with attn_mask",
                   "NotImplementedError", "enable_gqa", "return_lse", "bfloat16",
                   '"fast"', "float16"):
        assert phrase in doc
    assert "kernel family" in pydoc.render_doc(attn.kernel_name, renderer=pydoc.plaintext)
    assert attn.__version__.count(".") == 2


def test_readme_example():
    """The README's Python example (the block after <!-- example:python -->) runs and
    prints what its comment says."""
    import os
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    assert "<!-- example:python -->" in text
    block = text.split("<!-- example:python -->", 1)[1].split("```python\n", 1)[1]
    code = block.split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    expected = code.strip().splitlines()[-1].split("# ", 1)[1]
    assert r.stdout.strip() == expected
