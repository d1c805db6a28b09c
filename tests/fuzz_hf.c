/* libFuzzer target for the Hugging Face directory loader (`make fuzz-hf`, `make
 * fuzz-short`): config.json and model.safetensors from one input (its first two bytes, little
 * endian, are config.json's length; the rest after it is the safetensors file), written into
 * a directory of the run's own. The directory must load, or be refused with an input code
 * and a message naming it; a model that loads passes the loader's config check. */
#include "tests/fuzz_common.h"
#include "common/loader.h"
#include "common/model.h"
#include <fcntl.h>

static char dir[64];

static void remove_dir(void) {
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void put_file(const char *name, const uint8_t *data, size_t n) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    RS_ASSERT(fd >= 0);
    RS_ASSERT(write(fd, data, n) == (ssize_t)n);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/rootspec-fuzz-hf.XXXXXX");
        RS_ASSERT(mkdtemp(dir) != NULL);
        atexit(remove_dir);
    }
    size_t len = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
    size_t body = size >= 2 ? size - 2 : 0;
    len = len < body ? len : body;
    put_file("config.json", data + 2 * (size >= 2), len);
    put_file("model.safetensors", data + 2 * (size >= 2) + len, body - len);
    Model *m = NULL;
    RsErr e = {0};
    int rc = model_load(dir, &m, &e);
    if (rc != RS_OK) {
        fuzz_check_refusal(rc, &e, dir);
        return 0;
    }
    RS_ASSERT(loader_check_config(&m->cfg, dir, &e) == RS_OK);
    model_destroy(&m);
    return 0;
}
