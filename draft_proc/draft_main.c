/* rootspec-draft: the drafter process. Loads a model (or a layer subset of one, or an
 * EAGLE-3 head with its target's embeddings), then serves pools to one target at a time
 * over ZeroMQ until SIGINT/SIGTERM. */
#include "common/cli.h"
#include "proto/proto.h"
#include "proto/secure.h"
#include "common/eagle3.h"
#include "eagle3_drafter.h"
#include "model_drafter.h"
#include "server.h"
#include <signal.h>
#include <string.h>

static volatile int g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-draft --model PATH --bind ENDPOINT [options]\n"
            "       rootspec-draft --gen-keys DIR\n"
            "\n"
            "  --model PATH         drafter model (GGUF file or Hugging Face directory), or a\n"
            "                       random-weight model: random:PRESET[,seed=N,layers=N,...]\n"
            "                       (llama3-8b, llama3-1b, smollm2-135m, tiny), or an EAGLE-3\n"
            "                       head directory (config.json LlamaForCausalLMEagle3) or\n"
            "                       random:eagle3-tiny / random:eagle3-llama3-8b\n"
            "  --target-model PATH  the target an EAGLE-3 head drafts for: supplies its token\n"
            "                       embeddings and vocabulary (required with a head, refused\n"
            "                       otherwise); the head runs on --backend (cpu: weights in\n"
            "                       their stored type on --threads threads; cuda: bf16\n"
            "                       weights and KV cache on --device)\n"
            "  --eagle3-layer-ids input|output  what an EAGLE-3 head's listed feature-layer\n"
            "                       ids mean: the stream entering layer i (vLLM) or the output\n"
            "                       of layer i (SGLang); default: inferred from the ids\n"
            "  --draft-layers SPEC  run only these layers of the model (self-drafter), e.g. 0-5\n"
            "  --bind ENDPOINT      ipc:///tmp/rootspec.sock or tcp://HOST:PORT\n"
            "  --backend NAME       cpu | cuda (default cpu)\n"
            "  --device N           CUDA device ordinal (default 0)\n"
            "  --batch-invariant    CUDA: a row's logits do not depend on the batch (default off)\n"
            "  --threads N          CPU threads (default 1)\n"
            "  --ctx N              KV cache entries (default 2048)\n"
            "  --curve-dir DIR      CURVE keys for tcp:// (server.key, client.pub)\n"
            "  --insecure           allow plain tcp:// without CURVE\n"
            "  --max-requests N     exit after answering N requests (scripted runs, tests)\n"
            "  --gen-keys DIR       write a fresh server/client CURVE key pair into DIR and exit\n"
            "                       (refused when DIR holds keys already)\n"
            "  -h, --help           this text\n"
            "\n"
            "Exit status: 0 after SIGINT/SIGTERM, 1 runtime failure, 2 bad usage or input.\n");
}

/* Everything the command line says. */
typedef struct {
    const char *model, *layers, *bind, *backend, *curve, *gen, *target_path;
    int device, threads, ctx, insecure, max_req;
} Args;

/* Parses the options; returns -1 to go on, else the exit status (0 for --help, 2 for bad
 * usage), so each outcome keeps its exit code. */
static int parse_args(int argc, char **argv, Args *A) {
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = 0;
#define VAL() (rc = cli_value(argc, argv, i, &v, &e), i += !rc, rc == 0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) { if (VAL()) A->model = v; }
        else if (!strcmp(a, "--draft-layers")) { if (VAL()) A->layers = v; }
        else if (!strcmp(a, "--target-model")) { if (VAL()) A->target_path = v; }
        else if (!strcmp(a, "--eagle3-layer-ids")) { if (VAL()) rc = eagle3_layer_ids_option(v, &e); }
        else if (!strcmp(a, "--bind")) { if (VAL()) A->bind = v; }
        else if (!strcmp(a, "--backend")) { if (VAL()) A->backend = v; }
        else if (!strcmp(a, "--device")) { if (VAL()) rc = cli_int(a, v, 0, 64, &A->device, &e); }
        else if (!strcmp(a, "--batch-invariant")) backend_set_batch_invariant(1);
        else if (!strcmp(a, "--threads")) { if (VAL()) rc = cli_int(a, v, 1, 256, &A->threads, &e); }
        else if (!strcmp(a, "--ctx")) { if (VAL()) rc = cli_int(a, v, 256, 1 << 20, &A->ctx, &e); }
        else if (!strcmp(a, "--curve-dir")) { if (VAL()) A->curve = v; }
        else if (!strcmp(a, "--insecure")) A->insecure = 1;
        else if (!strcmp(a, "--gen-keys")) { if (VAL()) A->gen = v; }
        else if (!strcmp(a, "--max-requests")) { if (VAL()) rc = cli_int(a, v, 1, 1 << 30, &A->max_req, &e); }
        else rc = rs_err(&e, RS_EINVAL, "unknown option '%s' (see --help)", a);
#undef VAL
        if (rc) {
            fprintf(stderr, "rootspec-draft: %s\n", e.msg);
            return 2;
        }
    }
    return -1;
}

/* --gen-keys DIR is a command of its own: write the key pairs and stop. */
static int gen_keys(const char *dir) {
    RsErr e = {0};
    int rc = secure_gen_keys(dir, &e);
    if (rc) {
        fprintf(stderr, "rootspec-draft: %s\n", e.msg);
        return rc == RS_EINVAL ? 2 : 1;
    }
    printf("wrote CURVE keys to %s (server.key/.pub for the drafter, client.key/.pub for the target)\n", dir);
    return 0;
}

/* The options that go together, checked before anything loads; -1 to go on, else 2. */
static int check_args(const Args *A, const BackendOps **ops, int *head) {
    RsErr e = {0};
    if (!A->model || !A->bind) {
        fprintf(stderr, "rootspec-draft: need --model and --bind\n");
        usage(stderr);
        return 2;
    }
    if (secure_check_endpoint(A->bind, A->insecure, A->curve, &e) ||
        !(*ops = backend_ops_by_name(A->backend, &e))) {
        fprintf(stderr, "rootspec-draft: %s\n", e.msg);
        return 2;
    }
    *head = eagle3_path_is_head(A->model);
    if (*head != (A->target_path != NULL) || (*head && A->layers)) {
        fprintf(stderr, "rootspec-draft: %s\n",
                *head && A->layers ? "--draft-layers applies to a model, not to an EAGLE-3 head"
                : *head ? "--model names an EAGLE-3 head: give --target-model (the target "
                          "supplies its embeddings and vocabulary)"
                        : "--target-model is for an EAGLE-3 head, and --model is not one");
        return 2;
    }
    return -1;
}

/* The model (or a head's target), its tokenizer and the drafter of the kind asked for;
 * -1 on success, else the exit status with nothing left allocated. */
static int load_drafter(const Args *A, const BackendOps *ops, int head, Model **full,
                        Tokenizer **tok, Drafter **d) {
    RsErr e = {0};
    /* A head needs only its target's config, tokenizer and embedding rows (read on demand,
     * or made from a random model's seed): no weights are materialised for it. */
    int rc = head ? model_load(A->target_path, full, &e) : backend_model_load(ops, A->model, full, &e);
    if (!rc) rc = tokenizer_load_model(*full, tok, &e);
    if (!rc && head)
        rc = drafter_eagle3_open(A->model, *full, ops,
                                 &(BackendParams){.kv_capacity = A->ctx + POOL_N_EXPANDED,
                                                  .threads = A->threads, .device = A->device},
                                 d, &e);
    else if (!rc && A->layers)
        rc = drafter_self_create(*full, A->layers, ops, A->ctx, A->threads, A->device, d, &e);
    else if (!rc) rc = drafter_model_create(*full, ops, A->ctx, A->threads, A->device, d, &e);
    if (!rc) return -1;
    fprintf(stderr, "rootspec-draft: %s\n", e.msg);
    tokenizer_destroy(tok);
    model_destroy(full);
    return cli_exit_status(rc);
}

int main(int argc, char **argv) {
    Args A = {.backend = "cpu", .threads = 1, .ctx = 2048};
    int rc = parse_args(argc, argv, &A);
    if (rc >= 0) return rc;
    if (A.gen) return gen_keys(A.gen);
    const BackendOps *ops = NULL;
    int head = 0;
    if ((rc = check_args(&A, &ops, &head)) >= 0) return rc;
    Model *full = NULL;
    Tokenizer *tok = NULL;
    Drafter *d = NULL;
    if ((rc = load_drafter(&A, ops, head, &full, &tok, &d)) >= 0) return rc;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ServerOpts so = {.endpoint = A.bind, .insecure = A.insecure, .curve_dir = A.curve,
                     .name = head       ? "rootspec-draft (EAGLE-3 head)"
                             : A.layers ? "rootspec-draft (layer view)"
                                        : "rootspec-draft",
                     .caps = ops == cuda_backend_ops_get() ? PROTO_CAP_CUDA : 0,
                     .max_requests = A.max_req, .stop = &g_stop};
    RsErr e = {0};
    rc = server_run(d, tokenizer_identity(tok, full->cfg.vocab_size), &so, &e);
    if (rc) fprintf(stderr, "rootspec-draft: %s\n", e.msg);
    drafter_destroy(&d); /* before the model it borrows */
    tokenizer_destroy(&tok);
    model_destroy(&full);
    return !rc ? 0 : rc == RS_EINVAL || rc == RS_EFORMAT ? 2 : 1; /* bad --bind path or keys: 2 */
}
