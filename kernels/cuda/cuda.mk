# CUDA build fragment, included by the Makefile (which defines CC, CFLAGS, LDLIBS, CHECK_LIBS,
# LIB_OBJS, BENCH_OBJS, main_bench_objs and MAIN_SRCS). Nothing here is built by `make` or
# `make test`:
#   make cuda [CUDA_ARCHS="80 86 89 90"]  -> build/cuda/rootspec-{<mains>,cuda-bench,cuda-tests}
#   make gpu-bundle                       -> gpu-bundle/: sm_90 binaries, the shared
#                                            libraries a bare CUDA machine lacks and
#                                            compute-sanitizer: what tools/gpu-check.sh
#                                            runs on a GPU machine
#   make gpu-prepare                      -> gpu-bundle + gpu-carry/ (default model in 2
#                                            parts, for the optional --default-model run)
# The CUDA binaries link the CPU library objects except kernels/cuda/cuda_stub.o (which would
# answer "no CUDA backend") plus the nvcc objects of kernels/cuda/*.cu. The CPU emulator build
# (make cuda-emu, cuda-emu-test) is test scaffolding: tests/cuemu/cuemu.mk.
CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS ?= 80 86 89 90
# SASS for every arch plus PTX of the newest, so a later GPU can still JIT it.
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_GENCODE) -I. -Xcompiler -Wall,-Wno-unused-parameter -MMD -MP
# cudart is linked statically (as nvcc does by default), so a machine needs only the
# driver and libcublas; override with CUDART=-lcudart for the shared runtime.
CUDART     ?= -lcudart_static -ldl -lrt
# DT_RPATH (--disable-new-dtags), not DT_RUNPATH: it also serves the bundled libraries' own
# dependencies (libzmq -> libsodium, ...), which a RUNPATH on the executable would not.
CUDA_RPATH := -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/lib' -Wl,-rpath,$(CUDA_HOME)/lib64
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcublas $(CUDART) -lstdc++ $(LDLIBS)

CUDA_DIR      := build/cuda
CUDA_CU_SRCS  := $(wildcard kernels/cuda/*.cu)
CUDA_CU_OBJS  := $(CUDA_CU_SRCS:%.cu=$(CUDA_DIR)/%.o)
CUDA_LIB_OBJS := $(filter-out build/obj/kernels/cuda/cuda_stub.o,$(LIB_OBJS))
CUDA_MAIN_BINS := $(foreach m,$(MAIN_SRCS),$(CUDA_DIR)/rootspec-$(patsubst %_main.c,%,$(notdir $(m))))
CUDA_BENCH    := $(CUDA_DIR)/rootspec-cuda-bench
CUDA_TEST_BIN := $(CUDA_DIR)/rootspec-cuda-tests
CUDA_TEST_SRCS := $(wildcard tests/cuda/test_cuda_*.c)
CUDA_TEST_OBJS := $(patsubst %.c,$(CUDA_DIR)/%.o,$(wildcard tests/cuda/*.c) tests/testutil.c)
CUDA_CFLAGS   := $(CFLAGS) -I$(CUDA_HOME)/include

.PHONY: cuda cuda-test
cuda: $(CUDA_MAIN_BINS) $(CUDA_BENCH) $(CUDA_TEST_BIN)

# Objects are rebuilt when CUDA_ARCHS changes (the stamp only changes with its content).
$(CUDA_DIR)/archs.stamp: FORCE_CUDA_ARCHS
	@mkdir -p $(CUDA_DIR)
	@echo '$(CUDA_ARCHS)' > $@.tmp; cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
.PHONY: FORCE_CUDA_ARCHS

$(CUDA_DIR)/%.o: %.cu $(CUDA_DIR)/archs.stamp
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<) $(NVCC) $(NVCCFLAGS) -c $< -o $@

$(CUDA_DIR)/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<) $(CC) $(CUDA_CFLAGS) -c $< -o $@

define CUDA_BIN_RULE
$(CUDA_DIR)/rootspec-$(patsubst %_main.c,%,$(notdir $(1))): build/obj/$(1:.c=.o) $(call main_bench_objs,$(1),$$(BENCH_OBJS)) $(call main_serve,$(1),$$(SERVE_OBJS)) $$(CUDA_LIB_OBJS) $$(CUDA_CU_OBJS)
	$$(call say,LD,$$@) $$(CC) $$(CFLAGS) $$^ -o $$@ $$(CUDA_RPATH) $$(CUDA_LDLIBS) $(call main_serve,$(1),$$(SERVE_LIBS))
endef
$(foreach m,$(MAIN_SRCS),$(eval $(call CUDA_BIN_RULE,$(m))))

$(CUDA_BENCH): $(CUDA_DIR)/bench/cuda_bench_main.o $(CUDA_LIB_OBJS) $(CUDA_CU_OBJS)
	$(call say,LD,$@) $(CC) $(CFLAGS) $^ -o $@ $(CUDA_RPATH) $(CUDA_LDLIBS)

# The CUDA test runner has its own suite list (tests/cuda/test_cuda_NAME.c defines
# Suite *suite_cuda_NAME(void)); the CPU test binary never sees these files.
$(CUDA_DIR)/suites.inc: $(CUDA_TEST_SRCS)
	@mkdir -p $(CUDA_DIR)
	@printf '%s\n' $(patsubst tests/cuda/test_%.c,'SUITE(%)',$(CUDA_TEST_SRCS)) > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
$(CUDA_DIR)/tests/cuda/main.o: $(CUDA_DIR)/suites.inc

$(CUDA_TEST_BIN): $(CUDA_TEST_OBJS) $(CUDA_LIB_OBJS) $(CUDA_CU_OBJS)
	$(call say,LD,$@) $(CC) $(CFLAGS) $^ -o $@ $(CUDA_RPATH) $(CUDA_LDLIBS) $(CHECK_LIBS)

cuda-test: $(CUDA_TEST_BIN)
	./$(CUDA_TEST_BIN)

# gpu-bundle: sm_90 build (always relinked) + every shared library ldd resolves outside the set a CUDA
# machine has anyway (libc family, libstdc++/libgcc_s, the CUDA libraries), reached
# through the $ORIGIN/lib rpath, + compute-sanitizer (sanitizer/) from the PyPI wheel of the
# toolkit's CUDA version, so the sanitizer stages run on a machine that has only the
# driver; BUILD.txt names the CUDA runtime linked in (the check's preflight compares it with
# the driver). The fixtures the CUDA tests read come with the working tree.
# glibc's own libraries must match the machine's libc, so they are never bundled.
GPU_BUNDLE_SKIP := linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/libresolv|/libutil\.so|/libanl|/libnsl|/libstdc\+\+|/libgcc_s|/libcuda|/libcublas|/libcudart
# The working tree and gpu-bundle/ travel to the GPU machine together, in at most 64 MiB.
GPU_BUNDLE_MAX := 67108864
CUDA_VERSION_MM = $(shell $(NVCC) --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
CUDA_SANITIZER_WHEEL ?= nvidia-cuda-sanitizer-api==$(CUDA_VERSION_MM).*
gpu-bundle:
	$(MAKE) cuda CUDA_ARCHS=90
	rm -rf gpu-bundle
	mkdir -p gpu-bundle/lib
	cp $(CUDA_MAIN_BINS) $(CUDA_BENCH) $(CUDA_TEST_BIN) gpu-bundle/
	strip --strip-unneeded gpu-bundle/rootspec-*
	for b in gpu-bundle/rootspec-*; do ldd $$b | awk '/=> \// {print $$3}'; done \
	  | sort -u | grep -Ev '$(GPU_BUNDLE_SKIP)' | while read -r lib; do \
	    cp -L "$$lib" gpu-bundle/lib/ && chmod u+w "gpu-bundle/lib/$$(basename $$lib)" && \
	    strip --strip-unneeded "gpu-bundle/lib/$$(basename $$lib)"; done
	bash tools/nvidia-wheel.sh '$(CUDA_SANITIZER_WHEEL)' gpu-bundle/sanitizer
	gpu-bundle/sanitizer/compute-sanitizer --version | tail -1
	printf 'cuda_runtime=%s\nnvcc=%s\narchs=90\ncommit=%s\n' '$(CUDA_VERSION_MM)' \
	  "$$($(NVCC) --version | sed -n 's/.*\(V[0-9.]*\)$$/\1/p')" "$$(git rev-parse --short HEAD)" >gpu-bundle/BUILD.txt
	# binaries and libraries travel xz-compressed (50 MB -> 14: the bundle and the working
	# tree must fit GPU_BUNDLE_MAX); tools/gpu-check.sh unpacks them (or: xz -d
	# gpu-bundle/*.xz gpu-bundle/*/*.xz) before the binaries start.
	xz -T0 -6 gpu-bundle/rootspec-* gpu-bundle/lib/* gpu-bundle/sanitizer/*
	@echo "gpu-bundle: $$(du -sh gpu-bundle | cut -f1) ($$(ls gpu-bundle/lib | wc -l) libraries: $$(ls gpu-bundle/lib | tr '\n' ' '))"
	@tree=$$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1); \
	  all=$$((tree + $$(du -sb gpu-bundle | cut -f1))); \
	  echo "gpu-bundle: working tree + gpu-bundle = $$all bytes (at most $(GPU_BUNDLE_MAX))"; \
	  [ $$all -le $(GPU_BUNDLE_MAX) ] || { echo "gpu-bundle: over $(GPU_BUNDLE_MAX) bytes" >&2; exit 1; }

# Everything the two GPU runs need (docs/CUDA.md): gpu-bundle/ plus the default model in
# two parts under gpu-carry/, each run's share checked against GPU_BUNDLE_MAX.
.PHONY: gpu-prepare
gpu-prepare: gpu-bundle $(DEFAULT_MODEL)
	bash tools/gpu-carry.sh split

-include $(CUDA_CU_OBJS:.o=.d) $(CUDA_DIR)/bench/cuda_bench_main.d $(CUDA_TEST_OBJS:.o=.d)

# Resource and SASS lint (needs nvcc, no GPU; tools/cuda-lint.sh): ptxas -v of every
# kernels/cuda/*.cu for CUDA_ARCHS — registers x threads of each launch size, static shared
# memory, local memory, spills (a spill, or a launch a GPU would refuse as "too many
# resources requested", fails: the CPU emulator cannot see either) — and the 16-byte loads
# per iteration of the sm_90 hot loops (attention, GEMV), printed.
.PHONY: cuda-resources
cuda-resources:
	bash tools/cuda-lint.sh --archs "$(CUDA_ARCHS)" --out $(CUDA_DIR)/lint
