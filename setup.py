"""setup.py — builds the `attn` Python package: the CPython extension attn._attn, compiled
together with every C source of the library (src/<folder>/*.c), so `pip install .` needs neither
`make` nor a prebuilt libattn.

What it is not: the package metadata (pyproject.toml) or the Makefile. The flags mirror the
Makefile's portable ones: -std=c11 -O2 -fopenmp, never fast-math or -march=native.

The files of a kernel's folder (src/kernels/avx2/*.c with -mavx2 -mfma -mf16c, say) get
their ISA's flags from PER_FILE_FLAGS below, read from that kernel's line of
src/kernels/list.h, and only those files do. A file outside the kernel folders whose
name looks ISA-specific is compiled with the base flags and reported in a warning (it
still builds if it selects its ISA with __attribute__((target(...))) itself).
"""
import glob
import os
import platform
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

# Extra compiler flags for the files of a kernel's folder, src/kernels/<isa>/*.c: the
# flags of that kernel's line in src/kernels/list.h (the one list the Makefile reads too),
# on x86-64 only (elsewhere those files compile to nothing and the generic kernel is the
# only one). dispatch.c picks a kernel at run time.
def kernel_isa_flags():
    """{"src/kernels/<isa>/<file>.c": [flags]} for every kernel folder with flags."""
    with open(os.path.join(HERE, "src", "kernels", "list.h"), encoding="utf-8") as f:
        flags = dict(re.findall(r'^ *X\((\w+), *"([^"]*)"', f.read(), re.MULTILINE))
    table = {}
    for isa, value in flags.items():
        for path in glob.glob(os.path.join(HERE, "src", "kernels", isa, "*.c")):
            if value.split():
                table[os.path.relpath(path, HERE)] = value.split()
    return table


PER_FILE_FLAGS = kernel_isa_flags() if platform.machine().lower() in ("x86_64", "amd64") else {}

BASE_FLAGS = ["-std=c11", "-O2", "-fopenmp", "-fno-strict-aliasing", "-fvisibility=hidden",
              "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Wno-unused-parameter"]
LINK_FLAGS = ["-fopenmp"]


def blas_flags():
    """(compile flags, link flags) for OpenBLAS through pkg-config, as the Makefile's
    default BLAS; ([], []) without it (the calls that need a BLAS then return
    ATTN_ERR_UNSUPPORTED). ATTN_BLAS=none builds without one on purpose."""
    if os.environ.get("ATTN_BLAS", "openblas") == "none":
        return [], []
    import subprocess
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", "openblas"], check=True,
                                capture_output=True, text=True).stdout.split()
        libs = subprocess.run(["pkg-config", "--libs", "openblas"], check=True,
                              capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        sys.stderr.write("warning: no OpenBLAS found by pkg-config: built without a BLAS\n")
        return [], []
    return cflags + ["-DATTN_HAVE_CBLAS", "-DATTN_BLAS_OPENBLAS"], libs


BLAS_CFLAGS, BLAS_LIBS = blas_flags()
ISA_NAME = re.compile(r"(sse|avx|fma|neon|sve|f16c|amx)", re.IGNORECASE)


def library_sources():
    """Every C source of the library, sorted, as paths relative to the repository root: the
    folders of src/ (a folder per concern) and the kernels' own, src/kernels/<isa>/; not
    src/mpi/, which is libattn_mpi's."""
    found = (glob.glob(os.path.join(HERE, "src", "*", "*.c"))
             + glob.glob(os.path.join(HERE, "src", "kernels", "*", "*.c")))
    rel = (os.path.relpath(p, HERE) for p in found)
    return sorted(p for p in rel if not p.startswith(os.path.join("src", "mpi") + os.sep))


def version():
    """The version in include/attn.h (ATTN_VERSION_MAJOR.MINOR.PATCH)."""
    with open(os.path.join(HERE, "include", "attn.h"), encoding="utf-8") as f:
        text = f.read()
    parts = [re.search(r"#define ATTN_VERSION_%s (\d+)" % k, text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def build_jobs():
    """How many files are compiled at once: ATTN_BUILD_JOBS, else one per CPU."""
    try:
        return max(1, int(os.environ.get("ATTN_BUILD_JOBS", "0")) or os.cpu_count() or 1)
    except ValueError:
        return os.cpu_count() or 1


class BuildExt(build_ext):
    """build_ext that compiles every source itself, the files of PER_FILE_FLAGS with their
    flags, build_jobs() files at a time (setuptools compiles one extension's sources one
    after another), then links them as setuptools does."""

    def build_extension(self, ext):
        from concurrent.futures import ThreadPoolExecutor

        for s in ext.sources:
            if s.startswith("src") and s not in PER_FILE_FLAGS and ISA_NAME.search(
                    os.path.basename(s)):
                sys.stderr.write(
                    "warning: %s looks ISA-specific but has no entry in PER_FILE_FLAGS "
                    "(setup.py): compiled with the base flags only\n" % s)

        def compile_one(s):
            return self.compiler.compile(
                [s], output_dir=self.build_temp, include_dirs=ext.include_dirs,
                macros=ext.define_macros or None,
                extra_postargs=ext.extra_compile_args + PER_FILE_FLAGS.get(s, []),
                depends=ext.depends)

        # threads suffice: each compile is a compiler process
        with ThreadPoolExecutor(max_workers=build_jobs()) as pool:
            objects = [o for objs in pool.map(compile_one, ext.sources) for o in objs]
        saved = ext.sources, ext.extra_objects, ext.depends
        ext.sources = []  # compiled: setuptools links, and relinks when a source is newer
        ext.extra_objects = list(saved[1] or []) + objects
        ext.depends = list(saved[2] or []) + list(saved[0])
        try:
            super().build_extension(ext)
        finally:
            ext.sources, ext.extra_objects, ext.depends = saved


def main():
    missing = [f for f in PER_FILE_FLAGS if not os.path.exists(os.path.join(HERE, f))]
    if missing:
        sys.exit("setup.py: PER_FILE_FLAGS names missing files: %s" % ", ".join(missing))
    ext = Extension(
        "attn._attn",
        # the extension's files, one part each (python/attn/_attn.h lists what each owns)
        sources=["python/attn/_attn.c", "python/attn/_attn_import.c",
                 "python/attn/_attn_inputs.c", "python/attn/_attn_forward.c",
                 "python/attn/_attn_backward.c", "python/attn/_attn_varlen.c",
                 "python/attn/_attn_block.c",
                 "python/attn/_mha.c"] + library_sources(),
        include_dirs=["include", "src"],
        depends=["include/attn.h", "python/attn/_attn.h"] + sorted(
            os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "src", "*", "*.h"))
            + glob.glob(os.path.join(HERE, "src", "kernels", "*", "*.h"))),
        extra_compile_args=BASE_FLAGS + BLAS_CFLAGS,
        extra_link_args=LINK_FLAGS + BLAS_LIBS,
        libraries=["m", "pthread"],
    )
    os.makedirs(os.path.join(HERE, "build", "python"), exist_ok=True)
    setup(
        version=version(),
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExt},
        # under build/ (ignored, removed by make clean), beside the Makefile's objects
        options={"build": {"build_base": "build/python"},
                 "egg_info": {"egg_base": "build/python"}},
    )


if __name__ == "__main__":
    main()
