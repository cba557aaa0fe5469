"""test_onnx.py — the ONNX `Attention` conformance cases (opsets 23-25: 87 folders under
../shared/conformance/onnx_attention, or $ATTN_CONFORMANCE_DIR) through the Python API,
on the fused and the reference path.

The mapping of ONNX's semantics is the C harness's (tests/test_onnx.c), in NumPy:
- 3-D layout (B, S, H*D) is reshaped to (B, S, H, D) and transposed to (B, H, S, D): a
  strided view, read in place; Y is compared the same way.
- past_key/past_value: K = concat(past, new, axis=2) (checked against present_key/value).
- attn_mask broadcasts right-aligned like PyTorch's; a last dimension shorter than the
  total key count is padded with False / -inf.
- ONNX's causal/window offset: 0 -> top-left; nonpad_kv_seqlen without a past cache ->
  bottom-right with kv_len = nonpad; a past cache with Sq == Skv (and no nonpad) ->
  bottom-right; any other past case -> past_seq zero query rows are prepended and the
  call runs top-left (row past + i then has diagonal past + i), their outputs dropped.
- qk_matmul_output mode 3 (the probabilities) is compared with return_weights; modes
  0-2 (raw or masked logits) are not outputs of the library.
- float16 cases run twice: widened to float32 (as the C harness runs them), and in
  float16 as given (a float16 output, which the library rounds once); both compared
  with atol 1e-3, as ONNX computed them in float16 (its numbers are up to 2.4e-4 off,
  and a float16 output adds half an ulp: at most 4.9e-4 below 2). float32:
  |got - exp| <= 1e-5 + 1e-5 |exp|.
Without the folder (a clone outside the team has no ../shared) the suite is skipped.
"""
import json
import os

import numpy as np
import pytest

import attn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("ATTN_CONFORMANCE_DIR") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "conformance", "onnx_attention"))
CASES = sorted(d for d in os.listdir(ROOT) if d.startswith("test_attention_")
               and os.path.isdir(os.path.join(ROOT, d))) if os.path.isdir(ROOT) else []
SKIP_REASON = "%s not found (a clone outside the team has no ../shared)" % ROOT


def load(case, widen=True):
    d = os.path.join(ROOT, case)
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        man = json.load(f)
    arrays = {}
    for name in ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen",
                 "Y", "present_key", "present_value", "qk_matmul_output"):
        p = os.path.join(d, name + ".npy")
        if os.path.exists(p):
            a = np.load(p)
            arrays[name] = a.astype(np.float32) if widen and a.dtype == np.float16 else a
    return man, arrays


def bhsx(a, layout3d, H):
    """The logical (B, H, S, X) view of a (B, S, H*X) or (B, H, S, X) array, no copy."""
    if not layout3d:
        return a
    B, S, HX = a.shape
    return a.reshape(B, S, H, HX // H).transpose(0, 2, 1, 3)


def close(got, exp, atol, rtol):
    got, exp = np.asarray(got, np.float64), np.asarray(exp, np.float64)
    assert got.shape == exp.shape
    fin = np.isfinite(got) & np.isfinite(exp)
    same = (np.isnan(got) & np.isnan(exp)) | (got == exp)
    assert (fin | same).all(), "non-finite mismatch"
    excess = np.abs(got - exp) - (atol + rtol * np.abs(exp))
    worst = np.unravel_index(np.argmax(np.where(fin, excess, -np.inf)), got.shape) if got.size else None
    assert not (fin & (excess > 0)).any(), "worst at %s: expected %r, got %r" % (
        worst, exp[worst], got[worst])


def run_case(case, path, threads=0, widen=True):
    man, a = load(case, widen)
    attr, der = man["attributes_effective"], man["derived"]
    layout3d = der["layout"] == "3D"
    fp16 = der["dtype"] == "float16"
    B, Hq, Hkv, Sq, Skv, past, T = (der[k] for k in (
        "batch", "q_num_heads", "kv_num_heads", "q_seq", "kv_seq", "past_seq", "total_seq"))
    causal = bool(attr["is_causal"])
    scale = attr.get("scale")
    softcap = attr.get("softcap") or 0.0
    mode = attr.get("qk_matmul_output_mode") or 0
    wl, wr = attr.get("left_window_size"), attr.get("right_window_size")
    window = None if wl is None and wr is None else (
        -1 if wl is None else wl, -1 if wr is None else wr)
    has_out = man["has_outputs"]

    q = bhsx(a["Q"], layout3d, Hq)
    k = bhsx(a["K"], layout3d, Hkv)
    v = bhsx(a["V"], layout3d, Hkv)
    if "past_key" in a:
        k = np.concatenate([a["past_key"], k], axis=2)
        v = np.concatenate([a["past_value"], v], axis=2)
        for name, got in (("present_key", k), ("present_value", v)):
            if has_out.get(name):
                assert np.array_equal(got, a[name]), name + ": concat(past, new)"
    nonpad = a.get("nonpad_kv_seqlen")

    align, shift = "top-left", 0
    if causal or window is not None:
        if "past_key" in a:
            if nonpad is None and past > 0 and Skv == Sq:
                align = "bottom-right"
            else:
                shift = past
        elif nonpad is not None:
            align = "bottom-right"

    mask = a.get("attn_mask")
    if mask is not None:
        if mask.shape[-1] < T:   # ONNX pads a short last dimension with False / -inf
            pad = [(0, 0)] * (mask.ndim - 1) + [(0, T - mask.shape[-1])]
            fill = False if mask.dtype == np.bool_ else -np.inf
            mask = np.pad(mask, pad, constant_values=fill)
        if shift and mask.ndim >= 2 and mask.shape[-2] > 1:   # dummy rows attend everything
            rows = np.ones if mask.dtype == np.bool_ else np.zeros
            lead = mask.shape[:-2]
            mask = np.concatenate([rows(lead + (shift, T), mask.dtype), mask], axis=-2)
    if shift:
        q = np.concatenate([np.zeros((B, Hq, shift, q.shape[-1]), q.dtype), q], axis=2)

    want_w = bool(has_out.get("qk_matmul_output")) and mode == 3
    res = attn.scaled_dot_product_attention(
        q, k, v, mask, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv, align=align,
        window=window, softcap=softcap, kv_len=nonpad, return_weights=want_w, path=path,
        threads=threads)
    out, w = res if want_w else (res, None)
    assert out.dtype == q.dtype

    atol, rtol = (1e-3, 0.0) if fp16 else (1e-5, 1e-5)
    close(out[:, :, shift:], bhsx(a["Y"], layout3d, Hq), atol, rtol)
    if want_w:
        close(w[:, :, shift:], a["qk_matmul_output"], atol, rtol)
    return out, w


@pytest.mark.skipif(not CASES, reason=SKIP_REASON)
def test_all_cases_present():
    assert len(CASES) == 87, "expected the 87 cases of INDEX.md, found %d" % len(CASES)


@pytest.mark.parametrize("path", ["fused", "reference"])
@pytest.mark.parametrize("case", CASES or [pytest.param(None, marks=pytest.mark.skip(
    reason=SKIP_REASON))])
def test_onnx_case(case, path):
    out, w = run_case(case, path, threads=1)
    out2, w2 = run_case(case, path, threads=2)
    assert np.array_equal(out, out2, equal_nan=True), "1 and 2 threads differ"
    if w is not None:
        assert np.array_equal(w, w2, equal_nan=True)


def _dtype(case):
    with open(os.path.join(ROOT, case, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["derived"]["dtype"]


FP16 = [c for c in CASES if _dtype(c) == "float16"]


@pytest.mark.parametrize("path", ["fused", "reference"])
@pytest.mark.parametrize("case", FP16 or [pytest.param(None, marks=pytest.mark.skip(
    reason=SKIP_REASON if not CASES else "no float16 case"))])
def test_onnx_case_in_float16(case, path):
    out, _ = run_case(case, path, widen=False)
    assert out.dtype == np.float16
