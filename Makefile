# rootspec build. `make` builds the CPU engine into build/, `make test` runs the Check
# suites (under ASan+UBSan), `make cuda` builds the CUDA backend with nvcc, `make setup`
# installs Debian packages and fetches the default model, `make run` is the main job.
CC      ?= cc
PKGS    := libzmq libcjson libpcre2-8 libutf8proc
# libmicrohttpd: rootspec-serve alone links it (SERVE_LIBS).
SERVE_PKGS := libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) $(SERVE_PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lmsgpackc
SERVE_LIBS := $(shell pkg-config --libs $(SERVE_PKGS) 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
# -Wno-psabi: GCC notes that vector arguments changed ABI in GCC 4.6 even for static inline
# helpers, which have no ABI (a #pragma does not silence the note).
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wno-sign-compare -Wno-psabi
CFLAGS  ?= -O2 -march=x86-64-v2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread $(WARN) $(PKG_CFLAGS) -I. -MMD -MP
LDLIBS  := $(PKG_LIBS) -lm -pthread
SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

DEFAULT_MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
# The default pair's target: the default model's values in F16 (tools/setup.sh --pair).
PAIR_MODEL := models/SmolLM2-135M-Instruct.F16.gguf

# Quiet by default: one "CC file.c" / "AR lib" / "LD prog" line per step, so a build shows
# what it makes and its warnings; `make V=1` prints every command in full.
# $(call say,TAG,WHAT) prefixes a recipe line: the short line, or nothing with V=1.
V ?= 0
ifeq ($(V),1)
say =
else
say = @printf '  %-6s %s\n' '$(1)' '$(2)';
endif

# The engine library (librootspec.a, linked by every program): every .c in LIB_DIRS except
# program entry points (*_main.c). The bench's own code (statistics, logs, summary) is a
# second library, librootspec-bench.a, linked only by the programs in bench/ and the tests,
# so rootspec-target and rootspec-draft carry none of it. The HTTP server's folder, serve/,
# is a third, librootspec-serve.a, for rootspec-serve and the tests.
LIB_DIRS   := common kernels kernels/cpu kernels/cpu/x86 kernels/cuda proto draft_proc target_proc
BENCH_DIR  := bench
SERVE_DIR  := serve
SERVE_SRCS := $(filter-out %_main.c,$(wildcard $(SERVE_DIR)/*.c))
LIB_SRCS   := $(filter-out %_main.c,$(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
BENCH_SRCS := $(filter-out %_main.c,$(wildcard $(BENCH_DIR)/*.c))
MAIN_SRCS  := $(foreach d,$(LIB_DIRS) $(BENCH_DIR) $(SERVE_DIR),$(wildcard $(d)/*_main.c))
TEST_SRCS  := $(wildcard tests/test_*.c)

LIB_OBJS       := $(LIB_SRCS:%.c=build/obj/%.o)
SAN_OBJS       := $(LIB_SRCS:%.c=build/san/%.o)
BENCH_OBJS     := $(BENCH_SRCS:%.c=build/obj/%.o)
BENCH_SAN_OBJS := $(BENCH_SRCS:%.c=build/san/%.o)
SERVE_OBJS     := $(SERVE_SRCS:%.c=build/obj/%.o)
SERVE_SAN_OBJS := $(SERVE_SRCS:%.c=build/san/%.o)
TEST_OBJS := $(TEST_SRCS:%.c=build/san/%.o) build/san/tests/main.o build/san/tests/testutil.o \
             build/san/tests/qk_avx512_emu.o build/san/tests/qk_amx_emu.o
# $(call main_bench_objs,MAIN.c,OBJS): OBJS when MAIN.c is a bench program, else nothing.
main_bench_objs = $(if $(filter $(BENCH_DIR)/%,$(1)),$(2))
# $(call main_serve,MAIN.c,X): X when MAIN.c is rootspec-serve's, else nothing.
main_serve = $(if $(filter $(SERVE_DIR)/%,$(1)),$(2))
# target_proc/target_main.c -> build/rootspec-target
BINS := $(foreach m,$(MAIN_SRCS),build/rootspec-$(patsubst %_main.c,%,$(notdir $(m))))

.PHONY: all test test-bin check-repo setup run cuda clean fuzz bench-micro gpu-bundle amx-overhead
all: $(BINS)

build/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<) $(CC) $(CFLAGS) -c $< -o $@

build/san/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC-SAN,$<) $(CC) $(filter-out -O2 -O3,$(CFLAGS)) $(SAN_FLAGS) -c $< -o $@

build/librootspec.a: $(LIB_OBJS)
build/librootspec-san.a: $(SAN_OBJS)
build/librootspec-bench.a: $(BENCH_OBJS)
build/librootspec-bench-san.a: $(BENCH_SAN_OBJS)
build/librootspec-serve.a: $(SERVE_OBJS)
build/librootspec-serve-san.a: $(SERVE_SAN_OBJS)
build/librootspec.a build/librootspec-san.a build/librootspec-bench.a build/librootspec-bench-san.a \
build/librootspec-serve.a build/librootspec-serve-san.a:
	@mkdir -p build
	$(call say,AR,$@) rm -f $@ && ar rcs $@ $^

# The bench library comes first: it calls into the engine library, not the other way round.
define BIN_RULE
build/rootspec-$(patsubst %_main.c,%,$(notdir $(1))): build/obj/$(1:.c=.o) $(call main_bench_objs,$(1),build/librootspec-bench.a) $(call main_serve,$(1),build/librootspec-serve.a) build/librootspec.a
	$$(call say,LD,$$@) $$(CC) $$(CFLAGS) $$^ -o $$@ $$(LDLIBS) $(call main_serve,$(1),$$(SERVE_LIBS))
endef
$(foreach m,$(MAIN_SRCS),$(eval $(call BIN_RULE,$(m))))

# One test binary, one Check summary: tests/test_NAME.c defines Suite *suite_NAME(void).
build/suites.inc: $(TEST_SRCS)
	@mkdir -p build
	@printf '%s\n' $(patsubst tests/test_%.c,'SUITE(%)',$(TEST_SRCS)) > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp

build/san/tests/main.o: build/suites.inc
build/rootspec-tests: $(TEST_OBJS) build/librootspec-bench-san.a build/librootspec-serve-san.a build/librootspec-san.a
	$(call say,LD,$@) $(CC) $(SAN_FLAGS) $^ -o $@ $(LDLIBS) $(SERVE_LIBS) $(CHECK_LIBS)

# rootspec-serve under ASan+UBSan, for tests/serve_test.sh's malformed-request flood.
build/rootspec-serve-san: build/san/serve/serve_main.o build/librootspec-serve-san.a build/librootspec-san.a
	$(call say,LD,$@) $(CC) $(SAN_FLAGS) $^ -o $@ $(LDLIBS) $(SERVE_LIBS)

test-bin: build/rootspec-tests $(BINS) build/amx-overhead

# The AMX family's work outside its tile instructions against the AVX2 family's whole
# computation, on any AVX2 machine (tests/amx_overhead.c): a benchmark, built with the tests.
build/amx-overhead: build/obj/tests/amx_overhead.o build/obj/tests/qk_avx512_emu.o build/librootspec-bench.a build/librootspec.a
	$(call say,LD,$@) $(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

amx-overhead: build/amx-overhead
	./build/amx-overhead

# rootspec-serve with real clients (the openai package in its own venv under build/, curl),
# the malformed-request flood under ASan; half a minute on two cores once the venv and the
# ASan build exist. .ci/run runs it.
.PHONY: test-serve
test-serve: build/rootspec-serve build/rootspec-serve-san build/rootspec-target build/rootspec-draft $(DEFAULT_MODEL)
	bash tests/serve_test.sh

# Repository checks (documentation pointers, layering): a second, no build needed.
check-repo:
	bash tests/check_repo.sh

# ASAN_OPTIONS: check's fork mode is fine with leak checks on.
test: check-repo test-bin $(DEFAULT_MODEL)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1 ./build/rootspec-tests

setup:
	bash tools/setup.sh

$(DEFAULT_MODEL):
	@bash tools/setup.sh --model-only

$(PAIR_MODEL): $(DEFAULT_MODEL) build/rootspec-convert
	@bash tools/setup.sh --pair

run: all $(DEFAULT_MODEL) $(PAIR_MODEL)
	@bash deploy/run-main.sh

clean:
	rm -rf build

-include kernels/cuda/cuda.mk
-include tests/cuemu/cuemu.mk
-include tests/fuzz.mk
-include $(SERVE_OBJS:.o=.d) $(SERVE_SAN_OBJS:.o=.d) build/san/serve/serve_main.d
-include $(LIB_OBJS:.o=.d) $(SAN_OBJS:.o=.d) $(BENCH_OBJS:.o=.d) $(BENCH_SAN_OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(MAIN_SRCS:%.c=build/obj/%.d) build/obj/tests/amx_overhead.d

# Optional, slow (minutes on a CPU): T=0 identity of every decoder with AR on the default model.
.PHONY: test-default-model
test-default-model: all $(DEFAULT_MODEL)
	bash tests/slow_identity.sh

# Dev-time, not part of `make test`: rootspec-micro against llama.cpp on the same GGUF
# (needs llama-cpp-python; see tools/llama_peer.py for the venv and build flags).
.PHONY: peer-compare
peer-compare: all $(DEFAULT_MODEL)
	bash tools/peer-compare.sh $(DEFAULT_MODEL)
