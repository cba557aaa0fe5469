#!/usr/bin/env bash
# test_tune.sh — `attn tune` (tools/attn/cli_tune.c) through its files and exit codes:
#                one quick tune into a fresh folder, its file's shape, --show on it and on
#                a foreign copy, and each refusal (exit 2 for usage, 1 for a file, one
#                line on stderr, no file left behind); ATTN_TUNE=auto's tune at the command's start.
#
# Usage: bash tests/test_tune.sh [path/to/attn]      (default build/attn)
#
# What it is not: a test of the wisdom's reading and use (tests/test_wisdom.c) or of what
# the tuner chooses (timings are not checked: any valid choice passes). About 10 s on 2
# cores: one `attn tune --quick`, and one under ATTN_TUNE=auto.

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

# ATTN_TUNE=auto: `attn demo` in a process that finds no file at the default path runs the
# quick tune before its subcommand (attn_tune_auto), writes the file (its folder made) and
# says so once; a second process reads it and tunes nothing; a corrupt file is warned
# about and left as it is; ATTN_ISA set: one warning, no file. `timeout`: a tune that
# waited on a pthread_once of its own would hang here.
# auto_run DIR [VAR=VALUE...]: attn demo under ATTN_TUNE=auto with XDG_CACHE_HOME=DIR
auto_run() {
    local dir=$1
    shift
    env ATTN_TUNE=auto XDG_CACHE_HOME="$dir" OMP_NUM_THREADS=2 "$@" \
        timeout 300 "$ATTN" demo --section seed000 >out.txt 2>err.txt
}
W="$T/auto/attn/wisdom"
auto_run "$T/auto"
check "ATTN_TUNE=auto, no file: exits 0 ($(tail -n 1 err.txt))" $?
grep -q "3.1  query" out.txt
check "ATTN_TUNE=auto: the demo's output is there" $?
[ -f "$W" ]
check "ATTN_TUNE=auto wrote \$XDG_CACHE_HOME/attn/wisdom" $?
lines=$(wc -l <err.txt)
tuned=$(grep -c -E "^attn: ATTN_TUNE=auto: tuned 5 classes in [0-9.]+ s, wrote $W\$" err.txt)
check "ATTN_TUNE=auto: one line on stderr, the tuning's ($tuned of $lines)" \
    "$([ "$lines" = 1 ] && [ "$tuned" = 1 ] && echo 0 || echo 1)"
left=$(find "$T/auto" -name '*.tmp.*' 2>/dev/null | wc -l)
check "ATTN_TUNE=auto: no temporary file left ($left)" "$([ "$left" = 0 ] && echo 0 || echo 1)"
"$ATTN" tune --show "$W" >out.txt 2>err.txt && grep -q "this process would use it" out.txt
check "ATTN_TUNE=auto: --show accepts the file" $?
cp "$W" auto.copy
auto_run "$T/auto"
check "ATTN_TUNE=auto, the file there: exits 0" $?
[ ! -s err.txt ]
check "ATTN_TUNE=auto, the file there: nothing on stderr (not tuned again)" $?
cmp -s "$W" auto.copy
check "ATTN_TUNE=auto, the file there: the file unchanged" $?

mkdir -p "$T/bad/attn" && printf 'attn-wisdom 1\nnot a cpu line\n' >"$T/bad/attn/wisdom"
cp "$T/bad/attn/wisdom" bad.copy
auto_run "$T/bad"
check "ATTN_TUNE=auto, a corrupt file: exits 0" $?
lines=$(wc -l <err.txt)
grep -q "^attn: wisdom $T/bad/attn/wisdom ignored: " err.txt && [ "$lines" = 1 ]
check "ATTN_TUNE=auto, a corrupt file: one warning ($lines lines)" $?
cmp -s "$T/bad/attn/wisdom" bad.copy
check "ATTN_TUNE=auto, a corrupt file: left untouched" $?

auto_run "$T/isa" ATTN_ISA=generic
check "ATTN_TUNE=auto with ATTN_ISA: exits 0" $?
lines=$(wc -l <err.txt)
grep -q "^attn: ATTN_TUNE=auto: not tuned, .*ATTN_ISA" err.txt && [ "$lines" = 1 ]
check "ATTN_TUNE=auto with ATTN_ISA: one warning ($lines lines)" $?
[ ! -e "$T/isa/attn/wisdom" ]
check "ATTN_TUNE=auto with ATTN_ISA: no file" $?

finish
