"""test_tune_auto.py — ATTN_TUNE=auto through the package: `import attn` in a process that
finds no wisdom file runs the quick tune (attn_tune_auto), writes the file, says so in one
line on stderr and its first call reads that file; a second process finds it, tunes
nothing and leaves it as it is. Attention calls never tune by themselves, so the import is
where this is asked (docs/KERNELS.md, "Tuner").
"""
import os
import re
import subprocess
import sys

CALL = ("import numpy as np, attn\n"
        "q = np.ones((1, 2, 8, 64), np.float32)\n"
        "o = attn.scaled_dot_product_attention(q, q, q)\n"
        "assert np.allclose(o, 1.0)\n")


def run(cache):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATTN_WISDOM", "ATTN_ISA", "ATTN_FWD_BQ", "ATTN_FWD_BK",
                        "ATTN_BWD_BQ")}
    env.update(ATTN_TUNE="auto", XDG_CACHE_HOME=str(cache), ATTN_VERBOSE="1",
               OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, "-c", CALL], capture_output=True, text=True,
                          env=env, timeout=600)


def test_import_tunes_once_and_the_first_call_reads_the_file(tmp_path):
    wisdom = tmp_path / "attn" / "wisdom"
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert wisdom.is_file()
    lines = r.stderr.splitlines()
    tuned = [s for s in lines if s.startswith("attn: ATTN_TUNE=auto: tuned")]
    assert len(tuned) == 1, r.stderr
    n = int(re.match(r"attn: ATTN_TUNE=auto: tuned (\d+) classes in [0-9.]+ s, wrote (.*)$",
                     tuned[0]).group(1))
    assert n > 0
    # the tune came first: the call's loading of the wisdom (ATTN_VERBOSE) follows it
    read = [i for i, s in enumerate(lines) if s == f"attn: wisdom {wisdom}: {n} classes"]
    assert read and read[0] > lines.index(tuned[0]), r.stderr

    before = wisdom.read_bytes()
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert not any("ATTN_TUNE=auto" in s for s in r.stderr.splitlines()), r.stderr
    assert wisdom.read_bytes() == before
