#!/usr/bin/env python3
"""bench_mha_torch.py — attn.nn.MultiheadAttention beside torch.nn.MultiheadAttention, in one
process, on the layer the multi-head issue names: BERT-base self-attention (B = 8, L = 512,
E = 768, 12 heads, float32, batch_first).

What it is: the two modules with the same weights (attn's loads PyTorch's state_dict), checked
first (outputs and, for the training row, gradients within the float32 tolerance: max error
<= 1e-4 (1 + max|y|)), then timed interleaved — one call of each in turn, so that a noisy
machine slows both alike — on three rows:
  forward          eval, torch.no_grad(), need_weights=False (PyTorch's fast path)
  forward+weights  eval, no_grad, need_weights=True (weights averaged over heads)
  train step       train mode, forward + backward of y.sum() (gradients reset between calls)
Medians of `--reps` calls after `--warmup`, the ratio torch/attn (> 1: attn faster), and the
thread count (torch.set_num_threads and OMP_NUM_THREADS alike).

What it is not: the C module's own timing (`attn bench-mha` times attn_mha_forward without
Python; this one includes attn.nn's conversions between tensors and arrays, as a PyTorch user
pays them).

Usage: python scripts/bench_mha_torch.py [--threads 2] [--reps 15] [--warmup 3] [--json PATH]
                                        [--also PACKAGE] [--profile]
(PyTorch needed: `attn bench --setup-torch` makes .venv-bench/ with it.)
--also PACKAGE times PACKAGE.nn.MultiheadAttention as a third module in the same
interleaving (checked the same way): another build of attn copied under another name, for
before/after figures in one run, e.g. `cp -r /tmp/site-old/attn /tmp/both/attnbase` beside
the new `attn` in /tmp/both, then `PYTHONPATH=/tmp/both python ... --also attnbase`.
--profile: PyTorch's own breakdown instead (torch.profiler over --reps calls of each row,
torch's module only, the attn package not imported): each operator's self CPU time per
call, grouped into GEMM (the projections: addmm, mm), attention (the fused kernels, and
the fast path's bmm and softmax), copies (copy_, contiguous, cat, transpose materialized) and the rest — the
counterpart of the projections / attention split `attn bench-mha` prints.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--L", type=int, default=512)
    ap.add_argument("--E", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--also", default=None, help="a third module: PACKAGE.nn.MultiheadAttention")
    ap.add_argument("--profile", action="store_true", help="torch.profiler breakdown of torch's rows")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    try:
        import torch
    except ImportError:
        print("bench_mha_torch: PyTorch is not installed (attn bench --setup-torch)")
        return 2
    torch.set_num_threads(a.threads)
    if a.profile:
        return profile(torch, a)
    import attn
    import attn.nn

    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(a.E, a.heads, batch_first=True)
    ours = attn.nn.MultiheadAttention(a.E, a.heads, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    mods = [("torch", ref), ("attn", ours)]
    if a.also:
        import importlib
        other = importlib.import_module(a.also + ".nn").MultiheadAttention(a.E, a.heads,
                                                                           batch_first=True)
        other.load_state_dict(ref.state_dict())
        mods.append((a.also, other))
    x = torch.randn(a.B, a.L, a.E)

    def fwd(m, weights):
        m.eval()
        with torch.no_grad():
            return m(x, x, x, need_weights=weights)

    def train(m, xx):
        m.train()
        m.zero_grad(set_to_none=True)
        y, _ = m(xx, xx, xx, need_weights=False)
        y.sum().backward()
        return y

    # the answers first
    def close(got, want, what):
        err = (got - want).abs().max().item()
        tol = 1e-4 * (1 + want.abs().max().item())
        if not err <= tol:
            raise SystemExit("bench_mha_torch: %s differs: max error %.3g > %.3g" % (what, err, tol))
        return err

    errs = {}
    for who, m in mods[1:]:
        tag = "" if who == "attn" else who + " "
        yr, _ = fwd(ref, False)
        yo, _ = fwd(m, False)
        errs[tag + "forward"] = close(yo, yr, tag + "forward")
        yr, wr = fwd(ref, True)
        yo, wo = fwd(m, True)
        errs[tag + "weights"] = close(wo, wr, tag + "averaged weights")
        xr, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        train(ref, xr)
        train(m, xo)
        errs[tag + "dx"] = close(xo.grad, xr.grad, tag + "dX")
        for (n, pr), (_, po) in zip(ref.named_parameters(), m.named_parameters()):
            errs[tag + "d" + n] = close(po.grad, pr.grad, tag + "d" + n)

    rows = [("forward", lambda m: fwd(m, False)), ("forward+weights", lambda m: fwd(m, True)),
            ("train step", lambda m: train(m, x.clone().requires_grad_(True)))]
    out = []
    load = [open("/proc/loadavg").read().split()[0]] if os.path.exists("/proc/loadavg") else []
    for name, call in rows:
        times = {who: [] for who, _ in mods}
        for rep in range(a.warmup + a.reps):
            for who, m in mods:
                t0 = time.perf_counter()
                call(m)
                dt = time.perf_counter() - t0
                if rep >= a.warmup:
                    times[who].append(dt)
        mt, ma = statistics.median(times["torch"]), statistics.median(times["attn"])
        row = {"row": name, "torch_ms": 1e3 * mt, "attn_ms": 1e3 * ma, "torch_over_attn": mt / ma,
               "reps": a.reps}
        if a.also:
            mo = statistics.median(times[a.also])
            row.update({"also_ms": 1e3 * mo, "torch_over_also": mt / mo})
        out.append(row)
    if load:
        load.append(open("/proc/loadavg").read().split()[0])
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("bench_mha_torch: B=%d L=%d E=%d heads=%d float32, %d threads, torch %s, CPU: %s"
          % (a.B, a.L, a.E, a.heads, a.threads, torch.__version__, cpu))
    print("checked first: max |attn - torch| %s" % ", ".join(
        "%s %.2g" % kv for kv in errs.items() if kv[0].split(" ")[-1] in ("forward", "weights", "dx")))
    if load:
        print("load average (1 min) before %s, after %s" % tuple(load))
    also = " %10s %8s" % (a.also + " ms", "torch/" + a.also) if a.also else ""
    print("%-16s %10s %10s %8s%s" % ("row", "torch ms", "attn ms", "torch/attn", also))
    for r in out:
        also = " %10.1f %8.2fx" % (r["also_ms"], r["torch_over_also"]) if a.also else ""
        print("%-16s %10.1f %10.1f %8.2fx%s" % (r["row"], r["torch_ms"], r["attn_ms"],
                                                r["torch_over_attn"], also))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu, "torch": torch.__version__, "threads": a.threads, "rows": out,
                       "max_errors": errs}, f, indent=1)
    return 0


# operator name -> group of the breakdown (names as torch.profiler reports them; an
# operator that calls others is counted by its own time only, its callees by theirs). In
# this module the projections' GEMMs are mm / addmm; bmm is the attention's Q·Kᵀ and P·V
# (the fast path's _native_multi_head_attention forms the scores by bmm and a softmax)
_GEMM = ("aten::addmm", "aten::mm", "aten::matmul", "aten::linear")
_ATTN = ("attention", "aten::_softmax", "aten::softmax", "aten::_safe_softmax", "aten::bmm",
         "aten::baddbmm")
_COPY = ("aten::copy_", "aten::contiguous", "aten::cat", "aten::clone", "aten::_to_copy",
         "aten::transpose", "aten::view", "aten::reshape", "aten::permute", "aten::unflatten",
         "aten::chunk", "aten::split", "aten::select", "aten::slice", "aten::as_strided",
         "aten::empty", "aten::empty_strided", "aten::zero_", "aten::fill_", "aten::t")


def _group(name):
    if name in _GEMM:
        return "GEMM"
    if any(k in name for k in _ATTN):
        return "attention"
    if name in _COPY:
        return "copies/views"
    return "rest"


def profile(torch, a):
    """torch.profiler self CPU time per call of torch.nn.MultiheadAttention's three rows"""
    from torch.profiler import ProfilerActivity, profile as tprofile
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(a.E, a.heads, batch_first=True)
    x = torch.randn(a.B, a.L, a.E)

    def fwd(weights):
        ref.eval()
        with torch.no_grad():
            return ref(x, x, x, need_weights=weights)

    def train():
        ref.train()
        ref.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        y, _ = ref(xx, xx, xx, need_weights=False)
        y.sum().backward()

    print("bench_mha_torch --profile: B=%d L=%d E=%d heads=%d float32, %d threads, torch %s, "
          "load average %s" % (a.B, a.L, a.E, a.heads, a.threads, torch.__version__,
                               open("/proc/loadavg").read().split()[0]
                               if os.path.exists("/proc/loadavg") else "?"))
    for name, call in (("forward", lambda: fwd(False)), ("forward+weights", lambda: fwd(True)),
                       ("train step", train)):
        for _ in range(a.warmup):
            call()
        t0 = time.perf_counter()
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.reps):
                call()
        wall = (time.perf_counter() - t0) / a.reps
        groups, ops = {}, []
        for ev in prof.key_averages():
            ms = ev.self_cpu_time_total / 1e3 / a.reps
            groups[_group(ev.key)] = groups.get(_group(ev.key), 0.0) + ms
            ops.append((ms, ev.key, ev.count // a.reps))
        total = sum(groups.values())
        print("%s: %.1f ms a call under the profiler, self CPU %.1f ms: %s" % (
            name, 1e3 * wall, total, ", ".join("%s %.1f ms = %.0f%%" % (g, v, 100 * v / total)
                                               for g, v in sorted(groups.items(),
                                                                  key=lambda kv: -kv[1]))))
        for ms, key, n in sorted(ops, reverse=True)[:8]:
            print("    %-44s %8.2f ms  x%d  (%s)" % (key, ms, n, _group(key)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
