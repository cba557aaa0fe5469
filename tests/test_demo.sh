#!/usr/bin/env bash
# test_demo.sh — `attn demo`'s sections against the numbers the seeds print or imply:
#                seed 000's example 3.2 and exercises 3.1-3.5, seed 003 §4's lower-triangular rows, §5's difference at the "1e-6 level",
#                exercise 1's row sums of 1, exercise 4's identical heads, exercise 5's
#                measurement at small sizes (the suite never runs 100K tokens), the six
#                pitfalls of §7, seed 002's rows; and --section's refusals.
#
# Usage: bash tests/test_demo.sh [path/to/attn]      (default build/attn)
# What it is not: a test of the library's numerics (test_forward.c) — the numbers here are
# what a reader of the seeds checks by eye, parsed from the printed text.

. "$(dirname "$0")/lib.sh"
suite demo
attn_arg "${1:-}"
[ -x "$ATTN" ] || cannot_run "no executable $ATTN"
tmp_dir
has() { grep -qF -- "$2" <<<"$1"; echo $?; }
# a number after a fixed text, compared with awk: num TEXT OUTPUT
num() { grep -oE -- "$1 *-?[0-9.e+-]+" <<<"$2" | head -n 1 | sed -E "s/.*$1 *//"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 < b + 0) }'; echo $?; }

# seed 000, chapter 3: the digits the chapter prints (example 3.2; answers 5, 0.8808, 8,
# 16) and exercise 3.5's shift invariance: the weights of s and s + 1000 identical, equal
# to the softmax of (0, -1, -2) (computed here in float64), the LSE moved by c, and the
# naive exp(1000) overflowing
out=$("$ATTN" demo --section seed000)
check "example 3.2: weights and output" "$(grep -qF "a1 = 0.804   a2 = 0.196" <<<"$out" && grep -qF "a1 v1 + a2 v2 = (8.04, 1.96)" <<<"$out"; echo $?)"
check "exercise 3.1: 5" "$(has "$out" "3.1  query (0, 0): first component of the output = 5")"
check "exercise 3.2: 0.8808" "$(has "$out" "a1 = 0.8808")"
check "exercise 3.3: 8" "$(has "$out" "d_k = 64: 8.0 ")"
check "exercise 3.4: 16" "$(has "$out" "at 4096 tokens = 16")"
check "exercise 3.5: the weights of s and s + c, softmax(0, -1, -2), the LSE moved by c" "$(python3 -c '
import math, re, sys
t = sys.stdin.read()
a = re.search(r"weights of s +\[([0-9., ]+)\] +LSE ([0-9.]+)", t)
b = re.search(r"weights of s \+ c \[([0-9., ]+)\] +LSE ([0-9.]+) \(moved by 1000\)", t)
z = sum(math.exp(-j) for j in range(3))
want = ["%.4f" % (math.exp(-j) / z) for j in range(3)]
ok = a and b and a.group(1).split(", ") == want == b.group(1).split(", ")
ok = ok and abs(float(a.group(2)) - math.log(z)) <= 1e-4 and abs(float(b.group(2)) - 1000 - math.log(z)) <= 1e-3
sys.exit(0 if ok else 1)' <<<"$out"; echo $?)"
check "exercise 3.5: identical weights, naive exp(1000) overflows" "$(has "$out" "max |difference| = 0; naive exp(1000) = inf in float32, inf in float64")"

out=$("$ATTN" demo --section causal --png "$T/c.png")
check "section 4: row 0 sees only itself" "$(has "$out" "row 0: [1.00, 0.00, 0.00, 0.00]")"
check "section 4: row 1 ends in two zeros" "$(grep -qE 'row 1: \[0\.[0-9]+, 0\.[0-9]+, 0\.00, 0\.00\]' <<<"$out"; echo $?)"
check "section 4: row 2 ends in a zero" "$(grep -qE 'row 2: \[0\.[0-9]+, 0\.[0-9]+, 0\.[0-9]+, 0\.00\]' <<<"$out"; echo $?)"
check "section 4: the picture" "$([ -s "$T/c.png" ]; echo $?)"
plain=$("$ATTN" demo)
check "plain demo keeps section 4's numbers" "$(has "$plain" "$(grep 'row 3' <<<"$out")")"

out=$("$ATTN" demo --section sdpa)
check "section 5: max abs diff below 1e-6 ($(num "max abs diff:" "$out"))" "$(lt "$(num "max abs diff:" "$out")" 1e-6)"

out=$("$ATTN" demo --section ex1)
check "exercise 1: the shape" "$(has "$out" "attn shape [2, 1, 8, 8]")"
check "exercise 1: rows sum to 1 ($(num "= " "$(grep sum <<<"$out")"))" "$(lt "$(grep -oE '= [0-9.e+-]+;' <<<"$out" | tr -d '=;')" 1e-6)"
check "exercise 1: nothing above the diagonal" "$(has "$out" "above the diagonal: 0")"

out=$("$ATTN" demo --section ex4)
check "exercise 4: alike heads are identical" "$(grep -qE 'alike *: max .* = 0$' <<<"$out"; echo $?)"
indep=$(grep independently <<<"$out" | grep -oE '[0-9.e+-]+$')
check "exercise 4: independent heads differ ($indep)" "$(lt 0.05 "$indep")"

out=$("$ATTN" demo --section ex5 --tokens 300,2000)
check "exercise 5: both sizes measured" "$([ "$(grep -c 'tokens: .* s; peak resident set' <<<"$out")" = 2 ]; echo $?)"
check "exercise 5: the score matrix of 2000 tokens" "$(has "$out" "4e+06 elements = 16 MB in float32")"
check "exercise 5: the paragraph" "$(has "$out" "never materializes the score matrix")"

out=$("$ATTN" demo --section pitfalls)
w=($(grep -oE 'mean largest weight [0-9.]+' <<<"$out" | grep -oE '[0-9.]+$'))
check "pitfall 1: saturation without sqrt(d_k) (${w[*]})" "$(lt "${w[0]:-}" "$(awk -v x="${w[1]:-0}" 'BEGIN { print x / 4 }')")"
check "pitfall 2: the mask's status" "$(has "$out" "does not broadcast to the scores")"
check "pitfall 3: -inf masks, 0/1 does not" "$(has "$out" "with -inf: [1.00, 0.00, 0.00, 0.00]")"
# no copy of the mask: the workspace grows by the structure summary only, far less than
# the mask's own bytes
check "pitfall 4: no copy of the mask" "$(python3 -c '
import re, sys
t = sys.stdin.read().replace("\n", " ")
m = re.search(r"bias of (\d+) bytes\): +workspace (\d+) bytes, +(\d+) more than without", t)
sys.exit(0 if m and int(m.group(3)) * 16 < int(m.group(1)) else 1)' <<<"$out"; echo $?)"
check "pitfall 5: both applied" "$(grep -qE 'row 2: \[0\.00, 0\.[0-9]+, 0\.[0-9]+, 0\.00\]' <<<"$out"; echo $?)"
check "pitfall 6: transposed K read in place" "$(has "$out" "max |O - O_transposed| = 0.")"

out=$("$ATTN" demo --section compare)
check "seed 002: the dot-product row" "$(has "$out" "scaled dot-product  row 0 weights")"
# the three rows' weights, each a distribution (printed to 2 decimals: within 0.021 of 1)
check "seed 002: dot-product, additive and multi-head weights each sum to 1" "$(python3 -c '
import re, sys
t = sys.stdin.read()
rows = [re.search(name + r" +row 0 weights \[([0-9., ]+)\]", t) for name in ("dot-product", "Bahdanau.", "multi-head")]
ok = all(m and abs(sum(map(float, m.group(1).split(","))) - 1) <= 0.021 for m in rows)
sys.exit(0 if ok else 1)' <<<"$out"; echo $?)"

out=$("$ATTN" bench --head-dims --tokens 48 --png "$T/hd.png")
check "bench --head-dims: 21 head dimensions, 8 to 256" "$([ "$(grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+' <<<"$out")" = 21 ] &&
    grep -qE '^ +8 ' <<<"$out" && grep -qE '^ +256 ' <<<"$out"; echo $?)"
check "bench --head-dims: sizes not multiples of 16 marked" "$([ "$(grep -c 'not a multiple of 16' <<<"$out")" = 8 ]; echo $?)"
check "bench --head-dims: the plot" "$([ -s "$T/hd.png" ]; echo $?)"

"$ATTN" demo --section nope >/dev/null 2>"$T/err"
check "unknown section: exit 2" "$([ $? = 2 ] && [ "$(wc -l <"$T/err")" = 1 ]; echo $?)"
"$ATTN" demo --section ex5 --tokens 0 >/dev/null 2>"$T/err"
check "--tokens 0: exit 2" "$([ $? = 2 ]; echo $?)"

finish
