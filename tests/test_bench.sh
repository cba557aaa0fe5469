#!/usr/bin/env bash
# test_bench.sh — tests of `attn bench`'s logic on its tiny --quick sweep: that it runs,
#                 checks every case against the reference (and that the check fails on a
#                 planted error, on the whole case and on a checked subset, on 16-bit and
#                 backward rows too), counts FLOPs
#                 by the stated formula, prints a parseable table and JSON, filters shapes,
#                 refuses bad options, and speaks its protocol with the PyTorch side (here
#                 a stand-in script: the real PyTorch is large and stays out of the suite).
#
# Usage: bash tests/test_bench.sh [path/to/attn]      (default build/attn)
#
# What it is not: a benchmark. No time is asserted anywhere: on a shared 2-core machine
# any time limit would be a flaky test. Needs python3 only (json from the standard library).

. "$(dirname "$0")/lib.sh"
suite bench
attn_arg "${1:-}"
OK_VERBOSE=1   # each check's line, passed or not
if [ ! -x "$ATTN" ] || ! command -v python3 >/dev/null; then
    cannot_run "needs an executable attn ($ATTN) and python3"
fi
tmp_dir cd
# expect NAME CODE COMMAND...: the command exits with CODE
expect() {
    local name=$1 code=$2
    shift 2
    "$@" >out.txt 2>err.txt
    local rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$name (exit $rc)"; else
        bad "$name: exit $rc, expected $code"; sed 's/^/    /' err.txt | tail -5; fi
}
# pycheck NAME SCRIPT: a python3 assertion script over the files here
pycheck() {
    local name=$1
    if python3 -c "$2" >py.txt 2>&1; then ok "$name"; else
        bad "$name"; sed 's/^/    /' py.txt | tail -8; fi
}

# ---- the whole quick sweep, JSON ----------------------------------------------------------
expect "quick sweep, --json" 0 "$ATTN" bench --quick --json --quiet
cp out.txt quick.json
pycheck "JSON: every case checked and passed, FLOPs by the formula, fields present" '
import json
d = json.load(open("quick.json"))
assert d["quick"] is True and d["threads"] >= 1, d
m = d["machine"]
assert m["measured"] is True
assert m["peak_gflops_1"] > 0 and m["peak_gflops_n"] > 0 and m["bw_gbs_1"] > 0 and m["bw_gbs_n"] > 0, m
assert "generic" in {p["isa"] for p in m["fma_peak"]} and isinstance(m["other_peaks"], list), m
assert 0 <= m["others_cpu_pct"] <= 100, m
names = [c["name"] for c in d["cases"]]
assert len(names) == len(set(names)) >= 8, names
kinds = {c["mask"] for c in d["cases"]}
assert kinds == {"none", "causal", "bool", "window"}, kinds
assert any(c["Hq"] != c["Hkv"] for c in d["cases"]), "no GQA case"
assert any(c["decode"] for c in d["cases"]), "no decoding case"
for c in d["cases"]:
    assert c["check"] == "pass" and c["checked"] == "all", c
    half = c["dtype"] != "float32" or c["kv_dtype"] != "float32"
    if half:   # the half-precision rule: at most twice the naive same-precision error
        assert c["max_abs"] <= c["tol_abs"] and c["tol_abs"] >= 2 * c["naive_max_abs"], c
        assert c["tol_abs"] <= 2 * c["naive_max_abs"] + 1e-6, c
    else:
        assert c["rel_fro"] <= 1e-6 and c["max_abs"] <= c["tol_abs"], c
    pairs = c["Lq"] * c["Lk"]
    if c["mask"] == "causal":
        pairs /= 2
    if c["mask"] == "window":
        pairs = sum(max(0, min(c["Lk"] - 1, i + c["window_right"] if c["window_right"] >= 0 else c["Lk"] - 1)
                        - max(0, i - c["window_left"] if c["window_left"] >= 0 else 0) + 1)
                    for i in range(c["Lq"]))
    flop = 2 * (c["Dk"] + c["Dv"]) * c["B"] * c["Hq"] * pairs
    if c["direction"] == "backward":
        flop *= 2.5
    assert abs(c["flop"] - flop) <= 1e-5 * flop, (c["name"], c["flop"], flop)
    kv_size = 4 if c["kv_dtype"] == "float32" else 2
    assert c["kv_bytes"] == kv_size * c["B"] * c["Hkv"] * c["Lk"] * (c["Dk"] + c["Dv"]), c
    assert c["reps"] >= d["reps"] and c["min_s"] <= c["median_s"] <= c["max_s"], c
    assert abs(c["gflops"] - c["flop"] / c["median_s"] * 1e-9) <= 0.01 * c["gflops"] + 0.01, c
    assert c["rotate"] >= 1 and c["kernel"] == d["kernel"] and c["threads"] == d["threads"], c
    assert ("gbs" in c) == c["decode"], c
    # a decoding row: the read timed beside its calls, and its % of that read
    assert ("bw_here_gbs" in c) == c["decode"], c
    if c["decode"]:
        # (the JSON rounds GB/s to 0.01 and the opening bandwidth to 0.1: 1% slack)
        assert c["bw_here_gbs"] > 0 and abs(c["pct_bw"] - 100 * c["gbs"] / c["bw_here_gbs"]) <= 0.01 * c["pct_bw"] + 0.1, c
        assert abs(c["pct_bw_start"] - 100 * c["gbs"] / m["bw_gbs_n"]) <= 0.01 * c["pct_bw_start"] + 0.1, c
    assert "ref_median_s" in c, c   # every quick case is under --ref-max-l
'
pycheck "JSON: 16-bit rows, FAST precision and backward rows, each with its float32 row" '
import json
d = json.load(open("quick.json"))
cs = {c["name"]: c for c in d["cases"]}
assert {c["direction"] for c in cs.values()} == {"forward", "backward"}, cs.keys()
assert {c["precision"] for c in cs.values()} == {"default", "fast"}, cs.keys()
assert {"bfloat16", "float16"} <= {c["kv_dtype"] for c in cs.values()}, cs.keys()
assert any(c["dtype"] == "float32" and c["kv_dtype"] != "float32" and c["decode"] for c in cs.values())
for c in cs.values():
    if c["dtype"] != "float32" or c["kv_dtype"] != "float32":
        b = cs[c["base"]]    # the float32 forward row of the same shape
        assert b["dtype"] == b["kv_dtype"] == "float32" and b["direction"] == "forward", b
        assert [c[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "mask")] == \
               [b[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv", "mask")], (c, b)
        assert abs(c["speedup_vs_base"] - b["median_s"] / c["median_s"]) <= 1e-3 * c["speedup_vs_base"], c
    else:
        assert "base" not in c and "speedup_vs_base" not in c, c
'

# ---- the table ------------------------------------------------------------------------------
expect "table, --shapes filter, --no-machine" 0 "$ATTN" bench --quick --quiet --no-machine --shapes 'fwd-L64-*,decode-*'
cp out.txt table.txt
pycheck "table: a header and one parseable row per selected case" '
rows = [l.split() for l in open("table.txt") if l.startswith(("fwd-", "decode-"))]
assert [r[0] for r in rows] == ["fwd-L64-D16", "fwd-L64-D16-causal", "fwd-L64-D64",
                                "fwd-L64-D64-causal", "decode-Lk1000-D32", "fwd-L64-D16-bf16",
                                "fwd-L64-D16-bf16-fast", "decode-Lk1000-D32-kvf16"], rows
assert [r[7] for r in rows] == ["f32"] * 5 + ["bf16", "bf16+F", "f32/f16"], rows   # dtype Q/KV
assert all(r[-1] == "-" for r in rows[:5]) and all(r[-1].endswith("x") for r in rows[5:]), rows  # x f32
head = [l for l in open("table.txt") if l.startswith("case ")]
assert len(head) == 1 and "GFLOP/s" in head[0] and "%peak" in head[0], head
for r in rows:
    assert r[10] == "ok", r        # check column (the shape takes five)
    float(r[11]); float(r[12])     # ms, GFLOP/s
'
if ! grep -q 'fp32 FMA peak:' table.txt; then ok "--no-machine skips the peak"; else bad "--no-machine still measured"; fi

expect "--machine-only" 0 "$ATTN" bench --quick --quiet --machine-only --json
pycheck "--machine-only measures and runs no case" '
import json
d = json.load(open("out.txt"))
assert d["cases"] == [] and d["machine"]["measured"] is True and d["machine"]["bw_gbs_n"] > 0, d
'

expect "--rounds 2" 0 "$ATTN" bench --quick --quiet --no-machine --rounds 2 --reps 2 --shapes 'fwd-L64-D16,win-*' --json
pycheck "--rounds pools the calls of every round" '
import json
d = json.load(open("out.txt"))
assert d["rounds"] == 2 and len(d["cases"]) == 2, d
for c in d["cases"]:
    assert c["check"] == "pass" and c["reps"] >= 4 and c["min_s"] <= c["median_s"] <= c["max_s"], c
'

expect "--list" 0 "$ATTN" bench --quick --list --shapes '*causal'
if [ -s out.txt ] && ! grep -qv 'causal$' out.txt; then ok "--list --shapes lists only the matches"; else
    bad "--list --shapes"; cat out.txt; fi

expect "--json-out with the table" 0 "$ATTN" bench --quick --quiet --no-machine --shapes 'mask-*' --json-out j.json
pycheck "--json-out writes the JSON, the table goes to stdout" '
import json
d = json.load(open("j.json"))
assert [c["name"] for c in d["cases"]] == ["mask-L80-D32-bool"] and d["machine"]["measured"] is False, d
assert any(l.startswith("mask-L80-D32-bool") for l in open("out.txt"))
'

expect "--isa generic --threads 1" 0 "$ATTN" bench --quick --quiet --no-machine --isa generic --threads 1 --shapes 'win-*' --json
pycheck "the kernel and thread count are the ones asked for" '
import json
d = json.load(open("out.txt"))
assert d["kernel"] == "generic" and d["threads"] == 1 and d["cases"][0]["check"] == "pass", d
'

# ---- the check itself ------------------------------------------------------------------------
expect "a planted error fails the check" 1 "$ATTN" bench --quick --quiet --no-machine --plant-error --shapes 'fwd-L64-D16'
if grep -q 'FAIL' out.txt && grep -q 'check FAILED' out.txt; then ok "the failure is shown in the table"; else
    bad "no FAIL row"; cat out.txt; fi

for s in fwd-L64-D16-bf16 fwd-L64-D16-bf16-fast decode-Lk1000-D32-kvf16 bwd-L64-D16 bwd-L96-D32-gqa-causal; do
    expect "a planted error fails the check of $s" 1 "$ATTN" bench --quick --quiet --no-machine --plant-error --shapes "$s"
    if grep -q "^$s: check FAILED" out.txt; then ok "  and is shown"; else bad "  no FAILED line"; cat out.txt; fi
done

expect "subsets checked under a small budget" 0 "$ATTN" bench --quick --quiet --no-machine --check-budget 50000 --ref-max-l 0 --json
pycheck "subset checks (last rows, bottom-right diagonal) pass on causal, window, mask, GQA" '
import json
d = json.load(open("out.txt"))
sub = [c for c in d["cases"] if c["checked"] != "all"]
assert len(sub) >= 8 and all(c["check"] == "pass" for c in d["cases"]), d["cases"]
assert {c["mask"] for c in sub} == {"none", "causal", "bool", "window"}, sub
assert any("rows" in c["checked"] and not c["checked"].endswith("rows 0..%d" % (c["Lq"] - 1)) for c in sub)
assert any(c["direction"] == "backward" and "all rows" in c["checked"] for c in sub), sub
assert any(c["dtype"] == "bfloat16" and c["precision"] == "fast" for c in sub), sub
'
expect "a planted error fails a subset check too" 1 "$ATTN" bench --quick --quiet --no-machine --check-budget 50000 --ref-max-l 0 --plant-error --shapes 'win-*,gqa-*'

# ---- usage errors: exit 2, one line on stderr --------------------------------------------------
for args in "--bogus" "--reps 0" "--threads x" "--isa sse9" "--vs onnx" "--shapes nothing-matches" \
            "--json --json-out x.json" "--check-budget 0" "--machine-only --no-machine" "--rounds 0" "stray"; do
    # shellcheck disable=SC2086
    expect "usage error: $args" 2 "$ATTN" bench --quick $args
    if [ "$(wc -l <err.txt)" -eq 1 ] && [ ! -s out.txt ]; then ok "  one line on stderr: $(cat err.txt)"; else
        bad "  expected one line on stderr and nothing on stdout"; cat err.txt out.txt; fi
done
expect "--help" 0 "$ATTN" bench --help
grep -q -- '--vs torch' out.txt && ok "--help names --vs torch" || bad "--help"

# ---- the PyTorch side's protocol, with a stand-in ---------------------------------------------
cat > fake_torch.py <<'EOF'
import json, sys
hello = json.loads(sys.stdin.readline())
print(json.dumps({"torch": "0.0-fake", "info": "threads %d" % hello["threads"]}), flush=True)
for line in sys.stdin:
    c = json.loads(line)
    assert c["threads"] == hello["threads"] and c["rotate"] >= 1 and c["reps"] >= 1, c
    assert c["dtype"] in ("float32", "float16", "bfloat16") and c["direction"] in ("forward", "backward"), c
    if c["mask"] == "bool":
        print(json.dumps({"name": c["name"], "error": "no bool masks here"}), flush=True)
    else:  # 1 s per GFLOP... of the shape it was sent, so the bench must have sent the right one
        t = 2 * (c["Dk"] + c["Dv"]) * c["B"] * c["Hq"] * c["Lq"] * c["Lk"] * 1e-9
        print(json.dumps({"name": c["name"], "median_s": t, "min_s": t, "max_s": t, "reps": 7,
                          "times": [t] * 7}), flush=True)
EOF
expect "--vs torch through a stand-in (a torch error is that row's, not the run's)" 0 "$ATTN" bench --quick --quiet --no-machine --vs torch \
    --python python3 --torch-script fake_torch.py --shapes 'fwd-L64-D16,mask-*' --json
pycheck "per-row torch time, GFLOP/s and speedup; a torch error is that row's" '
import json
d = json.load(open("out.txt"))
assert d["torch"]["version"] == "0.0-fake" and "threads %d" % d["threads"] in d["torch"]["info"], d
a, m = d["cases"]
assert a["name"] == "fwd-L64-D16" and a["torch_reps"] == 7, a
t = 4 * 16 * 2 * 64 * 64 * 1e-9
assert abs(a["torch_median_s"] - t) < 1e-12 and abs(a["torch_gflops"] - 1.0) < 1e-6, a
assert abs(a["speedup_vs_torch"] - t / a["median_s"]) <= 1e-3 * a["speedup_vs_torch"], a
assert m["torch_error"] == "no bool masks here" and "torch_median_s" not in m and m["check"] == "pass", m
'
echo "print('not json')" > broken.py
expect "--vs torch: a side that does not answer the hello" 1 "$ATTN" bench --quick --quiet --no-machine \
    --vs torch --python python3 --torch-script broken.py --shapes 'fwd-L64-D16'
expect "--vs torch without the venv" 2 "$ATTN" bench --quick --vs torch --python /nonexistent/python \
    --torch-script /nonexistent/script.py

# ---- additive attention's rows (bench/bench_additive.c) ------------------------------------
expect "bench --additive --quick" 0 "$ATTN" bench --additive --quick --reps 1
if grep -q "check O .* ok" out.txt && grep -q "forward (fused)" out.txt &&
    grep -q "tight tanh loop" out.txt; then ok "bench --additive prints its checks and rows"
else bad "bench --additive output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --additive --plant-error fails its check" 1 "$ATTN" bench --additive --quick --reps 1 \
    --plant-error
expect "bench --additive --reps 0" 2 "$ATTN" bench --additive --reps 0

# ---- the q8_0 cache's decoding rows (bench/bench_q8.c) ---------------------------------------
expect "bench --q8 --quick" 0 "$ATTN" bench --q8 --quick --reps 1
if grep -q "q8_0 .*uniform data: fused vs float64 .* ok" out.txt && grep -q "^  q8_0 .*bfloat16's speed" out.txt; then
    ok "bench --q8 prints its checks and rows"
else bad "bench --q8 output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --q8 --plant-error fails its check" 1 "$ATTN" bench --q8 --quick --reps 1 --plant-error
expect "bench --q8 --reps 0" 2 "$ATTN" bench --q8 --reps 0

# ---- the paged cache's decoding rows (bench/bench_paged.c) -----------------------------------
expect "bench --paged --quick" 0 "$ATTN" bench --paged --quick --reps 1
if grep -q "decode B=1 Lk=4096 float32  paged 16 .*paged/contig" out.txt &&
    grep -q "decode B=1 Lk=4096 bfloat16 paged 256 .*paged/contig" out.txt; then
    ok "bench --paged prints its rows"
else bad "bench --paged output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --paged --plant-error fails its check" 1 "$ATTN" bench --paged --quick --reps 1 --plant-error
expect "bench --paged --reps 0" 2 "$ATTN" bench --paged --reps 0

finish
