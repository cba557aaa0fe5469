#!/usr/bin/env bash
# test_bench.sh — tests of `attn bench`'s logic on its tiny --quick sweep: that it runs,
#                 checks every case against the reference (and that the check fails on a
#                 planted error, on the whole case and on a checked subset, on 16-bit and
#                 backward rows too), counts FLOPs
#                 by the stated formula, prints a parseable table and JSON, filters shapes,
#                 refuses bad options, and speaks its protocol with the PyTorch side (here
#                 a stand-in script: the real PyTorch is large and stays out of the suite);
#                 `attn bench masks` (its checks, --plant-error, the PyTorch side through a
#                 NumPy stand-in, a clean failure without torch) and `attn bench --models`
#                 (without torch, without transformers, a stand-in's rows).
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

# ---- a wisdom in use: the static and the tuned figure side by side --------------------------
# (scripts/check.sh sets ATTN_TUNE=0: these calls take it away)
expect "attn tune --quick writes a wisdom" 0 env -u ATTN_TUNE "$ATTN" tune --quick --out wisdom.txt
expect "quick sweep with --wisdom" 0 env -u ATTN_TUNE "$ATTN" bench --quick --quiet --no-machine --wisdom wisdom.txt --reps 1 --json-out tuned.json
cp out.txt tuned.txt
pycheck "--wisdom: every row has its static and its tuned median, table and JSON" '
import json
d = json.load(open("tuned.json"))
assert d["tuned"] is True and d["wisdom"].endswith("wisdom.txt"), d
assert len(d["cases"]) >= 8
for c in d["cases"]:
    assert c["check"] == "pass", c
    assert c["static_ms"] > 0 and c["tuned_ms"] > 0 and c["static_min_ms"] <= c["static_ms"] <= c["static_max_ms"], c
    assert abs(c["tuned_ms"] - 1e3 * c["median_s"]) <= 1e-6 * c["tuned_ms"] + 1e-9, c
    assert abs(c["static_over_tuned"] - c["static_ms"] / c["tuned_ms"]) <= 1e-3 * c["static_over_tuned"], c
lines = open("tuned.txt").read().splitlines()
head = [l for l in lines if l.startswith("case ")]
assert len(head) == 1 and head[0].split()[-4:] == ["static", "ms", "x", "static"], head
rows = [l.split() for l in lines if l.split() and l.split()[0] in {c["name"] for c in d["cases"]}]
assert len(rows) == len(d["cases"]), rows
for r in rows:
    float(r[-2]); assert r[-1].endswith("x") and float(r[-1][:-1]) > 0, r
'
# the static calls are the static choices whatever the wisdom says: a wisdom that sends one
# class to the generic kernel runs that row tuned on generic (its answer checked), the
# others as before
{ head -2 wisdom.txt; echo "prefill f32 d64 none g1 = kernel=generic bq=static bk=static split=static"; } > generic.txt
expect "--wisdom naming another kernel for a class" 0 env -u ATTN_TUNE "$ATTN" bench --quick --quiet --no-machine --wisdom generic.txt --reps 1 --shapes 'fwd-L200-D64*' --json
pycheck "  both rows checked, both columns" '
import json
d = json.load(open("out.txt"))
assert [c["name"] for c in d["cases"]] == ["fwd-L200-D64", "fwd-L200-D64-causal"], d
assert all(c["check"] == "pass" and c["static_ms"] > 0 and c["tuned_ms"] > 0 for c in d["cases"]), d
'
expect "without a wisdom: one column" 0 env -u ATTN_TUNE ATTN_WISDOM="$PWD/none.txt" "$ATTN" bench --quick --quiet --no-machine --reps 1 --shapes 'fwd-L64-*' --json-out plain.json
pycheck "  no static column, no static_ms" '
import json
d = json.load(open("plain.json"))
assert d["tuned"] is False and d["wisdom"] is None, d
assert all("static_ms" not in c and "tuned_ms" not in c for c in d["cases"]), d
assert "static ms" not in open("out.txt").read()
'
expect "--wisdom with ATTN_TUNE=0: not used" 0 env ATTN_TUNE=0 "$ATTN" bench --quick --no-machine --reps 1 --shapes 'fwd-L64-D16' --wisdom wisdom.txt
if ! grep -q "static ms" out.txt && grep -q "is not used (ATTN_TUNE=0)" err.txt; then ok "  one column, and why"; else
    bad "  --wisdom under ATTN_TUNE=0"; cat out.txt err.txt; fi
printf 'attn-wisdom 1\ncpu vendor=Nobody family=1 model=1 isa=generic version=0\n' > foreign.txt
expect "--wisdom: a foreign file is refused" 1 "$ATTN" bench --quick --no-machine --wisdom foreign.txt
grep -q "made for" err.txt && ok "  and says why" || { bad "  no reason"; cat err.txt; }

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
# --vs torch: the option parses; without torch it fails cleanly, nothing timed; the protocol
# and the check of PyTorch's answers through a stand-in that hands attn's own answers back
expect "bench --additive --help" 0 "$ATTN" bench --additive --help
grep -q -- '--vs torch' out.txt && ok "  --help names --vs torch" || bad "  --help: no --vs torch"
expect "bench --additive --vs tf" 2 "$ATTN" bench --additive --quick --vs tf
expect "bench --additive --python without --vs torch" 2 "$ATTN" bench --additive --quick --python python3
expect "bench --additive --vs torch: no such script" 2 "$ATTN" bench --additive --quick --vs torch \
    --python python3 --torch-script /nonexistent/script.py
if python3 -c 'import torch' 2>/dev/null; then
    echo "ok - (skipped: this python3 has torch, the no-torch failure cannot be seen with it)"
else
    expect "bench --additive --vs torch with a python without torch: exit 1" 1 "$ATTN" bench \
        --additive --quick --reps 1 --vs torch --python python3
    if grep -q "cannot import torch" err.txt && ! grep -q "check O" out.txt; then
        ok "  told why on stderr, before anything ran"
    else bad "  no reason, or it went on"; sed 's/^/    /' err.txt out.txt | tail -5; fi
fi
cat > fake_additive.py <<'EOF'
import json, os, shutil, struct, sys
hello = json.loads(sys.stdin.readline())
print(json.dumps({"torch": "0.0-fake", "info": "threads %d" % hello["threads"]}), flush=True)
wrong = os.environ.get("FAKE_WRONG", "")
for line in sys.stdin:
    c = json.loads(line)
    if "load" in c:
        d = c["load"]
        assert c["Lq"] == c["Lk"] and c["threads"] == hello["threads"], c
        assert os.path.getsize(os.path.join(d, "q.f32")) == 4 * c["B"] * c["Lq"] * c["Dq"], c
        assert os.path.getsize(os.path.join(d, "W.f32")) == 4 * c["Dq"] * c["A"], c
        lens = struct.unpack("<%dq" % c["B"], open(os.path.join(d, "key_len.i64"), "rb").read())
        assert all(x == c["Lk"] for x in lens), lens
        for k in ("o", "dq", "dk", "dv", "dW", "dU", "dvv", "db"):  # attn's answers handed back
            for to in ("torch_", "ref_"):  # as its answers and as the float64 ones
                shutil.copy(os.path.join(d, "attn_%s.f32" % k), os.path.join(d, to + k + ".f32"))
        if wrong:  # one value of one file (torch_<name> or ref_<name>) moved by 1e-2 (1 + max)
            raw = bytearray(open(os.path.join(d, wrong + ".f32"), "rb").read())
            top = max(abs(y) for y in struct.unpack("<%df" % (len(raw) // 4), raw))
            x = struct.unpack_from("<f", raw, 4 * 5)[0]
            struct.pack_into("<f", raw, 4 * 5, x + 1e-2 * (1 + top))
            open(os.path.join(d, wrong + ".f32"), "wb").write(raw)
        print(json.dumps({"ok": 1, "peak_forward_bytes": 3 * 1048576, "peak_train_bytes": -1}), flush=True)
    else:  # a fixed time per call: the ratio must be the bench's arithmetic on it
        print(json.dumps({"s": 0.5 if c["time"] == "forward" else 2.0}), flush=True)
EOF
expect "bench --additive --vs torch through a stand-in" 0 "$ATTN" bench --additive --quick --reps 3 \
    --vs torch --python python3 --torch-script fake_additive.py
pycheck "  PyTorch's answers checked, rows interleaved, the ratio and the peaks printed" '
import re
t = open("out.txt").read()
for k in ("o", "dq", "dk", "dv", "dW", "dU", "dvv", "db"):
    assert re.search(r"check %-3s torch +relative .* ok" % k, t), k
assert "vs PyTorch 0.0-fake (threads " in t and "median of 3" in t, t
f = re.search(r"^  forward +([0-9.]+) +500\.00 +([0-9.]+)x +([0-9.]+) +3\.0$", t, re.M)
b = re.search(r"^  forward\+backward +([0-9.]+) +2000\.00 +([0-9.]+)x +([0-9.]+) +n/a$", t, re.M)
assert f and b, t
for m, s in ((f, 500.0), (b, 2000.0)):
    assert abs(float(m.group(2)) - s / float(m.group(1))) <= 0.01 * float(m.group(2)) + 0.01, m.group(0)
'
for w in torch_o torch_dk torch_dW torch_db torch_dvv ref_o ref_dU; do
    expect "bench --additive --vs torch: a stand-in wrong in $w fails the check" 1 env FAKE_WRONG=$w \
        "$ATTN" bench --additive --quick --reps 1 --vs torch --python python3 --torch-script fake_additive.py
    side=${w%%_*}; side=${side/ref/attn}; name=${w#*_}   # a wrong float64 answer fails attn's check
    grep -Eq "check $name +$side .*FAILED" out.txt && ! grep -q "vs PyTorch" out.txt &&
        ok "  $name $side FAILED, nothing timed" || { bad "  $w not refused"; tail -5 out.txt; }
done
expect "bench --additive --vs torch --plant-torch-error fails the check" 1 "$ATTN" bench --additive \
    --quick --reps 1 --vs torch --python python3 --torch-script fake_additive.py --plant-torch-error

# ---- the q8_0 cache's decoding rows (bench/bench_q8.c) ---------------------------------------
expect "bench --q8 --quick" 0 "$ATTN" bench --q8 --quick --reps 1
if grep -q "q8_0 .*uniform data: fused vs float64 .* ok" out.txt && grep -q "^  q8_0 .*bfloat16's speed" out.txt; then
    ok "bench --q8 prints its checks and rows"
else bad "bench --q8 output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --q8 --plant-error fails its check" 1 "$ATTN" bench --q8 --quick --reps 1 --plant-error
expect "bench --q8 --reps 0" 2 "$ATTN" bench --q8 --reps 0
expect "bench --q8 --thp" 0 "$ATTN" bench --q8 --quick --reps 1 --thp
if grep -q "^  huge pages: attn_huge_pages on the 7 caches" out.txt && grep -q "^  q8_0 .*bfloat16's speed" out.txt; then
    ok "bench --q8 --thp moves its caches with attn_huge_pages, then times them"
else bad "bench --q8 --thp output"; sed 's/^/    /' out.txt | tail -8; fi

# ---- streaming and computing at once (bench/bench_overlap.c) ---------------------------------
case "$(uname -m)" in
x86_64)
    expect "bench --overlap --quick" 0 "$ATTN" bench --overlap --quick --reps 1
    if grep -q "^overlap probe: 64 MiB streamed" out.txt && grep -qE "^ +16 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +4\.0 +[0-9.]+%" out.txt; then
        ok "bench --overlap prints its rows, F 16 among them"
    else bad "bench --overlap output"; sed 's/^/    /' out.txt | tail -8; fi ;;
*) expect "bench --overlap refuses a CPU without its loops" 2 "$ATTN" bench --overlap --quick --reps 1 ;;
esac
expect "bench --overlap --mib 0" 2 "$ATTN" bench --overlap --mib 0

# ---- latent attention's decoding rows (bench/bench_mla.c) ----------------------------------
expect "bench --mla --quick" 0 "$ATTN" bench --mla --quick --reps 1
if grep -q "^  float32 .* ok" out.txt && grep -q "^  bfloat16 .* ok" out.txt && grep -qE "fp32 peak \([a-z0-9]+ loops\) ([1-9][0-9]*|0)\.[0-9]" out.txt &&
   ! grep -qE "fp32 peak \([a-z0-9]+ loops\) 0\.0 " out.txt; then
    ok "bench --mla prints its checked rows and a measured peak (the kernel's ISA, or the best)"
else bad "bench --mla output"; sed 's/^/    /' out.txt | tail -6; fi
expect "bench --mla --plant-error fails its check" 1 "$ATTN" bench --mla --quick --reps 1 --plant-error

# ---- a mixed serving step in one call (bench/bench_step.c) ------------------------------
expect "bench --step --quick" 0 "$ATTN" bench --step --quick --reps 1
if grep -q "bit for bit: ok" out.txt && grep -q "one call / separate calls" out.txt; then
    ok "bench --step prints its check and the ratio"
else bad "bench --step output"; sed 's/^/    /' out.txt | tail -6; fi
expect "bench --step --plant-error fails its check" 1 "$ATTN" bench --step --quick --reps 1 --plant-error

# ---- the float64 rows (bench/bench_f64.c) ---------------------------------------------------
expect "bench --f64 --quick" 0 "$ATTN" bench --f64 --quick --reps 1
if [ "$(grep -c "fused vs reference: .* ok$" out.txt)" = 5 ] && grep -q "^  backward reference, no mask .*reference / fused" out.txt; then
    ok "bench --f64 prints its checks and rows"
else bad "bench --f64 output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --f64 --plant-error fails its check" 1 "$ATTN" bench --f64 --quick --reps 1 --plant-error
expect "bench --f64 --reps 0" 2 "$ATTN" bench --f64 --reps 0

# ---- the paged cache's decoding rows (bench/bench_paged.c) -----------------------------------
expect "bench --paged --quick" 0 "$ATTN" bench --paged --quick --reps 1
if grep -q "decode B=1 Hq=32 Lk=4096 float32  paged 16 .*% of bound .*paged/contig" out.txt &&
    grep -q "decode B=1 Hq=32 Lk=4096 bfloat16 paged 256 .*% of bound .*paged/contig" out.txt &&
    grep -q "^compute bound (bench/decode_bound.h: " out.txt; then
    ok "bench --paged prints its rows and their compute bound"
else bad "bench --paged output"; sed 's/^/    /' out.txt | tail -8; fi
# the compute bound is the model of the kernel that runs, at this core's measured rates: a
# finite positive figure, or n/a where the kernel has no model (generic: the tiles), never 0
cp out.txt paged_default.txt
expect "bench --paged --quick --isa generic" 0 "$ATTN" bench --paged --quick --reps 1 --isa generic
cp out.txt paged_generic.txt
expect "bench --q8 --quick --isa generic" 0 "$ATTN" bench --q8 --quick --reps 1 --isa generic
cp out.txt q8_generic.txt
expect "bench --q8 --isa nothing" 2 "$ATTN" bench --q8 --quick --isa nothing
expect "bench --q8 --quick" 0 "$ATTN" bench --q8 --quick --reps 1
cp out.txt q8_default.txt
pycheck "the decoding rows' compute bound: positive for a kernel with a model, n/a without, never 0" '
import math, re
def bounds(name):
    t = open(name).read()
    kernel = re.search(r"kernel (\S+),", t)
    vals = re.findall(r"  compute +(\S+) GB/s  ", t)                            # --paged rows
    vals += [r.split()[8] for r in re.findall(r"^  (?:float32|bfloat16|q8_0) +[0-9.]+ .*$", t, re.M)]  # --q8
    assert vals, t
    for v in vals:
        assert v == "n/a" or (math.isfinite(float(v)) and float(v) > 0), (name, v)
    return vals, t
for name in ("paged_generic.txt", "q8_generic.txt"):
    vals, t = bounds(name)
    assert set(vals) == {"n/a"} and "n/a (kernel generic has no model of a decoding step)" in t, (name, t)
for name in ("paged_default.txt", "q8_default.txt"):
    vals, t = bounds(name)
    modelled = re.findall(r"compute bound,? .*?(?:float32|bfloat16|q8_0): the (\S+) step", t)
    if modelled:  # a kernel with a model (avx2, avx512): its figures, at rates measured here
        assert "n/a" not in vals, (name, vals)
        assert re.search(r"G vector FMAs/s, [0-9.]+ G vector loads/s a thread", t), t
'
expect "bench --paged --in-cache" 0 "$ATTN" bench --paged --in-cache
if [ "$(grep -c "^in cache: .* cycles a key (model " out.txt)" = 12 ]; then
    ok "bench --paged --in-cache prints its twelve rows (six cache dtypes, GQA 4 and 8)"
else bad "bench --paged --in-cache output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --paged --plant-error fails its check" 1 "$ATTN" bench --paged --quick --reps 1 --plant-error
expect "bench --paged --reps 0" 2 "$ATTN" bench --paged --reps 0

# ---- shared-prefix (cascade) decoding rows (bench/bench_cascade.c) -----------------------------
expect "bench --cascade --quick" 0 "$ATTN" bench --cascade --quick --reps 1
if [ "$(grep -c "check against the float64 path: per-seq ok .* paged ok .* cascade ok .* cascade-paged ok" out.txt)" -eq 2 ] &&
    [ "$(grep -c "^  cascade .*x$" out.txt)" -eq 2 ] && grep -q "speedup <= .*flop/byte" out.txt; then
    ok "bench --cascade prints its checks, rows and bound for both caches"
else bad "bench --cascade output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --cascade --plant-error fails its check" 1 "$ATTN" bench --cascade --quick --reps 1 --plant-error
expect "bench --cascade --reps 0" 2 "$ATTN" bench --cascade --reps 0
# ---- packed (variable-length) batches (bench/bench_varlen.c) ----------------------------------
expect "bench --varlen --quick" 0 "$ATTN" bench --varlen --quick --reps 1
if [ "$(grep -c "varlen == separate calls, bit for bit: ok" out.txt)" -eq 5 ] &&
    [ "$(grep -c "vs varlen, valid rows: .* ok$" out.txt)" -eq 10 ] &&
    [ "$(grep -c "^forward \|^backward " out.txt)" -eq 8 ] && grep -q "^backward: varlen at " out.txt; then
    ok "bench --varlen prints its checks, rows and ratios"
else bad "bench --varlen output"; sed 's/^/    /' out.txt | tail -8; fi
expect "bench --varlen --plant-error fails its check" 1 "$ATTN" bench --varlen --quick --reps 1 --plant-error
expect "bench --varlen --reps 0" 2 "$ATTN" bench --varlen --reps 0
# ---- attn bench masks (bench/cli_bench_masks.c) ----------------------------------------------
expect "bench masks --quick --json-out" 0 "$ATTN" bench masks --quick --reps 1 --json-out masks.json
pycheck "masks: seven groups (padding, causal+padding, detector, random), every row checked, ratios to the base" '
import json
d = json.load(open("masks.json"))
assert d["bench"] == "masks" and d["torch"] is None and d["threads"] == 2 and d["reps"] == 1, d
groups = {}
for r in d["rows"]:
    groups.setdefault(r["group"], []).append(r)
assert len(groups) == 7 and sum(g.endswith(" causal") for g in groups) == 2, list(groups)
assert sum(g.endswith(" detector") for g in groups) == 2, list(groups)
for g, rs in groups.items():
    for r in rs:
        assert "torch_check" not in r and r["attn_min_ms"] <= r["attn_median_ms"] <= r["attn_max_ms"], r
    if rs[0]["what"].startswith("random"):
        assert len(rs) == 1 and rs[0]["check"] == "pass" and rs[0]["rel"] <= 1e-6, rs
        continue
    assert len(rs) == 5 and rs[0]["check"] == "base", rs
    assert rs[0]["what"] == ("kv_len+causal" if g.endswith(" causal") else
                             "kv_len 0 (O = 0 alone)" if g.endswith(" detector") else "kv_len"), rs[0]
    for r in rs[1:]:
        assert r["check"] == "pass" and r["rel"] <= 1e-6, r
        assert abs(r["ratio_vs_base"] - r["attn_median_ms"] / rs[0]["attn_median_ms"]) <= 1e-3 * r["ratio_vs_base"], r
'
expect "bench masks --plant-error fails every checked row" 1 "$ATTN" bench masks --quick --reps 1 --plant-error
n=$(grep -c ' FAILED ' out.txt)
if [ "$n" -eq 25 ] && ! grep -q ' pass ' out.txt; then ok "  25 rows FAILED (24 against their base, 1 against the reference)"; else
    bad "  expected 25 FAILED rows and no pass, got $n"; sed 's/^/    /' out.txt | head -35; fi
for args in "--bogus" "--reps 0" "--threads x" "--vs onnx" "--python python3" "--torch-script x.py" "stray"; do
    # shellcheck disable=SC2086
    expect "bench masks usage error: $args" 2 "$ATTN" bench masks --quick $args
    if [ "$(wc -l <err.txt)" -eq 1 ] && [ ! -s out.txt ]; then ok "  one line on stderr: $(cat err.txt)"; else
        bad "  expected one line on stderr and nothing on stdout"; cat err.txt out.txt; fi
done
expect "bench masks --help" 0 "$ATTN" bench masks --help
grep -q -- '--vs torch' out.txt && ok "  names --vs torch" || bad "  bench masks --help"

# A Python that cannot import torch (no site-packages, no PYTHON* variables), whatever is
# installed here: the PyTorch sides must say so and stop with exit status 1.
printf '#!/bin/sh\nexec python3 -S -E "$@"\n' > nopy && chmod +x nopy
expect "bench masks --vs torch, a Python without torch" 1 "$ATTN" bench masks --quick --reps 1 --vs torch --python ./nopy
if grep -q "cannot import torch" err.txt && [ ! -s out.txt ]; then ok "  says so: $(head -1 err.txt)"; else
    bad "  no clear message"; cat err.txt out.txt; fi

# The PyTorch side's protocol with a stand-in that computes SDPA in float64 NumPy from the
# files the bench writes (the real PyTorch stays out of the suite), and answers fixed times.
if python3 -c "import numpy" 2>/dev/null; then
    cat > fake_torch_masks.py <<'PY'
import json, os, sys
import numpy as np
hello = json.loads(sys.stdin.readline())
print(json.dumps({"torch": "0.0-numpy", "info": "threads %d" % hello["threads"]}), flush=True)
wrong = os.environ.get("FAKE_MASKS_WRONG") == "1"   # a side that forgets the masks
st = {}
def sdpa(i):
    q, k, v = st["qkv"]
    m, causal = st["var"][i]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if m is not None and not wrong:
        s = np.where(m, s, -np.inf) if m.dtype == bool else s + m
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ v).astype(np.float32)
for line in sys.stdin:
    m = json.loads(line)
    if m["op"] == "load":   # [B, L, H, D] files, seen as (B, H, L, D)
        st["qkv"] = [np.load(m[x]).astype(np.float64).transpose(0, 2, 1, 3) for x in "qkv"]
        st["var"] = [(None if x["mask"] is None else np.load(x["mask"]), x["causal"]) for x in m["variants"]]
        assert all(not (x["mask"] and x["causal"]) for x in m["variants"]), m
        ans = {"ok": True}
    elif m["op"] == "check":
        for i, p in enumerate(m["out"]):
            np.save(p, sdpa(i))
        ans = {"ok": True}
    elif m["op"] == "round":   # variant i takes i + 1 ms
        ans = {"times": [1e-3 * (i + 1) for i in range(len(st["var"]))]}
    else:
        st.clear()
        ans = {"ok": True}
    print(json.dumps(ans), flush=True)
PY
    expect "bench masks --vs torch through a NumPy stand-in" 0 "$ATTN" bench masks --quick --reps 2 --vs torch \
        --python python3 --torch-script fake_torch_masks.py --json-out masks_torch.json
    pycheck "masks vs torch: the stand-in's outputs pass the check, its times reach each row; kv_len rows have none" '
import json
d = json.load(open("masks_torch.json"))
assert d["torch"]["version"] == "0.0-numpy" and d["torch"]["omp_wait_policy"], d["torch"]
groups = {}
for r in d["rows"]:
    groups.setdefault(r["group"], []).append(r)
timed = 0
for g, rs in groups.items():
    sent = 0
    for r in rs:
        if r["what"].startswith("kv_len"):
            assert r["torch_note"] == "SDPA has no key lengths" and "torch_check" not in r, r
        elif "1,L]+causal" in r["what"]:
            assert "refuses is_causal" in r["torch_note"] and "torch_check" not in r, r
        elif g.endswith(" detector"):
            assert "NaN for a fully masked row" in r["torch_note"] and "torch_check" not in r, r
        else:
            assert r["torch_check"] == "pass" and r["torch_rel"] <= 1e-5, r
            sent += 1   # the i-th variant sent to the side took i ms
            assert r["torch_median_ms"] == r["torch_min_ms"] == r["torch_max_ms"] == sent, r
            assert abs(r["attn_over_torch"] - r["attn_median_ms"] / sent) <= 1e-3 * r["attn_over_torch"], r
            timed += 1
assert timed == 13, timed   # 2 shapes x (4 padding masks + 2 causal ones) + the random mask
'
    expect "bench masks --vs torch: a side that forgets the masks fails the check" 1 env FAKE_MASKS_WRONG=1 \
        "$ATTN" bench masks --quick --reps 1 --vs torch --python python3 --torch-script fake_torch_masks.py
    n=$(grep -c 'torch FAILED' out.txt)
    if [ "$n" -eq 13 ]; then ok "  13 torch rows FAILED"; else bad "  expected 13 torch FAILED rows, got $n"; sed 's/^/    /' out.txt | head -25; fi
    expect "bench masks --vs torch --plant-error fails attn's checks and the side's" 1 "$ATTN" bench masks \
        --quick --reps 1 --vs torch --python python3 --torch-script fake_torch_masks.py --plant-error
    n=$(grep -c 'torch FAILED' out.txt)
    if [ "$n" -eq 13 ]; then ok "  13 torch rows FAILED"; else bad "  expected 13 torch FAILED rows, got $n"; sed 's/^/    /' out.txt | head -25; fi
else
    echo "skip - bench masks --vs torch through a NumPy stand-in: no numpy in python3"
fi

# ---- attn bench --models (bench/bench_models.c, scripts/bench_hf.py) ---------------------------
expect "bench --models, a Python without torch" 1 "$ATTN" bench --models --vs torch --python ./nopy
if grep -q "cannot import torch" err.txt; then ok "  says so: $(grep 'cannot import' err.txt)"; else
    bad "  no clear message"; cat err.txt out.txt; fi
# torch importable (a stub, through --attn-site) but no transformers: every row is skipped
# with the reason, and the run goes on (exit 0)
mkdir -p stub/torch && echo '__version__ = "0.0-stub"' > stub/torch/__init__.py
printf '#!/bin/sh\nexec python3 -S "$@"\n' > sitepy && chmod +x sitepy
expect "bench --models without transformers" 0 "$ATTN" bench --models --python ./sitepy --attn-site stub --json-out models0.json
if [ "$(grep -c 'skipped: transformers is not installed' out.txt)" -eq 2 ]; then ok "  both rows skipped, with the reason"; else
    bad "  expected two skipped rows"; cat out.txt err.txt; fi
pycheck "models JSON: the skips" '
import json
d = json.load(open("models0.json"))
assert d["bench"] == "models" and [r["row"] for r in d["rows"]] == ["llama", "minilm"], d
assert all("transformers is not installed" in r["skip"] for r in d["rows"]), d
'
for args in "--bogus" "--rows gpt" "--vs onnx" "--reps 0" "--attn-site /nonexistent"; do
    # shellcheck disable=SC2086
    expect "bench --models usage error: $args" 2 "$ATTN" bench --models --python python3 $args
    if [ "$(wc -l <err.txt)" -eq 1 ] && [ ! -s out.txt ]; then ok "  one line on stderr: $(cat err.txt)"; else
        bad "  expected one line on stderr and nothing on stdout"; cat err.txt out.txt; fi
done
cat > fake_hf.py <<'PY'
import json, sys
args = sys.argv[1:]
assert "--json" in args and args[args.index("--threads") + 1] == "2", args
print(json.dumps({"header": {"torch": "0.0", "transformers": "0.0", "attn": "0.0", "attn_file": "x",
                             "kernel": "k", "threads": 2, "reps": 5}}))
for impl, ms in [("attn", 100.0), ("sdpa", 125.0), ("eager", 400.0)]:
    print(json.dumps({"row": "llama", "impl": impl, "info": "B=1 L=2048", "median_ms": ms,
                      "min_ms": ms - 1, "max_ms": ms + 1, "check_rel": 1e-7}))
if "--plant-error" in args:
    print(json.dumps({"row": "minilm", "error": "output differs from eager's"}))
    sys.exit(1)
print(json.dumps({"row": "minilm", "skip": "the model package is not installed"}))
PY
expect "bench --models through a stand-in" 0 "$ATTN" bench --models --python python3 --hf-script fake_hf.py --json-out models.json
pycheck "models: rows, attn/this ratios, the skip" '
import json
d = json.load(open("models.json"))
rows = d["rows"]
assert [r.get("impl") for r in rows] == ["attn", "sdpa", "eager", None], rows
assert rows[0]["attn_over_this"] == 1 and abs(rows[1]["attn_over_this"] - 0.8) < 1e-9 and abs(rows[2]["attn_over_this"] - 0.25) < 1e-9, rows
assert rows[3]["skip"] == "the model package is not installed" and d["peer"]["header"]["torch"] == "0.0", d
table = open("out.txt").read()
assert "llama   sdpa" in table and "0.80" in table and "minilm  skipped" in table, table
'
expect "bench --models: a failed row fails the run" 1 "$ATTN" bench --models --python python3 --hf-script fake_hf.py --plant-error
grep -q "minilm  FAILED: output differs" out.txt && ok "  and is shown" || { bad "  no FAILED row"; cat out.txt; }

finish
