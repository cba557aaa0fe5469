"""textbook_torch.py — seed 003 §4 and §5 replayed with PyTorch, beside attn: the seed's
own code (torch.manual_seed(0), W ~ N(0, 1)), its causal weights, and the max difference
of F.scaled_dot_product_attention, of the hand-written five lines and of
attn.scaled_dot_product_attention on the same Q, K, V. `attn demo --section sdpa` is the
C side (no PyTorch there: its input is the demo's own); this is the comparison the seed
makes, where PyTorch is installed.

Usage: python scripts/textbook_torch.py      (needs torch, numpy and the attn package)
What it is not: a test (tests/python/test_textbook_torch.py checks its numbers).
"""
import numpy as np


def seed003(torch):
    """The seed's §4/§5 input and results: (Q, K, V, manual weights, manual out, SDPA out),
    torch tensors, exactly as the seed's code computes them."""
    F = torch.nn.functional
    torch.manual_seed(0)
    B, T, D = 1, 4, 8
    x = torch.randn(B, T, D)
    Wq = torch.randn(D, D); Wk = torch.randn(D, D); Wv = torch.randn(D, D)  # noqa: E702
    Q, K, V = x @ Wq, x @ Wk, x @ Wv
    out_fast = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    mask = torch.triu(torch.ones(T, T), diagonal=1).bool()
    scores = (Q @ K.transpose(-2, -1)) / (D ** 0.5)
    scores = scores.masked_fill(mask, float('-inf'))
    weights = F.softmax(scores, dim=-1)
    return Q, K, V, weights, weights @ V, out_fast


def main():
    import torch
    import attn
    Q, K, V, w, manual, fast = seed003(torch)
    o, aw = attn.scaled_dot_product_attention(Q.numpy(), K.numpy(), V.numpy(), is_causal=True,
                                              return_weights=True)
    print("Seed 003 section 4 with PyTorch %s (torch.manual_seed(0), W ~ N(0, 1), the seed's code):"
          % torch.__version__)
    for i in range(4):
        print("  row %d  torch [%s]   attn [%s]" % (
            i, ", ".join("%.2f" % x for x in w[0, i].tolist()),
            ", ".join("%.2f" % x for x in aw[0, i].tolist())))
    print("  (the seed prints row 1 = [0.31, 0.69, 0, 0] as a 'typical output'; its own code "
          "gives the row above)")
    print("Seed 003 section 5, max abs diff on that input:")
    print("  torch SDPA - torch manual: %.3g" % (fast - manual).abs().max().item())
    print("  attn       - torch SDPA  : %.3g" % np.abs(np.asarray(o) - fast.numpy()).max())
    print("  attn       - torch manual: %.3g" % np.abs(np.asarray(o) - manual.numpy()).max())
    print("  attn weights - torch weights: %.3g" % np.abs(np.asarray(aw) - w.numpy()).max())


if __name__ == "__main__":
    main()
