#!/usr/bin/env bash
# test_install.sh — installs the library into a temporary prefix with `make install`,
# then builds the README's C example against it with pkg-config and runs it, and runs
# the installed `attn demo`. Checks what a user who follows the README gets.
#
# Usage: bash tests/test_install.sh [BUILD_DIR]   (from the repo root; default build)
. "$(dirname "$0")/lib.sh"
suite install
build=${1:-build}
tmp_dir
tmp=$T
prefix=$tmp/prefix

if make -s BUILD="$build" install PREFIX="$prefix" >"$tmp/install.log" 2>&1; then ok; else
    bad "make install: $(tail -n 3 "$tmp/install.log")"; fi
for f in include/attn.h lib/libattn.so lib/libattn.a lib/pkgconfig/attn.pc bin/attn; do
    if [ -e "$prefix/$f" ]; then ok; else bad "not installed: $f"; fi
done

# The C block that follows the <!-- example:c --> marker in the README.
awk '/<!-- example:c -->/ {m = 1; next} m && /^```c/ {c = 1; next} c && /^```/ {exit} c' \
    README.md >"$tmp/example.c"
if [ -s "$tmp/example.c" ]; then ok; else bad "no C example found in README.md"; fi

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
if cc -std=c11 -Wall -Werror "$tmp/example.c" $(pkg-config --cflags --libs attn) \
    -o "$tmp/example" 2>"$tmp/cc.log"; then ok; else bad "example does not build: $(cat "$tmp/cc.log")"; fi
out=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/example" 2>&1)
if [ "$out" = "8.04 1.96" ]; then ok; else bad "example printed '$out', expected '8.04 1.96'"; fi
# it must have run against the installed shared library
if LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/example" | grep -q "$prefix/lib/libattn.so"; then ok; else
    bad "example is not linked against the installed libattn.so"; fi

demo=$("$prefix/bin/attn" demo 2>&1)
for want in "a1 = 0.804   a2 = 0.196" "= (8.04, 1.96)" "output = 5" "a1 = 0.8808" \
    "d_k = 64: 8.0" "= 16" "row 0: [1.00, 0.00, 0.00, 0.00]" \
    "Seed 002 section 4" "Seed 003 section 6" "x (2, 8, 16) -> y (2, 8, 16)" \
    "identical heads: loss"; do
    if grep -qF -- "$want" <<<"$demo"; then ok; else bad "attn demo lacks '$want'"; fi
done

finish
