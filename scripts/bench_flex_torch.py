#!/usr/bin/env python3
"""bench_flex_torch.py — attn.flex_attention with a block mask beside PyTorch's
FlexAttention compiled for the CPU (torch.compile(flex_attention)), the same masks, the
same inputs, in one process.

    python3 scripts/bench_flex_torch.py [--quick] [--reps N] [--threads N] [--plant-error]

Masks, over B 1, H 8, L 8192 (--quick: 2048), D 64, float32: 8 documents of L / 8 tokens,
and a causal window of 512 keys with 64 global tokens (bench/bench_block_mask.c's). Rows:
attn's forward and backward, torch's compiled forward (its backward on the CPU raises
NotImplementedError in torch 2.15: reported as such). The answer is checked first: attn's
output within the contract's float32 bound of torch's float64 flex_attention run eagerly
at a smaller L (tests/python/oracle.py's rule); --plant-error moves one element of attn's
output first, and the check must fail (exit 1). Each row gets a warm-up call (torch's
compile happens there, outside the timing), then rounds run the rows in turn: medians.
GFLOP/s count the blocks attn computes (non-empty 64 x 16 blocks x 4 x 64 x 16 x D,
backward 2.5x), the same for both libraries.

What it is not: a test (no time limit), or attn's own per-block figures beside the
unmasked call (`attn bench --block-mask`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

H, D, WINDOW, GLOBAL = 8, 64, 512, 64


def masks(L):
    n = L // 8

    def docs(b, h, q, kv):
        return (q // n) == (kv // n)

    def window(b, h, q, kv):
        return ((kv <= q) & (q - kv < WINDOW)) | (kv < GLOBAL) | (q < GLOBAL)
    return {"8 documents": docs, "window 512 + 64 global": window}


def check(torch, attn, plant):
    """attn against torch's float64 eager flex_attention at L 640, both masks."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from oracle import tolerance_failure
    L = 640
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, L, D, generator=g) for _ in range(3))
    ok = True
    for name, mod in masks(L).items():
        bm = attn.create_block_mask(mod, None, None, L, L)
        got = attn.flex_attention(q, k, v, block_mask=bm).numpy()
        if plant:
            got[0, 1, 17, 3] += 1e-3
        tbm = create_block_mask(mod, None, None, L, L, device="cpu")
        ref = flex_attention(q.double(), k.double(), v.double(), block_mask=tbm).numpy()
        why = tolerance_failure(got, ref)
        print("check %-24s attn vs torch's float64 flex_attention (L %d): %s"
              % (name, L, "ok" if why is None else "FAILED: " + why))
        ok = ok and why is None
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="0: all of the machine's")
    ap.add_argument("--plant-error", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:  # noqa: BLE001
        print("bench_flex_torch: skipped, PyTorch's flex_attention is not importable (%s)" % e)
        return 0
    import attn
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    if not check(torch, attn, a.plant_error):
        print("bench_flex_torch: the check failed%s"
              % (" (planted error: as it should)" if a.plant_error else ""), file=sys.stderr)
        return 1
    L = 2048 if a.quick else 8192
    reps = a.reps or (3 if a.quick else 5)
    print("attn %s (kernel %s), torch %s; B 1, H %d, L %d, D %d, float32, %d threads; median "
          "of %d rounds (rows interleaved)" % (attn.__version__ if hasattr(attn, "__version__")
                                                else "", attn.kernel_name(), torch.__version__,
                                                H, L, D, threads, reps))
    g = torch.Generator().manual_seed(1)
    for name, mod in masks(L).items():
        torch._dynamo.reset()   # each mask's compile its own, as a fresh process's
        compiled = torch.compile(flex_attention)
        q, k, v = (torch.randn(1, H, L, D, generator=g) for _ in range(3))
        t0 = time.perf_counter()
        bm = attn.create_block_mask(mod, None, None, L, L)
        t_make = time.perf_counter() - t0
        t0 = time.perf_counter()
        tbm = create_block_mask(mod, None, None, L, L, device="cpu")
        t_tmake = time.perf_counter() - t0
        info = bm.library_blocks()
        blocks = (info["full"] + info["partial"]) * H
        flops = blocks * 64 * 16 * 4.0 * D
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

        def attn_fwd():
            return attn.flex_attention(q, k, v, block_mask=bm)

        def attn_bwd():
            for x in (qg, kg, vg):
                x.grad = None
            attn.flex_attention(qg, kg, vg, block_mask=bm).sum().backward()

        def torch_fwd():
            return compiled(q, k, v, block_mask=tbm)
        rows = [("attn forward", attn_fwd, 1.0), ("torch compiled forward", torch_fwd, 1.0),
                ("attn forward+backward", attn_bwd, 3.5)]
        t0 = time.perf_counter()
        torch_fwd()   # the compile, outside the timing
        t_compile = time.perf_counter() - t0
        for _, fn, _ in rows:
            fn()
        times = {r[0]: [] for r in rows}
        for _ in range(reps):
            for rname, fn, _ in rows:
                t0 = time.perf_counter()
                fn()
                times[rname].append(time.perf_counter() - t0)
        # torch's backward, tried after the timings (a failed grad-mode compile leaves
        # later calls of the compiled function slower)
        try:
            qg2 = q.clone().requires_grad_()
            compiled(qg2, k, v, block_mask=tbm).sum().backward()
            torch_bwd = "runs (not timed here)"
        except Exception as e:  # noqa: BLE001
            torch_bwd = "%s: %s" % (type(e).__name__, str(e).split("\n")[0][:110])
        print("\n%s: %.1f%% of the 64 x 16 blocks computed; block masks made in %.2f s (attn), "
              "%.2f s (torch); torch's compile %.1f s" % (
                  name, 100.0 * (info["full"] + info["partial"]) /
                  (info["empty"] + info["full"] + info["partial"]), t_make, t_tmake, t_compile))
        med = {r: statistics.median(t) for r, t in times.items()}
        for rname, _, f in rows:
            print("  %-24s %9.1f ms %9.1f GFLOP/s (blocks)" % (rname, 1e3 * med[rname],
                                                            f * flops / med[rname] * 1e-9))
        ratio = med["torch compiled forward"] / med["attn forward"]
        print("  forward: attn %.2fx torch's compiled flex_attention (target: faster, > 1: %s)"
              % (ratio, "met" if ratio > 1 else "NOT met"))
        print("  backward: attn's forward+backward above; torch's on the CPU: %s" % torch_bwd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
