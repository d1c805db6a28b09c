# libFuzzer target for the protocol decoder (included by the Makefile).
#   make fuzz                 FUZZ_SECONDS (default 60) on a copy of the seed corpus
#   make fuzz-short           a bounded 10 s run for CI
# Built with clang directly from the proto sources and the common/ files they call.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SRCS := tests/fuzz_proto.c proto/proto.c common/util.c common/pool.c common/quant.c \
             common/textsafe.c
FUZZ_CORPUS := tests/fuzz_corpus/proto

build/fuzz_proto: $(FUZZ_SRCS) proto/proto.h common/pool.h common/util.h common/quant.h tests/fuzz.mk
	@mkdir -p build
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined $(FUZZ_SRCS) -o $@ -lmsgpackc -lzmq -lm

.PHONY: fuzz fuzz-short
# New inputs go to build/fuzz_corpus so the committed seed corpus stays small.
fuzz: build/fuzz_proto
	@mkdir -p build/fuzz_corpus
	./build/fuzz_proto -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
	  -rss_limit_mb=2048 build/fuzz_corpus $(FUZZ_CORPUS)

fuzz-short: build/fuzz_proto
	@mkdir -p build/fuzz_corpus
	./build/fuzz_proto -max_total_time=10 -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
	  build/fuzz_corpus $(FUZZ_CORPUS)
