/* rootspec-serve: the engine behind an OpenAI-compatible HTTP API (chat and text
 * completions, streamed over server-sent events or whole), with /health, /v1/models and
 * Prometheus /metrics. One decode at a time, or --parallel N of them batched into shared
 * passes; see serve.h and batch.h for the pieces. */
#include "common/cli.h"
#include "target_proc/engine_cli.h"
#include "serve_http.h"
#include "draft_proc/suffix_drafter.h"
#include "kernels/cpu/cpu_backend.h"
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <string.h>


static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-serve --model PATH [options]\n"
            "\n"
            "  --host ADDR           IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N              TCP port (default 8080; 0: any free port, printed at start)\n"
            "  --model-name NAME     the model id clients name (default: the model file's name)\n"
            "  --max-tokens N        output cap of a request without max_tokens (default 512)\n"
            "  --queue N             requests that may wait while others decode; more get a 429\n"
            "                        (default 16)\n"
            "  --parallel N          decodes at once, batched into shared passes (default: as many\n"
            "                        --ctx sequences as half the available memory holds, at most\n"
            "                        16 with --drafter suffix or --decoder ar; otherwise 1). Each\n"
            "                        request keeps a drafter of its own: a suffix, self or\n"
            "                        model drafter per worker (sharing the weights),\n"
            "                        or a sequence of the remote drafter's session\n"
            "                        (rootspec-draft --max-seqs); not an EAGLE-3 head\n"
            "  --batch-rows N        --parallel: most rows one pass carries (default 64)\n"
            "  --prefill-chunk N     --parallel: prompt rows a request hands the scheduler at once\n"
            "                        (1..256; default 256), run over as many passes as --batch-rows\n"
            "                        needs, the shortest remaining prompt first\n"
            "  --kv-entries N        --parallel: KV cache entries all requests share, in blocks of\n"
            "                        16 (default N x --ctx, capped at what half the available\n"
            "                        memory holds); a request holds what its length needs. A value\n"
            "                        over 90%% of the available memory is refused\n"
            "  --no-prefix-cache     prefill every prompt whole (default: a prompt reuses the KV\n"
            "                        blocks of the longest prefix an earlier one computed)\n"
            "  --suffix-global N     the suffix drafter also proposes from the last N tokens of\n"
            "                        earlier requests' outputs, shared by the workers, oldest\n"
            "                        out first (--drafter suffix; default 0: off)\n"
            "  --log-rounds FILE     append one JSON object per round of every decode to FILE\n"
            "                        (rootspec-target's round log; prompt_id: the request id)\n"
            "  --max-body BYTES      largest request body; larger ones get a 413 (default 1048576)\n"
            "  --max-connections N   open connections at once (default 512)\n"
            "  --max-connections-per-client N\n"
            "                        open connections at once from one client address (default 16)\n"
            "  --timeout S           seconds a connection may stall (no byte either way); a request\n"
            "                        that waits for the decoder or decodes is not stalled (default 60)\n"
            "  --request-timeout S   seconds a request's headers and body may take to arrive, from\n"
            "                        the connection's start or the previous answer's end; a slower\n"
            "                        or idle client is disconnected (default 10)\n"
            "  --allowed-hosts LIST  comma-separated Host header names a request may carry (a web\n"
            "                        page elsewhere names its own: DNS rebinding); '*': any\n"
            "                        (default: localhost, 127.0.0.1, [::1] and --host when --host\n"
            "                        is a loopback address, else any)\n"
            "  --api-key KEY         require 'Authorization: Bearer KEY' (401 otherwise; /health\n"
            "                        stays open). Repeatable; prefer --api-key-file (argv is public)\n"
            "  --api-key-file F      keys one a line (# comments); F must not be readable by others\n"
            "  --metrics-public      /metrics without a key\n"
            "  --no-auth             allow a non-loopback --host without any key\n"
            "  -h, --help            this text\n"
            "\n"
            "--threads defaults to the CPUs this process may use (its affinity mask and cgroup\n"
            "CPU quota); the available memory is MemAvailable capped by the cgroup's memory.max.\n"
            "Both, and the --parallel and --kv-entries they give, are printed at start.\n"
            "\n"
            "Engine and decoder (--decoder, --budget and the sampling options are the defaults of\n"
            "requests that omit them; a request picks its own with \"rootspec\": {\"decoder\": NAME,\n"
            "\"budget\": B}, \"temperature\", \"top_k\", \"top_p\", \"min_p\" and \"seed\"):\n");
    engine_cli_usage(f);
    fprintf(f, "\nExit status: 0 ok (stopped by SIGINT or SIGTERM), 1 runtime failure, 2 bad usage or input.\n");
}

typedef struct {
    EngineOpts eo;
    CliRuntime rt; /* copied into eo once parsed */
    DecodeOpts opts;
    ServeHttpOpts http;
    const char *model_name;
    int queue;
    ServeGate gate;
    const char *allowed_hosts;
    int no_auth;
    int parallel, batch_rows, prefill_chunk, kv_entries;
    int suffix_global;
    const char *log_path; /* --log-rounds */
} Args;

/* The drafter each batched worker opens: the engine's options, in process. */
static DrafterSpec slot_spec(const Args *A) {
    return (DrafterSpec){.kind = A->eo.drafter_kind, .model_path = A->eo.draft_model_path,
                         .layers = A->eo.draft_layers, .corpus_path = A->eo.draft_corpus,
                         .endpoint = A->eo.draft_endpoint};
}

/* Whether --parallel defaults above 1: AR, or each request a suffix drafter of its own (a
 * model drafter per request costs a KV cache and CPU beside the batch: asked for only). */
static int batchable(const Args *A) {
    DrafterSpec s = slot_spec(A);
    return A->opts.decoder == DECODER_AR || drafter_spec_kind(&s) == DRAFTER_KIND_SUFFIX;
}

/* --parallel's sizes, and a drafter every worker can have of its own. */
static int batch_args(Args *A, RsErr *e) {
    DrafterSpec s = slot_spec(A);
    if (A->suffix_global && (A->opts.decoder == DECODER_AR || drafter_spec_kind(&s) != DRAFTER_KIND_SUFFIX))
        return rs_err(e, RS_EINVAL, "--suffix-global %d: needs --drafter suffix and a speculative "
                      "--decoder", A->suffix_global);
    if (A->parallel <= 1) return RS_OK;
    if (A->opts.decoder != DECODER_AR && drafter_spec_kind(&s) == DRAFTER_KIND_EAGLE3)
        return rs_err(e, RS_EINVAL, "--parallel %d: an EAGLE-3 head drafts from the target's "
                      "features, which batched decodes do not send: use --parallel 1, or a "
                      "suffix, self, model or remote drafter", A->parallel);
    if (A->kv_entries && A->kv_entries < A->eo.ctx)
        return rs_err(e, RS_EINVAL, "--kv-entries %d is below --ctx %d (one request must fit)",
                      A->kv_entries, A->eo.ctx);
    return RS_OK;
}

#define PARALLEL_DEFAULT_MAX 16 /* decodes at once when --parallel is not given */
#define MIB (1024.0 * 1024.0)

/* Bytes one KV cache entry takes on the target's backend: K and V of every layer. */
static long long kv_entry_bytes(Engine *en) {
    Backend *b = target_backend(en->target);
    const Config *c = &en->target_model->cfg;
    int es = !strcmp(backend_name(b), "cpu") && !strcmp(cpu_backend_kv(b), "f32") ? 4 : 2;
    return 2LL * c->n_layers * c->n_kv_heads * c->head_dim * es;
}

/* --parallel and --kv-entries where the command line left them, from the memory available
 * now (the model loaded): half of it for the shared KV cache. A given --kv-entries over
 * 90% of it is refused; so is a --parallel whose cache could not hold one --ctx sequence.
 * Prints what it chose. */
static int memory_defaults(Args *A, Engine *en, RsErr *e) {
    long long avail = cli_mem_available(), per = kv_entry_bytes(en), ctx = A->eo.ctx;
    long long fit = avail ? avail / 2 / per / BACKEND_KV_BLOCK * BACKEND_KV_BLOCK : 0;
    int given_p = A->parallel > 0, given_kv = A->kv_entries > 0;
    int on_cpu = !strcmp(backend_name(target_backend(en->target)), "cpu");
    if (given_kv && avail && A->kv_entries * per > avail / 10 * 9)
        return rs_err(e, RS_EINVAL, "--kv-entries %d needs %.0f MiB (%lld bytes an entry); %.0f MiB "
                      "of memory are available", A->kv_entries, A->kv_entries * per / MIB, per, avail / MIB);
    if (!given_p) {
        long long p = !avail ? 1 : fit / ctx;
        A->parallel = !on_cpu || !batchable(A) || p < 1 ? 1 : p > PARALLEL_DEFAULT_MAX ? PARALLEL_DEFAULT_MAX : (int)p;
    }
    if (A->parallel > 1 && !given_kv) {
        long long kv = A->parallel * ctx;
        if (avail && fit < kv) kv = fit;
        if (kv < ctx)
            return rs_err(e, RS_EINVAL, "--parallel %d: half of the %.0f MiB available holds %lld KV "
                          "entries (%lld bytes each), below --ctx %lld: lower --ctx or --parallel",
                          A->parallel, avail / MIB, kv, per, ctx);
        A->kv_entries = (int)kv;
    }
    fprintf(stderr, "rootspec-serve: %.0f MiB of memory available, KV entries of %lld bytes: "
            "--parallel %d (%s)", avail / MIB, per, A->parallel, given_p ? "given" : "default");
    if (A->parallel > 1)
        fprintf(stderr, ", --kv-entries %d = %.0f MiB (%s)", A->kv_entries, A->kv_entries * per / MIB,
                given_kv ? "given" : "default");
    fputc('\n', stderr);
    return RS_OK;
}

static int parse_args(int argc, char **argv, Args *A, RsErr *e) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = 0, n = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if ((rc = cli_runtime_option(argc, argv, &i, &A->rt, e)) != 0 ||
            (rc = engine_cli_option(argc, argv, &i, &A->eo, &A->opts, e)) != 0) {
            if (rc < 0) return rc;
            continue;
        }
        if (!strcmp(a, "--no-prefix-cache")) {
            A->eo.prefix_cache = 0;
            continue;
        }
        if (!strcmp(a, "--metrics-public") || !strcmp(a, "--no-auth")) {
            *(a[2] == 'm' ? &A->gate.metrics_public : &A->no_auth) = 1;
            continue;
        }
        static const char *const own[] = {"--host", "--port", "--model-name", "--max-tokens",
                                          "--queue", "--max-body", "--max-connections",
                                          "--max-connections-per-client", "--timeout",
                                          "--request-timeout", "--allowed-hosts", "--api-key",
                                          "--api-key-file", "--parallel", "--batch-rows",
                                          "--prefill-chunk", "--kv-entries", "--suffix-global",
                                          "--log-rounds"};
        size_t k = 0;
        while (k < sizeof own / sizeof own[0] && strcmp(a, own[k])) k++;
        if (k == sizeof own / sizeof own[0]) return rs_err(e, RS_EINVAL, "unknown option '%s' (see --help)", a);
        if ((rc = cli_value(argc, argv, i++, &v, e))) return rc;
        if (!strcmp(a, "--host")) A->http.host = v;
        else if (!strcmp(a, "--port")) rc = cli_int(a, v, 0, 65535, &A->http.port, e);
        else if (!strcmp(a, "--model-name")) A->model_name = v;
        else if (!strcmp(a, "--allowed-hosts")) A->allowed_hosts = v;
        else if (!strcmp(a, "--log-rounds")) A->log_path = v;
        else if (!strcmp(a, "--api-key")) {
            if (!*v) return rs_err(e, RS_EINVAL, "--api-key is empty");
            serve_gate_add_key(&A->gate, v);
        } else if (!strcmp(a, "--api-key-file")) rc = serve_gate_key_file(&A->gate, v, e);
        else if (!strcmp(a, "--max-tokens")) rc = cli_int(a, v, 1, 1 << 20, &A->opts.max_new, e);
        else if (!strcmp(a, "--queue")) rc = cli_int(a, v, 1, 4096, &A->queue, e);
        else if (!strcmp(a, "--parallel")) rc = cli_int(a, v, 1, 256, &A->parallel, e);
        else if (!strcmp(a, "--batch-rows")) rc = cli_int(a, v, 1, 4096, &A->batch_rows, e);
        else if (!strcmp(a, "--prefill-chunk")) rc = cli_int(a, v, 1, 256, &A->prefill_chunk, e);
        else if (!strcmp(a, "--suffix-global")) rc = cli_int(a, v, 0, SUFFIX_INDEX_MAX, &A->suffix_global, e);
        else if (!strcmp(a, "--kv-entries")) rc = cli_int(a, v, 16, 1 << 24, &A->kv_entries, e);
        else if (!strcmp(a, "--max-body")) {
            if (!(rc = cli_int(a, v, 1024, 1 << 30, &n, e))) A->http.max_body = (size_t)n;
        } else if (!strcmp(a, "--max-connections")) rc = cli_int(a, v, 2, 4096, &A->http.max_conn, e);
        else if (!strcmp(a, "--max-connections-per-client")) rc = cli_int(a, v, 1, 4096, &A->http.max_conn_ip, e);
        else if (!(rc = cli_int(a, v, 1, 86400, &n, e))) {
            if (!strcmp(a, "--timeout")) A->http.timeout = (unsigned)n;
            else A->http.request_timeout = (unsigned)n;
        }
        if (rc) return rc;
    }
    if (!A->eo.model_path) return rs_err(e, RS_EINVAL, "need --model (see --help)");
    int rc = serve_gate_hosts(&A->gate, A->allowed_hosts, A->http.host, e);
    if (rc) return rc;
    struct in_addr ip;
    int loopback = inet_pton(AF_INET, A->http.host, &ip) == 1 && (ntohl(ip.s_addr) >> 24) == 127;
    if (!loopback && !A->gate.n_keys && !A->no_auth)
        return rs_err(e, RS_EINVAL, "--host %s is reachable from other machines: give --api-key or "
                      "--api-key-file, or --no-auth to serve without authentication", A->http.host);
    A->gate.max_body = A->http.max_body;
    A->http.gate = &A->gate;
    if (A->rt.threads == 0) A->rt.threads = cli_cpus_available(); /* --threads not given */
    rc = engine_cli_runtime(&A->eo, &A->rt, e);
    if (!rc) rc = engine_cli_check(&A->eo, &A->opts, e);
    return rc ? rc : batch_args(A, e);
}

/* The model id: --model-name, else the model path's last component. */
static const char *model_id(const Args *A) {
    if (A->model_name) return A->model_name;
    const char *p = A->eo.model_path, *s = strrchr(p, '/');
    return s && s[1] ? s + 1 : p;
}

/* Serves until SIGINT or SIGTERM (blocked in every thread, taken here by sigwait). */
static int serve(Args *A, Engine *en, const sigset_t *sigs) {
    ServeMetrics *m = NULL;
    serve_metrics_create(&m);
    DrafterSpec spec = slot_spec(A);
    ServeConfig cfg = {.model_name = model_id(A), .queue_max = A->queue, .opts_default = A->opts,
                       .parallel = A->parallel,
                       .batch = {.row_budget = A->batch_rows, .prefill_chunk = A->prefill_chunk,
                                 .kv_entries = A->kv_entries, .seq_capacity = A->eo.ctx,
                                 .backend = engine_backend_params(&A->eo)},
                       .slot_drafter = A->opts.decoder != DECODER_AR ? &spec : NULL,
                       .suffix_global = A->suffix_global};
    if (A->log_path && !(cfg.round_log = fopen(A->log_path, "a"))) {
        fprintf(stderr, "rootspec-serve: cannot open --log-rounds '%s': %s\n", A->log_path,
                strerror(errno));
        serve_metrics_destroy(&m);
        return 1;
    }
    ServeCore *core = NULL;
    RsErr e = {0};
    int rc = serve_core_create(en, &cfg, m, &core, &e);
    if (rc) {
        fprintf(stderr, "rootspec-serve: %s\n", e.msg);
        if (cfg.round_log) fclose(cfg.round_log);
        serve_metrics_destroy(&m);
        return cli_exit_status(rc);
    }
    ServeHttp *http = NULL;
    rc = serve_http_start(core, &A->http, &http, &e);
    if (rc) fprintf(stderr, "rootspec-serve: %s\n", e.msg);
    else {
        char smp[SAMPLING_STR], budget[16] = "auto";
        if (A->opts.budget) snprintf(budget, sizeof budget, "%d", A->opts.budget);
        fprintf(stderr, "rootspec-serve: listening on http://%s:%d (model %s, context %d, decoder %s, "
                "B=%s, %s, threads %d of %d CPUs available, %s)\n",
                A->http.host, serve_http_port(http), cfg.model_name, serve_core_context(core),
                decoder_name(A->opts.decoder), budget, sampling_str(&A->opts.sampling, smp, sizeof smp),
                A->eo.threads, cli_cpus_available(),
                A->gate.n_keys ? "API key required" : "no API key");
        int sig = 0;
        sigwait(sigs, &sig);
        fprintf(stderr, "rootspec-serve: stopping (signal %d)\n", sig);
    }
    /* Graceful: no new connections; every job ends (503); the handlers get to send that. */
    serve_http_quiesce(http);
    serve_core_stop(core);
    serve_http_drain(http, 5000);
    serve_http_stop(&http);
    serve_core_destroy(&core);
    serve_metrics_destroy(&m);
    if (cfg.round_log && fclose(cfg.round_log)) {
        fprintf(stderr, "rootspec-serve: writing --log-rounds '%s' failed\n", A->log_path);
        if (!rc) return 1;
    }
    return rc ? cli_exit_status(rc) : 0;
}

int main(int argc, char **argv) {
    Args A = {.eo = {.draft_timeout_ms = 10000, .prefix_cache = 1}, .rt = cli_runtime_defaults(),
              .opts = {.decoder = DECODER_AR, .budget = 59, .seed = 1, .max_new = 512},
              .http = {.host = "127.0.0.1", .port = 8080, .max_body = 1 << 20, .max_conn = 512,
                       .max_conn_ip = 16, .timeout = 60, .request_timeout = 10},
              .queue = 16, .batch_rows = 64, .prefill_chunk = 256}; /* parallel 0: from memory */
    A.rt.threads = 0; /* the CPUs this process may use, unless --threads says */
    RsErr e = {0};
    int rc = parse_args(argc, argv, &A, &e);
    if (rc) serve_gate_free(&A.gate);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "rootspec-serve: %s\n", e.msg);
        return 2;
    }
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* before any thread starts: they inherit it */
    signal(SIGPIPE, SIG_IGN);                /* a client gone mid-write is an error, not death */
    Engine *en = NULL;
    rc = engine_cli_open("rootspec-serve", &A.eo, &A.opts, &en);
    if (rc >= 0) return rc;
    if ((rc = memory_defaults(&A, en, &e))) {
        fprintf(stderr, "rootspec-serve: %s\n", e.msg);
        engine_destroy(&en);
        serve_gate_free(&A.gate);
        return 2;
    }
    rc = serve(&A, en, &sigs);
    engine_destroy(&en);
    serve_gate_free(&A.gate);
    return rc;
}
