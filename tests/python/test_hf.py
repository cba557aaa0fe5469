"""test_hf.py — the Hugging Face transformers backend (attn.integrations.transformers):
tiny randomly initialised models built from their configs (no download) run with
attn_implementation="attn" against "eager" and "sdpa" on the same weights.

Architectures: BERT (bidirectional, padding mask), GPT-2 (causal, padding), Llama (causal,
left padding), Mistral (sliding window shorter than the sequence), Qwen2 (GQA, 4 query heads
over 2 key/value heads), Gemma 2 (logit softcap and sliding-window layers; eager only, as
transformers' SDPA refuses softcap). Checked: logits (forward), every parameter's gradient
of a loss on the logits, the attention weights with output_attentions=True against eager's,
greedy generation through the KV cache (Llama; Mistral and Gemma 2 past their sliding
window) giving the same tokens and step logits, a torch.compile(fullgraph=True) model
(backend aot_eager: the whole graph through AOTAutograd and the op's fake implementation)
equal to the uncompiled one, torch.export keeping the op, misuse raising what SDPA
raises, dropout and sinks passed to the library (test_hf_dropout_sinks.py: gpt-oss's sinks
and dropout in train mode).

Padded rows: a query row whose keys are all masked (a left-padded position under a causal
mask) is 0 in attn and in PyTorch's SDPA, and a uniform average in eager (which adds
finfo.min); such rows are padding and excluded from every comparison, as the model's user
ignores them.

Tolerance: max |attn - ref| <= 2e-6 * (1 + max |ref|) on logits and attention weights
(measured 1.6e-7 over every architecture, padded), and on each parameter's gradient
<= 5e-5 * (max |its ref grad| + 1% of the model's largest) (measured 1.2e-5 for BERT's
token-type embedding, a sum over every token that cancels, 8.3e-7 elsewhere);
test_planted shows both checks reject a backend whose scale is off by 1e-3 (logits
6.7e-6, gradients 1e-3 relative) and one that drops the mask. Optional: skipped with the reason where PyTorch or transformers is absent.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the transformers "
                            "backend tests are skipped")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                   "the transformers backend tests are skipped")

import attn.integrations.transformers as hf  # noqa: E402  (registers "attn")
import attn.integrations.torch_op as op  # noqa: E402
from hf_models import LOGIT_TOL, close, close_grads  # noqa: E402

B, L = 3, 21
LENGTHS = [21, 13, 6]  # real tokens per row: padding in rows 1 and 2


def configs():
    c = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)
    dec = dict(c, num_key_value_heads=4, head_dim=16)
    return {
        "bert": (transformers.BertConfig(**c, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0),
                 transformers.BertModel, "right"),
        "gpt2": (transformers.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4,
                                         n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0),
                 transformers.GPT2LMHeadModel, "right"),
        "llama": (transformers.LlamaConfig(**dec), transformers.LlamaForCausalLM, "left"),
        "mistral": (transformers.MistralConfig(**dec, sliding_window=7),
                    transformers.MistralForCausalLM, "left"),
        "qwen2": (transformers.Qwen2Config(**dict(dec, num_key_value_heads=2)),
                  transformers.Qwen2ForCausalLM, "left"),
        "gemma2": (transformers.Gemma2Config(**dict(dec, num_key_value_heads=2),
                                             sliding_window=5, attn_logit_softcapping=3.0,
                                             final_logit_softcapping=None,
                                             query_pre_attn_scalar=16),
                   transformers.Gemma2ForCausalLM, "left"),
    }


ARCHS = list(configs())
REFS = {"bert": ["eager", "sdpa"], "gpt2": ["eager", "sdpa"], "llama": ["eager", "sdpa"],
        "mistral": ["eager", "sdpa"], "qwen2": ["eager", "sdpa"], "gemma2": ["eager"]}


def build(arch, impl):
    cfg, cls, _ = configs()[arch]
    torch.manual_seed(1234)
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl)
    assert model.config._attn_implementation == impl
    return model.eval()


def batch(arch, padded=True):
    side = configs()[arch][2]
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 97, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    if padded:
        for b, n in enumerate(LENGTHS):
            if side == "right":
                mask[b, n:] = 0
            else:
                mask[b, :L - n] = 0
    return ids, mask


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def valid(mask):
    return mask.bool()  # (B, L): real tokens


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits(arch, padded):
    ids, mask = batch(arch, padded)
    keep = valid(mask)
    with torch.no_grad():
        ours = logits_of(build(arch, "attn")(input_ids=ids, attention_mask=mask))
        for ref_impl in REFS[arch]:
            ref = logits_of(build(arch, ref_impl)(input_ids=ids, attention_mask=mask))
            close(ours[keep], ref[keep], LOGIT_TOL, "%s vs %s" % (arch, ref_impl))


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients(arch):
    ids, mask = batch(arch, True)
    keep = valid(mask)
    grads = {}
    for impl in ["attn", "eager"]:
        model = build(arch, impl)
        out = logits_of(model(input_ids=ids, attention_mask=mask))
        (out[keep].square().mean()).backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    close_grads(grads["attn"], grads["eager"], arch)


@pytest.mark.parametrize("arch", ["bert", "llama", "mistral", "qwen2", "gemma2"])
def test_output_attentions(arch):
    ids, mask = batch(arch, True)
    keep = valid(mask)
    with torch.no_grad():
        ours = build(arch, "attn")(input_ids=ids, attention_mask=mask, output_attentions=True)
        ref = build(arch, "eager")(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert ours.attentions is not None and len(ours.attentions) == len(ref.attentions) == 2
    for a, r in zip(ours.attentions, ref.attentions):
        assert a.shape == r.shape and a.dtype == r.dtype
        rows = keep[:, None, :, None].expand_as(r)  # real query rows
        close(a[rows], r[rows], LOGIT_TOL, "%s attentions" % arch)
    close(logits_of(ours)[keep], logits_of(ref)[keep], LOGIT_TOL, "%s logits" % arch)


def _planted_backends():
    return [
        ("scale", lambda m, q, k, v, am, scaling=None, **kw: hf.attention_forward(
            m, q, k, v, am, scaling=scaling * (1 + 1e-3), **kw)),
        ("no mask", lambda m, q, k, v, am, **kw: hf.attention_forward(
            m, q, k, v, None, **kw)),
    ]


@pytest.mark.parametrize("which", [0, 1], ids=["scale", "no-mask"])
def test_planted(which):
    """The comparisons reject a wrong backend: a scale off by 1e-3, or the mask dropped."""
    name, planted = _planted_backends()[which]
    ids, mask = batch("llama", True)
    keep = valid(mask)
    hf.register("attn_planted")
    transformers.AttentionInterface.register("attn_planted", planted)
    try:
        outs, grads = {}, {}
        for impl in ["attn_planted", "eager"]:
            model = build("llama", impl)
            outs[impl] = model(input_ids=ids, attention_mask=mask).logits
            outs[impl][keep].square().mean().backward()
            grads[impl] = {n: p.grad for n, p in model.named_parameters()
                           if p.grad is not None}
    finally:
        transformers.AttentionInterface._global_mapping.pop("attn_planted", None)
        transformers.AttentionMaskInterface._global_mapping.pop("attn_planted", None)
    with pytest.raises(AssertionError):
        close(outs["attn_planted"][keep].detach(), outs["eager"][keep].detach(), LOGIT_TOL,
              "planted " + name)
    with pytest.raises(AssertionError):
        close_grads(grads["attn_planted"], grads["eager"], "planted " + name)


def test_compiled_model():
    """torch.compile(fullgraph=True) traces the whole model (no graph break at the op) and
    computes what the uncompiled model computes."""
    ids, mask = batch("llama", True)
    keep = valid(mask)
    model = build("llama", "attn")
    with torch.no_grad():
        eager_out = model(input_ids=ids, attention_mask=mask).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        comp_out = compiled(input_ids=ids, attention_mask=mask).logits
    close(comp_out[keep], eager_out[keep], 1e-6, "compiled")


def test_export_keeps_op():
    ids, mask = batch("qwen2", True)
    model = build("qwen2", "attn")
    ep = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask,
                                         "use_cache": False})
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("attn.sdpa" in t for t in targets) == 2, targets
    with torch.no_grad():
        ours = ep.module()(input_ids=ids, attention_mask=mask, use_cache=False).logits
        ref = model(input_ids=ids, attention_mask=mask).logits
    close(ours, ref, 1e-6, "exported")


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 1


def test_misuse_matches_sdpa_types():
    """What SDPA refuses, the backend refuses with the same exception type."""
    F = torch.nn.functional
    q = torch.randn(2, 4, 8, 16)
    bad_mask = torch.ones(2, 1, 8, 5, dtype=torch.bool)
    cases = [
        ("mask shape", (q, q, q, bad_mask)),
        ("int dtype", (q.int(), q.int(), q.int(), None)),
        ("key/value dtypes", (q, q.half(), q, None)),
        ("int mask", (q, q, q, torch.ones(8, 8, dtype=torch.int32))),
        ("heads", (q, q[:, :3], q[:, :3], None)),
    ]
    for name, (a, b, c, m) in cases:
        with pytest.raises(Exception) as theirs:
            F.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True)
        with pytest.raises(Exception) as ours:
            hf.attention_forward(_Module(), a, b, c, m)
        assert isinstance(ours.value, type(theirs.value)), (name, ours.value, theirs.value)


def test_dropout_and_sinks_passed():
    """dropout (training) and s_aux (gpt-oss's sinks) reach the library: the backend's
    output is attn.scaled_dot_product_attention's with the seed drawn from torch's
    generator (test_hf_dropout_sinks.py checks the models)."""
    import attn
    q = torch.randn(1, 2, 4, 8)
    sinks = torch.tensor([0.5, -1.0])
    torch.manual_seed(4)
    out, _ = hf.attention_forward(_Module(), q, q, q, None, dropout=0.25, s_aux=sinks)
    torch.manual_seed(4)
    ref = attn.scaled_dot_product_attention(q, q, q, None, 0.25, is_causal=True, sinks=sinks)
    assert torch.equal(out, ref.transpose(1, 2))


def test_registered():
    assert transformers.AttentionInterface._global_mapping["attn"] is hf.attention_forward
    assert "attn" in transformers.AttentionMaskInterface._global_mapping
    assert op.sdpa is not None


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_generate_with_cache(arch):
    """Greedy decoding through the KV cache (one query row over a growing cache, the
    sliding-window cache of Mistral and Gemma 2 past its window): the same tokens and the
    same step logits as sdpa / eager."""
    ids, mask = batch(arch, True)
    ref_impl = REFS[arch][-1]
    outs = {}
    for impl in ["attn", ref_impl]:
        with torch.no_grad():
            outs[impl] = build(arch, impl).generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(outs["attn"].sequences, outs[ref_impl].sequences)
    for a, r in zip(outs["attn"].logits, outs[ref_impl].logits):
        close(a, r, LOGIT_TOL, "%s step logits" % arch)
