"""bench_cascade_torch.py — the PyTorch side of `attn bench --cascade`: shared-prefix
decoding with torch's scaled_dot_product_attention over the gathered keys (each sequence's
prefix + suffix, [B, Hkv, P + S, D], GQA by enable_gqa: PyTorch has no cascade call),
beside attn.cascade_attention and attn's per-sequence equivalent on the same data,
timed interleaved in one process.

Usage: PYTHONPATH=<site with attn> <python with torch> scripts/bench_cascade_torch.py
           [--quick] [--reps N] [--threads N]
Each answer is first checked against a float64 torch computation at the contract's
float32 tolerance (max |diff| <= 1e-5 (1 + max |ref|)); medians are printed. What it is
not: a test, or part of `make check` (it needs torch).
"""
import argparse
import os
import statistics
import time

import numpy as np
import torch

import attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    B, P, S = (4, 1024, 64) if a.quick else (32, 8192, 256)
    Hq, Hkv, D = 32, 8, 128
    print("cascade vs torch %s SDPA: B=%d P=%d S=%d Lq=1 Hq=%d Hkv=%d D=%d, %d torch threads, "
          "load average %s" % (torch.__version__, B, P, S, Hq, Hkv, D, torch.get_num_threads(),
                                " ".join(open("/proc/loadavg").read().split()[:3])))
    g = torch.Generator().manual_seed(5)
    for dt in (torch.bfloat16, torch.float32):
        q = torch.rand(B, 1, Hq, D, generator=g) * 2 - 1          # [B, Lq, Hq, D]
        kp = (torch.rand(P, Hkv, D, generator=g) * 2 - 1).to(dt)  # [P, Hkv, D]
        vp = (torch.rand(P, Hkv, D, generator=g) * 2 - 1).to(dt)
        ks = (torch.rand(B, S, Hkv, D, generator=g) * 2 - 1).to(dt)
        vs = (torch.rand(B, S, Hkv, D, generator=g) * 2 - 1).to(dt)
        # the gathered cache: each sequence's own copy of the prefix, [B, Hkv, P + S, D]
        kg = torch.cat([kp.unsqueeze(0).expand(B, -1, -1, -1), ks], 1).transpose(1, 2).contiguous()
        vg = torch.cat([vp.unsqueeze(0).expand(B, -1, -1, -1), vs], 1).transpose(1, 2).contiguous()
        qh = q.transpose(1, 2).contiguous()  # [B, Hq, 1, D]
        ref = torch.nn.functional.scaled_dot_product_attention(
            qh.double(), kg.double(), vg.double(), enable_gqa=True).transpose(1, 2)

        def sdpa():
            # torch's math needs one dtype: q in the cache's dtype for bfloat16 (as a server does)
            return torch.nn.functional.scaled_dot_product_attention(
                qh.to(dt), kg, vg, enable_gqa=True).transpose(1, 2).float()

        def cascade():
            return attn.cascade_attention(q, kp, vp, ks, vs, threads=a.threads)

        rows = [("torch sdpa (gathered)", sdpa), ("attn cascade", cascade)]
        times = {}
        for name, f in rows:
            out = f()
            err = (out.double() - ref).abs().max().item()
            bound = 1e-5 * (1 + ref.abs().max().item())
            # torch's bfloat16 SDPA rounds q and P to bfloat16: its error is reported, not judged
            ok = err <= bound or (name.startswith("torch") and dt == torch.bfloat16)
            print("  %-8s %-22s max |diff| vs float64 %.2e %s" % (str(dt).replace("torch.", ""), name, err,
                                                                   "ok" if ok else "FAILED"))
            if not ok:
                raise SystemExit(1)
            times[name] = []
        for _ in range(a.reps):
            for name, f in rows:
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times[rows[0][0]])
        for name, _ in rows:
            m = statistics.median(times[name])
            print("  %-8s %-22s median %8.2f ms   %.2fx torch" % (str(dt).replace("torch.", ""), name,
                                                                 m * 1e3, base / m))


if __name__ == "__main__":
    main()
