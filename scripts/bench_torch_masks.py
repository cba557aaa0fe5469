#!/usr/bin/env python3
"""bench_torch_masks.py — the PyTorch side of `attn bench masks --vs torch`.

What it is: a child process of `attn bench masks` (bench/bench_masks_peer.c) that times
torch.nn.functional.scaled_dot_product_attention on the CPU on the very inputs and masks
attn's rows use: the bench writes them as .npy files and this side loads them once per
shape. q, k and v arrive in [B, L, H, D] storage and are passed as their transpose(1, 2)
views, (B, H, L, D) with BERT's strides, as transformers' BERT passes them; the masks are
the bool (True = attend) or float (0 / -inf) tensors of the row, [B, 1, L, L] or
[B, 1, 1, L], passed as attn_mask; is_causal=True where the row asks for it and has no
mask (SDPA refuses is_causal together with attn_mask: a causal padded batch is the mask
that encodes both, as transformers builds it).

Protocol (JSON Lines on stdin and stdout, one object a line; the hello is that of
scripts/bench_torch.py, so the bench starts both through the same torch_start):
  in:  {"hello": 1, "threads": N}
  out: {"torch": "2.x", "info": "..."}                    or {"error": "..."}
  in:  {"op": "load", "q": PATH, "k": PATH, "v": PATH,
        "variants": [{"mask": PATH or null, "causal": bool}, ...]}
  out: {"ok": true}                                        or {"error": "..."}
  in:  {"op": "check", "out": [PATH, ...]}   (one per variant: each one's output, saved
                                              as float32 (B, H, L, D), C order)
  out: {"ok": true}                                        or {"error": "..."}
  in:  {"op": "round", "warm": W}            (W untimed calls of variant 0, then one
                                              timed call of each variant in turn)
  out: {"times": [seconds of each variant's call]}         or {"error": "..."}
  in:  {"op": "free"}
  out: {"ok": true}
Every call is made under torch.inference_mode() with torch.set_num_threads(N).

What it is not: a check (the bench reads the outputs back and compares them with attn's),
nor a timing of anything but the SDPA call: the inputs are loaded before the clock starts.
"""
import json
import os
import sys
import time


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Side:
    def __init__(self, torch, np):
        self.torch, self.np = torch, np
        self.F = torch.nn.functional
        self.q = self.k = self.v = None
        self.variants = []

    def tensor(self, path):
        return self.torch.from_numpy(self.np.load(path))

    def load(self, m):
        # [B, L, H, D] storage seen as (B, H, L, D): BERT's strides
        self.q, self.k, self.v = (self.tensor(m[x]).transpose(1, 2) for x in ("q", "k", "v"))
        self.variants = [(None if x["mask"] is None else self.tensor(x["mask"]), bool(x["causal"]))
                         for x in m["variants"]]
        for mask, causal in self.variants:
            if mask is not None and causal:
                raise ValueError("a variant with both a mask and causal (SDPA refuses them)")
        return {"ok": True}

    def call(self, i):
        mask, causal = self.variants[i]
        return self.F.scaled_dot_product_attention(self.q, self.k, self.v, attn_mask=mask,
                                                   is_causal=causal)

    def check(self, m):
        if len(m["out"]) != len(self.variants):
            raise ValueError("%d output paths for %d variants" % (len(m["out"]), len(self.variants)))
        for i, path in enumerate(m["out"]):
            o = self.call(i).to(self.torch.float32).contiguous().numpy()
            self.np.save(path, o)
        return {"ok": True}

    def round(self, m):
        for _ in range(int(m.get("warm", 0))):
            self.call(0)
        times = []
        for i in range(len(self.variants)):
            t0 = time.perf_counter()
            self.call(i)
            times.append(time.perf_counter() - t0)
        return {"times": times}

    def free(self, m):
        self.q = self.k = self.v = None
        self.variants = []
        return {"ok": True}


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_torch import handshake  # the hello of scripts/bench_torch.py
    torch = handshake(also=("numpy",))
    if torch is None:
        return 1
    import numpy as np
    side = Side(torch, np)
    ops = {"load": side.load, "check": side.check, "round": side.round, "free": side.free}
    with torch.inference_mode():
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                m = json.loads(line)
                say(ops[m["op"]](m))
            except Exception as e:  # the bench reports it as the group's torch error
                say({"error": "%s: %s" % (type(e).__name__, e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
