"""test_tune.py — attn.tune (the C library's attn_tune through the extension): its
refusals, each raised before any timing (an unwritable file: OSError; ATTN_ISA set:
RuntimeError; a negative thread count: ValueError), and nothing written by a refused call.
The tuning itself is tests/test_tune.sh's (`attn tune --quick`), and the wisdom's use
tests/test_wisdom.c's; a tune here would add seconds for no new line of the binding."""
import os

import pytest

import attn


def test_unwritable_out_raises_oserror():
    with pytest.raises(OSError, match="cannot write"):
        attn.tune(quick=True, out="/proc/attn-no-such-folder/wisdom")


def test_forced_isa_raises_runtimeerror(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_ISA", "generic")
    out = tmp_path / "wisdom"
    with pytest.raises(RuntimeError, match="ATTN_ISA"):
        attn.tune(quick=True, out=str(out))
    assert not out.exists()


def test_negative_threads_raise_valueerror(tmp_path):
    out = tmp_path / "wisdom"
    with pytest.raises(ValueError, match="threads"):
        attn.tune(out=str(out), threads=-1)
    assert not out.exists()


def test_keyword_only():
    with pytest.raises(TypeError):
        attn.tune(True)  # quick is keyword-only
