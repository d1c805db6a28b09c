# libFuzzer targets (included by the Makefile) for what the engine reads from outside: the
# protocol decoder, the GGUF loader, the tokenizer.json reader, the Hugging Face directory
# loader, prompt files and rootspec-serve's request handling.
#   make fuzz                 FUZZ_SECONDS (default 60) of the protocol decoder on a copy of
#                             its seed corpus
#   make fuzz-gguf            FUZZ_SECONDS of the GGUF loader (and the tokenizer it builds
#                             from the file's metadata), seeded with the loader fixtures
#   make fuzz-tokjson         FUZZ_SECONDS of the Hugging Face tokenizer.json reader, seeded
#                             with the tokenizer fixtures
#   make fuzz-hf              FUZZ_SECONDS of the Hugging Face directory loader (config.json
#                             and model.safetensors from one input), seeded with the
#                             llama and qwen2 fixture directories
#   make fuzz-prompts         FUZZ_SECONDS of the prompt-file reader (JSON lines), seeded with
#                             deploy/prompts.jsonl and tests/fuzz_corpus/prompts
#   make fuzz-serve           FUZZ_SECONDS of rootspec-serve's request handling (the gate's
#                             Host, key and Content-Type checks, the request JSON parser):
#                             an HTTP request's line, headers and body, seeded with
#                             tests/fuzz_corpus/serve
#   make fuzz-short           a bounded 10 s run of each, for CI
# Built with clang directly from the sources they call (common/ is self-contained).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined
FUZZ_SRCS := tests/fuzz_proto.c proto/proto.c common/util.c common/pool.c common/quant.c \
             common/textsafe.c
FUZZ_CORPUS := tests/fuzz_corpus/proto
# The file-format targets: tests/fuzz_NAME.c with common/ (self-contained), seeded from
# build/fuzz_seed_NAME (rules below), inputs up to FUZZ_LEN_NAME bytes, new inputs kept in
# build/fuzz_corpus_NAME.
FUZZ_FILES := gguf tokjson hf prompts
FUZZ_LEN_gguf := 262144
FUZZ_LEN_tokjson := 65536
FUZZ_LEN_hf := 131072
FUZZ_LEN_prompts := 16384
FUZZ_LEN_serve := 16384
# The server's request handling: its sources without sockets (serve_gate.c, serve_api.c,
# serve_text.c) and the engine pieces they name (decoder names, the sampling law, chat).
FUZZ_SERVE_SRCS := tests/fuzz_serve.c serve/serve_gate.c serve/serve_api.c \
                   serve/serve_text.c target_proc/select.c
# Seeds: the committed GGUF fixtures, copied into a folder of their own (libFuzzer takes
# folders; theirs hold other files too).
FUZZ_GGUF_SEEDS := tests/fixtures/loader/tiny.gguf tests/fixtures/loader/tiny_llama3.gguf \
                   tests/fixtures/golden/qwen2/qwen2.gguf
FUZZ_TOK_SEEDS := tests/fixtures/tok/small/tokenizer.json \
                  tests/fixtures/tok/small_split/tokenizer.json
FUZZ_HF_SEEDS := tests/fixtures/loader/hf_llama tests/fixtures/loader/hf_qwen2
FUZZ_LIBS = $(shell pkg-config --libs libcjson libpcre2-8 libutf8proc 2>/dev/null) -lm -pthread
# $(call fuzz_file,NAME): the command that fuzzes NAME; append -max_total_time.
fuzz_file = mkdir -p build/fuzz_corpus_$(1) && ./build/fuzz_$(1) -max_len=$(FUZZ_LEN_$(1)) \
  -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 build/fuzz_corpus_$(1) \
  build/fuzz_seed_$(1) $(wildcard tests/fuzz_corpus/$(1))

build/fuzz_proto: $(FUZZ_SRCS) proto/proto.h common/pool.h common/util.h common/quant.h tests/fuzz.mk
	@mkdir -p build
	$(call say,CC,$@) $(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SRCS) -o $@ -lmsgpackc -lzmq -lm

$(FUZZ_FILES:%=build/fuzz_%): build/fuzz_%: tests/fuzz_%.c $(wildcard common/*.c) \
                                $(wildcard common/*.h) tests/fuzz_common.h tests/fuzz.mk
	@mkdir -p build
	$(call say,CC,$@) $(FUZZ_CC) $(FUZZ_FLAGS) $(PKG_CFLAGS) $< $(wildcard common/*.c) -o $@ $(FUZZ_LIBS)

build/fuzz_serve: $(FUZZ_SERVE_SRCS) serve/serve.h $(wildcard common/*.c) \
                   $(wildcard common/*.h) tests/fuzz.mk
	@mkdir -p build
	$(FUZZ_CC) $(FUZZ_FLAGS) $(PKG_CFLAGS) $(FUZZ_SERVE_SRCS) $(wildcard common/*.c) -o $@ $(FUZZ_LIBS)

# The seeds are committed (tests/fuzz_corpus/serve, which fuzz_file adds).
build/fuzz_seed_serve:
	@mkdir -p $@

build/fuzz_seed_gguf: $(FUZZ_GGUF_SEEDS)
	@mkdir -p $@
	cp $^ $@/

# A seed per fixture directory: config.json's length (2 bytes, little endian), config.json,
# model.safetensors (fuzz_hf.c's layout).
build/fuzz_seed_hf: $(foreach d,$(FUZZ_HF_SEEDS),$(d)/config.json $(d)/model.safetensors)
	@mkdir -p $@
	for d in $(FUZZ_HF_SEEDS); do n=$$(stat -c %s $$d/config.json); \
	  printf "\\$$(printf %03o $$((n % 256)))\\$$(printf %03o $$((n / 256)))" > $@/$$(basename $$d); \
	  cat $$d/config.json $$d/model.safetensors >> $@/$$(basename $$d); done

build/fuzz_seed_prompts: deploy/prompts.jsonl
	@mkdir -p $@
	cp $^ $@/

# Both seeds are named tokenizer.json: numbered copies.
build/fuzz_seed_tokjson: $(FUZZ_TOK_SEEDS)
	@mkdir -p $@
	i=0; for f in $^; do i=$$((i + 1)); cp $$f $@/seed$$i.json; done

.PHONY: fuzz fuzz-gguf fuzz-tokjson fuzz-hf fuzz-prompts fuzz-serve fuzz-short
# New inputs go to build/fuzz_corpus* so the committed seeds stay small.
fuzz: build/fuzz_proto
	@mkdir -p build/fuzz_corpus
	./build/fuzz_proto -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
	  -rss_limit_mb=2048 build/fuzz_corpus $(FUZZ_CORPUS)

$(FUZZ_FILES:%=fuzz-%) fuzz-serve: fuzz-%: build/fuzz_% build/fuzz_seed_%
	$(call fuzz_file,$*) -max_total_time=$(FUZZ_SECONDS)

fuzz-short: build/fuzz_proto $(FUZZ_FILES:%=build/fuzz_%) $(FUZZ_FILES:%=build/fuzz_seed_%) \
            build/fuzz_serve build/fuzz_seed_serve
	@mkdir -p build/fuzz_corpus
	./build/fuzz_proto -max_total_time=10 -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
	  build/fuzz_corpus $(FUZZ_CORPUS)
	$(foreach t,$(FUZZ_FILES) serve,$(call fuzz_file,$(t)) -max_total_time=10 && ) true
