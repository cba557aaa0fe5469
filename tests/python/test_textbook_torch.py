"""test_textbook_torch.py — seed 003 §4/§5 replayed with PyTorch (scripts/textbook_torch.py):
attn's causal weights and output on the seed's own input (torch.manual_seed(0)) against
PyTorch's hand-written softmax and F.scaled_dot_product_attention. Skipped with the
reason where PyTorch is not installed (CI has none)."""
import os
import sys

import numpy as np
import pytest

import attn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import textbook_torch  # noqa: E402


def test_seed003_against_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional)")
    Q, K, V, w, manual, fast = textbook_torch.seed003(torch)
    o, aw = attn.scaled_dot_product_attention(Q.numpy(), K.numpy(), V.numpy(), is_causal=True,
                                              return_weights=True)
    # float32 on both sides: the seed's "1e-6 level", relative to the output's size
    bound = 1e-6 * max(1.0, float(manual.abs().max()))
    assert np.abs(o - fast.numpy()).max() <= 4 * bound
    assert np.abs(o - manual.numpy()).max() <= 4 * bound
    assert np.abs(aw - w.numpy()).max() <= 1e-6
    assert np.all(np.triu(aw[0], 1) == 0)          # causal: nothing above the diagonal
