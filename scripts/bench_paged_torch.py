#!/usr/bin/env python3
"""bench_paged_torch.py — decoding over a paged cache, attn beside PyTorch, in one process.

What it is: the decoding step of `attn bench --paged` (Lq = 1, Lk = 16384, Hq = 32, Hkv = 8,
D = 128, B = 1 and 8, float32 queries; a float32 or bfloat16 cache in pools of
[num_pages, page_size, Hkv, D], FlashAttention's layout, each sequence's pages in a shuffled
order) through the calls a PyTorch user has:
  attn          attn.attention_with_kvcache(q, k_pool, v_pool, block_table=...): the pages
                read in place;
  torch gather  what SDPA needs first: the sequence's pages gathered into a contiguous
                cache (k_pool[block_table], one copy), then
                F.scaled_dot_product_attention(..., enable_gqa=True) on it, q cast to the
                cache's dtype as SDPA wants one dtype (a PyTorch user's paged step);
  torch contig  SDPA over the contiguous cache alone, no gather (the floor a paged PyTorch
                step cannot beat).
Each answer is checked first against float64 attention over the same cache values
(relative Frobenius error; attn's must be within 1e-5, PyTorch's is printed); then the
three are timed interleaved (one call of each in turn, so a noisy machine slows all
alike): medians of --reps calls after --warmup; GB/s = the cache's bytes / time; ratios
torch time / attn time (> 1: attn faster). Threads: torch.set_num_threads and
OMP_NUM_THREADS alike.

What it is not: the C bench (`attn bench --paged` times attn_forward without Python and
beside a plain read); this one includes the package's argument handling, as a user pays it.

Usage: PYTHONPATH=<built attn package> python scripts/bench_paged_torch.py
           [--threads 2] [--reps 15] [--warmup 2] [--lk 16384] [--b 1,8]
           [--pages 16,64,256] [--dtypes float32,bfloat16] [--quick] [--plant-error]
--quick: Lk 2048, B 1, page 16, 3 reps. --plant-error: one key of attn's pool turned
towards the query after the copies are made: the check must fail (exit 1).
"""
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lk", type=int, default=16384)
    ap.add_argument("--b", default="1,8")
    ap.add_argument("--pages", default="16,64,256")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plant-error", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.lk, a.b, a.pages, a.reps, a.warmup = 2048, "1", "16", 3, 1
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
        import attn
    except Exception as e:  # optional: PyTorch and the built package
        print("bench_paged_torch: skipped (%s: %s)" % (type(e).__name__, e))
        return 0
    torch.set_num_threads(a.threads)
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        pick = lambda key: next((l.split(":", 1)[1].strip() for l in info.splitlines()
                                 if l.startswith(key)), "?")
        cpu = "%s, family %s model %s" % (pick("model name"), pick("cpu family"), pick("model\t"))
    except OSError:
        pass
    print("paged decoding beside PyTorch %s: Lq 1, Hq 32, Hkv 8, D 128, Lk %d, %d threads, "
          "attn kernel %s, CPU %s" % (torch.__version__, a.lk, a.threads,
                                      attn.kernel_name() if hasattr(attn, "kernel_name") else "?", cpu))
    print("%-9s %2s %5s  %9s %9s %9s  %9s  %11s %11s" % (
        "cache", "B", "page", "attn ms", "gather ms", "contig ms", "attn GB/s", "gather/attn",
        "contig/attn"))
    Hq, Hkv, D, bad = 32, 8, 128, 0
    for dt in a.dtypes.split(","):
        tdt = getattr(torch, dt)
        for B in [int(x) for x in a.b.split(",")]:
            for page in [int(x) for x in a.pages.split(",")]:
                bad |= row(np, torch, F, attn, a, dt, tdt, B, page, Hq, Hkv, D)
    return bad


def row(np, torch, F, attn, a, dt, tdt, B, page, Hq, Hkv, D):
    g = torch.Generator().manual_seed(7)
    Lk = a.lk
    npages = (Lk + page - 1) // page
    pool = B * npages
    perm = torch.randperm(pool, generator=g).to(torch.int32)
    table = perm.view(B, npages).contiguous()
    k_pool = (torch.rand(pool, page, Hkv, D, generator=g) * 2 - 1).to(tdt)
    v_pool = (torch.rand(pool, page, Hkv, D, generator=g) * 2 - 1).to(tdt)
    q = torch.rand(B, 1, Hq, D, generator=g) * 2 - 1
    seqlens = torch.full((B,), Lk, dtype=torch.int32)
    scale = D ** -0.5

    def gather():
        k = k_pool[table.long()].reshape(B, npages * page, Hkv, D)[:, :Lk].transpose(1, 2)
        v = v_pool[table.long()].reshape(B, npages * page, Hkv, D)[:, :Lk].transpose(1, 2)
        return k, v

    kc, vc = gather()
    kc, vc = kc.contiguous(), vc.contiguous()
    qt = q.transpose(1, 2).to(tdt)  # [B, Hq, 1, D]

    def call_attn():
        return attn.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=seqlens,
                                           block_table=table, softmax_scale=scale)

    def call_gather():
        k, v = gather()
        return F.scaled_dot_product_attention(qt, k, v, scale=scale, enable_gqa=True)

    def call_contig():
        return F.scaled_dot_product_attention(qt, kc, vc, scale=scale, enable_gqa=True)

    # the check: float64 attention over the same cache values
    with torch.inference_mode():
        k64 = kc.double().repeat_interleave(Hq // Hkv, dim=1)
        v64 = vc.double().repeat_interleave(Hq // Hkv, dim=1)
        s = (q.transpose(1, 2).double() @ k64.transpose(-1, -2)) * scale
        ref = torch.softmax(s, dim=-1) @ v64  # [B, Hq, 1, D]
        if a.plant_error:
            k_pool[int(table[0, 0]), 0, 0] = (4.0 * q[0, 0, 0]).to(tdt)
        o_attn = call_attn().transpose(1, 2).double()
        o_gather = call_gather().double()
        rel = lambda o: float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))
        e_attn, e_torch = rel(o_attn), rel(o_gather)
        if not e_attn <= 1e-5:
            print("%-9s %2d %5d  check FAILED: attn's rel error %.3g against float64 > 1e-5"
                  % (dt, B, page, e_attn))
            return 1
        fns = [call_attn, call_gather, call_contig]
        for _ in range(a.warmup):
            for f in fns:
                f()
        times = [[], [], []]
        for _ in range(a.reps):
            for i, f in enumerate(fns):
                t0 = time.perf_counter()
                f()
                times[i].append(time.perf_counter() - t0)
    med = [statistics.median(t) * 1e3 for t in times]
    gbs = 2 * B * Hkv * Lk * D * k_pool.element_size() / (med[0] * 1e-3) / 1e9
    print("%-9s %2d %5d  %9.3f %9.3f %9.3f  %9.1f  %10.2fx %10.2fx   (rel err attn %.1e, torch %.1e)"
          % (dt, B, page, med[0], med[1], med[2], gbs, med[1] / med[0], med[2] / med[0],
             e_attn, e_torch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
