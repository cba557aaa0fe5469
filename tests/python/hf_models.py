"""hf_models.py — what the transformers-backend suites (test_hf.py, test_hf_dropout_sinks.py)
share: the tolerances of a model run through attn against the same model on eager or sdpa,
and the two comparisons that hold them (logits or weights; every parameter's gradient).

Not a test module (pytest collects test_*.py only) and not a model zoo: each suite builds
its own tiny models from their configs. Imports torch: import it after the suite's
pytest.importorskip("torch").
"""
LOGIT_TOL = 2e-6   # max |attn - ref| <= LOGIT_TOL * (1 + max |ref|) on logits and weights
GRAD_TOL = 5e-5    # per parameter: <= GRAD_TOL * (max |its ref grad| + 1% of the largest)


def close(ours, ref, tol, what):
    """max |ours - ref| <= tol * (1 + max |ref|); returns that max."""
    err = (ours - ref).abs().max().item()
    bound = tol * (1.0 + ref.abs().max().item())
    assert err <= bound, "%s: max |attn - ref| = %.3g > %.3g" % (what, err, bound)
    return err


def close_grads(ours, ref, what, tol=GRAD_TOL):
    """Each parameter's gradient (dicts name -> tensor, the same names) within tol of its
    own size, plus 1% of the largest gradient of the model (a key bias's gradient is
    exactly 0 in exact arithmetic: both sides hold rounding noise there)."""
    top = max(g.abs().max().item() for g in ref.values())
    assert ours.keys() == ref.keys() and ref
    for name, g in ref.items():
        err = (ours[name] - g).abs().max().item()
        bound = tol * (g.abs().max().item() + 0.01 * top)
        assert err <= bound, "%s %s: max |attn - ref| = %.3g > %.3g" % (what, name, err, bound)
