/* libFuzzer target for prompt files (`make fuzz-prompts`, `make fuzz-short`): any file
 * must load, or be refused with an input code and a message naming the file; a
 * file that loads must keep common/prompts.h's promises for every prompt: non-empty valid
 * UTF-8 text without NUL bytes, a 1-based line number, an id of [A-Za-z0-9_./:+-] under
 * PROMPT_ID_MAX bytes that no other prompt of the file has. */
#include "tests/fuzz_common.h"
#include "common/prompts.h"

static int id_ok(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n >= PROMPT_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:+-", id[i]))
            return 0;
    return 1;
}

static void check_set(const PromptSet *p, size_t size) {
    RS_ASSERT(p->n >= 1);
    for (int i = 0; i < p->n; i++) {
        const Prompt *q = &p->items[i];
        size_t n = strlen(q->text);
        RS_ASSERT(n > 0 && n <= size && prompts_utf8_invalid_at(q->text, n) == -1);
        RS_ASSERT(q->line >= 1 && q->category != NULL);
        RS_ASSERT(id_ok(q->id));
        for (int k = 0; k < i; k++) RS_ASSERT(strcmp(p->items[k].id, q->id) != 0);
        RS_ASSERT(i == 0 || q->line > p->items[i - 1].line);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfd(data, size, "prompts.jsonl", path, sizeof path);
    PromptSet *p = NULL;
    RsErr e = {0};
    int rc = prompts_load(path, &p, &e);
    if (rc != RS_OK) {
        RS_ASSERT(rc != RS_EUNSUPPORTED); /* prompts.h: EFORMAT / EINVAL only */
        fuzz_check_refusal(rc, &e, path);
    } else {
        check_set(p, size);
        prompts_destroy(&p);
    }
    close(fd);
    return 0;
}
