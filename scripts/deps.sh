#!/usr/bin/env bash
# deps.sh — installs what building and testing attn needs and this machine lacks:
# a C compiler with OpenMP (gcc), make, pkg-config, libpng's headers (the loss curves
# of `attn train`) and OpenBLAS (the projections), from Debian's packages; for the
# Python package (tests/python/run.sh): Python's headers, and NumPy, pytest, setuptools
# and wheel with pip (Debian's packages where pip is missing or may not install).
# On x86-64 also an AArch64 cross compiler and qemu-user, for the suite's run of the
# portable build on another CPU (skipped, not failed, where they cannot be installed).
# Open MPI (libattn_mpi's ring attention; skipped where it cannot be installed).
# Idempotent and quiet when everything is there already.
set -eu
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
[ -f /usr/include/png.h ] || missing+=(libpng-dev)
# OpenBLAS (its OpenMP build, which shares the library's OpenMP threads) for the
# projections' matrix products
pkg-config --exists openblas 2>/dev/null || missing+=(libopenblas-openmp-dev)
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ "$(uname -m)" = x86_64 ] && { ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 ||
    ! command -v qemu-aarch64 >/dev/null 2>&1; }; then
    echo "deps: installing gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    { $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; } ||
        echo "deps: the AArch64 tools did not install; make check will skip that run"
fi

# Open MPI, for libattn_mpi (ring attention) and its suite under mpirun (skipped, not
# failed, where it cannot be installed: the core library never needs it).
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    echo "deps: installing libopenmpi-dev openmpi-bin"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    { $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenmpi-dev openmpi-bin; } ||
        echo "deps: Open MPI did not install; make check will skip the ring's suite"
fi
# mpi4py (optional), for attn.ring's Python binding and tests/python/test_ring.py:
# built from source against Open MPI's mpicc; skipped, not failed, where it will not build
if command -v mpicc >/dev/null 2>&1 && ! python3 -c 'import mpi4py' >/dev/null 2>&1; then
    echo "deps: installing mpi4py (optional)"
    python3 -m pip install -q mpi4py ||
        echo "deps: mpi4py did not install; the Python ring test will be skipped"
fi

# The Python package is built without isolation (no network at test time), so its build
# tools are installed here with its test dependencies.
py_ok() { python3 -c "import numpy, pytest, setuptools, wheel, pip" 2>/dev/null; }
if ! py_ok; then
    echo "deps: installing numpy pytest setuptools wheel (pip)"
    python3 -m pip install -q --disable-pip-version-check numpy pytest setuptools wheel ||
        true
fi
headers=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if ! py_ok || [ ! -f "$headers/Python.h" ]; then
    echo "deps: installing python3-dev python3-pip python3-numpy python3-pytest python3-setuptools python3-wheel"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-dev python3-pip \
        python3-numpy python3-pytest python3-setuptools python3-wheel
fi

# The hardening runs of make check (scripts/check_harden.sh): clang with its libFuzzer
# runtime (Debian's libclang-rt-<version>-dev, libclang-rt-14-dev for bookworm's clang 14)
# for the fuzzers, valgrind for memcheck; skipped, not failed, where they cannot be
# installed (make check then prints why each part did not run).
fuzz_ok() {
    local d
    d=$(mktemp -d)
    printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
        'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }' >"$d/p.c"
    clang -fsanitize=fuzzer,address "$d/p.c" -o "$d/p" >/dev/null 2>&1
    local rc=$?
    rm -rf "$d"
    return $rc
}
hard=()
command -v valgrind >/dev/null 2>&1 || hard+=(valgrind)
if ! command -v clang >/dev/null 2>&1; then
    hard+=(clang libclang-rt-dev)
elif ! fuzz_ok; then
    hard+=("libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev")
fi
if [ ${#hard[@]} -gt 0 ]; then
    echo "deps: installing ${hard[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    { $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${hard[@]}"; } ||
        echo "deps: ${hard[*]} did not install; make check will skip the runs that need them"
fi
