/* rootspec-convert: a GGUF model the engine loads, written again with every matrix in F16
 * or BF16 (gguf_convert, common/model.h): the engine's own dequantized values, rounded to
 * nearest even. Makes a full-precision target from a quantized file, whose quantized twin
 * can then draft for it. */
#include "common/cli.h"
#include "common/model.h"
#include "common/quant.h"
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *f) {
    fprintf(f, "usage: rootspec-convert --model IN.gguf --out OUT.gguf [--type f16|bf16]\n"
               "  --model IN   a GGUF file rootspec loads (any stored type it reads)\n"
               "  --out OUT    the GGUF file to write (replaced whole when it exists)\n"
               "  --type T     f16 (default) or bf16: the matrices' stored type; vectors\n"
               "               (norms, biases) keep theirs, metadata and tokenizer are copied\n");
}

int main(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = "f16";
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char **dst = !strcmp(argv[i], "--model") ? &in
                           : !strcmp(argv[i], "--out") ? &out
                           : !strcmp(argv[i], "--type") ? &type : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!dst) {
            fprintf(stderr, "rootspec-convert: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (cli_value(argc, argv, i++, dst, &e)) {
            fprintf(stderr, "rootspec-convert: %s\n", e.msg);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "rootspec-convert: --model and --out are required\n");
        usage(stderr);
        return 2;
    }
    uint32_t t = !strcasecmp(type, "f16") ? QT_F16 : !strcasecmp(type, "bf16") ? QT_BF16 : 0;
    if (!t) {
        fprintf(stderr, "rootspec-convert: --type must be f16 or bf16, not '%s'\n", type);
        return 2;
    }
    int rc = gguf_convert(in, out, t, &e);
    if (rc) {
        fprintf(stderr, "rootspec-convert: %s\n", e.msg);
        return cli_exit_status(rc);
    }
    fprintf(stderr, "rootspec-convert: wrote %s (%s matrices)\n", out, quant_type_name(t));
    return 0;
}
