"""test_hf_t5.py — a model whose bias is trained: T5's relative position bias through the
Hugging Face backend (attn_implementation="attn"), whose gradient is the library's d_bias
(docs/CONTRACT.md, "The bias's gradient"), and the float mask's gradient through
attn.scaled_dot_product_attention and the torch op.

Checked: a tiny random T5 (encoder-decoder, padded batch) gives eager's logits and every
parameter a gradient — relative_attention_bias.weight included, which reaches the
attention only as the float mask — each within hf_models' close_grads of eager's; the
float mask's gradient of attn.scaled_dot_product_attention and of attn::sdpa against
PyTorch's math SDPA run in float64 on the same inputs (a [1, H, L, S] bias shared by the
batch, and a [B, 1, 1, S] one), within the contract's element rule. A backend that drops
the mask's gradient (the state before d_bias) is rejected by the same checks.
Optional: skipped with the reason where PyTorch or transformers is absent.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the T5 and "
                            "mask-gradient tests are skipped")

import attn  # noqa: E402
import attn.integrations.torch_op as op  # noqa: E402


def _mask_grad_case(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 7, 8, generator=g)
    k = torch.randn(2, 3, 9, 8, generator=g)
    v = torch.randn(2, 3, 9, 8, generator=g)
    m = torch.randn(*shape, generator=g)
    do = torch.randn(2, 3, 7, 8, generator=g)
    return q, k, v, m, do


def _ref_mask_grad(q, k, v, m, do):
    """PyTorch's math SDPA in float64: the float mask's gradient."""
    q, k, v, m, do = (x.double() for x in (q, k, v, m, do))
    m = m.clone().requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    (out * do).sum().backward()
    return m.grad


def _within(got, ref):
    """The contract's float32 element rule, max |got - ref| <= 1e-5 (1 + max |ref|): the
    mask gradients here are sums of at most B x H x L logits' gradients of size 1e-1."""
    return (got.double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item())


@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 1, 1, 9), (7, 9)])
@pytest.mark.parametrize("via", ["sdpa", "op"])
def test_float_mask_gradient(shape, via):
    q, k, v, m, do = _mask_grad_case(shape)
    ref = _ref_mask_grad(q, k, v, m, do)
    mm = m.clone().requires_grad_(True)
    if via == "sdpa":
        out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mm)
    else:
        out = op.sdpa(q, k, v, attn_mask=mm)
    (out * do).sum().backward()
    assert mm.grad is not None and mm.grad.shape == m.shape
    assert _within(mm.grad, ref), (mm.grad.double() - ref).abs().max().item()
    # planted: no gradient (zeros), or the batch's sum forgotten, is rejected
    assert not _within(torch.zeros_like(mm.grad), ref)


def test_bfloat16_mask_gradient():
    """A 16-bit mask (a bfloat16 model's position bias) gets its gradient in its dtype."""
    q, k, v, m, do = _mask_grad_case((1, 3, 7, 9), seed=3)
    mm = m.to(torch.bfloat16).requires_grad_(True)
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mm)
    (out * do).sum().backward()
    assert mm.grad is not None and mm.grad.dtype == torch.bfloat16
    ref = _ref_mask_grad(q, k, v, mm.detach().float(), do)
    # rounded once to bfloat16: half an ulp (2^-9 relative) on top of the float32 rule
    err = (mm.grad.double() - ref).abs()
    assert (err <= 2.0 ** -8 * ref.abs() + 1e-5 * (1 + ref.abs().max())).all()


transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                   "the T5 test is skipped")

import attn.integrations.transformers as hf  # noqa: E402,F401  (registers "attn")
from hf_models import LOGIT_TOL, close, close_grads  # noqa: E402


def _t5(impl):
    cfg = transformers.T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, decoder_start_token_id=0)
    torch.manual_seed(99)
    model = transformers.T5ForConditionalGeneration._from_config(copy.deepcopy(cfg),
                                                                  attn_implementation=impl)
    model.train()
    return model


def _step(model):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 97, (2, 11), generator=g)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 7:] = 0
    labels = torch.randint(1, 97, (2, 6), generator=g)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


def test_t5_position_bias_is_trained():
    eager = _t5("eager")
    ours = _t5("attn")
    ours.load_state_dict(eager.state_dict())
    ref_logits, ref_grads = _step(eager)
    logits, grads = _step(ours)
    close(logits, ref_logits, LOGIT_TOL, "T5 logits")
    names = {n for n, p in eager.named_parameters() if p.requires_grad}
    assert set(ref_grads) == names
    missing = sorted(names - set(grads))
    assert not missing, "parameters without a gradient: %s" % missing
    bias = [n for n in names if "relative_attention_bias" in n]
    assert bias and all(grads[n].abs().max() > 0 for n in bias)
    close_grads(grads, ref_grads, "T5")
    # planted: the position bias frozen (no gradient: the state before d_bias) is rejected
    frozen = dict(grads)
    for n in bias:
        frozen[n] = torch.zeros_like(grads[n])
    with pytest.raises(AssertionError):
        close_grads(frozen, ref_grads, "T5 frozen bias")
