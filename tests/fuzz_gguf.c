/* libFuzzer target for the GGUF loader (`make fuzz-gguf`, `make fuzz-short`): any file
 * must load, or fail with one of the loader's codes and a message naming the file; a file
 * that loads must give a model that passes the loader's config check, and its tokenizer
 * (from the file's metadata) must load or fail the same way, and round-trip a short text
 * when it loads. The input is handed over as a memfd, so the loader maps it as it maps a
 * real file. */
#include "tests/fuzz_common.h"
#include "common/loader.h"
#include "common/model.h"
#include "common/tokenizer.h"

/* A tokenizer that loads encodes and decodes "hello world" without failing. */
static void check_tokenizer(const Model *m, const char *path) {
    Tokenizer *tok = NULL;
    RsErr e = {0};
    int rc = tokenizer_load_model(m, &tok, &e);
    if (rc != RS_OK) {
        fuzz_check_refusal(rc, &e, path);
        return;
    }
    int *ids = NULL, n = 0;
    if (tokenizer_encode(tok, "hello world", &ids, &n, &e) == RS_OK) {
        for (int i = 0; i < n; i++) RS_ASSERT(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(tok));
        free(tokenizer_decode(tok, ids, n));
    }
    free(ids);
    tokenizer_destroy(&tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfd(data, size, "fuzz.gguf", path, sizeof path);
    Model *m = NULL;
    RsErr e = {0};
    int rc = model_load(path, &m, &e);
    if (rc != RS_OK) {
        fuzz_check_refusal(rc, &e, path);
    } else {
        RS_ASSERT(loader_check_config(&m->cfg, path, &e) == RS_OK);
        check_tokenizer(m, path);
        model_destroy(&m);
    }
    close(fd);
    return 0;
}
