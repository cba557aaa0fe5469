#!/usr/bin/env python3
"""bench_additive_torch.py — the PyTorch side of `attn bench --additive --vs torch`.

What it is: a child process of `attn bench --additive` that runs additive (Bahdanau)
attention as its users write it in PyTorch — the broadcast of the issue:

    Wq = q @ W                                   [B, Lq, A]   (the projections, as attn's
    Uk = k @ U + b                               [B, Lk, A]    call forms them inside it)
    e  = torch.tanh(Wq[:, :, None, :] + Uk[:, None, :, :]) @ v     [B, Lq, Lk]
    e  = e.masked_fill(~key_mask[:, None, :], -inf)                 (key lengths)
    out = torch.softmax(e, -1) @ V               [B, Lq, Dv]

on the inputs the bench wrote, writes its outputs (and gradients) back for the bench to
check against attn's, reports its peak memory, then times single calls on request, so
that the bench can interleave them with attn's (one of each in turn, the same threads).

Protocol (JSON Lines on stdin and stdout, one object a line):
  in:  {"hello": 1, "threads": N}
  out: {"torch": "2.x", "info": "..."}            or {"error": "..."}
  in:  {"load": DIR, "B", "Lq", "Lk", "Dq", "Dk", "Dv", "A", "threads"}
       DIR holds q k v W U vv b d_o (float32, raw little-endian, C order) and key_len
       (int64, B) (and attn's answers, attn_<name>.f32, which this side does not read);
       the answers go to DIR/torch_{o,dq,dk,dv,dW,dU,dvv,db}.f32, and the same function in
       float64 (batch by batch, untimed), rounded to float32, to DIR/ref_<name>.f32: the
       bench checks both attn's answers and these against it
  out: {"ok": 1, "peak_forward_bytes": n, "peak_train_bytes": n}   or {"error": "..."}
       (peak = the process's resident high-water mark over one call, above its resident
       size before it, from /proc/self/status after resetting VmHWM through
       /proc/self/clear_refs; -1 where that is not available)
  in:  {"time": "forward" | "train"}
  out: {"s": seconds}                             or {"error": "..."}
       forward: one call under torch.no_grad(); train: the forward with autograd and
       out.backward(d_o), the gradients reset (set to None) before the clock starts.

What it is not: a check (the bench compares these outputs with attn's), nor a timing of
anything but the call: the inputs are made before the clock starts.
"""
import array
import json
import os
import sys
import time


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def status_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def peak_of(fn):
    """fn's result and the resident high-water mark it reached above the resident size
    before it, in bytes (-1 where /proc cannot tell)."""
    rss = status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)
        reset = True
    except OSError:
        reset = False
    r = fn()
    hwm = status_kib("VmHWM")
    if not reset or rss < 0 or hwm < 0:
        return r, -1
    return r, max(0, hwm - rss) * 1024


class Case:
    def __init__(self, torch, c):
        self.torch = torch
        self.dir = c["load"]
        B, Lq, Lk, Dq, Dk, Dv, A = (c[x] for x in ("B", "Lq", "Lk", "Dq", "Dk", "Dv", "A"))
        self.shape = (B, Lq, Lk, Dq, Dk, Dv, A)
        self.q = self.read("q", B, Lq, Dq)
        self.k = self.read("k", B, Lk, Dk)
        self.v = self.read("v", B, Lk, Dv)
        self.W = self.read("W", Dq, A)
        self.U = self.read("U", Dk, A)
        self.vv = self.read("vv", A)
        self.b = self.read("b", A)
        self.d_o = self.read("d_o", B, Lq, Dv)
        lens = self.read("key_len", B, dtype=torch.int64)
        # the padding mask as users build it from the lengths: True = a real key
        self.keep = torch.arange(Lk)[None, :] < lens[:, None]
        self.leaves = [x.detach().clone().requires_grad_(True)
                       for x in (self.q, self.k, self.v, self.W, self.U, self.vv, self.b)]

    def read(self, name, *shape, dtype=None):
        torch = self.torch
        dtype = dtype or torch.float32
        with open(os.path.join(self.dir, name + ".f32" if dtype == torch.float32
                               else name + ".i64"), "rb") as f:
            raw = bytearray(f.read())
        n = 1
        for s in shape:
            n *= s
        t = torch.frombuffer(raw, dtype=dtype)
        if t.numel() != n:
            raise ValueError("%s: %d values, expected %d" % (name, t.numel(), n))
        return t.reshape(*shape).clone()

    def write(self, name, t, prefix="torch_"):
        t = t.detach().contiguous().to(self.torch.float32).reshape(-1)
        with open(os.path.join(self.dir, prefix + name + ".f32"), "wb") as f:
            f.write(array.array("f", t.tolist()).tobytes())

    def additive(self, q, k, v, W, U, vv, b):
        torch = self.torch
        Wq = q @ W
        Uk = k @ U + b
        e = torch.tanh(Wq[:, :, None, :] + Uk[:, None, :, :]) @ vv
        e = e.masked_fill(~self.keep[:, None, :], float("-inf"))
        return torch.softmax(e, dim=-1) @ v

    def forward(self):
        with self.torch.no_grad():
            return self.additive(self.q, self.k, self.v, self.W, self.U, self.vv, self.b)

    def train(self):
        for x in self.leaves:
            x.grad = None
        out = self.additive(*self.leaves)
        out.backward(self.d_o)
        return out

    def reference(self):
        """The same function in float64, batch by batch (untimed; about Lq Lk A doubles a
        tensor): the arbiter of the check, written as ref_<name>.f32. The weights'
        gradients are summed over the batches in float64."""
        torch = self.torch
        sums = None
        outs = {k: [] for k in ("o", "dq", "dk", "dv")}
        for bi in range(self.shape[0]):
            leaves = [x[bi:bi + 1].double().requires_grad_(True) for x in (self.q, self.k, self.v)]
            leaves += [x.double().requires_grad_(True) for x in (self.W, self.U, self.vv, self.b)]
            Wq = leaves[0] @ leaves[3]
            Uk = leaves[1] @ leaves[4] + leaves[6]
            e = torch.tanh(Wq[:, :, None, :] + Uk[:, None, :, :]) @ leaves[5]
            e = e.masked_fill(~self.keep[bi:bi + 1, None, :], float("-inf"))
            out = torch.softmax(e, dim=-1) @ leaves[2]
            out.backward(self.d_o[bi:bi + 1].double())
            for k, x in zip(("o", "dq", "dk", "dv"), (out, *leaves[:3])):
                outs[k].append((x if k == "o" else x.grad).detach())
            g = [x.grad for x in leaves[3:]]
            sums = g if sums is None else [a + b for a, b in zip(sums, g)]
            del Wq, Uk, e, out, leaves
        for k, v in outs.items():
            self.write(k, torch.cat(v), "ref_")
        for k, v in zip(("dW", "dU", "dvv", "db"), sums):
            self.write(k, v, "ref_")

    def load(self):
        self.reference()
        out, peak_f = peak_of(self.forward)
        self.write("o", out)
        del out
        for x in self.leaves:
            x.grad = None
        _, peak_t = peak_of(self.train)
        for name, x in zip(("dq", "dk", "dv", "dW", "dU", "dvv", "db"), self.leaves):
            self.write(name, x.grad)
        return {"ok": 1, "peak_forward_bytes": peak_f, "peak_train_bytes": peak_t}

    def time(self, what):
        fn = {"forward": self.forward, "train": self.train}[what]
        if what == "train":
            for x in self.leaves:
                x.grad = None
        t0 = time.perf_counter()
        fn()
        return {"s": time.perf_counter() - t0}


def main():
    hello = sys.stdin.readline()
    try:
        import torch
    except Exception as e:  # the bench prints this line and stops
        say({"error": "cannot import torch with %s: %s" % (sys.executable, e)})
        return 1
    threads = json.loads(hello).get("threads", 0) if hello.strip() else 0
    if threads:
        torch.set_num_threads(threads)
    say({"torch": torch.__version__, "info": "threads %d" % torch.get_num_threads()})
    case = None
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        try:
            if "load" in c:
                case = Case(torch, c)
                say(case.load())
            elif "time" in c:
                if case is None:
                    raise RuntimeError("no case loaded")
                say(case.time(c["time"]))
            else:
                raise ValueError("unknown request: %s" % line.strip()[:80])
        except Exception as e:  # the bench reports it and stops
            say({"error": "%s: %s" % (type(e).__name__, e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
