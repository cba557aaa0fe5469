"""test_hf_packed.py — packed sequences through the transformers backend
(attn.integrations.transformers, attn.integrations._packing): batch 1 holding several
documents with position_ids restarting at 0 (DataCollatorWithFlattening's layout), or with
explicit cu_seq_lens_q/k and max_length_q/k, runs as one attn.varlen_attention call
without a mask.

Checked: _packing recognises exactly such calls (position ids that restart at 0 and
count up by one; a mask that is None or the block-diagonal one; not a padded batch, a KV
cache step, 3-D position ids or an unrelated mask); a tiny Llama / Mistral (sliding window
shorter than a document) / Qwen2 (GQA) on a packed row gives, document by document, the
logits of the same model on "eager" run on each document alone (LOGIT_TOL), through the
varlen call (counted), and every parameter's gradient of a loss on them (close_grads);
a padded batch does not take the varlen path. Skipped, with the reason, where PyTorch or
transformers is absent.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the transformers "
                            "packed-sequence tests are skipped")

from attn.integrations import _packing  # noqa: E402  (imports torch only)


def positions(lens):
    return torch.cat([torch.arange(n) for n in lens])[None]


def block_mask(lens, causal):
    seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    keep = seq[:, None] == seq[None, :]
    if causal:
        keep &= torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
    return keep[None, None]


def test_recognises_packing():
    lens = [5, 9, 3]
    L = sum(lens)
    q = torch.zeros(1, 4, L, 8)
    k = torch.zeros(1, 2, L, 8)
    kw = {"position_ids": positions(lens)}
    got = _packing.packed_sequences(q, k, None, True, -1, kw)
    assert got is not None and got[0].tolist() == [0, 5, 14, 17] and got[2] == got[3] == 9
    assert _packing.packed_sequences(q, k, block_mask(lens, True), True, -1, kw) is not None
    assert _packing.packed_sequences(q, k, block_mask(lens, False), False, -1, kw) is not None
    # the plain causal mask over the whole row (what a builder unaware of the packing
    # makes) is read as the packing too; refused: a full mask under a causal layer, one
    # key dropped, a padded batch, a single sequence, positions not from 0, a jump, 3-D
    # ids, a KV-cache step
    whole = torch.ones(1, 1, L, L, dtype=torch.bool).tril()
    assert _packing.packed_sequences(q, k, whole, True, -1, kw) is not None
    assert _packing.packed_sequences(q, k, torch.ones(1, 1, L, L, dtype=torch.bool), True, -1,
                                     kw) is None
    holed = whole.clone()
    holed[0, 0, 9, 6] = False
    assert _packing.packed_sequences(q, k, holed, True, -1, kw) is None
    assert _packing.packed_sequences(q, k, block_mask(lens, False), True, -1, kw) is None
    assert _packing.packed_sequences(q.expand(2, -1, -1, -1), k, None, True, -1, kw) is None
    assert _packing.packed_sequences(q, k, None, True, -1,
                                     {"position_ids": torch.arange(L)[None]}) is None
    assert _packing.packed_sequences(q, k, None, True, -1,
                                     {"position_ids": positions(lens) + 1}) is None
    jump = positions(lens).clone()
    jump[0, 3] = 7
    assert _packing.packed_sequences(q, k, None, True, -1, {"position_ids": jump}) is None
    assert _packing.packed_sequences(q, k, None, True, -1,
                                     {"position_ids": positions(lens)[None]}) is None
    assert _packing.packed_sequences(q[:, :, :1], k, None, True, -1, kw) is None
    # explicit keywords
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    got = _packing.packed_sequences(q, k, None, True, -1, dict(
        cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9))
    assert got is not None and got[0] is not None and got[2] == 9
    # a sliding window: the mask must carry it
    win = block_mask(lens, True) & (torch.arange(L)[None, :] >= torch.arange(L)[:, None] - 3)
    assert _packing.packed_sequences(q, k, win, True, 3, kw) is not None
    assert _packing.packed_sequences(q, k, win, True, -1, kw) is None


def test_mask_checked_again_after_a_change():
    lens = [4, 4]
    q = torch.zeros(1, 2, 8, 8)
    kw = {"position_ids": positions(lens)}
    m = block_mask(lens, True).clone()
    assert _packing.packed_sequences(q, q, m, True, -1, kw) is not None
    m[0, 0, 5, 1] = True  # in place: a key of another document
    assert _packing.packed_sequences(q, q, m, True, -1, kw) is None


# ---- models -------------------------------------------------------------------------------------

LENS = [5, 11, 1, 8]


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed: the "
                               "packed-sequence model tests are skipped")


def configs(transformers):
    dec = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64, num_key_value_heads=4,
               head_dim=16)
    return {
        "llama": (transformers.LlamaConfig(**dec), transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig(**dec, sliding_window=4),
                    transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config(**dict(dec, num_key_value_heads=2)),
                  transformers.Qwen2ForCausalLM),
    }


def build(transformers, arch, impl):
    import attn.integrations.transformers  # noqa: F401,PLC0415  (registers "attn")
    cfg, cls = configs(transformers)[arch]
    torch.manual_seed(1234)
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl)
    return model.eval()


class _Spy:
    """Counts the varlen calls the backend makes."""

    def __init__(self, monkeypatch):
        import attn.integrations.transformers as hf  # noqa: PLC0415
        self.calls = 0
        real = hf.varlen_attention

        def spy(*a, **kw):
            self.calls += 1
            return real(*a, **kw)
        monkeypatch.setattr(hf, "varlen_attention", spy)


def _ids():
    g = torch.Generator().manual_seed(5)
    return torch.randint(1, 97, (1, sum(LENS)), generator=g)


def _per_document(model, ids):
    outs, start = [], 0
    for n in LENS:
        outs.append(model(input_ids=ids[:, start:start + n]).logits[0])
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("how", ["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_packed_logits_and_gradients(monkeypatch, arch, how):
    transformers = _transformers()
    from hf_models import LOGIT_TOL, close, close_grads  # noqa: PLC0415
    ids = _ids()
    kw = {"position_ids": positions(LENS)}
    if how == "cu_seq_lens":
        cu = torch.tensor([sum(LENS[:i]) for i in range(len(LENS) + 1)], dtype=torch.int32)
        kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENS),
                  max_length_k=max(LENS))
    spy = _Spy(monkeypatch)
    grads, logits = {}, {}
    # the reference: eager on each document alone, what transformers' flash-attention
    # path computes for a packed row (its documents apart). attn runs the row as varlen
    # whether transformers' mask is the documents' block-diagonal one, none, or (its
    # sliding-window layers) the row's plain causal mask
    for impl in ("attn", "eager"):
        model = build(transformers, arch, impl)
        out = model(input_ids=ids, **kw).logits[0] if impl == "attn" else _per_document(
            model, ids)
        out.square().mean().backward()
        logits[impl] = out.detach()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert spy.calls == 2, "the packed row did not run as varlen (%d calls)" % spy.calls
    close(logits["attn"], logits["eager"], LOGIT_TOL, "%s packed vs eager per document" % arch)
    close_grads(grads["attn"], grads["eager"], arch)


def test_padded_batch_is_not_packed(monkeypatch):
    transformers = _transformers()
    spy = _Spy(monkeypatch)
    model = build(transformers, "llama", "attn")
    ids = torch.randint(1, 97, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids[:1])  # one sequence: positions 0..6, not packed
    assert spy.calls == 0
