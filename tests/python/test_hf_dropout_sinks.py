"""test_hf_dropout_sinks.py — attention dropout and attention sinks through the torch custom
op (attn.integrations.torch_op) and the transformers backend (attn.integrations.transformers).

Sinks: a tiny gpt-oss model (GptOssForCausalLM from its config, no download: GQA 4 query
over 2 key/value heads, a sliding-window layer and a full one, its learned ``sinks`` set to
N(0, 2) so that they matter) under attn_implementation="attn" against "eager" on the same
weights: logits, and every parameter's gradient, the sinks' own included. gpt-oss's eager
path appends the sink as a logit column and drops it after the softmax; attn adds exp(sink)
to the denominator: the same formula.

Dropout: in train mode (attention_dropout 0.3) the backend's output is a function of
torch.manual_seed (the same seed: the same bits; another seed: other logits); the kept
fraction of the attention weights (output_attentions=True in train mode) is 1 - p within 5
standard deviations; and the logits and gradients (sinks included) match a reference
backend written here in plain torch (gpt-oss's eager formula) that applies the very same
mask, read from the weights of an attn::sdpa call with the same seed (the mask is a function
of the seed and (b, h, i, j) only: docs/CONTRACT.md, "Dropout"). At the op: output and
gradients of op.sdpa with dropout and sinks against torch autograd through the same mask,
bit-identical to attn.scaled_dot_product_attention with the same seed, and opcheck over
dropout and sinks samples; torch.compile(fullgraph=True) of a call with dropout and sinks.

Tolerances: the backend's as test_hf.py (logits 2e-6 * (1 + max |ref|), gradients 5e-5 of
each parameter's own size + 1% of the model's largest); the op's 1e-5 * (1 + max |ref|).
test_planted_* shows each comparison rejecting a reference that drops the sinks or uses
another dropout seed (and, at the op, one that does not rescale by 1 / (1 - p)), the
gpt-oss comparison rejecting a backend that ignores s_aux, and the statistical check
rejecting a kept fraction computed for p / 2.
Skipped, with the reason, where PyTorch or transformers is absent (the op tests need only
PyTorch).
"""
import copy
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the dropout and "
                            "sinks tests of the torch op and transformers backend are skipped")

import attn  # noqa: E402
import attn.integrations.torch_op as op  # noqa: E402
from hf_models import LOGIT_TOL, close, close_grads  # noqa: E402

OP_TOL = 1e-5
P = 0.3


def randn(*shape, seed=0, scale=1.0, grad=True):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return (torch.randn(*shape, generator=g) * scale).requires_grad_(grad)


def reference(q, k, v, logit_mask, scale, sinks, keep, p, weights=False):
    """Plain-torch attention (gpt-oss's eager formula): the sink as an extra logit column
    dropped after the softmax, then the dropout mask keep (bool, broadcast) scaled by
    1 / (1 - p)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    logits = q @ k.transpose(-1, -2) * scale
    if logit_mask is not None:
        logits = logits + logit_mask
    if sinks is not None:
        col = sinks.reshape(1, -1, 1, 1).expand(*logits.shape[:3], 1)
        logits = torch.cat([logits, col], -1)
    probs = torch.softmax(logits, -1)
    if sinks is not None:
        probs = probs[..., :-1]
    if keep is not None:
        probs = probs * keep / (1.0 - p)
    return probs if weights else probs @ v


# ---- the op ---------------------------------------------------------------------------------

def op_inputs():
    q, k, v = randn(2, 4, 9, 16, seed=1), randn(2, 2, 11, 16, seed=2), randn(2, 2, 11, 16, seed=3)
    sinks = randn(4, seed=4, scale=2.0)
    causal = torch.ones(9, 11, dtype=torch.bool).tril()
    return q, k, v, sinks, causal


def test_op_against_torch_with_the_same_mask():
    q, k, v, sinks, causal = op_inputs()
    seed = 12345
    _, w = op.sdpa(q, k, v, causal, enable_gqa=True, dropout_p=P, seed=seed, sinks=sinks,
                   return_weights=True)
    keep = w != 0
    ours = op.sdpa(q, k, v, causal, enable_gqa=True, dropout_p=P, seed=seed, sinks=sinks)
    mask = torch.zeros(9, 11).masked_fill(~causal, float("-inf"))
    ref = reference(q, k, v, mask, 0.25, sinks, keep, P)
    close(ours, ref, OP_TOL, "op output")
    close(w, reference(q, k, v, mask, 0.25, sinks, keep, P, weights=True).detach(), OP_TOL,
          "op weights")
    g = randn(*ref.shape, seed=9, grad=False)
    names = ["q", "k", "v", "sinks"]
    for a, b, n in zip(torch.autograd.grad(ours, (q, k, v, sinks), g, retain_graph=True),
                       torch.autograd.grad(ref, (q, k, v, sinks), g), names):
        close(a, b, OP_TOL, "op d" + n)
    # the same bits as attn.scaled_dot_product_attention with the same seed
    lib = attn.scaled_dot_product_attention(q, k, v, causal, P, enable_gqa=True, seed=seed,
                                            sinks=sinks)
    assert torch.equal(ours, lib)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v, sinks), g),
                    torch.autograd.grad(lib, (q, k, v, sinks), g)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("planted", ["other-seed", "no-sinks", "no-rescale"])
def test_planted_op(planted):
    """The op comparison rejects a reference with another seed's mask, without the sinks,
    or without the 1 / (1 - p) rescaling."""
    q, k, v, sinks, causal = op_inputs()
    seed = 12345 + (planted == "other-seed")
    _, w = op.sdpa(q, k, v, causal, enable_gqa=True, dropout_p=P, seed=seed, sinks=sinks,
                   return_weights=True)
    ours = op.sdpa(q, k, v, causal, enable_gqa=True, dropout_p=P, seed=12345, sinks=sinks)
    mask = torch.zeros(9, 11).masked_fill(~causal, float("-inf"))
    ref = reference(q, k, v, mask, 0.25, None if planted == "no-sinks" else sinks, w != 0,
                    0.0 if planted == "no-rescale" else P)
    with pytest.raises(AssertionError):
        close(ours, ref, OP_TOL, "planted " + planted)


def test_op_seed_from_torch_generator():
    q, k, v, sinks, _ = op_inputs()
    with torch.no_grad():
        torch.manual_seed(3)
        a = op.sdpa(q, k, v, enable_gqa=True, dropout_p=P)
        torch.manual_seed(3)
        b = op.sdpa(q, k, v, enable_gqa=True, dropout_p=P)
        c = op.sdpa(q, k, v, enable_gqa=True, dropout_p=P)
    assert torch.equal(a, b) and not torch.equal(a, c)


def kept_fraction_ok(w, attended, p):
    n = int(attended.sum())
    frac = (w[attended] != 0).double().mean().item()
    sd = math.sqrt(p * (1 - p) / n)
    return abs(frac - (1 - p)) <= 5 * sd, frac, sd


def test_op_kept_fraction():
    q, k, v = (randn(2, 4, 64, 16, seed=s, grad=False) for s in (1, 2, 3))
    _, w = op.sdpa(q, k, v, is_causal=True, dropout_p=P, seed=99, return_weights=True)
    attended = torch.ones(64, 64, dtype=torch.bool).tril().expand_as(w)
    ok, frac, sd = kept_fraction_ok(w, attended, P)
    assert ok, "kept %.4f, expected %.4f +- 5 * %.4f" % (frac, 1 - P, sd)
    assert (w[~attended] == 0).all()


def test_planted_kept_fraction():
    q, k, v = (randn(2, 4, 64, 16, seed=s, grad=False) for s in (1, 2, 3))
    _, w = op.sdpa(q, k, v, is_causal=True, dropout_p=P / 2, seed=99, return_weights=True)
    attended = torch.ones(64, 64, dtype=torch.bool).tril().expand_as(w)
    assert not kept_fraction_ok(w, attended, P)[0]


def op_samples():
    q, k, v, sinks, causal = op_inputs()
    sinks16 = randn(4, seed=5).to(torch.bfloat16).requires_grad_(True)
    # (query, key, value, mask, is_causal, scale, gqa, left, right, softcap, weights,
    #  dropout_p, seed, sinks)
    return {
        "dropout": (q, k, v, None, True, None, True, -1, -1, 0.0, False, P, 7, None),
        "dropout-weights": (q, k, v, causal, False, 0.3, True, -1, -1, 0.0, True, P, -5, None),
        "sinks": (q, k, v, causal, False, None, True, -1, -1, 0.0, True, 0.0, 0, sinks),
        "sinks-bf16": (q, k, v, None, True, None, True, 3, 0, 0.0, False, 0.0, 0, sinks16),
        "dropout-sinks": (q, k, v, None, True, None, True, -1, -1, 2.0, False, P, 1 << 40,
                          sinks),
    }


@pytest.mark.parametrize("name", list(op_samples()))
def test_opcheck(name):
    torch.library.opcheck(torch.ops.attn.sdpa.default, op_samples()[name])


def test_compile_fullgraph_dropout_sinks():
    q, k, v, sinks, _ = op_inputs()

    def f(q, k, v, s):
        return op.sdpa(q * 2.0, k, v, is_causal=True, enable_gqa=True, dropout_p=P, seed=11,
                       sinks=s).sin().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a = compiled(q, k, v, sinks)
    ga = torch.autograd.grad(a, (q, k, v, sinks))
    b = f(q, k, v, sinks)
    gb = torch.autograd.grad(b, (q, k, v, sinks))
    close(a, b, 1e-6, "compiled")
    for x, y in zip(ga, gb):
        close(x, y, 1e-6, "compiled grad")


# ---- the transformers backend -----------------------------------------------------------------

B, L = 3, 21
LENGTHS = [21, 13, 6]  # left padding in rows 1 and 2


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed: the "
                               "backend's dropout and sinks tests are skipped")


def gpt_oss_config(dropout=0.0):
    transformers = _transformers()
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss (GptOssConfig)")
    return transformers.GptOssConfig(
        vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=5, max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"], attention_dropout=dropout,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def build(impl, dropout=0.0, train=False):
    transformers = _transformers()
    cfg = gpt_oss_config(dropout)
    torch.manual_seed(1234)
    model = transformers.GptOssForCausalLM._from_config(copy.deepcopy(cfg),
                                                        attn_implementation=impl)
    assert model.config._attn_implementation == impl
    with torch.no_grad():
        for layer in model.model.layers:  # learned sinks, large enough to matter
            layer.self_attn.sinks.copy_(randn(4, seed=layer.self_attn.layer_idx, scale=2.0,
                                              grad=False))
    return model.train() if train else model.eval()


def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 97, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :L - n] = 0
    return ids, mask


def ref_backend(sinks=True, seed_shift=0):
    """A plain-torch attention function (gpt-oss's eager formula) that applies attn's own
    dropout mask: the seed drawn as the attn backend draws it (the same torch generator
    state under the same torch.manual_seed), the mask read from an attn::sdpa call's
    weights. sinks=False or seed_shift != 0 plant an error."""
    def forward(module, q, k, v, attention_mask, dropout=0.0, scaling=None, **kwargs):
        seed = op.draw_seed() if dropout > 0.0 else 0
        s_aux = kwargs.get("s_aux") if sinks else None
        keep = None
        if dropout > 0.0:
            with torch.no_grad():
                _, _, w = torch.ops.attn.sdpa(q, k, v, attention_mask, False, scaling, True,
                                              -1, -1, 0.0, True, dropout, seed + seed_shift,
                                              s_aux)
            keep = w != 0
        out = reference(q, k, v, attention_mask, scaling, s_aux, keep, dropout)
        return out.transpose(1, 2).contiguous(), None
    return forward


def run(model, ids, mask, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    logits[keep].square().mean().backward()
    grads = {n.replace("_orig_mod.", ""): p.grad for n, p in model.named_parameters()
             if p.grad is not None}  # (a compiled module's names have the prefix)
    return logits.detach(), grads


def with_ref(fn, name="attn_ref_dropout_sinks"):
    transformers = _transformers()
    from transformers.masking_utils import eager_mask
    transformers.AttentionInterface.register(name, fn)
    transformers.AttentionMaskInterface.register(name, eager_mask)
    return name


def unregister(name):
    transformers = _transformers()
    transformers.AttentionInterface._global_mapping.pop(name, None)
    transformers.AttentionMaskInterface._global_mapping.pop(name, None)


def test_gpt_oss_sinks_against_eager():
    import attn.integrations.transformers  # noqa: F401  (registers "attn")
    ids, mask = batch()
    keep = mask.bool()
    ours, ours_g = run(build("attn"), ids, mask)
    ref, ref_g = run(build("eager"), ids, mask)
    assert any("sinks" in n for n in ref_g)
    close(ours[keep], ref[keep], LOGIT_TOL, "gpt-oss logits")
    close_grads(ours_g, ref_g, "gpt-oss")


def compare_train(ref_fn, seed=21):
    import attn.integrations.transformers  # noqa: F401
    ids, mask = batch()
    keep = mask.bool()
    ours, ours_g = run(build("attn", P, train=True), ids, mask, seed)
    name = with_ref(ref_fn)
    try:
        ref, ref_g = run(build(name, P, train=True), ids, mask, seed)
    finally:
        unregister(name)
    close(ours[keep], ref[keep], LOGIT_TOL, "train logits")
    close_grads(ours_g, ref_g, "train")


def test_gpt_oss_dropout_against_reference_with_the_same_mask():
    compare_train(ref_backend())


@pytest.mark.parametrize("planted", ["no-sinks", "other-seed"])
def test_planted_backend(planted):
    fn = ref_backend(sinks=False) if planted == "no-sinks" else ref_backend(seed_shift=1)
    with pytest.raises(AssertionError):
        compare_train(fn)


def test_planted_sinks_eager():
    """Without its sinks the gpt-oss comparison fails: the sinks are large enough to matter."""
    import attn.integrations.transformers as hf
    name = with_ref(lambda m, q, k, v, am, **kw: hf.attention_forward(
        m, q, k, v, am, **{x: y for x, y in kw.items() if x != "s_aux"}),
        "attn_planted_no_sinks")
    try:
        from transformers.masking_utils import sdpa_mask
        _transformers().AttentionMaskInterface.register(name, sdpa_mask)
        ids, mask = batch()
        keep = mask.bool()
        with torch.no_grad():
            ours = build(name)(input_ids=ids, attention_mask=mask).logits
            ref = build("eager")(input_ids=ids, attention_mask=mask).logits
    finally:
        unregister(name)
    with pytest.raises(AssertionError):
        close(ours[keep], ref[keep], LOGIT_TOL, "planted: sinks dropped")


def test_train_mode_reproducible_and_kept_fraction():
    import attn.integrations.transformers  # noqa: F401
    ids, mask = batch()
    model = build("attn", P, train=True)
    with torch.no_grad():
        torch.manual_seed(8)
        a = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        torch.manual_seed(8)
        b = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        torch.manual_seed(9)
        c = model(input_ids=ids, attention_mask=mask)
        model.eval()
        e = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert torch.equal(a.logits, b.logits)
    assert not torch.equal(a.logits, c.logits)
    rows = mask.bool()[:, None, :, None]
    for wa, we in zip(a.attentions, e.attentions):
        attended = (we != 0) & rows
        ok, frac, sd = kept_fraction_ok(wa, attended, P)
        assert ok, "kept %.4f, expected %.4f +- 5 * %.4f" % (frac, 1 - P, sd)
        assert (wa[~attended & rows.expand_as(wa)] == 0).all()


def test_compiled_model_eval():
    """torch.compile(fullgraph=True) of the gpt-oss model (sinks) in eval mode: no graph
    break, the uncompiled values."""
    import attn.integrations.transformers  # noqa: F401
    ids, mask = batch()
    keep = mask.bool()
    model = build("attn")
    with torch.no_grad():
        eager_out = model(input_ids=ids, attention_mask=mask).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        comp_out = compiled(input_ids=ids, attention_mask=mask).logits
    close(comp_out[keep], eager_out[keep], 1e-6, "compiled")


def test_compiled_model_train():
    """In train mode (dropout and sinks) fullgraph compiles too: the seed drawn from torch's
    generator becomes a scalar of the graph (Tensor.item() captured), so the compiled model
    draws a new mask per call, the same one as the uncompiled model under the same
    torch.manual_seed (backend aot_eager runs torch's own randint), with the same
    gradients."""
    import attn.integrations.transformers  # noqa: F401
    ids, mask = batch()
    keep = mask.bool()
    model = build("attn", P, train=True)
    eager_out, eager_g = run(model, ids, mask, 31)
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    comp_out, comp_g = run(compiled, ids, mask, 31)
    close(comp_out[keep], eager_out[keep], 1e-6, "compiled train")
    for name, g in eager_g.items():
        close(comp_g[name], g, 1e-6, "compiled train grad " + name)
    with torch.no_grad():
        again = compiled(input_ids=ids, attention_mask=mask).logits  # a new seed
    assert not torch.equal(again, comp_out)


def test_export_keeps_op_with_sinks():
    """torch.export of the gpt-oss model keeps attn::sdpa (the sinks parameter an input of
    each call) and computes what the model computes."""
    import attn.integrations.transformers  # noqa: F401
    ids, mask = batch()
    model = build("attn")
    ep = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask,
                                         "use_cache": False})
    calls = [n for n in ep.graph.nodes
             if n.op == "call_function" and "attn.sdpa" in str(n.target)]
    assert len(calls) == 2 and all(len(n.args) == 14 and n.args[13] is not None
                                   for n in calls), [n.args for n in calls]
    with torch.no_grad():
        ours = ep.module()(input_ids=ids, attention_mask=mask, use_cache=False).logits
        ref = model(input_ids=ids, attention_mask=mask).logits
    close(ours, ref, 1e-6, "exported")
