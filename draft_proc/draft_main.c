/* rootspec-draft: the drafter process. Loads a model (or a layer subset of one, or an
 * EAGLE-3 head with its target's embeddings), then serves pools to one target at a time
 * over ZeroMQ until SIGINT/SIGTERM. */
#include "common/cli.h"
#include "proto/proto.h"
#include "proto/secure.h"
#include "common/eagle3.h"
#include "drafter_open.h"
#include "draft_server.h"
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
            "  --draft-layers SPEC  run only these layers of the model (self-drafter), e.g. 0-5,\n"
            "                       or half (the first half) or short (the first eighth)\n"
            "  --drafter KIND       self | model | eagle3 | suffix (default: from the options:\n"
            "                       --draft-layers self, a head directory eagle3, else model).\n"
            "                       suffix: model-free, continues earlier occurrences of the\n"
            "                       context's last tokens; --model (or --target-model) only\n"
            "                       supplies the tokenizer\n"
            "  --corpus FILE        suffix drafter: a text file it also looks in\n"
            "  --bind ENDPOINT      ipc:///tmp/rootspec.sock or tcp://HOST:PORT\n"
            "  --backend NAME       cpu | cuda (default cpu)\n"
            "  --device N           CUDA device ordinal (default 0)\n"
            "  --batch-invariant    CUDA: a row's logits do not depend on the batch (default off)\n"
            "  --threads N          CPU threads (default 1)\n"
            "  --ctx N              KV cache entries (default 2048)\n"
            "  --curve-dir DIR      CURVE keys for tcp:// (server.key, client.pub)\n"
            "  --insecure           allow plain tcp:// without CURVE\n"
            "  --max-seqs N         sequences one target may draft for at once (a batching\n"
            "                       target, rootspec-serve --parallel): each holds a drafter\n"
            "                       of its own, with a KV cache of --ctx entries (default 16)\n"
            "  --max-requests N     exit after answering N requests (scripted runs, tests)\n"
            "  --no-ahead           do not run ahead between requests (a model drafter\n"
            "                       otherwise guesses the next commit and grows its pool while\n"
            "                       the target verifies; docs/DESIGN.md §5)\n"
            "  --gen-keys DIR       write a fresh server/client CURVE key pair into DIR and exit\n"
            "                       (refused when DIR holds keys already)\n"
            "  -h, --help           this text\n"
            "\n"
            "Exit status: 0 after SIGINT/SIGTERM, 1 runtime failure, 2 bad usage or input.\n");
}

/* Everything the command line says. */
typedef struct {
    const char *model, *layers, *bind, *gen, *target_path, *corpus;
    DrafterKind kind;
    Eagle3LayerIds layer_ids; /* --eagle3-layer-ids */
    CliRuntime rt;
    int max_req, no_ahead, max_seqs;
} Args;

/* Parses the options; returns -1 to go on, else the exit status (0 for --help, 2 for bad
 * usage), so each outcome keeps its exit code. */
static int parse_args(int argc, char **argv, Args *A) {
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = 0;
#define VAL() (rc = cli_value(argc, argv, i, &v, &e), i += !rc, rc == 0)
        int shared = cli_runtime_option(argc, argv, &i, &A->rt, &e);
        if (shared) rc = shared < 0 ? shared : 0;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) { if (VAL()) A->model = v; }
        else if (!strcmp(a, "--draft-layers")) { if (VAL()) A->layers = v; }
        else if (!strcmp(a, "--target-model")) { if (VAL()) A->target_path = v; }
        else if (!strcmp(a, "--corpus")) { if (VAL()) A->corpus = v; }
        else if (!strcmp(a, "--drafter")) { if (VAL()) rc = drafter_kind_option(v, &A->kind, &e); }
        else if (!strcmp(a, "--eagle3-layer-ids")) { if (VAL()) rc = eagle3_layer_ids_parse(v, &A->layer_ids, &e); }
        else if (!strcmp(a, "--bind")) { if (VAL()) A->bind = v; }
        else if (!strcmp(a, "--gen-keys")) { if (VAL()) A->gen = v; }
        else if (!strcmp(a, "--no-ahead")) A->no_ahead = 1;
        else if (!strcmp(a, "--max-seqs")) { if (VAL()) rc = cli_int(a, v, 1, DRAFT_SEQS_MAX, &A->max_seqs, &e); }
        else if (!strcmp(a, "--max-requests")) { if (VAL()) rc = cli_int(a, v, 1, 1 << 30, &A->max_req, &e); }
        else rc = rs_err(&e, RS_EINVAL, "unknown option '%s' (see --help)", a);
#undef VAL
        if (rc) {
            fprintf(stderr, "rootspec-draft: %s\n", e.msg);
            return 2;
        }
    }
    if (cli_runtime_env(&A->rt, &e)) {
        fprintf(stderr, "rootspec-draft: %s\n", e.msg);
        return 2;
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

/* What the options ask for, as the factory's spec. */
static DrafterSpec spec_of(const Args *A) {
    DrafterSpec s = {.kind = A->kind, .model_path = A->model, .layers = A->layers,
                     .corpus_path = A->corpus, .layer_ids = A->layer_ids};
    if (s.kind == DRAFTER_KIND_AUTO)
        s.kind = A->corpus ? DRAFTER_KIND_SUFFIX
                 : A->layers ? DRAFTER_KIND_SELF
                             : drafter_spec_kind(&s);
    return s;
}

/* Why the options do not go together, or NULL. */
static const char *args_conflict(const Args *A, DrafterKind k) {
    if (k == DRAFTER_KIND_EAGLE3 && !A->target_path)
        return "--model names an EAGLE-3 head: give --target-model (the target supplies its "
               "embeddings and vocabulary)";
    if (A->target_path && k != DRAFTER_KIND_EAGLE3 && k != DRAFTER_KIND_SUFFIX)
        return "--target-model is for an EAGLE-3 head, and --model is not one (or for the "
               "suffix drafter's tokenizer)";
    if (A->layers && k != DRAFTER_KIND_SELF)
        return "--draft-layers applies to a model (the self-drafter), not to this drafter kind";
    if (A->corpus && k != DRAFTER_KIND_SUFFIX) return "--corpus is for --drafter suffix";
    return NULL;
}

/* The options that go together, checked before anything loads; -1 to go on, else 2. */
static int check_args(const Args *A, const BackendOps **ops) {
    RsErr e = {0};
    if (!(A->model || (A->kind == DRAFTER_KIND_SUFFIX && A->target_path)) || !A->bind) {
        fprintf(stderr, "rootspec-draft: need --model and --bind\n");
        usage(stderr);
        return 2;
    }
    if (secure_check_endpoint(A->bind, A->rt.insecure, A->rt.curve_dir, &e) ||
        !(*ops = backend_ops_by_name(A->rt.backend, &e))) {
        fprintf(stderr, "rootspec-draft: %s\n", e.msg);
        return 2;
    }
    const char *why = args_conflict(A, spec_of(A).kind);
    if (why) {
        fprintf(stderr, "rootspec-draft: %s\n", why);
        return 2;
    }
    return -1;
}

/* How the server opens a drafter for each further sequence: the first one's spec and host
 * (a model kind borrows the loaded model, so sequences share its weights). */
typedef struct {
    DrafterSpec spec;
    DrafterHost host;
} Opener;

static int open_seq(void *arg, Drafter **out, RsErr *e) {
    Opener *o = arg;
    return drafter_open(&o->spec, &o->host, out, e);
}

/* The host model (whose tokenizer the drafter speaks), its tokenizer and the drafter; -1
 * on success, else the exit status with nothing left allocated. A head or the suffix
 * drafter needs only the host's config, tokenizer (and a head its embedding rows, read on
 * demand): no weights are materialised for them. */
static int load_drafter(const Args *A, const BackendOps *ops, Model **full, Tokenizer **tok,
                        Drafter **out, Opener *op) {
    RsErr e = {0};
    DrafterSpec s = spec_of(A);
    int light = s.kind == DRAFTER_KIND_EAGLE3 || s.kind == DRAFTER_KIND_SUFFIX;
    const char *host = A->target_path ? A->target_path : A->model;
    BackendParams bp = {.kv_capacity = A->rt.ctx, .threads = A->rt.threads,
                        .device = A->rt.device, .batch_invariant = A->rt.batch_invariant,
                        .cpu_kernels = A->rt.cpu_kernels, .sw = A->rt.sw};
    int rc = light ? model_load(host, full, &e)
                   : backend_model_load(ops, A->model, &bp, full, &e);
    if (!rc) rc = tokenizer_load_model(*full, tok, &e);
    if (s.kind == DRAFTER_KIND_MODEL) s.model = *full, s.model_path = NULL;
    DrafterHost h = {.model = *full, .tok = *tok, .ops = ops, .backend = bp};
    if (!rc) rc = drafter_open(&s, &h, out, &e);
    *op = (Opener){.spec = s, .host = h};
    if (!rc) return -1;
    fprintf(stderr, "rootspec-draft: %s\n", e.msg);
    tokenizer_destroy(tok);
    model_destroy(full);
    return cli_exit_status(rc);
}

int main(int argc, char **argv) {
    Args A = {.rt = cli_runtime_defaults()};
    int rc = parse_args(argc, argv, &A);
    if (rc >= 0) return rc;
    if (A.gen) return gen_keys(A.gen);
    const BackendOps *ops = NULL;
    if ((rc = check_args(&A, &ops)) >= 0) return rc;
    Model *full = NULL;
    Tokenizer *tok = NULL;
    Drafter *d = NULL;
    Opener op;
    if ((rc = load_drafter(&A, ops, &full, &tok, &d, &op)) >= 0) return rc;
    char name[PROTO_NAME_MAX + 1];
    snprintf(name, sizeof name, "rootspec-draft (%s)", drafter_kind_name(spec_of(&A).kind));
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    DraftServerOpts so = {.endpoint = A.bind, .insecure = A.rt.insecure, .curve_dir = A.rt.curve_dir,
                     .name = name,
                     .caps = ops == cuda_backend_ops_get() ? PROTO_CAP_CUDA : 0,
                     .max_requests = A.max_req, .no_ahead = A.no_ahead, .stop = &g_stop,
                     .open_seq = open_seq, .open_arg = &op,
                     .max_seqs = A.max_seqs ? A.max_seqs : 16};
    RsErr e = {0};
    rc = draft_server_run(d, tokenizer_identity(tok, full->cfg.vocab_size), &so, &e);
    if (rc) fprintf(stderr, "rootspec-draft: %s\n", e.msg);
    DrafterAheadStats st = drafter_ahead_stats(d);
    if (st.guesses)
        fprintf(stderr, "rootspec-draft: ran ahead %ld times: %ld commits guessed (%ld pools ready), "
                "%ld not\n", st.guesses, st.hits, st.pools_ready, st.misses);
    if (st.rows_kept)
        fprintf(stderr, "rootspec-draft: commits kept %ld rows from the pools' expansions, ran %ld\n",
                st.rows_kept, st.rows_run);
    if (st.ahead_passes || st.commits_free)
        fprintf(stderr, "rootspec-draft: %ld passes of growth ahead; %ld commits needed no "
                "commit pass, %ld expansions had run\n", st.ahead_passes, st.commits_free,
                st.expansions_free);
    drafter_destroy(&d); /* before the model it borrows */
    tokenizer_destroy(&tok);
    model_destroy(&full);
    return !rc ? 0 : rc == RS_EINVAL || rc == RS_EFORMAT ? 2 : 1; /* bad --bind path or keys: 2 */
}
