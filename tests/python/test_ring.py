"""attn.ring (python/attn/ring.py): ring attention through mpi4py, run under mpirun
(tests/python/run_ring.sh runs it on 2 processes). Each process takes its rows of
global random Q, K, V (attn.ring.take), calls attn.ring.attention, and compares its rows
of O and the LSE with a float64 NumPy attention on the whole sequence at the float32
tolerance of docs/CONTRACT.md. Skipped, with the reason, without mpi4py or outside
mpirun (the plain Python suite)."""

import importlib.util
import os

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/deps.sh)")
# (checked before mpi4py.MPI is imported, which initialises MPI)
if "OMPI_COMM_WORLD_SIZE" not in os.environ and "PMI_SIZE" not in os.environ:
    pytest.skip("not under mpirun (tests/python/run_ring.sh runs this file)",
                allow_module_level=True)
from mpi4py import MPI  # noqa: E402

try:
    import attn.ring as ring
except ImportError:  # the source tree's module by its path, without the extension
    _p = os.path.join(os.path.dirname(__file__), "..", "..", "python", "attn", "ring.py")
    _s = importlib.util.spec_from_file_location("attn_ring", _p)
    ring = importlib.util.module_from_spec(_s)
    _s.loader.exec_module(ring)

COMM = MPI.COMM_WORLD


def reference(q, k, v, causal=False, scale=None, window=None, kv_len=None):
    """float64 attention on the whole sequence: O and the LSE (-inf for empty rows)"""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, Lq, D = q.shape
    g = Hq // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * (scale if scale is not None else D ** -0.5)
    i, j = np.arange(Lq)[:, None], np.arange(k.shape[2])[None, :]
    keep = np.ones((Lq, k.shape[2]), bool)
    if causal:
        keep &= j <= i
    if window is not None:
        if window[0] >= 0:
            keep &= j >= i - window[0]
        if window[1] >= 0:
            keep &= j <= i + window[1]
    keep = np.broadcast_to(keep, (B, 1, Lq, k.shape[2])).copy()
    if kv_len is not None:
        keep &= (np.arange(k.shape[2])[None, :] < np.asarray(kv_len)[:, None])[:, None, None, :]
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    z = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", p / np.where(z > 0, z, 1), v)
    lse = np.where(z[..., 0] > 0, np.log(np.where(z[..., 0] > 0, z[..., 0], 1)) + m[..., 0], -np.inf)
    return o, lse


def close(got, ref):
    """the contract's float32 tolerance, non-finite values equal"""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    if (np.isfinite(got) != fin).any() or (got[~fin] != ref[~fin]).any():
        return False
    e = np.abs(got[fin] - ref[fin])
    den = np.sqrt((ref[fin] ** 2).sum()) or 1.0
    return (np.sqrt((e ** 2).sum()) / den <= 1e-6 and
            e.max(initial=0) <= 1e-5 * (1 + np.abs(ref[fin]).max(initial=0)))


CASES = [
    dict(name="uneven GQA", B=2, Hq=4, Hkv=2, Lq=13, Lk=21, D=8),
    dict(name="causal zigzag", B=1, Hq=2, Hkv=1, Lq=27, Lk=27, D=16, causal=True),
    dict(name="window, kv_len, scale", B=2, Hq=2, Hkv=2, Lq=19, Lk=19, D=8, window=(4, 2),
         kv_len=[11, 19], scale=0.4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_ring_matches_one_process(case):
    r = np.random.default_rng(case["Lq"] * 7 + case["Lk"])
    B, Hq, Hkv, Lq, Lk, D = (case[x] for x in ("B", "Hq", "Hkv", "Lq", "Lk", "D"))
    q = r.standard_normal((B, Hq, Lq, D)).astype(np.float32)
    k = r.standard_normal((B, Hkv, Lk, D)).astype(np.float32)
    v = r.standard_normal((B, Hkv, Lk, D)).astype(np.float32)
    causal = case.get("causal", False)
    opts = dict(causal=causal, scale=case.get("scale"), window=case.get("window"),
                kv_len=case.get("kv_len"))
    o_ref, l_ref = reference(q, k, v, **opts)
    o, lse = ring.attention(ring.take(q, COMM, causal), ring.take(k, COMM, causal),
                            ring.take(v, COMM, causal), COMM, return_lse=True, **opts)
    assert close(o, ring.take(o_ref, COMM, causal))
    assert close(lse, ring.take(l_ref[..., None], COMM, causal)[..., 0])
    # the comparison rejects a planted error of 1e-4 in one element
    if o.size:
        bad = o.copy()
        bad.flat[o.size // 2] += 1e-4
        assert not close(bad, ring.take(o_ref, COMM, causal))


def test_refused_everywhere():
    """a mask-free option the ring refuses: causal with Lq != Lk, on every process"""
    q = np.zeros((1, 1, 2, 4), np.float32)
    k = np.zeros((1, 1, 3, 4), np.float32)
    with pytest.raises(RuntimeError, match="Lq = Lk"):
        ring.attention(q, k, k, COMM, causal=True)
