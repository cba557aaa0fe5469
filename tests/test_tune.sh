#!/usr/bin/env bash
# test_tune.sh — `attn tune` (tools/attn/cli_tune.c) through its files and exit codes:
#                one quick tune into a fresh folder, its file's shape, --show on it and on
#                a foreign copy, and each refusal (exit 2 for usage, 1 for a file, one
#                line on stderr, no file left behind).
#
# Usage: bash tests/test_tune.sh [path/to/attn]      (default build/attn)
#
# What it is not: a test of the wisdom's reading and use (tests/test_wisdom.c) or of what
# the tuner chooses (timings are not checked: any valid choice passes). About 5 s on 2
# cores: one `attn tune --quick`.

. "$(dirname "$0")/lib.sh"
suite tune
attn_arg "${1:-}"
[ -x "$ATTN" ] || cannot_run "needs an executable attn ($ATTN)"
tmp_dir cd
# never the developer's own wisdom
export XDG_CACHE_HOME=$T/cache
unset ATTN_WISDOM ATTN_ISA ATTN_FWD_BQ ATTN_FWD_BK ATTN_BWD_BQ
export ATTN_TUNE=0

# expect_fail CODE WHAT CMD...: exit status CODE, exactly one line on stderr
expect_fail() {
    local code=$1 what=$2 rc lines
    shift 2
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    check "$what: exit $rc (expected $code)" "$([ "$rc" = "$code" ] && echo 0 || echo 1)"
    check "$what: $lines lines on stderr (expected 1)" "$([ "$lines" = 1 ] && echo 0 || echo 1)"
}

"$ATTN" tune --help >out.txt 2>err.txt
check "attn tune --help exits 0" $?
grep -q -- "--quick" out.txt
check "attn tune --help names --quick" $?

expect_fail 2 "an unknown option" "$ATTN" tune --fast
expect_fail 2 "--threads 0" "$ATTN" tune --threads 0
expect_fail 2 "--show with --quick" "$ATTN" tune --show --quick
expect_fail 1 "ATTN_ISA set" env ATTN_ISA=generic "$ATTN" tune --quick --out "$T/isa/w"
[ ! -e "$T/isa/w" ]
check "ATTN_ISA set: no file written" $?
expect_fail 1 "an unwritable folder" "$ATTN" tune --quick --out /proc/attn-no-such/w
expect_fail 1 "--show of a missing file" "$ATTN" tune --show "$T/missing"

# one quick tune into a folder that does not exist yet
"$ATTN" tune --quick --threads 2 --out "$T/sub/dir/w" >out.txt 2>err.txt
check "attn tune --quick exits 0 ($(tail -n 1 err.txt))" $?
[ -f "$T/sub/dir/w" ]
check "attn tune --quick wrote its file" $?
left=$(find "$T/sub/dir" -name '*.tmp.*' | wc -l)
check "no temporary file left ($left)" "$([ "$left" = 0 ] && echo 0 || echo 1)"
[ "$(sed -n 1p "$T/sub/dir/w")" = "attn-wisdom 1" ]
check "line 1 is the header" $?
sed -n 2p "$T/sub/dir/w" | grep -q "^cpu vendor=.* family=[0-9]* model=[0-9]* isa=[a-z0-9_,]* version="
check "line 2 is the cpu line" $?
classes=$(grep -c -E '^(prefill|decode|backward) [a-z0-9_]+ d[0-9]+ [a-z]+ g[0-9] = kernel=[a-z0-9_]+ bq=[a-z0-9]+ bk=[a-z0-9]+ split=[a-z0-9]+$' "$T/sub/dir/w")
check "5 class lines ($classes)" "$([ "$classes" = 5 ] && echo 0 || echo 1)"
grep -q "^#   static [0-9.]* ms, chosen [0-9.]* ms" "$T/sub/dir/w"
check "the candidates' times are in the comments" $?
grep -q "wrote $T/sub/dir/w" out.txt
check "attn tune says where it wrote" $?
lines=$(grep -c "^attn tune: " err.txt)
check "a line per class on stderr ($lines)" "$([ "$lines" = 5 ] && echo 0 || echo 1)"

"$ATTN" tune --show "$T/sub/dir/w" >out.txt 2>err.txt
check "--show of the file exits 0" $?
grep -q "this process would use it" out.txt && grep -q "^prefill f32 d64 none g1 = " out.txt &&
    grep -q "^this CPU: cpu vendor=" out.txt
check "--show prints the verdict, the cpu line and the classes" $?

# the default path: $XDG_CACHE_HOME/attn/wisdom
mkdir -p "$XDG_CACHE_HOME/attn" && cp "$T/sub/dir/w" "$XDG_CACHE_HOME/attn/wisdom"
"$ATTN" tune --show >out.txt 2>err.txt
check "--show without FILE reads \$XDG_CACHE_HOME/attn/wisdom" $?
grep -q "^wisdom $XDG_CACHE_HOME/attn/wisdom" out.txt
check "--show names the default path" $?

# the same file made on another CPU: --show says it would be ignored, and exits 1
sed '2s/^cpu vendor=[^ ]*/cpu vendor=OtherVendor/' "$T/sub/dir/w" >foreign
"$ATTN" tune --show foreign >out.txt 2>err.txt
check "--show of a foreign file exits 1" "$([ $? = 1 ] && echo 0 || echo 1)"
grep -q "would ignore it: .*line 2" out.txt
check "--show says why it would be ignored" $?

finish
