/* libFuzzer target for the Hugging Face tokenizer.json reader (`make fuzz-tokjson`, `make
 * fuzz-short`): any file must give a tokenizer, or be refused with an input code and a
 * message naming the file; a tokenizer that loads must encode and decode a short mixed
 * text, every id inside its vocabulary. The input reaches the reader as a memfd. */
#include "tests/fuzz_common.h"
#include "common/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfd(data, size, "tokenizer.json", path, sizeof path);
    Tokenizer *tok = NULL;
    RsErr e = {0};
    int rc = tokenizer_load_json(path, &tok, &e);
    if (rc != RS_OK) {
        fuzz_check_refusal(rc, &e, path);
    } else {
        int *ids = NULL, n = 0;
        if (tokenizer_encode(tok, "Hello world, 12 caf\xc3\xa9s!\n", &ids, &n, &e) == RS_OK) {
            for (int i = 0; i < n; i++) RS_ASSERT(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(tok));
            free(tokenizer_decode(tok, ids, n));
        }
        free(ids);
        tokenizer_destroy(&tok);
    }
    close(fd);
    return 0;
}
