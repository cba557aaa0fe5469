"""test_hf_padding.py — the transformers backend's inference path: without a gradient and
outside torch.compile / torch.export a layer calls the library directly
(torch_op.forward_no_grad) and a right-padding bool mask is passed as key lengths
(attn.integrations._padding.padding_lengths, read once per mask tensor).

Checked: padding_lengths recognises exactly the right-padding masks (lengths equal to the
mask's own counts; None for left padding, a causal mask, one flipped key, a float mask,
per-head masks), reads a mask again after an in-place change (its version counter) and
for another tensor, and reads inference tensors at every call; the direct path is taken in
no_grad and inference mode and not where a gradient is wanted or under a function mode;
its output (key lengths, no mask) agrees with the op's (the mask) on a padded BERT batch
within LOGIT_TOL (max |a - b| <= 2e-6 (1 + max |b|); measured 0), and test_planted shows
that check failing for key lengths one short. Skipped, with the reason, where PyTorch or
transformers is absent.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the transformers "
                            "backend tests are skipped")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                   "the transformers backend tests are skipped")

import attn.integrations.transformers as hf  # noqa: E402  (registers "attn")
from attn.integrations import _padding, torch_op  # noqa: E402
from hf_models import LOGIT_TOL, close  # noqa: E402

LENS = [9, 4, 0, 7]  # one batch with no key at all
L = 9


def padding_mask(lens, q=L, s=L):
    keep = torch.arange(s)[None, :] < torch.tensor(lens)[:, None]
    return keep[:, None, None, :].expand(len(lens), 1, q, s).contiguous()


def test_recognises_right_padding():
    got = _padding.padding_lengths(padding_mask(LENS), len(LENS), L)
    assert got is not None and got.dtype == torch.int64 and got.tolist() == LENS
    # a (B, 1, 1, S) mask, and a batch of one broadcast to four
    assert _padding.padding_lengths(padding_mask(LENS, q=1), 4, L).tolist() == LENS
    assert _padding.padding_lengths(padding_mask([5], q=L), 4, L).tolist() == [5] * 4


def test_refuses_other_masks():
    right = padding_mask(LENS)
    left = right.flip(-1)
    causal = right & torch.ones(L, L, dtype=torch.bool).tril()
    flipped = right.clone()
    flipped[1, 0, 3, 2] = False  # one key of one query row
    heads = right.expand(4, 2, L, L)
    for name, m in [("left", left), ("causal", causal), ("flipped", flipped),
                    ("float", right.float()), ("heads", heads)]:
        assert _padding.padding_lengths(m, len(LENS), L) is None, name
    assert _padding.padding_lengths(right, len(LENS), L + 1) is None  # keys do not match
    assert _padding.padding_lengths(None, 4, L) is None


def test_reads_again_after_a_change():
    m = padding_mask(LENS)
    assert _padding.padding_lengths(m, 4, L).tolist() == LENS
    m[0, 0, :, 8] = False  # in place: batch 0 now keeps 8 keys
    assert _padding.padding_lengths(m, 4, L).tolist() == [8, 4, 0, 7]
    m[1, 0, 2, 0] = False  # one row differs: no longer a padding mask
    assert _padding.padding_lengths(m, 4, L) is None
    other = padding_mask([1, 2, 3, 4])
    assert _padding.padding_lengths(other, 4, L).tolist() == [1, 2, 3, 4]
    with torch.inference_mode():
        inf = padding_mask(LENS)
        assert _padding.padding_lengths(inf, 4, L).tolist() == LENS
        inf[3, 0, :, 6] = False  # no version counter: read at every call
        assert _padding.padding_lengths(inf, 4, L).tolist() == [9, 4, 0, 6]


class _Module(torch.nn.Module):
    is_causal = False


def qkv(requires_grad=False):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, L, 2, 8, generator=g).transpose(1, 2).requires_grad_(requires_grad)
            for _ in range(3)]


def _count_direct(monkeypatch):
    calls = []
    real = torch_op.forward_no_grad

    def spy(*a, **kw):
        calls.append(kw.get("kv_len"))
        return real(*a, **kw)
    monkeypatch.setattr(torch_op, "forward_no_grad", spy)
    return calls


def test_direct_path_taken_only_without_gradient(monkeypatch):
    calls = _count_direct(monkeypatch)
    mask = padding_mask(LENS)
    q, k, v = qkv(requires_grad=True)
    out, _ = hf.attention_forward(_Module(), q, k, v, mask)  # wants a gradient: the op
    assert not calls and out.requires_grad
    out.sum().backward()
    assert q.grad is not None
    with torch.no_grad():
        direct, _ = hf.attention_forward(_Module(), q, k, v, mask)
    assert len(calls) == 1 and calls[0].tolist() == LENS
    with torch.inference_mode():
        hf.attention_forward(_Module(), q, k, v, mask)
    assert len(calls) == 2
    with torch.no_grad(), torch.device("cpu"):  # a function mode: the op
        hf.attention_forward(_Module(), q, k, v, mask)
    assert len(calls) == 2
    close(direct, out.detach(), LOGIT_TOL, "direct vs op")


def test_direct_matches_op_on_a_padded_bert():
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(1234)
    model = transformers.BertModel._from_config(copy.deepcopy(cfg),
                                                attn_implementation="attn").eval()
    ids = torch.randint(1, 97, (4, L), generator=torch.Generator().manual_seed(5))
    am = (torch.arange(L)[None, :] < torch.tensor([9, 4, 1, 7])[:, None]).long()
    keep = am.bool()
    with torch.no_grad():
        direct = model(input_ids=ids, attention_mask=am).last_hidden_state
    through_op = model(input_ids=ids, attention_mask=am).last_hidden_state.detach()
    close(direct[keep], through_op[keep], LOGIT_TOL, "direct (kv_len) vs op (mask)")


def test_planted():
    """The comparison rejects key lengths one short of the mask's."""
    mask = padding_mask([9, 4, 2, 7])
    q, k, v = qkv()
    with torch.no_grad():
        ref, _ = hf.attention_forward(_Module(), q, k, v, mask)
        bad, _ = torch_op.forward_no_grad(q, k, v, None, False, None, False, -1, -1, 0.0,
                                          False, kv_len=torch.tensor([8, 3, 1, 6]))
    with pytest.raises(AssertionError):
        close(bad.transpose(1, 2), ref, LOGIT_TOL, "planted")
