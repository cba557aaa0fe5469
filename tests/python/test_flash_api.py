"""test_flash_api.py — attn.flash (FlashAttention 2's flash_attn_func,
flash_attn_varlen_func, flash_attn_with_kvcache on attn) and
attn.integrations.transformers_flash.register_flash (those three as transformers'
FlashAttention implementation).

Checked:
- flash_attn_func on [B, L, H, D]: against the float64 oracle (bottom-right causal,
  window, GQA, softcap, ALiBi, Lq != Lk) under the contract's float32 rule
  (tolerance_failure), its LSE too; bit for bit against attn.scaled_dot_product_attention
  of the same call (align="bottom-right") and attn.varlen_attention with batch row b as
  sequence b (output and LSE); gradients against grads.reference_grads
  (grad_failure); the return conventions (out; (out, lse [B, Hq, Lq], None)).
- flash_attn_varlen_func: bit for bit attn.varlen_attention (output, LSE [Hq, total_q],
  gradients); with a block_table over a shuffled page pool, bit for bit the packed call,
  and the pages' gradients are the packed keys' scattered back.
- flash_attn_with_kvcache: bit for bit attn.attention_with_kvcache (contiguous and paged,
  with an append), against the oracle; refusals of what attn does not do.
- transformers (skipped without it): register_flash's and write_local_kernel's name rules;
  a tiny Llama (GQA) on a packed batch from DataCollatorWithFlattening (cu_seq_lens
  kwargs, and position ids alone) through "attn-flash" (register_flash) and through
  "attn/flash-attn" (write_local_kernel's build for the `kernels` package; skipped, with
  the reason, where it is not installed): loss and every parameter's gradient against sdpa run on each
  document alone (hf_models' LOGIT_TOL and close_grads), through the varlen call
  (counted); model.generate_batch (continuous batching) giving sdpa greedy's tokens.
Skipped, with the reason, where PyTorch is absent.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: attn.flash (a "
                            "PyTorch API) is not tested")

import attn  # noqa: E402
from attn import flash  # noqa: E402
from grads import grad_failure, reference_grads  # noqa: E402
from oracle import reference, tolerance_failure  # noqa: E402


def _bhld(x):  # [B, L, H, D] -> [B, H, L, D], float64 NumPy
    return np.ascontiguousarray(np.transpose(np.asarray(x, np.float64), (0, 2, 1, 3)))


def _t(rng, *shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


# (B, Lq, Lk, Hq, Hkv, D, options): causal bottom-right with Lq < Lk and Lq > Lk, a
# window with a scale, GQA, softcap, ALiBi, one row
CASES = [
    (2, 7, 7, 4, 4, 16, dict(causal=True)),
    (2, 5, 19, 4, 2, 16, dict(causal=True)),
    (1, 23, 9, 6, 2, 8, dict(causal=True)),
    (3, 17, 33, 4, 1, 32, dict(window_size=(5, 2), softmax_scale=0.3)),
    (2, 16, 16, 2, 2, 16, dict(causal=True, window_size=(3, 0), softcap=2.0)),
    (1, 1, 40, 4, 2, 16, dict(causal=True, alibi_slopes=[0.5, 0.25, 0.125, 0.0625])),
]


def _oracle_opts(o):
    window = o.get("window_size")
    return dict(causal=o.get("causal", False), gqa=True, align="bottom-right",
                scale=o.get("softmax_scale"),
                window=None if window is None else tuple(window),
                softcap=o.get("softcap", 0.0),
                alibi=None if o.get("alibi_slopes") is None
                else np.asarray(o["alibi_slopes"], np.float32))


@pytest.mark.parametrize("case", CASES)
def test_func_forward(rng, case):
    B, Lq, Lk, Hq, Hkv, D, o = case
    q, k, v = _t(rng, B, Lq, Hq, D), _t(rng, B, Lk, Hkv, D), _t(rng, B, Lk, Hkv, D)
    out, lse, s = flash.flash_attn_func(q, k, v, return_attn_probs=True, **o)
    assert s is None and out.shape == (B, Lq, Hq, D) and lse.shape == (B, Hq, Lq)
    assert lse.dtype == torch.float32
    ref_o, ref_l, _ = reference(_bhld(q), _bhld(k), _bhld(v), **_oracle_opts(o))
    why = tolerance_failure(_bhld(out), ref_o)
    assert why is None, "out: " + why
    why = tolerance_failure(lse.numpy(), ref_l)
    assert why is None, "lse: " + why
    # attn's own calls: the same bits as scaled_dot_product_attention (bottom-right) and as
    # varlen_attention with batch row b as sequence b
    window = o.get("window_size")
    own = attn.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=o.get("causal", False),
        enable_gqa=True, scale=o.get("softmax_scale"), align="bottom-right", window=window,
        softcap=o.get("softcap", 0.0), alibi_slopes=o.get("alibi_slopes"))
    assert torch.equal(out, own.transpose(1, 2))
    packed, plse = attn.varlen_attention(
        q.reshape(B * Lq, Hq, D), k.reshape(B * Lk, Hkv, D), v.reshape(B * Lk, Hkv, D),
        [b * Lq for b in range(B + 1)], [b * Lk for b in range(B + 1)], Lq, Lk, return_lse=True,
        **o)
    assert torch.equal(out.reshape(B * Lq, Hq, D), packed)
    assert torch.equal(lse, plse.reshape(Hq, B, Lq).transpose(0, 1))
    plain = flash.flash_attn_func(q, k, v, **o)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, out)


@pytest.mark.parametrize("case", CASES[:5])
def test_func_gradients(rng, case):
    B, Lq, Lk, Hq, Hkv, D, o = case
    q, k, v = (x.requires_grad_() for x in (_t(rng, B, Lq, Hq, D), _t(rng, B, Lk, Hkv, D),
                                            _t(rng, B, Lk, Hkv, D)))
    d_o = _t(rng, B, Lq, Hq, D)
    flash.flash_attn_func(q, k, v, **o).backward(d_o)
    ro = _oracle_opts(o)
    ro.pop("alibi")
    ref, mag = reference_grads(_bhld(q.detach()), _bhld(k.detach()), _bhld(v.detach()),
                               _bhld(d_o), **ro)
    for name, t, r, m in zip(("dq", "dk", "dv"), (q, k, v), ref, mag):
        why = grad_failure(_bhld(t.grad), r, m)
        assert why is None, "%s: %s" % (name, why)


def test_func_dropout(rng):
    """dropout_p > 0: attn's mask, its seed drawn from torch's default generator, as
    scaled_dot_product_attention draws it: the same bits for the same torch seed."""
    q, k, v = _t(rng, 2, 9, 4, 16), _t(rng, 2, 12, 2, 16), _t(rng, 2, 12, 2, 16)
    torch.manual_seed(7)
    got = flash.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    torch.manual_seed(7)
    want = attn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), dropout_p=0.3, is_causal=True,
                                             enable_gqa=True, align="bottom-right")
    assert torch.equal(got, want.transpose(1, 2))
    assert not torch.equal(got, flash.flash_attn_func(q, k, v, causal=True))


def _pack(rng, lq, lk, Hq=4, Hkv=2, D=16):
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
    q = _t(rng, sum(lq), Hq, D)
    k, v = _t(rng, sum(lk), Hkv, D), _t(rng, sum(lk), Hkv, D)
    return q, k, v, cu_q, cu_k, max(lq), max(lk)


LQ, LK = [3, 1, 16, 0, 9], [7, 1, 16, 4, 21]


def test_varlen_is_varlen_attention(rng):
    q, k, v, cu_q, cu_k, mq, mk = _pack(rng, LQ, LK)
    d_o = _t(rng, *q.shape)
    got, want = [], []
    for fn, res in ((flash.flash_attn_varlen_func, got), (attn.varlen_attention, want)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        sinks = torch.tensor([0.5, -1.0, 0.0, 2.0], requires_grad=True)
        kw = dict(s_aux=sinks) if fn is flash.flash_attn_varlen_func else dict(sinks=sinks)
        out, lse, s = fn(*leaves, cu_q, cu_k, mq, mk, causal=True, window_size=(6, 1),
                         return_attn_probs=True, **kw)
        out.backward(d_o)
        assert s is None and lse.shape == (4, q.shape[0])
        res += [out, lse] + [x.grad for x in leaves] + [sinks.grad]
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), got, want):
        assert torch.equal(g, w), name


def _pages(k, cu_k, page, rng):
    """A shuffled pool [num_pages, page, Hkv, D] (NaN where no key is) holding packed k's
    sequences, and the table (B, max_pages), -1 past each sequence's pages."""
    lens = (cu_k[1:] - cu_k[:-1]).tolist()
    most = max(-(-n // page) for n in lens)
    total = sum(-(-n // page) for n in lens) + 2
    perm = rng.permutation(total)
    pool = torch.full((total, page) + tuple(k.shape[1:]), float("nan"))
    table = torch.full((len(lens), most), -1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(lens):
        for p in range(-(-n // page)):
            table[b, p] = int(perm[at])
            at += 1
            rows = k[int(cu_k[b]) + p * page:int(cu_k[b]) + min(n, (p + 1) * page)]
            pool[table[b, p], :rows.shape[0]] = rows
    return pool, table


def test_varlen_block_table(rng):
    q, k, v, cu_q, cu_k, mq, mk = _pack(rng, LQ, LK)
    kp, table = _pages(k, cu_k, 4, np.random.default_rng(3))
    vp, _ = _pages(v, cu_k, 4, np.random.default_rng(3))
    d_o = _t(rng, *q.shape)
    kp.requires_grad_()
    want = flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    got = flash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, mq, mk, causal=True,
                                       block_table=table)
    assert torch.equal(got, want)
    got.backward(d_o)
    kk = k.clone().requires_grad_()
    flash.flash_attn_varlen_func(q, kk, v, cu_q, cu_k, mq, mk, causal=True).backward(d_o)
    back, _ = _pages(kk.grad, cu_k, 4, np.random.default_rng(3))
    assert torch.equal(torch.nan_to_num(back, nan=0.0), kp.grad)
    # without a gradient: one paged call, bit for bit each sequence's own paged call, and
    # within the float32 rule of the packed call
    with torch.no_grad():
        fast, lse = flash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, mq, mk, causal=True,
                                                 block_table=table, return_attn_probs=True)[:2]
    for b in range(len(cu_q) - 1):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if rows.start == rows.stop:
            continue
        own = attn.attention_with_kvcache(q[None, rows], kp, vp,
                                          cache_seqlens=(cu_k[b + 1] - cu_k[b]).reshape(1).int(),
                                          block_table=table[b:b + 1].clamp(min=0), causal=True)
        assert torch.equal(own[0], fast[rows])
    assert tolerance_failure(fast.double().numpy(), want.detach().double().numpy()) is None
    assert lse.shape == (q.shape[1], q.shape[0])
    with pytest.raises(ValueError):  # a sequence longer than its pages
        flash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, mq, mk, block_table=table[:, :1])
    holed = table.clone()
    holed[4, 1] = -1  # a page the sequence needs
    with pytest.raises(ValueError):
        flash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, mq, mk, block_table=holed)


def test_kvcache(rng):
    B, Lk, Hq, Hkv, D = 3, 24, 4, 2, 16
    q = _t(rng, B, 2, Hq, D)
    kc, vc = _t(rng, B, Lk, Hkv, D), _t(rng, B, Lk, Hkv, D)
    lens = torch.tensor([24, 7, 15], dtype=torch.int32)
    out, lse = flash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                             return_softmax_lse=True, num_splits=3)
    assert lse.shape == (B, Hq, 2)
    own = attn.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert torch.equal(out, own)
    ref_o, ref_l, _ = reference(_bhld(q), _bhld(kc), _bhld(vc), causal=True, gqa=True,
                                align="bottom-right", kv_len=lens.numpy())
    assert tolerance_failure(_bhld(out), ref_o) is None
    assert tolerance_failure(lse.numpy(), ref_l) is None
    plain = flash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, out)
    # paged, with an append of two rows: the same bits as the contiguous append
    kn, vn = _t(rng, B, 2, Hkv, D), _t(rng, B, 2, Hkv, D)
    short = torch.tensor([5, 0, 13], dtype=torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    want = flash.flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=short, causal=True)
    page = 8
    table = torch.tensor(np.random.default_rng(1).permutation(B * Lk // page).reshape(B, -1),
                         dtype=torch.int32)
    kp = torch.empty(B * Lk // page, page, Hkv, D)
    vp = torch.empty_like(kp)
    for b in range(B):
        for p in range(Lk // page):
            kp[table[b, p]] = kc[b, p * page:(p + 1) * page]
            vp[table[b, p]] = vc[b, p * page:(p + 1) * page]
    got = flash.flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=short,
                                        block_table=table, causal=True)
    assert torch.equal(got, want)
    assert torch.equal(kp[table[1, 0], :2], kn[1])  # written in place through the table
    for bad in ("rotary_cos", "cache_batch_idx", "cache_leftpad"):
        with pytest.raises(NotImplementedError):
            flash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **{bad: lens})


# ---- transformers ---------------------------------------------------------------------------

def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed: its "
                               "FlashAttention path through attn.flash is not tested")


def _config(transformers):
    return transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=64, pad_token_id=0)


def _build(transformers, impl):
    torch.manual_seed(1234)
    return transformers.LlamaForCausalLM._from_config(copy.deepcopy(_config(transformers)),
                                                      attn_implementation=impl)


def test_register_flash_names():
    _transformers()
    from attn.integrations.transformers_flash import NAME, register_flash  # noqa: PLC0415
    assert register_flash() == NAME and "flash" in NAME
    import attn.integrations.transformers as hf  # noqa: PLC0415
    assert hf.register_flash is register_flash
    for bad in ("attn", "me/flash-attn", "flash_attention_2", "paged|attn-flash"):
        with pytest.raises(ValueError):
            register_flash(bad)
    from attn.integrations.transformers_flash import write_local_kernel  # noqa: PLC0415
    for bad in ("attn-flash", "me/attn", "a/b/flash", "me/flash@v1"):
        with pytest.raises(ValueError):
            write_local_kernel("/nonexistent/never-written", bad)


class _Spy:
    """Counts the varlen calls attn.flash makes."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = flash.varlen_attention

        def spy(*a, **kw):
            self.calls += 1
            return real(*a, **kw)
        monkeypatch.setattr(flash, "varlen_attention", spy)


DOCS = [[5, 17, 3, 9, 2], [44], [8, 8, 1, 30, 31, 12, 6, 70, 2, 11, 4], [3, 3, 3, 3]]


def _flash_name(way, monkeypatch, tmp_path):
    """The attn_implementation of attn.flash, made available one of the two ways:
    register_flash(), or write_local_kernel() for the `kernels` package's LOCAL_KERNELS
    (skipped, with the reason, where transformers finds no usable `kernels`)."""
    from attn.integrations import transformers_flash  # noqa: PLC0415
    if way == "register_flash":
        return transformers_flash.register_flash()
    from transformers.utils.import_utils import is_kernels_available  # noqa: PLC0415
    if not is_kernels_available():
        pytest.skip("the kernels package (>= 0.18.2, < 0.19) is not installed: the local "
                    "kernel build of attn.flash is not tested")
    entry = transformers_flash.write_local_kernel(tmp_path / "attn-flash")
    monkeypatch.setenv("LOCAL_KERNELS", entry)
    return transformers_flash.KERNEL_NAME


@pytest.mark.parametrize("way", ["register_flash", "local_kernel"])
@pytest.mark.parametrize("how", ["cu_seq_lens", "position_ids"])
def test_packed_training_step(monkeypatch, tmp_path, how, way):
    transformers = _transformers()
    from hf_models import LOGIT_TOL, close, close_grads  # noqa: PLC0415
    name = _flash_name(way, monkeypatch, tmp_path)
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    batch = collate([{"input_ids": d} for d in DOCS])
    if how == "position_ids":
        for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            del batch[key]
    spy = _Spy(monkeypatch)
    model = _build(transformers, name).train()
    assert model.config._attn_implementation == name
    loss = model(**batch).loss
    loss.backward()
    assert spy.calls == 2, "the packed batch did not run as varlen (%d calls)" % spy.calls
    grads = {n: p.grad for n, p in model.named_parameters()}

    # the reference: sdpa on each document alone, the same loss (the mean over every
    # next-token prediction inside a document)
    ref = _build(transformers, "sdpa").train()
    total, count = 0.0, 0
    for d in DOCS:
        ids = torch.tensor([d])
        logits = ref(input_ids=ids).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
        count += len(d) - 1
    ref_loss = total / count
    ref_loss.backward()
    close(loss.detach(), ref_loss.detach(), LOGIT_TOL, "packed loss vs sdpa per document")
    close_grads(grads, {n: p.grad for n, p in ref.named_parameters()}, "packed step")


@pytest.mark.parametrize("way", ["register_flash", "local_kernel"])
def test_continuous_batching(monkeypatch, tmp_path, way):
    transformers = _transformers()
    name = _flash_name(way, monkeypatch, tmp_path)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
    new = 6
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
    spy = _Spy(monkeypatch)
    model = _build(transformers, name).eval()
    cb = transformers.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64)
    got = model.generate_batch(inputs=prompts, generation_config=gen,
                               continuous_batching_config=cb, warmup=False)
    assert spy.calls > 0, "continuous batching did not call attn.flash's varlen"
    ref = _build(transformers, "sdpa").eval()
    for i, p in enumerate(prompts):
        want = ref.generate(torch.tensor([p]), generation_config=gen)[0, len(p):].tolist()
        out = [r for r in got.values() if list(r.prompt_ids) == p]
        assert len(out) == 1 and list(out[0].generated_tokens) == want, (i, out, want)
