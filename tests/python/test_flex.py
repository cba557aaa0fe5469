"""test_flex.py — FlexAttention-shaped calls (python/attn/_flex.py): attn.create_block_mask
and attn.flex_attention, pure Python over attn.scaled_dot_product_attention.

Checked (NumPy, always): mask_mods (8 documents, a sliding window + global tokens,
prefix-LM, causal) and score_mods (a relative-position bias table indexed by q - kv,
ALiBi), alone and together: the output and LSE against oracle.reference on the dense
mask / bias (tolerance_failure), and bit for bit against attn.scaled_dot_product_attention
given the same dense mask / bias; each block's classification against the dense mask
(empty iff no True inside, full iff all True); the refusals (a mask_mod that does not
broadcast or is not bool, bad sizes, a block mask of the wrong shape, a non-additive
score_mod). A mask_mod off by one is rejected by the same checks.

PyTorch (skipped without it): the same masks and score_mods against torch's own
flex_attention run eagerly on the CPU in float64; a learned relative bias table
(nn.Parameter) read by score_mod gets the gradient PyTorch's math SDPA gives in float64 for
the bias built from the table (the contract's element rule); a zeroed gradient is rejected.
"""
import warnings

import numpy as np
import pytest

import attn
from oracle import reference, tolerance_failure

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed: the "
                                 "comparison with torch's flex_attention is skipped")

B, H, L, D = 2, 4, 256, 32
DOCS = 8
WINDOW, GLOBAL, PREFIX = 32, 8, 48


def _doc_ids(L=L, n=DOCS, seed=1):
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, L), n - 1, replace=False))
    return np.searchsorted(cuts, np.arange(L), side="right").astype(np.int64)


DOC = _doc_ids()


def causal(b, h, q, kv):
    return q >= kv


def document(b, h, q, kv):
    return DOC[q] == DOC[kv]


def sliding_global(b, h, q, kv):
    return (abs(q - kv) <= WINDOW) | (q < GLOBAL) | (kv < GLOBAL)


def prefix_lm(b, h, q, kv):
    return (kv < PREFIX) | (q >= kv)


def causal_doc(b, h, q, kv):
    return (DOC[q] == DOC[kv]) & (q >= kv)


MASKS = {"causal": causal, "document": document, "sliding_global": sliding_global,
         "prefix_lm": prefix_lm, "causal_document": causal_doc}

_rng = np.random.default_rng(7)
TABLE = (_rng.standard_normal(2 * L - 1) * 0.5).astype(np.float32)   # bias[q - kv + L - 1]
SLOPES = np.array([2.0 ** (-8 * (i + 1) / H) for i in range(H)])


def rel_bias(s, b, h, q, kv):
    return s + TABLE[q - kv + L - 1]


def alibi(s, b, h, q, kv):
    return s - SLOPES[h] * abs(q - kv)


def rel_bias_dense():
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    return TABLE[i - j + L - 1].astype(np.float64)[None, None]


def alibi_dense():
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    return -SLOPES[None, :, None, None] * np.abs(i - j)[None, None].astype(np.float64)


SCORES = {"rel_bias": (rel_bias, rel_bias_dense), "alibi": (alibi, alibi_dense)}


def _dense(fn, b=1, h=1, Lq=L, Lk=L):
    """The mask independently of the vectorized path: fn on scalar indices, one by one."""
    out = np.zeros((b, h, Lq, Lk), bool)
    for bb in range(b):
        for hh in range(h):
            for ii in range(Lq):
                out[bb, hh, ii] = [bool(fn(bb, hh, ii, jj)) for jj in range(Lk)]
    return out


_DENSE_CACHE = {}


def dense_of(name):
    if name not in _DENSE_CACHE:
        _DENSE_CACHE[name] = _dense(MASKS[name])
    return _DENSE_CACHE[name]


def _qkv(seed=0, B=B, H=H, L=L, D=D):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, L, D)).astype(np.float32) for _ in range(3))


# ---- block masks --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("block", [128, 32, (16, 48)])
def test_block_mask_dense_and_blocks(name, block):
    bm = attn.create_block_mask(MASKS[name], None, None, L, L, BLOCK_SIZE=block)
    ref = dense_of(name)
    assert bm.mask.shape == (1, 1, L, L) and bm.mask.dtype == np.bool_
    assert np.array_equal(bm.mask, ref)
    assert bm.shape == (1, 1, L, L)
    qb, kb = block if isinstance(block, tuple) else (block, block)
    nq, nk = -(-L // qb), -(-L // kb)
    assert bm.block_kind.shape == (1, 1, nq, nk)
    for i in range(nq):
        for j in range(nk):
            tile = ref[0, 0, i * qb:(i + 1) * qb, j * kb:(j + 1) * kb]
            want = (attn.BlockMask.EMPTY if not tile.any() else
                    attn.BlockMask.FULL if tile.all() else attn.BlockMask.PARTIAL)
            assert bm.block_kind[0, 0, i, j] == want, (i, j)
    counts = bm.block_counts()
    assert sum(counts.values()) == nq * nk
    assert bm.sparsity() == pytest.approx(100.0 * counts["empty"] / (nq * nk))
    assert np.array_equal(bm.to_dense(), (bm.block_kind != 0).astype(np.int32))
    r = repr(bm)
    assert "empty %d" % counts["empty"] in r and "full %d" % counts["full"] in r


def test_block_mask_document_is_sparse():
    bm = attn.create_block_mask(document, None, None, L, L, BLOCK_SIZE=16)
    assert bm.sparsity() > 50.0
    assert bm.block_counts()["full"] > 0


def test_block_mask_library_blocks():
    """The library's block mask: 8 documents of 64-aligned lengths have no partial block;
    its counts add up; it is far smaller than the dense mask."""
    n = 1024
    bm = attn.create_block_mask(lambda b, h, q, kv: q // 128 == kv // 128, None, None, n, n)
    info = bm.library_blocks()
    assert (info["B"], info["H"], info["Lq"], info["Lk"]) == (1, 1, n, n)
    assert (info["block_rows"], info["block_keys"]) == (64, 16)
    assert info["partial"] == 0 and info["full"] == 8 * 2 * 8
    assert info["empty"] + info["full"] + info["partial"] == (n // 64) * (n // 16)
    assert info["bytes"] < n * n // 4
    # partial blocks where the boundaries cut them
    bm = attn.create_block_mask(document, None, None, L, L)
    assert bm.library_blocks()["partial"] > 0


def test_block_mask_is_the_dense_mask_bit_for_bit_with_gradients():
    """flex_attention with a block mask (the library's options.block_mask) against
    scaled_dot_product_attention with its dense mask: O, LSE and, under torch autograd,
    every gradient the same bits."""
    q, k, v = _qkv(11)
    bm = attn.create_block_mask(sliding_global, None, None, L, L)
    out, lse = attn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    want, want_lse = attn.scaled_dot_product_attention(q, k, v, attn_mask=bm.mask,
                                                       return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    torch = pytest.importorskip("torch")
    ins = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    flex = attn.flex_attention(*ins, block_mask=bm)
    flex.square().sum().backward()
    got = [x.grad.clone() for x in ins]
    for x in ins:
        x.grad = None
    dense = attn.scaled_dot_product_attention(*ins, attn_mask=torch.from_numpy(bm.mask.copy()))
    dense.square().sum().backward()
    assert torch.equal(flex, dense)
    for a, x in zip(got, ins):
        assert torch.equal(a, x.grad)


def test_block_mask_batch_and_heads():
    """b and h index arrays: a per-(batch, head) mask."""
    def mod(b, h, q, kv):
        return (q - kv) <= (b * H + h)   # a causal band whose offset depends on b and h
    bm = attn.create_block_mask(mod, B, H, 64, 48, BLOCK_SIZE=16)
    assert bm.mask.shape == (B, H, 64, 48) and bm.shape == (B, H, 64, 48)
    assert np.array_equal(bm.mask, _dense(mod, B, H, 64, 48))
    assert bm.block_kind.shape == (B, H, 4, 3)


def test_block_mask_clipped_edge_blocks():
    """Lengths not multiples of the block: the last blocks are clipped, and a clipped
    all-True block is full."""
    bm = attn.create_block_mask(lambda b, h, q, kv: kv < 1000, None, None, 100, 70,
                                BLOCK_SIZE=32)
    assert bm.block_kind.shape == (1, 1, 4, 3)
    assert (bm.block_kind == attn.BlockMask.FULL).all()


@pytest.mark.parametrize("bad, err", [
    (lambda b, h, q, kv: q - kv, "bool"),
    (lambda b, h, q, kv: np.ones(3, bool), "broadcast"),
    (lambda b, h, q, kv: (q >= kv).astype(np.float32), "bool"),
])
def test_block_mask_refuses_bad_mask_mod(bad, err):
    with pytest.raises(ValueError, match=err):
        attn.create_block_mask(bad, None, None, 16, 16)


@pytest.mark.parametrize("kw", [dict(Q_LEN=0), dict(KV_LEN=-1), dict(B=0), dict(H=-2),
                                dict(BLOCK_SIZE=0), dict(BLOCK_SIZE=(8, 0)), dict(Q_LEN=2.5),
                                dict(B=True)])
def test_block_mask_refuses_bad_sizes(kw):
    args = dict(B=None, H=None, Q_LEN=16, KV_LEN=16, BLOCK_SIZE=8)
    args.update(kw)
    with pytest.raises(ValueError):
        attn.create_block_mask(causal, **args)


# ---- flex_attention against the oracle and against the dense call -----------------------

def _check(got, got_lse, q, k, v, dense_mask, dense_bias, scale=None):
    """got against oracle.reference and bit for bit against the dense call."""
    if dense_bias is None:
        m = dense_mask
    else:
        m = dense_bias if dense_mask is None else np.where(dense_mask, dense_bias, -np.inf)
        m = m.astype(np.float32)
    ref, ref_lse, _ = reference(q, k, v, mask=m, scale=scale)
    why = tolerance_failure(got, ref)
    assert why is None, why
    why = tolerance_failure(got_lse, ref_lse)
    assert why is None, "LSE: " + why
    want, want_lse = attn.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale,
                                                       return_lse=True)
    assert np.array_equal(got, want) and np.array_equal(got_lse, want_lse)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_flex_mask_mod(name):
    q, k, v = _qkv(1)
    bm = attn.create_block_mask(MASKS[name], None, None, L, L, BLOCK_SIZE=32)
    out, lse = attn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert out.shape == q.shape and lse.shape == (B, H, L)
    _check(out, lse, q, k, v, dense_of(name), None)
    # reused: the same bits a second time
    again = attn.flex_attention(q, k, v, block_mask=bm)
    assert np.array_equal(again, out)


@pytest.mark.parametrize("score", sorted(SCORES))
def test_flex_score_mod(score):
    q, k, v = _qkv(2)
    mod, dense = SCORES[score]
    out, lse = attn.flex_attention(q, k, v, score_mod=mod, return_lse=True, scale=0.3)
    _check(out, lse, q, k, v, None, dense(), scale=0.3)


@pytest.mark.parametrize("score", sorted(SCORES))
@pytest.mark.parametrize("name", ["document", "sliding_global", "prefix_lm"])
def test_flex_score_and_mask(score, name):
    q, k, v = _qkv(3)
    mod, dense = SCORES[score]
    bm = attn.create_block_mask(MASKS[name], None, None, L, L)
    out, lse = attn.flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=True)
    _check(out, lse, q, k, v, dense_of(name), dense())


def test_flex_plain_and_gqa():
    q, k, v = _qkv(4)
    out = attn.flex_attention(q, k, v)
    ref, _, _ = reference(q, k, v)
    assert tolerance_failure(out, ref) is None
    kv = _qkv(5, H=2)
    bm = attn.create_block_mask(causal, 1, H, L, L)
    out = attn.flex_attention(q, kv[0], kv[1], block_mask=bm, enable_gqa=True)
    ref, _, _ = reference(q, kv[0], kv[1], causal=True, gqa=True)
    assert tolerance_failure(out, ref) is None


def test_flex_planted_off_by_one_is_rejected():
    q, k, v = _qkv(6)
    bm = attn.create_block_mask(lambda b, h, q, kv: q >= kv + 1, None, None, L, L)
    out = attn.flex_attention(q, k, v, block_mask=bm)
    ref, _, _ = reference(q, k, v, mask=dense_of("causal"))
    assert tolerance_failure(out, ref) is not None


def test_flex_refusals():
    q, k, v = _qkv(0, L=64)
    bm = attn.create_block_mask(causal, None, None, 32, 64)
    with pytest.raises(ValueError, match="does not fit"):
        attn.flex_attention(q, k, v, block_mask=bm)
    bm = attn.create_block_mask(causal, 3, None, 64, 64)
    with pytest.raises(ValueError, match="does not fit"):
        attn.flex_attention(q, k, v, block_mask=bm)
    with pytest.raises(ValueError, match="BlockMask"):
        attn.flex_attention(q, k, v, block_mask=np.ones((64, 64), bool))
    with pytest.raises(NotImplementedError, match="not additive"):
        attn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 30.0 * np.tanh(s / 30.0))
    with pytest.raises(NotImplementedError, match="not additive"):
        attn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * s + s + (i - j))
    with pytest.raises(NotImplementedError, match="not additive"):
        attn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 2 * s)
    with pytest.raises(ValueError, match="floats"):
        attn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: (i - j))
    with pytest.raises(ValueError, match="broadcast"):
        attn.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + np.ones(5))


def test_flex_score_mod_neg_inf_is_a_mask():
    """A score_mod that writes -inf masks those scores (additive at every probe)."""
    q, k, v = _qkv(8, L=64)
    out = attn.flex_attention(q, k, v,
                              score_mod=lambda s, b, h, i, j: s + np.where(i >= j, 0.0, -np.inf))
    ref, _, _ = reference(q, k, v, causal=True)
    assert tolerance_failure(out, ref) is None


# ---- PyTorch: torch's own flex_attention, and the bias table's gradient --------------------

def _torch_flex():
    from torch.nn.attention import flex_attention as fa
    return fa


def _torch_flex_run(q, k, v, score_mod=None, mask_mod=None):
    """torch's flex_attention, eagerly on the CPU in float64: (out, lse)."""
    fa = _torch_flex()
    bm = None
    if mask_mod is not None:
        bm = fa.create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "called without torch.compile", return_lse's deprecation
        return fa.flex_attention(q.double(), k.double(), v.double(), score_mod=score_mod,
                                 block_mask=bm, return_lse=True)



def _torch_mods():
    doc = torch.from_numpy(DOC)
    table = torch.from_numpy(TABLE)
    slopes = torch.from_numpy(SLOPES)
    masks = {"causal": causal,
             "document": lambda b, h, q, kv: doc[q] == doc[kv],
             "sliding_global": sliding_global, "prefix_lm": prefix_lm}
    scores = {None: None,
              "rel_bias": lambda s, b, h, q, kv: s + table[q - kv + L - 1],
              "alibi": lambda s, b, h, q, kv: s - slopes[h] * (q - kv).abs()}
    return masks, scores


@needs_torch
@pytest.mark.parametrize("score", [None, "rel_bias", "alibi"])
@pytest.mark.parametrize("name", [None, "causal", "document", "sliding_global", "prefix_lm"])
def test_torch_flex_matches_torch(name, score):
    masks, scores = _torch_mods()
    q, k, v = (torch.from_numpy(x) for x in _qkv(9))
    mask_mod, score_mod = masks.get(name), scores[score]
    try:
        ref, ref_lse = _torch_flex_run(q, k, v, score_mod, mask_mod)
    except Exception as e:   # pragma: no cover - where torch refuses eager CPU flex
        pytest.skip("torch's flex_attention does not run eagerly on the CPU here: %s" % e)
    bm = None if mask_mod is None else attn.create_block_mask(mask_mod, None, None, L, L)
    out, lse = attn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                   return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    why = tolerance_failure(out.numpy(), ref.numpy())
    assert why is None, why
    why = tolerance_failure(lse.numpy(), ref_lse.numpy())   # natural log, as torch's
    assert why is None, "LSE: " + why
    if name is not None:   # the mask_mod written for torch gives the same dense mask
        assert np.array_equal(bm.mask, dense_of(name))


@needs_torch
def test_torch_flex_planted_off_by_one_is_rejected():
    q, k, v = (torch.from_numpy(x) for x in _qkv(10))
    ref, _ = _torch_flex_run(q, k, v, mask_mod=causal)
    bm = attn.create_block_mask(lambda b, h, q, kv: q > kv, None, None, L, L)
    out = attn.flex_attention(q, k, v, block_mask=bm)
    assert tolerance_failure(out.numpy(), ref.numpy()) is not None


@needs_torch
def test_torch_mask_mod_with_torch_ops():
    """A mask_mod that only works on torch tensors (torch.where) falls back to them."""
    bm = attn.create_block_mask(lambda b, h, q, kv: torch.where(q >= kv, True, False),
                                None, None, 64, 64)
    assert np.array_equal(bm.mask[0, 0], np.tril(np.ones((64, 64), bool)))
    q, k, v = (torch.from_numpy(x) for x in _qkv(11, L=64))
    m1 = bm.dense_mask(q)
    assert isinstance(m1, torch.Tensor) and m1 is bm.dense_mask(q)   # cached


def _within(got, ref):
    """The contract's float32 element rule, max |got - ref| <= 1e-5 (1 + max |ref|): the
    table's gradient entries are sums of at most B x H x L logits' gradients."""
    return (got.double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item())


@needs_torch
@pytest.mark.parametrize("q_grad", [True, False])
@pytest.mark.parametrize("name", [None, "causal", "sliding_global"])
def test_torch_bias_table_gradient(name, q_grad):
    """A learned relative bias (nn.Parameter) read by score_mod gets its gradient through
    the library's d_bias, equal to the one PyTorch's math SDPA gives in float64."""
    Lq = 96
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 3, Lq, 16, generator=g) for _ in range(4))
    table = torch.nn.Parameter(torch.randn(2 * Lq - 1, generator=g) * 0.5)
    masks, _ = _torch_mods()
    mask_mod = masks.get(name)
    bm = None if mask_mod is None else attn.create_block_mask(mask_mod, None, None, Lq, Lq)
    qq = q.clone().requires_grad_(q_grad)   # False: only the table requires grad
    out = attn.flex_attention(qq, k, v, block_mask=bm,
                              score_mod=lambda s, b, h, i, j: s + table[i - j + Lq - 1])
    (out * do).sum().backward()
    assert table.grad is not None and (qq.grad is not None) == q_grad
    # the reference: math SDPA in float64 on the bias built from the table
    t64 = table.detach().double().requires_grad_(True)
    idx = torch.arange(Lq)[:, None] - torch.arange(Lq)[None, :] + Lq - 1
    bias = t64[idx]
    if bm is not None:
        bias = bias.masked_fill(~bm.dense_mask(q)[0, 0], float("-inf"))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=bias)
    (ref * do.double()).sum().backward()
    assert _within(table.grad, t64.grad), (table.grad.double() - t64.grad).abs().max().item()
    why = tolerance_failure(out.detach().numpy(), ref.detach().numpy())
    assert why is None, why
    # planted: a zeroed gradient is rejected by the same rule
    assert not _within(torch.zeros_like(table.grad), t64.grad)
