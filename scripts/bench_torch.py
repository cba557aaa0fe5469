#!/usr/bin/env python3
"""bench_torch.py — the PyTorch side of `attn bench --vs torch`.

What it is: a child process of `attn bench` that times
torch.nn.functional.scaled_dot_product_attention on the CPU for the cases the bench sends,
with the bench's own method: the same thread count (torch.set_num_threads), the same
number of warm-up calls, at least the same number of timed calls (more for short calls,
until about adaptive_seconds are timed, at most max_reps), the inputs rotated through the
same number of copies, and the median reported.

Protocol (JSON Lines on stdin and stdout, one object a line):
  in:  {"hello": 1, "threads": N}
  out: {"torch": "2.x", "info": "..."}            or {"error": "..."}
  in:  {"name": ..., "B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "mask": "none|causal|bool|window",
        "window_left", "window_right", "mask_density", "threads", "warmup", "reps",
        "max_reps", "adaptive_seconds", "rotate",
        "dtype", "kv_dtype": "float32|float16|bfloat16" (absent: float32),
        "direction": "forward|backward" (absent: forward)}
  out: {"name": ..., "median_s", "min_s", "max_s", "reps", "times": [each call's seconds]}
       or {"name": ..., "error": "..."}
It also runs alone: `python scripts/bench_torch.py < cases.jsonl` (the hello line first).

The masks as a PyTorch user writes them: causal is is_causal=True (top-left, as attn's
default); a bool mask is a random [1, 1, Lq, Lk] attn_mask of the given density (True =
attend, as attn); a sliding window has no SDPA argument, so it is the dense bool band
mask of the same window; grouped-query attention is enable_gqa=True.

Dtypes: q is made in `dtype`, k and v in `kv_dtype`; SDPA wants one dtype for all three,
so where they differ (attn's float32 queries over a 16-bit KV cache) q is cast to the KV
dtype, as a PyTorch user would do, before the clock starts.

Backward: q, k and v require grad; each timed call runs the forward untimed, then times
out.backward(d_o) alone (d_o uniform, made beforehand), gradients reset between calls.

What it is not: a check of PyTorch's answers (attn's answers are checked against its
float64 reference by the bench; PyTorch's are PyTorch's), nor a benchmark of anything
but the forward call (or the backward call): the inputs are made before the clock starts.
"""
import json
import statistics
import sys
import time


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def make_inputs(torch, c):
    g = torch.Generator().manual_seed(1)
    def uniform(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float32) * 4.0 - 2.0
    kvt = getattr(torch, c.get("kv_dtype", "float32"))
    q = uniform(c["B"], c["Hq"], c["Lq"], c["Dk"]).to(kvt)
    k = uniform(c["B"], c["Hkv"], c["Lk"], c["Dk"]).to(kvt)
    v = uniform(c["B"], c["Hkv"], c["Lk"], c["Dv"]).to(kvt)
    mask = None
    if c["mask"] == "bool":
        mask = torch.rand(1, 1, c["Lq"], c["Lk"], generator=g) < c["mask_density"]
    elif c["mask"] == "window":
        i = torch.arange(c["Lq"]).unsqueeze(1)  # top-left diagonal d_i = i
        j = torch.arange(c["Lk"]).unsqueeze(0)
        keep = torch.ones(c["Lq"], c["Lk"], dtype=torch.bool)
        if c["window_left"] >= 0:
            keep &= j >= i - c["window_left"]
        if c["window_right"] >= 0:
            keep &= j <= i + c["window_right"]
        mask = keep.view(1, 1, c["Lq"], c["Lk"])
    return q, k, v, mask


def run_case(torch, F, c):
    torch.set_num_threads(c["threads"])
    q0, k0, v0, m0 = make_inputs(torch, c)
    rot = max(1, int(c["rotate"]))
    sets = [(q0, k0, v0, m0)] + [
        (q0.clone(), k0.clone(), v0.clone(), None if m0 is None else m0.clone())
        for _ in range(rot - 1)
    ]
    gqa = c["Hq"] != c["Hkv"]
    causal = c["mask"] == "causal"

    kw = {"is_causal": causal}
    if gqa:
        kw["enable_gqa"] = True
    if c.get("direction", "forward") == "backward":
        return run_backward(torch, F, c, sets, kw)

    def call(i):
        q, k, v, m = sets[i]
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
        return time.perf_counter() - t0

    with torch.inference_mode():
        return measure(c, call, rot)


def measure(c, call, rot):
    """call(i) runs the case on input set i and returns its seconds. As attn: set 0 once
    (attn's check), the warm-up calls, then at least c["reps"] timed calls, more while less
    than c["adaptive_seconds"] is timed (at most c["max_reps"]), cycling through the sets."""
    call(0)
    n_call = 1
    for _ in range(c["warmup"]):
        call(n_call % rot)
        n_call += 1
    times, want, spent = [], c["reps"], 0.0
    while len(times) < want:
        dt = call(n_call % rot)
        n_call += 1
        times.append(dt)
        spent += dt
        if len(times) == c["reps"] and spent < c["adaptive_seconds"]:
            more = int(-(-c["adaptive_seconds"] // (spent / len(times))))
            want = max(c["reps"], min(c["max_reps"], more))
    return answer(c, times)


def answer(c, times):
    return {"name": c["name"], "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "reps": len(times), "times": times}


def run_backward(torch, F, c, sets, kw):
    """out.backward(d_o) timed alone; the forward before it is not timed"""
    g = torch.Generator().manual_seed(5)
    d_o = torch.rand(c["B"], c["Hq"], c["Lq"], c["Dv"], generator=g) * 4.0 - 2.0
    rot = len(sets)
    leaves = [tuple(x.detach().clone().requires_grad_(True) for x in s[:3]) + (s[3], d_o.clone())
              for s in sets]

    def call(i):
        q, k, v, m, do = leaves[i]
        for x in (q, k, v):
            x.grad = None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
        t0 = time.perf_counter()
        out.backward(do)
        return time.perf_counter() - t0

    return measure(c, call, rot)


def handshake(also=()):
    """Reads the bench's hello, imports torch (and the modules named in also), sets the
    thread count and answers with torch's version; torch, or None after answering with
    the reason (the bench prints it and stops). scripts/bench_torch_masks.py uses it too."""
    hello = sys.stdin.readline()
    try:
        import importlib
        import torch
        for name in also:
            importlib.import_module(name)
    except Exception as e:
        say({"error": "cannot import torch%s with %s: %s"
             % ("".join(" and " + n for n in also), sys.executable, e)})
        return None
    threads = json.loads(hello).get("threads", 0) if hello.strip() else 0
    if threads:
        torch.set_num_threads(threads)
    info = "threads %d, %s" % (torch.get_num_threads(),
                               "mkldnn" if torch.backends.mkldnn.is_available() else "no mkldnn")
    say({"torch": torch.__version__, "info": info})
    return torch


def main():
    torch = handshake()
    if torch is None:
        return 1
    import torch.nn.functional as F
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        try:
            say(run_case(torch, F, c))
        except Exception as e:  # one case's failure is that row's, not the run's
            say({"name": c.get("name", "?"), "error": "%s: %s" % (type(e).__name__, e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
