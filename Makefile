# Makefile — builds libattn (shared and static), the attn command and the test suites.
#
#   make                 library + command into build/
#   make demo            build, then run `attn demo`
#   make check           the whole test suite (also what .ci/run runs)
#   make install PREFIX=/usr/local   (DESTDIR honoured)
#
# Portable flags only: the library is built for baseline x86-64 (or whatever CC targets);
# no -march=native, and never the fast-math option (it assumes no Inf or NaN).

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
# OPENMP=-fopenmp-simd builds without the OpenMP runtime (one thread per call, the simd
# pragmas kept), for the ThreadSanitizer run of scripts/check.sh (libgomp is not
# instrumented for it)
OPENMP  ?= -fopenmp

CFLAGS_BASE = -std=c11 $(OPT) -g $(OPENMP) -Wall -Wextra -Wshadow -Wno-unused-parameter \
              -fno-strict-aliasing -D_POSIX_C_SOURCE=200809L -Iinclude $(SAN)
LIB_CFLAGS  = $(CFLAGS_BASE) -fPIC -fvisibility=hidden $(if $(SAN),-DATTN_SANITIZED)

# The BLAS of the projections (src/core/blas.c): OpenBLAS through pkg-config by default; any
# other CBLAS with  make BLAS=name BLAS_CFLAGS=-I... BLAS_LIBS="-L... -lcblas"  (name is
# what `attn --version` prints); BLAS=none builds without one (calls that need it return
# ATTN_ERR_UNSUPPORTED, and `make check` fails on x86-64 unless ATTN_CHECK_NO_BLAS=1).
# SBGEMM=1 adds cblas_sbgemm's bfloat16 products (a BLAS that exports it: an OpenBLAS
# built with BUILD_BFLOAT16; Debian's 0.3.21 does not).
BLAS ?= openblas
ifeq ($(BLAS),none)
BLAS_CFLAGS :=
BLAS_LIBS   :=
BLAS_DEFS   :=
else ifeq ($(BLAS),openblas)
ifeq ($(origin BLAS_LIBS),undefined)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null)
endif
BLAS_DEFS   := $(if $(BLAS_LIBS),-DATTN_HAVE_CBLAS -DATTN_BLAS_OPENBLAS)
else
BLAS_DEFS   := -DATTN_HAVE_CBLAS -DATTN_BLAS_NAME='"$(BLAS)"'
endif
SBGEMM ?= 0
ifeq ($(SBGEMM),1)
BLAS_DEFS += -DATTN_HAVE_SBGEMM
endif
LIB_CFLAGS += $(BLAS_CFLAGS) $(BLAS_DEFS)
LDLIBS      = $(BLAS_LIBS) -lm -lpthread

# the library: a folder per concern (src/core, kernels, forward, backward, cache, varlen, mha,
# additive, tune; README.md "Layout"), the kernels' own folders under src/kernels/<isa>;
# src/mpi is libattn_mpi's
LIB_SRC   = $(filter-out src/mpi/%,$(wildcard src/*/*.c)) $(wildcard src/kernels/*/*.c)
LIB_OBJ   = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRC))
# Everything outside the library that links into the attn command, one folder per room
# (README.md, "Layout"): the command itself (tools/attn), what it shares with the tests and
# the bench (tools/common), the benchmark (bench) and the example applications
# (examples/<name>). Sources are picked up by folder, so a file moved or added in one of
# these folders needs no line here; a .c left at tools/ (a branch made before the rooms)
# still builds until it is moved. The headers of all of them are on the include path.
APP_DIRS  = tools/attn tools/common bench $(patsubst %/,%,$(sort $(dir $(wildcard examples/*/*.c))))
APP_INC   = $(addprefix -I,$(APP_DIRS)) -Itools
APP_HDR   = $(foreach d,$(APP_DIRS) tools,$(wildcard $(d)/*.h))
TOOL_SRC  = $(foreach d,$(APP_DIRS),$(wildcard $(d)/*.c)) $(wildcard tools/*.c)
TOOL_OBJ  = $(patsubst %.c,$(BUILD)/obj/app/%.o,$(TOOL_SRC))
# the test suites' shared code: oracle, tolerances, views, the cases of several suites
TEST_INC  = -Itests/support
TEST_HDR  = $(wildcard tests/support/*.h)
TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BIN  = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

VERSION = $(shell sed -n 's/^\#define ATTN_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)/\2/p' include/attn.h | paste -sd.)

.PHONY: all demo check tests test-bins install uninstall clean
all: $(BUILD)/libattn.so $(BUILD)/libattn.a $(BUILD)/attn $(BUILD)/attn.pc

# Only the files of a kernel's folder, src/kernels/<isa>/, get ISA flags: those of its
# line in src/kernels/list.h (the one list of kernels); the rest of the library and the
# command is baseline. On a non-x86 target the x86 folders compile to nothing and take no
# flags: the generic kernel is the only one.
X86_64 := $(findstring x86_64,$(shell $(CC) -dumpmachine))
open_paren := (
isa_flags = $(if $(X86_64),$(shell sed -n 's/^ *X[$(open_paren)]$(1), *"\([^"]*\)".*/\1/p' src/kernels/list.h))
KERNEL_ISAS := $(notdir $(patsubst %/,%,$(wildcard src/kernels/*/)))
$(foreach i,$(KERNEL_ISAS),$(eval ISA_FLAGS_$(i) := $(call isa_flags,$(i))))

$(BUILD)/obj/kernels/%.o: src/kernels/%.c include/attn.h $(wildcard src/*/*.h src/kernels/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(LIB_CFLAGS) $(ISA_FLAGS_$(firstword $(subst /, ,$*))) $(if $(SAN),$(OPT)) -Isrc -c $< -o $@

$(BUILD)/obj/%.o: src/%.c include/attn.h $(wildcard src/*/*.h src/kernels/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(LIB_CFLAGS) -Isrc -c $< -o $@

$(BUILD)/libattn.so: $(LIB_OBJ)
	$(CC) -shared $(OPENMP) -Wl,-soname,libattn.so.0 $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/libattn.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/app/%.o: %.c include/attn.h $(APP_HDR) $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(APP_INC) -Isrc -c $< -o $@

$(BUILD)/attn: $(TOOL_OBJ) $(BUILD)/libattn.a
	$(CC) $(OPENMP) $(SAN) -o $@ $(TOOL_OBJ) $(BUILD)/libattn.a $(LDLIBS) -lpng

# Test programs may use the npy reader, the naive attention and the JSON reader.
TEST_TOOL_OBJ = $(BUILD)/obj/app/tools/attn/npy.o $(BUILD)/obj/app/tools/common/naive.o \
                $(BUILD)/obj/app/tools/common/json.o
$(BUILD)/tests/%: tests/%.c $(TEST_HDR) $(APP_HDR) $(BUILD)/libattn.a $(TEST_TOOL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -Isrc $(TEST_INC) $(APP_INC) -o $@ $< $(TEST_TOOL_OBJ) $(BUILD)/libattn.a $(LDLIBS)

# test_model compiles the training model's sources in directly
$(BUILD)/tests/test_model: examples/train/model.c

tests: $(TEST_BIN) $(BUILD)/attn

# the C suites alone (the sanitizer run of scripts/check.sh: no command, bench or ring)
test-bins: $(TEST_BIN)

$(BUILD)/attn.pc: attn.pc.in include/attn.h
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@BLAS_LIBS@|$(BLAS_LIBS)|g' $< > $@

demo: all
	$(BUILD)/attn demo

check:
	bash scripts/check.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/attn.h $(DESTDIR)$(PREFIX)/include/attn.h
	install -m 755 $(BUILD)/libattn.so $(DESTDIR)$(PREFIX)/lib/libattn.so.$(VERSION)
	ln -sf libattn.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libattn.so.0
	ln -sf libattn.so.0 $(DESTDIR)$(PREFIX)/lib/libattn.so
	install -m 644 $(BUILD)/libattn.a $(DESTDIR)$(PREFIX)/lib/libattn.a
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@BLAS_LIBS@|$(BLAS_LIBS)|g' attn.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/attn.pc
	install -m 755 $(BUILD)/attn $(DESTDIR)$(PREFIX)/bin/attn

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/attn.h $(DESTDIR)$(PREFIX)/lib/libattn.* \
	      $(DESTDIR)$(PREFIX)/lib/pkgconfig/attn.pc $(DESTDIR)$(PREFIX)/bin/attn

clean:
	rm -rf $(BUILD)

# libattn_mpi (include/attn_mpi.h, src/mpi/): ring attention over MPI, built beside
# libattn only where an MPI compiler wrapper exists (scripts/deps.sh installs Open MPI),
# so that libattn itself never depends on MPI. Its suite is tests/mpi/test_ring, run by
# scripts/check.sh under mpirun; build/ring_bench times the ring (docs/RING.md).
MPICC ?= $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
MPI_SRC = $(wildcard src/mpi/*.c)
MPI_OBJ = $(patsubst src/mpi/%.c,$(BUILD)/obj/mpi/%.o,$(MPI_SRC))
all: $(BUILD)/libattn_mpi.a $(BUILD)/libattn_mpi.so $(BUILD)/attn-ring
tests: $(BUILD)/tests/mpi/test_ring $(if $(wildcard tools/mpi/ring_bench.c),$(BUILD)/ring_bench)

$(BUILD)/obj/mpi/%.o: src/mpi/%.c include/attn.h include/attn_mpi.h $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(LIB_CFLAGS) -Isrc -c $< -o $@

$(BUILD)/libattn_mpi.a: $(MPI_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/mpi/test_ring: tests/mpi/test_ring.c $(TEST_HDR) $(APP_HDR) $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_BASE) -Isrc $(TEST_INC) $(APP_INC) -o $@ $< $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a $(LDLIBS)

# the shared library, for python/attn/ring.py (ctypes): libattn.so found beside it by
# its soname (the link libattn.so.0 made here, as make install makes it)
$(BUILD)/libattn_mpi.so: $(MPI_OBJ) $(BUILD)/libattn.so
	ln -sf libattn.so $(BUILD)/libattn.so.0
	$(MPICC) -shared $(OPENMP) $(SAN) -Wl,-soname,libattn_mpi.so.0 -o $@ $(MPI_OBJ) \
	    -L$(BUILD) -lattn -Wl,-rpath,'$$ORIGIN' $(LDLIBS)

# attn-ring: what `attn ring` execs (tools/attn/cli_ring_exec.c), with attn run's parser
# and file rules; attn itself stays free of MPI
RING_TOOL_OBJ = $(patsubst %,$(BUILD)/obj/app/tools/attn/%.o,cli_run cli_files cliopt npy)
$(BUILD)/attn-ring: tools/mpi/attn_ring.c $(RING_TOOL_OBJ) $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a
	$(MPICC) $(CFLAGS_BASE) -Isrc $(APP_INC) -o $@ $< $(RING_TOOL_OBJ) $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a $(LDLIBS)

# the study of the softcap gradient tolerance (docs/RING.md); libattn only, on demand
$(BUILD)/ring_softcap_study: tools/mpi/ring_softcap_study.c $(BUILD)/libattn.a
	$(CC) $(CFLAGS_BASE) -Isrc $(APP_INC) -o $@ $< $(BUILD)/libattn.a $(LDLIBS)

$(BUILD)/ring_bench: tools/mpi/ring_bench.c $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a
	$(MPICC) $(CFLAGS_BASE) -o $@ $< $(BUILD)/libattn_mpi.a $(BUILD)/libattn.a $(LDLIBS)

# installed beside libattn: link with -lattn_mpi -lattn and the MPI wrapper's flags
.PHONY: install-mpi uninstall-mpi
install: install-mpi
uninstall: uninstall-mpi
install-mpi: $(BUILD)/libattn_mpi.a $(BUILD)/attn-ring
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/attn_mpi.h $(DESTDIR)$(PREFIX)/include/attn_mpi.h
	install -m 644 $(BUILD)/libattn_mpi.a $(DESTDIR)$(PREFIX)/lib/libattn_mpi.a
	install -m 755 $(BUILD)/attn-ring $(DESTDIR)$(PREFIX)/bin/attn-ring
uninstall-mpi:
	rm -f $(DESTDIR)$(PREFIX)/include/attn_mpi.h $(DESTDIR)$(PREFIX)/lib/libattn_mpi.a \
	      $(DESTDIR)$(PREFIX)/bin/attn-ring
endif

# ---- fuzzing: libFuzzer harnesses fuzz/fuzz_*.c (clang only) -------------------------
#   make fuzz FUZZ_TIME=60     builds them into build-fuzz/ and runs each for 60 s from
#                              its seed corpus fuzz/corpus/<harness>/ (scripts/fuzz.sh)
# The library and the tools they call are compiled with coverage, ASan and UBSan.
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZ_SAN    = -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
              -fno-omit-frame-pointer
FUZZ_BIN    = $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard fuzz/fuzz_*.c))
FUZZ_TOOL_OBJ = $(patsubst %,$(BUILD)/obj/app/tools/attn/%.o,npy cliopt cli_run cli_files)

.PHONY: fuzz fuzz-build fuzz-bins
fuzz-build:
	$(MAKE) CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) OPT=-O1 SAN="$(FUZZ_SAN)" fuzz-bins

fuzz-bins: $(FUZZ_BIN)

$(BUILD)/fuzz/%: fuzz/%.c $(wildcard fuzz/*.h) $(BUILD)/libattn.a $(FUZZ_TOOL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -fsanitize=fuzzer -Isrc $(APP_INC) -o $@ $< $(FUZZ_TOOL_OBJ) \
	    $(BUILD)/libattn.a $(LDLIBS)

fuzz: fuzz-build
	bash scripts/fuzz.sh $(FUZZ_TIME) $(FUZZ_BUILD)
