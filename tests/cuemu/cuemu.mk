# CUDA emulator build fragment, included by the Makefile after kernels/cuda/cuda.mk (whose
# CUDA_* variables it uses). Test scaffolding, not product: the emulator (tests/cuemu/) runs
# the unchanged kernels/cuda/*.cu on the CPU, so the CUDA code is checked without a GPU or nvcc;
# only the CUDA headers are needed.
#   make cuda-emu            -> build/cuda-emu/rootspec-{<mains>,cuda-bench,cuda-tests},
#                               build/cuda-emu/cuemu-selftest
#   make cuda-emu-test       -> the emulator self-test, every CUDA suite, the kernel suite
#                               again with each block's threads in reverse order, and
#                               tools/pipeline-timing.sh on build/cuda-emu binaries
#   make cuda-emu-test SAN=1 -> the same under ASan+UBSan (build/cuda-emu-san/)
#   make cuda-emu-fma-kernels -> the kernel-level suites (CUEMU_SAN_SUITES) built with FMA
#                               contraction (build/cuda-emu-fma/: -march=x86-64-v3
#                               -ffp-contract=fast, as nvcc contracts a * b + c by default),
#                               blocks in random order; cuda-emu-test runs it last
#   make cuda-emu-san-kernels -> under ASan+UBSan, only the kernel-level suites
#                               (CUEMU_SAN_SUITES) and the self-test: what .ci/run runs,
#                               since the decode-level suites take minutes each under ASan
#                               on the emulator and run unsanitized in cuda-emu-test
# The unchanged kernels/cuda/*.cu are compiled by g++ as C++ with tests/cuemu/cuemu.h forced in
# (ROOTSPEC_CUEMU); the C tests and programs link the emulator's C-linkage runtime and cuBLAS
# instead of libcudart/libcublas. Every test runs in full (about a minute on 2 cores; ~2 with
# SAN=1). The emulator's knobs (CUEMU_SCHED, CUEMU_BLOCKS, CUEMU_PROTECT, ...) are listed in
# tests/cuemu/. Every suite runs with each launch's blocks in a random order
# (CUEMU_BLOCKS=random, CUEMU_SEED, default 1: `make cuda-emu-test CUEMU_SEED=7` draws
# another order).
CUEMU_CXX     ?= g++
ifeq ($(SAN),1)
CUEMU_DIR     := build/cuda-emu-san
CUEMU_OPT     := $(SAN_FLAGS)
CUEMU_LIB_OBJS := $(filter-out build/san/kernels/cuda/cuda_stub.o,$(SAN_OBJS))
CUEMU_BENCH_OBJS := $(BENCH_SAN_OBJS)
CUEMU_SERVE_OBJS := $(SERVE_SAN_OBJS)
else ifeq ($(FMA),1)
CUEMU_DIR     := build/cuda-emu-fma
CUEMU_OPT     := -O2 -g -march=x86-64-v3 -ffp-contract=fast -DCUEMU_FMA
CUEMU_LIB_OBJS := $(CUDA_LIB_OBJS)
CUEMU_BENCH_OBJS := $(BENCH_OBJS)
CUEMU_SERVE_OBJS := $(SERVE_OBJS)
else
CUEMU_DIR     := build/cuda-emu
CUEMU_OPT     := -O2 -g -march=x86-64-v2
CUEMU_LIB_OBJS := $(CUDA_LIB_OBJS)
CUEMU_BENCH_OBJS := $(BENCH_OBJS)
CUEMU_SERVE_OBJS := $(SERVE_OBJS)
endif
CUEMU_SRCS    := $(wildcard tests/cuemu/*.cc)
CUEMU_OBJS    := $(CUEMU_SRCS:%.cc=$(CUEMU_DIR)/%.o) $(CUDA_CU_SRCS:%.cu=$(CUEMU_DIR)/%.o)
# The emulated cuBLAS hands its products to OpenBLAS's sgemm: only the emulator links it.
CUEMU_BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
CUEMU_BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null)
CUEMU_CXXFLAGS := $(CUEMU_OPT) -std=c++17 -pthread -DROOTSPEC_CUEMU -D_GNU_SOURCE -I. \
                  -I$(CUDA_HOME)/include $(PKG_CFLAGS) $(CUEMU_BLAS_CFLAGS) -Wall -Wno-unused-parameter \
                  -Wno-sign-compare -Wno-unknown-pragmas -MMD -MP
CUEMU_CFLAGS  := $(filter-out -O2 -O3,$(CFLAGS)) $(CUEMU_OPT) -I$(CUDA_HOME)/include -DROOTSPEC_CUEMU \
                 -DCUDA_SUITES_INC='"$(CUEMU_DIR)/suites.inc"'
CUEMU_LDLIBS  := -lstdc++ $(LDLIBS) $(CUEMU_BLAS_LIBS)
CUEMU_MAIN_BINS := $(foreach m,$(MAIN_SRCS),$(CUEMU_DIR)/rootspec-$(patsubst %_main.c,%,$(notdir $(m))))
CUEMU_BENCH   := $(CUEMU_DIR)/rootspec-cuda-bench
CUEMU_TEST_BIN := $(CUEMU_DIR)/rootspec-cuda-tests
CUEMU_SELFTEST := $(CUEMU_DIR)/cuemu-selftest
CUEMU_TEST_OBJS := $(patsubst %.c,$(CUEMU_DIR)/%.o,$(wildcard tests/cuda/*.c) tests/testutil.c)
CUEMU_MAIN_OBJ = $(if $(filter 1,$(SAN)),build/san/$(1:.c=.o),build/obj/$(1:.c=.o))

.PHONY: cuda-emu cuda-emu-test cuda-emu-san-kernels cuemu-headers
cuda-emu: cuemu-headers $(CUEMU_MAIN_BINS) $(CUEMU_BENCH) $(CUEMU_TEST_BIN) $(CUEMU_SELFTEST)

cuemu-headers:
	@test -f $(CUDA_HOME)/include/cuda_runtime_api.h -a -f $(CUDA_HOME)/include/cublas_v2.h || \
	  { echo "cuda-emu: the CUDA toolkit headers are missing ($(CUDA_HOME)/include/cuda_runtime_api.h," \
	         "cublas_v2.h); install the toolkit or set CUDA_HOME" >&2; exit 1; }

$(CUEMU_DIR)/tests/cuemu/%.o: tests/cuemu/%.cc | cuemu-headers
	@mkdir -p $(dir $@)
	$(call say,CXX,$<) $(CUEMU_CXX) $(CUEMU_CXXFLAGS) -c $< -o $@

$(CUEMU_SELFTEST): $(CUEMU_DIR)/tests/cuemu/cuemu_selftest.o $(filter-out $(CUEMU_DIR)/kernels/cuda/cuda_%,$(CUEMU_OBJS))
	$(call say,LD,$@) $(CC) $(CUEMU_CFLAGS) $^ -o $@ $(CUEMU_LDLIBS)

$(CUEMU_DIR)/%.o: %.cu | cuemu-headers
	@mkdir -p $(dir $@)
	$(call say,CXX,$<) $(CUEMU_CXX) -x c++ $(CUEMU_CXXFLAGS) -include tests/cuemu/cuemu.h -c $< -o $@

$(CUEMU_DIR)/tests/%.o: tests/%.c | cuemu-headers
	@mkdir -p $(dir $@)
	$(call say,CC,$<) $(CC) $(CUEMU_CFLAGS) -c $< -o $@

$(CUEMU_DIR)/suites.inc: $(CUDA_TEST_SRCS)
	@mkdir -p $(CUEMU_DIR)
	@printf '%s\n' $(patsubst tests/cuda/test_%.c,'SUITE(%)',$(CUDA_TEST_SRCS)) > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
$(CUEMU_DIR)/tests/cuda/main.o: $(CUEMU_DIR)/suites.inc

define CUEMU_BIN_RULE
$(CUEMU_DIR)/rootspec-$(patsubst %_main.c,%,$(notdir $(1))): $(call CUEMU_MAIN_OBJ,$(1)) $(call main_bench_objs,$(1),$$(CUEMU_BENCH_OBJS)) $(call main_serve,$(1),$$(CUEMU_SERVE_OBJS)) $$(CUEMU_LIB_OBJS) $$(CUEMU_OBJS)
	$$(call say,LD,$$@) $$(CC) $$(CUEMU_CFLAGS) $$^ -o $$@ $$(CUEMU_LDLIBS) $(call main_serve,$(1),$$(SERVE_LIBS))
endef
$(foreach m,$(MAIN_SRCS),$(eval $(call CUEMU_BIN_RULE,$(m))))

$(CUEMU_BENCH): $(CUEMU_DIR)/bench/cuda_bench_main.o $(CUEMU_LIB_OBJS) $(CUEMU_OBJS)
	$(call say,LD,$@) $(CC) $(CUEMU_CFLAGS) $^ -o $@ $(CUEMU_LDLIBS)

$(CUEMU_TEST_BIN): $(CUEMU_TEST_OBJS) $(CUEMU_LIB_OBJS) $(CUEMU_OBJS)
	$(call say,LD,$@) $(CC) $(CUEMU_CFLAGS) $^ -o $@ $(CUEMU_LDLIBS) $(CHECK_LIBS)

CUEMU_SEED ?= 1
cuda-emu-test: cuda-emu
	ASAN_OPTIONS=detect_leaks=1 ./$(CUEMU_SELFTEST)
	@echo "cuda-emu-test: every CUDA suite, the blocks of each launch in a random order (seed $(CUEMU_SEED))"
	CUEMU_BLOCKS=random CUEMU_SEED=$(CUEMU_SEED) OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 \
	UBSAN_OPTIONS=print_stacktrace=1 ./$(CUEMU_TEST_BIN)
	@echo "cuda-emu-test: the kernel suite again with the threads of each block in reverse order" \
	      "(a shared-memory race would change results)"
	OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 CUEMU_SCHED=rev CK_RUN_SUITE=cuda_kernels \
	UBSAN_OPTIONS=print_stacktrace=1 ./$(CUEMU_TEST_BIN)
	@echo "cuda-emu-test: tools/pipeline-timing.sh (the GPU check's two-process run) with the CUDA" \
	      "backend in both processes, tiny random models, drafter = target (deep trees)"
	CUEMU_QUIET=1 OPENBLAS_NUM_THREADS=1 PIPE_BIN=$(CUEMU_DIR) PIPE_BACKEND=cuda \
	PIPE_TARGET=random:tiny,seed=9 PIPE_DRAFT=random:tiny,seed=9 PIPE_MAX_NEW=24 \
	PIPE_PROMPT_LEN=8 PIPE_OUT=$(CUEMU_DIR)/pipeline bash tools/pipeline-timing.sh
	$(if $(filter 1,$(SAN) $(FMA)),,$(MAKE) cuda-emu-fma-kernels)

CUEMU_SAN_SUITES ?= cuda_runtime cuda_kernels cuda_topk cuda_rowstats cuda_feat
.PHONY: cuda-emu-fma-kernels
cuda-emu-fma-kernels:
	$(MAKE) FMA=1 build/cuda-emu-fma/rootspec-cuda-tests
	@echo "cuda-emu-fma-kernels: the kernel-level suites with FMA contraction, blocks in random order"
	set -e; for s in $(CUEMU_SAN_SUITES); do \
	  CUEMU_BLOCKS=random CUEMU_SEED=$(CUEMU_SEED) OPENBLAS_NUM_THREADS=1 \
	  CK_EXCLUDE_TAGS=decode CK_RUN_SUITE=$$s ./build/cuda-emu-fma/rootspec-cuda-tests; done

cuda-emu-san-kernels:
	$(MAKE) SAN=1 build/cuda-emu-san/rootspec-cuda-tests build/cuda-emu-san/cuemu-selftest
	ASAN_OPTIONS=detect_leaks=1 ./build/cuda-emu-san/cuemu-selftest
	set -e; for s in $(CUEMU_SAN_SUITES); do \
	  CUEMU_BLOCKS=random CUEMU_SEED=$(CUEMU_SEED) \
	  OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  CK_EXCLUDE_TAGS=decode CK_RUN_SUITE=$$s ./build/cuda-emu-san/rootspec-cuda-tests; done

-include $(CUEMU_OBJS:.o=.d) $(CUEMU_DIR)/bench/cuda_bench_main.d $(CUEMU_TEST_OBJS:.o=.d) \
         $(CUEMU_DIR)/tests/cuemu/cuemu_selftest.d

