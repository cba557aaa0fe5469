#!/bin/sh
# bench_ggml.sh — attn's quantized-cache decoding beside llama.cpp's (ggml's)
# ggml_flash_attn_ext on the same shapes (docs/BENCHMARKS.md, "The serving caches").
# Optional, like the PyTorch comparisons: not run by make check.
#
#   bash scripts/bench_ggml.sh [--quick] [--threads T] [--reps N] [--b B] [--mask] [--rebuild]
#
#   --quick     Lk 2048 and 3 reps (an end-to-end run, not a measurement)
#   --threads T threads of both sides (default 2)
#   --reps N    timed calls per dtype, the median printed (default 21)
#   --b B       batch of the ggml side (default 1); attn bench --q8 is B = 1 only, so at
#               B != 1 the attn column is n/a
#   --mask      give ggml an all-zero f16 mask (llama.cpp always passes one) instead of none
#   --rebuild   rebuild ggml even when the scratch build is there
#
# ggml is built outside the repo, in ${TMPDIR:-/tmp}/attn-ggml (reused when built from the
# same source): CPU backend only, -DGGML_NATIVE=ON, Release, no CUDA, Metal or BLAS, no
# OpenMP (ggml's own threadpool). Its source: GGML_SRC, a git dir (bare or not) or a source
# folder; default /work/.mirror/ggml-org+ggml/repo when present, else a shallow clone of
# https://github.com/ggml-org/ggml. Nothing of ggml is copied into the repo: the driver,
# bench/peers/ggml_fa.c, is ours and calls ggml's public API. When ggml cannot be obtained
# or built the script says why and exits 0 ("skipped"); when ggml's answer is wrong (above
# 5e-2 relative against the float64 reference) the driver prints FAILED and this exits 1.
set -eu
cd "$(dirname "$0")/.."
repo=$(pwd)

quick=0 threads=2 reps=21 b=1 mask='' rebuild=0
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --reps) reps=$2; shift ;;
    --b) b=$2; shift ;;
    --mask) mask=--mask ;;
    --rebuild) rebuild=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_ggml.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
[ "$quick" = 1 ] && [ "$reps" = 21 ] && reps=3

skip() {
    echo "ggml comparison skipped: $*"
    exit 0
}

scratch=${TMPDIR:-/tmp}/attn-ggml
case $scratch in "$repo"|"$repo"/*) skip "the scratch folder $scratch is inside the repo" ;; esac
mkdir -p "$scratch" || skip "cannot create $scratch"
command -v cmake >/dev/null 2>&1 || skip "no cmake"
command -v git >/dev/null 2>&1 || skip "no git"
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || skip "no C compiler ($cc)"
command -v "${CXX:-c++}" >/dev/null 2>&1 || skip "no C++ compiler (${CXX:-c++}), which ggml's CPU backend needs"

# the ggml source: $scratch/src, and its identity in $scratch/src.id
src=${GGML_SRC:-}
if [ -z "$src" ] && [ -d /work/.mirror/ggml-org+ggml/repo ]; then src=/work/.mirror/ggml-org+ggml/repo; fi
if [ -n "$src" ]; then
    [ -e "$src" ] || skip "GGML_SRC=$src does not exist"
    if [ -f "$src/CMakeLists.txt" ] && [ -f "$src/include/ggml.h" ]; then
        id="dir $(cd "$src" && pwd) $(git -C "$src" rev-parse HEAD 2>/dev/null || echo nogit)"
        srcdir=$(cd "$src" && pwd)
    elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        id="git $(git --git-dir="$src" rev-parse HEAD)"
        srcdir=$scratch/src
        if [ "$(cat "$scratch/src.id" 2>/dev/null)" != "$id" ]; then
            rm -rf "$scratch/src" "$scratch/src.id" && mkdir -p "$scratch/src"
            git --git-dir="$src" archive HEAD | tar -x -C "$scratch/src" ||
                skip "cannot extract the ggml source from $src"
            echo "$id" > "$scratch/src.id"
        fi
    else
        skip "GGML_SRC=$src is neither a git dir nor a ggml source folder"
    fi
else
    srcdir=$scratch/src
    if [ ! -f "$scratch/src/CMakeLists.txt" ] || ! grep -q '^git https' "$scratch/src.id" 2>/dev/null; then
        rm -rf "$scratch/src" "$scratch/src.id"
        git clone -q --depth 1 https://github.com/ggml-org/ggml "$scratch/src" 2>"$scratch/clone.log" ||
            skip "cannot clone https://github.com/ggml-org/ggml ($(tail -1 "$scratch/clone.log"))"
        echo "git https $(git -C "$scratch/src" rev-parse HEAD)" > "$scratch/src.id"
    fi
    id=$(cat "$scratch/src.id")
fi

# ggml, built once per source
build=$scratch/build
libs="$build/src/libggml.a $build/src/libggml-cpu.a $build/src/libggml-base.a"
built=1
for l in $libs; do [ -f "$l" ] || built=0; done
[ "$(cat "$build/built.id" 2>/dev/null)" = "$id" ] || built=0
[ "$rebuild" = 1 ] && built=0
if [ "$built" = 0 ]; then
    echo "building ggml ($id) in $build ..."
    rm -rf "$build"
    cmake -S "$srcdir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=OFF \
        -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
        >"$scratch/cmake.log" 2>&1 || skip "ggml's cmake configure failed (see $scratch/cmake.log)"
    cmake --build "$build" -j 2 >"$scratch/build.log" 2>&1 ||
        skip "ggml's build failed (see $scratch/build.log)"
    for l in $libs; do [ -f "$l" ] || skip "ggml's build gave no $l"; done
    echo "$id" > "$build/built.id"
fi

# the driver, ours, against ggml's public headers
# shellcheck disable=SC2086
$cc -O2 -std=c11 -Wall -I"$srcdir/include" bench/peers/ggml_fa.c -o "$scratch/ggml_fa" \
    $libs -lstdc++ -lm -lpthread 2>"$scratch/driver.log" ||
    skip "the driver bench/peers/ggml_fa.c does not build against this ggml (see $scratch/driver.log)"

# attn
make -s -j2 all >"$scratch/attn-make.log" 2>&1 || {
    cat "$scratch/attn-make.log" >&2
    echo "bench_ggml.sh: attn's build failed" >&2
    exit 1
}

qflag=
[ "$quick" = 1 ] && qflag=--quick
gout=$scratch/ggml.out aout=$scratch/attn.out
echo "== ggml: $scratch/ggml_fa $qflag --b $b --threads $threads --reps $reps $mask"
grc=0
"$scratch/ggml_fa" $qflag --b "$b" --threads "$threads" --reps "$reps" $mask >"$gout" 2>&1 || grc=$?
cat "$gout"
if [ "$grc" != 0 ]; then
    echo "bench_ggml.sh: ggml's check FAILED or the driver failed (exit $grc)"
    exit 1
fi
if [ "$b" = 1 ]; then
    echo "== attn: build/attn bench --q8 $qflag --threads $threads --reps $reps"
    arc=0
    build/attn bench --q8 $qflag --threads "$threads" --reps "$reps" >"$aout" 2>&1 || arc=$?
    cat "$aout"
    [ "$arc" = 0 ] || { echo "bench_ggml.sh: attn bench --q8 failed (exit $arc)"; exit 1; }
else
    echo "== attn: bench --q8 is B = 1 only: no attn column at B = $b"
    : >"$aout"
fi

# the table: ggml's row per dtype beside attn's (its median ms, column 4 of bench --q8's rows)
kernel=$(sed -n 's/.*, kernel \([^ ]*\).*/\1/p' "$aout" | head -1)
echo
echo "== ggml_flash_attn_ext vs attn, decoding B=$b Hq=32 Hkv=8 Lq=1 Lk=$([ "$quick" = 1 ] && echo 2048 || echo 16384) D=128, $threads threads, median of $reps"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), family $(grep -m1 'cpu family' /proc/cpuinfo | sed 's/.*: //'), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | sed 's/.*: //')"
echo "attn kernel: ${kernel:-n/a}; ggml: $id"
awk -v gfile="$gout" -v afile="$aout" '
    BEGIN {
        while ((getline l < gfile) > 0) {
            n = split(l, f, " ")
            if (f[1] != "ggml") continue
            for (i = 3; i < n; i++) if (f[i] == "median_ms") g[f[2]] = f[i + 1]
            for (i = 3; i < n; i++) if (f[i] == "rel_err") ge[f[2]] = f[i + 1]
        }
        hdr = 0
        while ((getline l < afile) > 0) {
            n = split(l, f, " ")
            if (f[1] == "cache" && f[2] == "bytes/el") { hdr = 1; continue }
            if (hdr && n >= 4) a[f[1]] = f[4]
            if (f[2] == "uniform" && f[3] == "data:")
                for (i = 4; i < n; i++) if (f[i] == "rel") { ae[f[1]] = f[i + 1]; break }
        }
        printf "%-20s %9s %9s %10s %10s %20s\n", "dtype (ggml / attn)", "ggml err", "attn err", "ggml ms", "attn ms", "attn speed / ggml"
        row("f32", "float32"); row("f16", "bfloat16"); row("q8_0", "q8_0"); row("q4_0", "q4_0")
        print "(err: relative Frobenius error of O against the float64 softmax(QK^T/sqrt(D))V over the same"
        print " cache, dequantized: the arithmetic of each side alone, on its own uniform [-1, 1) draws;"
        print " f16 / bfloat16: both 2 bytes a value, not the same format: attn has no float16 cache row)"
    }
    function row(gn, an,   gm, am, r) {
        gm = (gn in g) ? g[gn] : "n/a"; am = (an in a) ? a[an] : "n/a"
        r = (gm != "n/a" && am != "n/a" && am + 0 > 0) ? sprintf("%.2fx", gm / am) : "n/a"
        printf "%-20s %9s %9s %10s %10s %20s\n", gn " / " an, (gn in ge) ? ge[gn] : "n/a", (an in ae) ? ae[an] : "n/a", gm, am, r
    }'
