#!/usr/bin/env bash
# run.sh — the Python suite as scripts/check.sh runs it: builds the working tree's `attn`
# package with pip into a temporary folder (no build isolation, so no network; nothing is
# installed into the environment), runs pytest on tests/python against that build, and
# closes with "python: N passed, N failed". Skips are not failures; pytest's "no tests
# ran" (exit 5) is 0 passed, 0 failed.
#
# Usage: bash tests/python/run.sh [pytest arguments]
set -u
cd "$(dirname "$0")/../.."

summary() { echo "python: $1 passed, $2 failed"; [ "$2" -eq 0 ]; exit $?; }

if ! python3 -c "import numpy, pytest, setuptools, wheel, pip" 2>/dev/null; then
    echo "python: pip, numpy, pytest, setuptools and wheel are needed (bash scripts/deps.sh)"
    summary 0 1
fi
site=$(mktemp -d)
out=$(mktemp)
trap 'rm -rf "$site" "$out"' EXIT

rm -rf build/python   # setup.py's build folder: a fresh build of the tree, nothing stale
# --target writes only to the temporary folder, so a Debian-managed Python may allow it
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --target "$site" . 2>&1 |
    grep -v "Running pip as the 'root' user"
if [ ! -d "$site/attn" ]; then
    echo "python: pip could not build the package"
    summary 0 1
fi

PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/python "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
last=$(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$out" | tail -n 1)
count() { grep -oE "[0-9]+ $1" <<<"$last" | head -n 1 | cut -d' ' -f1; }
passed=$(count passed)
failed=$(count failed)
errors=$(count error)
passed=${passed:-0}
failed=$(( ${failed:-0} + ${errors:-0} ))
case $rc in
0 | 5) ;;                                            # 5: no tests collected
1) [ "$failed" -gt 0 ] || failed=1 ;;
*) echo "python: pytest exited $rc"; failed=$((failed + 1)) ;;
esac
summary "$passed" "$failed"
