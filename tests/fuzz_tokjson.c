/* libFuzzer target for the Hugging Face tokenizer.json reader (`make fuzz-tokjson`, `make
 * fuzz-short`): any file must give a tokenizer, or be refused with an input code and a
 * message naming the file; a tokenizer that loads must encode and decode a short mixed
 * text, every id inside its vocabulary. The input reaches the reader as a memfd. */
#include "common/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("tokenizer.json", 0);
    RS_ASSERT(fd >= 0);
    RS_ASSERT(write(fd, data, size) == (ssize_t)size);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    Tokenizer *t = NULL;
    RsErr e = {0};
    int rc = tokenizer_load_json(path, &t, &e);
    if (rc != RS_OK) {
        RS_ASSERT(rc == RS_EFORMAT || rc == RS_EUNSUPPORTED || rc == RS_EINVAL ||
                  rc == RS_ENOMEM);
        RS_ASSERT(e.code == rc && e.msg[0] != 0);
        if (!strstr(e.msg, path)) {
            fprintf(stderr, "fuzz_tokjson: the message does not name the file: %s\n", e.msg);
            abort();
        }
    } else {
        int *ids = NULL, n = 0;
        if (tokenizer_encode(t, "Hello world, 12 caf\xc3\xa9s!\n", &ids, &n, &e) == RS_OK) {
            for (int i = 0; i < n; i++) RS_ASSERT(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(t));
            free(tokenizer_decode(t, ids, n));
        }
        free(ids);
        tokenizer_destroy(&t);
    }
    close(fd);
    return 0;
}
