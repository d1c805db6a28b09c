/* rootspec-bench: the SPEC §6 timing protocol. Runs every prompt of a prompt file through
 * every decoder x T x B combination (plus an AR baseline per T) in the seeded, rotated order
 * of bench_plan_make, logs every round (rounds.jsonl) and every decode (decodes.csv), and
 * ends with bench_analyze so summary.md and the plots come from the same code as --analyze.
 * The run's settings live in DIR/run.json so --resume continues exactly the same run. */
#include "bench/analyze.h"
#include "bench/benchlog.h"
#include "common/prompts.h"
#include "bench/stats.h"
#include "common/cli.h"
#include "target_proc/engine.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_JSON_VERSION 1
#define DRAFTER_START_S 600 /* a big drafter on a slow disk can take minutes to load */

static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-bench --model PATH --prompts FILE --out DIR [options]\n"
            "       rootspec-bench --resume DIR\n"
            "       rootspec-bench --analyze DIR\n"
            "\n"
            "Runs the SPEC section 6 timing protocol: warm-up decodes on the first prompts, then\n"
            "every prompt runs every decoder x T x B combination (and an AR baseline per T) once,\n"
            "in an order rotated by the prompt's position in a seeded shuffle.\n"
            "\n"
            "  --model PATH          target model: GGUF file or Hugging Face directory\n"
            "  --draft-model PATH    drafter model sharing the target's tokenizer\n"
            "  --draft-layers SPEC   self-drafter from target layers, e.g. 0-5,24-29 (default %s)\n"
            "  --draft-endpoint EP   use a running rootspec-draft at EP (ipc://, tcp://)\n"
            "  --launch-drafter      start build/rootspec-draft (next to this binary) on a private\n"
            "                        ipc:// endpoint with the drafter options, stop it at exit\n"
            "                        (default without either: in-process drafter)\n"
            "  --draft-timeout-ms N  remote drafter reply timeout (default 10000)\n"
            "  --insecure            allow plain tcp:// to the drafter (no CURVE)\n"
            "  --curve-dir DIR       CURVE key files for tcp://\n"
            "  --prompts FILE        prompt file (JSON lines, see below)\n"
            "  --limit N             use only the first N prompts of the file (default all)\n"
            "  --max-new N           stop after the round reaching N new tokens (default 256)\n"
            "  --decoders LIST       comma list of draft, pearl, rootdraw, root, ar\n"
            "                        (default draft,pearl,rootdraw,root)\n"
            "  --temps LIST          comma list of 0 (greedy) and 1 (sampling) (default 0,1)\n"
            "  --budgets LIST        comma list of tree budgets B in 1..%d (default 8,59)\n"
            "  --no-ar               no autoregressive baseline: exactly SPEC §6's 16 combinations\n"
            "                        (default: one AR decode per T joins each prompt's rotation,\n"
            "                        18 in all, for every decoder's speedup over AR)\n"
            "  --warmup N            prompts whose combinations run once first, unlogged\n"
            "                        (default 2)\n"
            "  --seed S              plan shuffle and sampling seed (default 1); each decode uses\n"
            "                        (S, prompt index, decoder, T, B) so runs are reproducible\n"
            "  --threads N           CPU threads (default 1)\n"
            "  --ctx N               KV cache entries per model (default 2048)\n"
            "  --backend NAME        cpu | cuda (default cpu)\n"
            "  --device N            CUDA device ordinal (default 0)\n"
            "  --out DIR             run directory (must not hold a run already)\n"
            "  --resume DIR          continue an interrupted run with the settings in DIR/run.json;\n"
            "                        refused when the prompt file changed since\n"
            "  --analyze DIR         rebuild DIR/summary.md and the plots from the logs\n"
            "  -h, --help            this text\n"
            "\n"
            "Exit status: 0 ok, 1 runtime failure, 2 bad usage or input, 130 interrupted\n"
            "(completed decodes are kept; continue with --resume DIR).\n"
            "\n",
            ENGINE_DEFAULT_DRAFT_LAYERS, TREE_MAX);
    fputs(bench_help_outputs(), f);
    fputs("\n", f);
    fputs(prompts_help(), f);
}

/* ---- settings (command line or DIR/run.json) ---- */

typedef struct {
    char *model, *draft_model, *draft_layers, *draft_endpoint, *curve_dir, *backend;
    char *prompts, *decoders, *temps, *budgets;
    char prompts_hash[17]; /* FNV-1a 64 of the prompt file's bytes, hex */
    int launch, insecure, draft_timeout_ms, device;
    int limit, max_new, no_ar, warmup, threads, ctx;
    uint64_t seed;
} Settings;

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void settings_free(Settings *s) {
    char **f[] = {&s->model, &s->draft_model, &s->draft_layers, &s->draft_endpoint,
                  &s->curve_dir, &s->backend, &s->prompts, &s->decoders, &s->temps, &s->budgets};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        free(*f[i]);
        *f[i] = NULL;
    }
}

/* Absolute path, so a resume from another working directory finds the same files. */
static char *abs_path(const char *p) {
    if (!p) return NULL;
    char buf[PATH_MAX];
    return realpath(p, buf) ? strdup(buf) : strdup(p);
}

static int file_hash(const char *path, char out[17], RsErr *e) {
    char *buf;
    size_t n;
    int rc = rs_read_file(path, &buf, &n, e);
    if (rc) return rc;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)buf[i]) * 0x100000001b3ull;
    free(buf);
    snprintf(out, 17, "%016" PRIx64, h);
    return RS_OK;
}

static void json_str(cJSON *o, const char *k, const char *v) {
    if (v) cJSON_AddStringToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

static int settings_save(const Settings *s, const char *dir, RsErr *e) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", RUN_JSON_VERSION);
    json_str(o, "model", s->model);
    json_str(o, "draft_model", s->draft_model);
    json_str(o, "draft_layers", s->draft_layers);
    json_str(o, "draft_endpoint", s->draft_endpoint);
    cJSON_AddBoolToObject(o, "launch_drafter", s->launch);
    cJSON_AddNumberToObject(o, "draft_timeout_ms", s->draft_timeout_ms);
    cJSON_AddBoolToObject(o, "insecure", s->insecure);
    json_str(o, "curve_dir", s->curve_dir);
    json_str(o, "prompts", s->prompts);
    json_str(o, "prompts_fnv1a64", s->prompts_hash);
    cJSON_AddNumberToObject(o, "limit", s->limit);
    cJSON_AddNumberToObject(o, "max_new", s->max_new);
    json_str(o, "decoders", s->decoders);
    json_str(o, "temps", s->temps);
    json_str(o, "budgets", s->budgets);
    cJSON_AddBoolToObject(o, "no_ar", s->no_ar);
    cJSON_AddNumberToObject(o, "warmup", s->warmup);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed); /* a string: doubles lose 64-bit seeds */
    json_str(o, "seed", seed);
    cJSON_AddNumberToObject(o, "threads", s->threads);
    cJSON_AddNumberToObject(o, "ctx", s->ctx);
    json_str(o, "backend", s->backend);
    cJSON_AddNumberToObject(o, "device", s->device);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    /* rename: a crash never leaves a half-written run.json behind */
    if (!ok || rename(tmp, path) != 0) {
        int err = errno;
        remove(tmp);
        return rs_err(e, RS_EIO, "cannot write '%s': %s", path, strerror(err));
    }
    return RS_OK;
}

static int jget_str(const cJSON *o, const char *path, const char *k, int nullable, char **out,
                    RsErr *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (nullable && (!v || cJSON_IsNull(v))) {
        *out = NULL;
        return RS_OK;
    }
    if (!cJSON_IsString(v))
        return rs_err(e, RS_EFORMAT, "%s: \"%s\" missing or not a string", path, k);
    *out = strdup(v->valuestring);
    return RS_OK;
}

static int jget_int(const cJSON *o, const char *path, const char *k, int min, int max, int *out,
                    RsErr *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v) && min == 0 && max == 1) {
        *out = cJSON_IsTrue(v);
        return RS_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < min ||
        v->valuedouble > max)
        return rs_err(e, RS_EFORMAT, "%s: \"%s\" missing or not an integer in %d..%d", path, k,
                      min, max);
    *out = (int)v->valuedouble;
    return RS_OK;
}

static int settings_load(Settings *s, const char *dir, RsErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/run.json", dir);
    char *text;
    size_t n;
    int rc = rs_read_file(path, &text, &n, e);
    if (rc) {
        char why[sizeof e->msg]; /* e->msg cannot be both the format argument and the output */
        snprintf(why, sizeof why, "%s", e->msg);
        return rs_err(e, RS_EINVAL, "--resume: %s (is '%s' a rootspec-bench run?)", why, dir);
    }
    cJSON *o = cJSON_ParseWithLength(text, n);
    free(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return rs_err(e, RS_EFORMAT, "%s: not a JSON object", path);
    }
    int ver = 0;
    char *seed = NULL;
    memset(s, 0, sizeof *s);
    if ((rc = jget_int(o, path, "version", 0, INT_MAX, &ver, e))) goto out;
    if (ver != RUN_JSON_VERSION) {
        rc = rs_err(e, RS_EUNSUPPORTED, "%s: version %d, this build reads %d", path, ver,
                    RUN_JSON_VERSION);
        goto out;
    }
    char *hash = NULL;
    if ((rc = jget_str(o, path, "model", 0, &s->model, e)) ||
        (rc = jget_str(o, path, "draft_model", 1, &s->draft_model, e)) ||
        (rc = jget_str(o, path, "draft_layers", 1, &s->draft_layers, e)) ||
        (rc = jget_str(o, path, "draft_endpoint", 1, &s->draft_endpoint, e)) ||
        (rc = jget_int(o, path, "launch_drafter", 0, 1, &s->launch, e)) ||
        (rc = jget_int(o, path, "draft_timeout_ms", 1, 3600000, &s->draft_timeout_ms, e)) ||
        (rc = jget_int(o, path, "insecure", 0, 1, &s->insecure, e)) ||
        (rc = jget_str(o, path, "curve_dir", 1, &s->curve_dir, e)) ||
        (rc = jget_str(o, path, "prompts", 0, &s->prompts, e)) ||
        (rc = jget_str(o, path, "prompts_fnv1a64", 0, &hash, e)) ||
        (rc = jget_int(o, path, "limit", 0, INT_MAX, &s->limit, e)) ||
        (rc = jget_int(o, path, "max_new", 1, 1 << 20, &s->max_new, e)) ||
        (rc = jget_str(o, path, "decoders", 0, &s->decoders, e)) ||
        (rc = jget_str(o, path, "temps", 0, &s->temps, e)) ||
        (rc = jget_str(o, path, "budgets", 0, &s->budgets, e)) ||
        (rc = jget_int(o, path, "no_ar", 0, 1, &s->no_ar, e)) ||
        (rc = jget_int(o, path, "warmup", 0, 1 << 20, &s->warmup, e)) ||
        (rc = jget_str(o, path, "seed", 0, &seed, e)) ||
        (rc = jget_int(o, path, "threads", 1, 256, &s->threads, e)) ||
        (rc = jget_int(o, path, "ctx", 256, 1 << 20, &s->ctx, e)) ||
        (rc = jget_str(o, path, "backend", 0, &s->backend, e)) ||
        (rc = jget_int(o, path, "device", 0, 64, &s->device, e))) {
        free(hash);
        goto out;
    }
    snprintf(s->prompts_hash, sizeof s->prompts_hash, "%s", hash);
    free(hash);
    if ((rc = cli_u64("seed", seed, &s->seed, e)))
        rc = rs_err(e, RS_EFORMAT, "%s: \"seed\" is not an unsigned integer: '%s'", path, seed);
out:
    free(seed);
    cJSON_Delete(o);
    if (rc) settings_free(s);
    return rc;
}

/* ---- signals and the launched drafter ----
 * SIGINT/SIGTERM end the run at once: every completed decode is already on disk (each line
 * is flushed, and log writes run with the signals blocked), the decode in flight is dropped,
 * so the handler only needs async-signal-safe calls: write, kill, unlink, rmdir, _exit.
 * The block covers the main thread only: a process-directed signal that arrives while it
 * writes goes to a thread that does not block it (the in-process drafter's worker, a BLAS
 * thread), so the handler there hands the signal to the main thread (pthread_kill), where it
 * waits until the write is complete. */

static pthread_t g_main_thread;
static volatile pid_t g_child = -1;
static char g_sock[4200], g_tmpdir[4096];
static char g_msg[2][1400];
static volatile sig_atomic_t g_msg_ix = -1;

static void on_signal(int sig) {
    if (!pthread_equal(pthread_self(), g_main_thread)) {
        pthread_kill(g_main_thread, sig);
        return;
    }
    if (g_msg_ix >= 0) {
        const char *m = g_msg[g_msg_ix];
        ssize_t w = write(STDERR_FILENO, m, strlen(m));
        (void)w;
    }
    if (g_child > 0) kill(g_child, SIGTERM);
    if (g_sock[0]) unlink(g_sock);
    if (g_tmpdir[0]) rmdir(g_tmpdir);
    _exit(sig == SIGINT ? 130 : 128 + sig);
}

static void set_interrupt_msg(const char *dir, int n_done) {
    int ix = g_msg_ix == 0 ? 1 : 0;
    snprintf(g_msg[ix], sizeof g_msg[ix],
             "\nrootspec-bench: interrupted; %d completed decodes are kept in %s.\n"
             "Continue with: rootspec-bench --resume %s\n",
             n_done, dir, dir);
    g_msg_ix = ix;
}

static void block_signals(int block) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    sigprocmask(block ? SIG_BLOCK : SIG_UNBLOCK, &s, NULL);
}

static void drafter_stop(void) {
    pid_t pid = g_child;
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(50000);
        if (waitpid(pid, &st, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
        g_child = -1;
    }
    if (g_sock[0]) unlink(g_sock);
    if (g_tmpdir[0]) rmdir(g_tmpdir);
    g_sock[0] = g_tmpdir[0] = 0;
}

/* Starts rootspec-draft from this binary's directory on ipc://<tmp>/draft.sock and waits
 * until it has bound (the socket file appears), watching for an early exit. */
static int drafter_launch(const Settings *s, char *endpoint, size_t cap, RsErr *e) {
    char self[PATH_MAX], bin[PATH_MAX + 32];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) return rs_err(e, RS_EIO, "--launch-drafter: cannot read /proc/self/exe: %s", strerror(errno));
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(bin, sizeof bin, "%s/rootspec-draft", self);
    if (access(bin, X_OK) != 0)
        return rs_err(e, RS_EIO, "--launch-drafter: '%s' not found or not executable (make all)", bin);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/rootspec-bench-XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        g_tmpdir[0] = 0;
        return rs_err(e, RS_EIO, "--launch-drafter: cannot create a temp dir: %s", strerror(errno));
    }
    snprintf(g_sock, sizeof g_sock, "%s/draft.sock", g_tmpdir);
    snprintf(endpoint, cap, "ipc://%s", g_sock);
    char th[16], ctx[16], dev[16];
    snprintf(th, sizeof th, "%d", s->threads);
    snprintf(ctx, sizeof ctx, "%d", s->ctx);
    snprintf(dev, sizeof dev, "%d", s->device);
    const char *layers = s->draft_model ? NULL
                         : s->draft_layers ? s->draft_layers
                                           : ENGINE_DEFAULT_DRAFT_LAYERS;
    const char *argv[20];
    int a = 0;
    argv[a++] = bin;
    argv[a++] = "--model";
    argv[a++] = s->draft_model ? s->draft_model : s->model;
    if (layers) {
        argv[a++] = "--draft-layers";
        argv[a++] = layers;
    }
    argv[a++] = "--bind";
    argv[a++] = endpoint;
    argv[a++] = "--backend";
    argv[a++] = s->backend;
    argv[a++] = "--device";
    argv[a++] = dev;
    argv[a++] = "--threads";
    argv[a++] = th;
    argv[a++] = "--ctx";
    argv[a++] = ctx;
    argv[a] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return rs_err(e, RS_EIO, "--launch-drafter: fork failed: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive a crashed bench */
        block_signals(0);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "rootspec-bench: cannot exec '%s': %s\n", bin, strerror(errno));
        _exit(127);
    }
    g_child = pid;
    fprintf(stderr, "rootspec-bench: started drafter (pid %d) on %s\n", (int)pid, endpoint);
    uint64_t deadline = rs_now_ns() + (uint64_t)DRAFTER_START_S * 1000000000ull;
    struct stat st;
    while (stat(g_sock, &st) != 0) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            g_child = -1;
            return rs_err(e, RS_EPEER, "--launch-drafter: '%s' exited (%s %d) before binding %s",
                          bin, WIFEXITED(status) ? "status" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), endpoint);
        }
        if (rs_now_ns() > deadline)
            return rs_err(e, RS_ETIMEOUT, "--launch-drafter: drafter did not bind %s within %d s",
                          endpoint, DRAFTER_START_S);
        usleep(20000);
    }
    return RS_OK; /* engine_open's HELLO (with its timeout) confirms that it answers */
}

/* ---- per-decode round capture ---- */

typedef struct {
    const BenchCombo *combo;
    const char *prompt_id;
    BenchRound *rounds; // (cap) buffered, written after the decode so no I/O is timed
    int n, cap;
    uint64_t graph0, eager0; /* backend counters before the decode / at the last round */
    const char *label;
} Sink;

static int64_t ts(uint64_t ns) { return ns ? (int64_t)ns : BENCH_NULL_NS; }

static void on_round(void *u, const RoundInfo *ri) {
    Sink *s = u;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->rounds = realloc(s->rounds, sizeof *s->rounds * (size_t)s->cap);
        RS_ASSERT(s->rounds);
    }
    BenchRound *r = &s->rounds[s->n++];
    benchlog_round_init(r);
    snprintf(r->decoder, sizeof r->decoder, "%s", s->combo->decoder);
    r->temp = s->combo->temp;
    r->budget = s->combo->budget;
    snprintf(r->prompt_id, sizeof r->prompt_id, "%s", s->prompt_id);
    r->round = ri->round;
    r->emitted = ri->emitted;
    r->accepted = ri->accepted;
    r->tree_size = ri->tree_size;
    r->x1_in_pool = ri->x1_in_pool < 0 ? BENCH_X1_NULL : ri->x1_in_pool;
    r->tau = ri->tau; /* NAN is written as null */
    r->t_round_start = ts(ri->t_round_start);
    r->t_grow_sent = ts(ri->t_grow_sent);
    r->t_root_start = ts(ri->t_root_start);
    r->t_root_end = ts(ri->t_root_end);
    r->t_pool_recv = ts(ri->t_pool_recv);
    r->t_select_done = ts(ri->t_select_done);
    r->t_tree_start = ts(ri->t_tree_start);
    r->t_tree_end = ts(ri->t_tree_end);
    r->t_commit = ts(ri->t_commit);
    r->draft_ns = ri->draft_ns ? (int64_t)ri->draft_ns : BENCH_NULL_NS;
    /* RoundInfo carries cumulative backend counters; the log wants this round's share */
    r->graph_replays = (int64_t)(ri->graph_replays - s->graph0);
    r->eager_launches = (int64_t)(ri->eager_launches - s->eager0);
    s->graph0 = ri->graph_replays;
    s->eager0 = ri->eager_launches;
}

static void on_event(void *u, const char *ev, const char *detail) {
    Sink *s = u;
    fprintf(stderr, "\nrootspec-bench: %s: %s: %s\n", s->label, ev, detail);
}

/* ---- main ---- */

static int exit_code(int rc) {
    return rc == RS_EINVAL || rc == RS_EFORMAT || rc == RS_EUNSUPPORTED ? 2 : 1;
}

static int echo_summary(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/summary.md", dir);
    char *text;
    size_t n;
    RsErr e = {0};
    if (rs_read_file(path, &text, &n, &e)) {
        fprintf(stderr, "rootspec-bench: %s\n", e.msg);
        return 1;
    }
    fwrite(text, 1, n, stdout);
    free(text);
    printf("\nrootspec-bench: summary: %s\n", path);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    Settings s = {0};
    s.threads = 1;
    s.ctx = 2048;
    s.max_new = 256;
    s.warmup = 2;
    s.seed = 1;
    s.draft_timeout_ms = 10000;
    const char *model = NULL, *draft_model = NULL, *draft_layers = NULL, *endpoint = NULL;
    const char *curve = NULL, *backend = "cpu", *prompts = NULL, *decoders = "draft,pearl,rootdraw,root";
    const char *temps = "0,1", *budgets = "8,59", *out = NULL, *resume = NULL, *analyze = NULL;
    const char *first_setting = NULL; /* options that --resume must not be combined with */
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = 0, setting = 1;
#define VAL() (rc = cli_value(argc, argv, i, &v, &e), i += !rc, rc == 0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) { if (VAL()) model = v; }
        else if (!strcmp(a, "--draft-model")) { if (VAL()) draft_model = v; }
        else if (!strcmp(a, "--draft-layers")) { if (VAL()) draft_layers = v; }
        else if (!strcmp(a, "--draft-endpoint")) { if (VAL()) endpoint = v; }
        else if (!strcmp(a, "--launch-drafter")) s.launch = 1;
        else if (!strcmp(a, "--draft-timeout-ms")) { if (VAL()) rc = cli_int(a, v, 1, 3600000, &s.draft_timeout_ms, &e); }
        else if (!strcmp(a, "--insecure")) s.insecure = 1;
        else if (!strcmp(a, "--curve-dir")) { if (VAL()) curve = v; }
        else if (!strcmp(a, "--prompts")) { if (VAL()) prompts = v; }
        else if (!strcmp(a, "--limit")) { if (VAL()) rc = cli_int(a, v, 1, INT_MAX, &s.limit, &e); }
        else if (!strcmp(a, "--max-new")) { if (VAL()) rc = cli_int(a, v, 1, 1 << 20, &s.max_new, &e); }
        else if (!strcmp(a, "--decoders")) { if (VAL()) decoders = v; }
        else if (!strcmp(a, "--temps")) { if (VAL()) temps = v; }
        else if (!strcmp(a, "--budgets")) { if (VAL()) budgets = v; }
        else if (!strcmp(a, "--no-ar")) s.no_ar = 1;
        else if (!strcmp(a, "--warmup")) { if (VAL()) rc = cli_int(a, v, 0, 1 << 20, &s.warmup, &e); }
        else if (!strcmp(a, "--seed")) { if (VAL()) rc = cli_u64(a, v, &s.seed, &e); }
        else if (!strcmp(a, "--threads")) { if (VAL()) rc = cli_int(a, v, 1, 256, &s.threads, &e); }
        else if (!strcmp(a, "--ctx")) { if (VAL()) rc = cli_int(a, v, 256, 1 << 20, &s.ctx, &e); }
        else if (!strcmp(a, "--backend")) { if (VAL()) backend = v; }
        else if (!strcmp(a, "--device")) { if (VAL()) rc = cli_int(a, v, 0, 64, &s.device, &e); }
        else if (!strcmp(a, "--out")) { if (VAL()) out = v; }
        else if (!strcmp(a, "--resume")) { setting = 0; if (VAL()) resume = v; }
        else if (!strcmp(a, "--analyze")) { setting = 0; if (VAL()) analyze = v; }
        else rc = rs_err(&e, RS_EINVAL, "unknown option '%s' (see --help)", a);
#undef VAL
        if (rc) {
            fprintf(stderr, "rootspec-bench: %s\n", e.msg);
            return 2;
        }
        if (setting && !first_setting) first_setting = a;
    }

    if (analyze) {
        if (resume || first_setting) {
            fprintf(stderr, "rootspec-bench: --analyze DIR takes no other option (got '%s')\n",
                    resume ? "--resume" : first_setting);
            return 2;
        }
        int rc = bench_analyze(analyze, &e);
        if (rc) {
            fprintf(stderr, "rootspec-bench: --analyze %s: %s\n", analyze, e.msg);
            return exit_code(rc);
        }
        return echo_summary(analyze);
    }

    const char *dir;
    int rc;
    if (resume) {
        if (first_setting) {
            fprintf(stderr,
                    "rootspec-bench: --resume DIR takes its settings from DIR/run.json; do not "
                    "combine it with '%s'\n", first_setting);
            return 2;
        }
        dir = resume;
        if ((rc = settings_load(&s, dir, &e))) {
            fprintf(stderr, "rootspec-bench: %s\n", e.msg);
            return 2;
        }
        char now[17];
        if ((rc = file_hash(s.prompts, now, &e))) {
            fprintf(stderr, "rootspec-bench: --resume: prompt file of the run: %s\n", e.msg);
            settings_free(&s);
            return 2;
        }
        if (strcmp(now, s.prompts_hash) != 0) {
            fprintf(stderr,
                    "rootspec-bench: --resume: prompt file '%s' changed since the run started "
                    "(FNV-1a %s, run.json has %s); start a new run with --out\n",
                    s.prompts, now, s.prompts_hash);
            settings_free(&s);
            return 2;
        }
    } else {
        if (!model || !prompts || !out) {
            fprintf(stderr, "rootspec-bench: need --model, --prompts and --out (or --resume DIR / --analyze DIR)\n");
            usage(stderr);
            return 2;
        }
        if (draft_model && draft_layers) {
            fprintf(stderr, "rootspec-bench: give --draft-model or --draft-layers, not both\n");
            return 2;
        }
        if (endpoint && s.launch) {
            fprintf(stderr, "rootspec-bench: give --draft-endpoint or --launch-drafter, not both\n");
            return 2;
        }
        dir = out;
        char rj[4200];
        snprintf(rj, sizeof rj, "%s/run.json", dir);
        if (access(rj, F_OK) == 0) {
            fprintf(stderr,
                    "rootspec-bench: '%s' already holds a run (%s); continue it with --resume %s "
                    "or choose another --out\n", dir, rj, dir);
            return 2;
        }
        /* The directory is made once the prompts are tokenized; one that cannot be made or
         * written is refused now, not after the models have loaded. */
        char where[4096];
        snprintf(where, sizeof where, "%s", dir);
        struct stat st;
        if (stat(where, &st) != 0) { /* to be created: check its parent */
            size_t k = strlen(where);
            while (k > 1 && where[k - 1] == '/') where[--k] = 0;
            char *sl = strrchr(where, '/');
            if (!sl) snprintf(where, sizeof where, ".");
            else sl[sl == where] = 0; /* "/run" -> "/" */
        }
        const char *why = stat(where, &st) != 0           ? "no such directory"
                          : !S_ISDIR(st.st_mode)              ? "not a directory"
                          : access(where, W_OK | X_OK) != 0   ? "not writable"
                                                              : NULL;
        if (why) {
            if (strcmp(where, dir))
                fprintf(stderr, "rootspec-bench: --out '%s': cannot create it in '%s': %s\n", dir,
                        where, why);
            else
                fprintf(stderr, "rootspec-bench: --out '%s': %s\n", dir, why);
            return 2;
        }
        s.model = abs_path(model);
        s.draft_model = abs_path(draft_model);
        s.draft_layers = dup_or_null(draft_layers);
        s.draft_endpoint = dup_or_null(endpoint);
        s.curve_dir = abs_path(curve);
        s.backend = strdup(backend);
        s.prompts = abs_path(prompts);
        s.temps = strdup(temps);
        s.budgets = strdup(budgets);
        s.decoders = strdup(decoders);
        if ((rc = file_hash(s.prompts, s.prompts_hash, &e))) {
            fprintf(stderr, "rootspec-bench: --prompts: %s\n", e.msg);
            settings_free(&s);
            return 2;
        }
    }

    /* From here on every exit goes through `done` to release what was set up. */
    int status = 0;
    PromptSet *ps = NULL;
    BenchCombo *combos = NULL;
    int n_combos = 0;
    BenchPlan *plan = NULL;
    BenchDoneSet *done = NULL;
    Engine en;
    int engine_ok = 0;
    int **ids = NULL, *n_ids = NULL;
    FILE *frounds = NULL, *fdecodes = NULL;
    Sink sink = {0};
    BenchProgress *prog = NULL;
    char *declist = NULL;
    int n_prompts = 0;

    if ((rc = prompts_load(s.prompts, &ps, &e))) {
        fprintf(stderr, "rootspec-bench: %s\n", e.msg);
        status = 2;
        goto done;
    }
    n_prompts = s.limit > 0 && s.limit < ps->n ? s.limit : ps->n;
    /* The AR baseline (one per T) comes first in the list unless --no-ar or listed already. */
    int has_ar = 0;
    {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", s.decoders);
        for (char *save, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (!strcmp(t, "ar")) has_ar = 1;
    }
    size_t dl = strlen(s.decoders) + 4;
    declist = rs_xmalloc(dl);
    snprintf(declist, dl, "%s%s", !s.no_ar && !has_ar ? "ar," : "", s.decoders);
    /* Check the lists as given first, so a message quotes the user's --decoders. */
    if ((rc = bench_combos_parse(s.decoders, s.temps, s.budgets, &combos, &n_combos, &e)) == 0) {
        free(combos);
        combos = NULL;
        rc = bench_combos_parse(declist, s.temps, s.budgets, &combos, &n_combos, &e);
    }
    if (rc) {
        fprintf(stderr, "rootspec-bench: %s\n", e.msg);
        status = 2;
        goto done;
    }
    int need_drafter = 0;
    for (int c = 0; c < n_combos; c++) {
        int r = rule_parse(combos[c].decoder);
        if (r < 0 || r == RULE_ORACLE) {
            fprintf(stderr,
                    "rootspec-bench: --decoders: unknown decoder '%s' (draft, pearl, rootdraw, "
                    "root, ar)\n", combos[c].decoder);
            status = 2;
            goto done;
        }
        if (r != RULE_AR) need_drafter = 1;
    }
    if (n_combos == 0) {
        fprintf(stderr, "rootspec-bench: no combinations to run\n");
        status = 2;
        goto done;
    }
    plan = bench_plan_make(n_prompts, n_combos, s.warmup, s.seed);
    if ((rc = bench_resume_load(dir, &done, &e))) {
        fprintf(stderr, "rootspec-bench: %s\n", e.msg);
        status = exit_code(rc);
        goto done;
    }
    int n_todo = 0, n_warm = 0, n_prior = bench_done_count(done);
    for (int k = 0; k < plan->n_runs; k++) {
        const BenchRun *r = &plan->runs[k];
        if (r->warmup) n_warm++;
        else if (!bench_done_has(done, ps->items[r->prompt].id, &combos[r->combo])) n_todo++;
    }
    if (n_todo == 0) n_warm = 0; /* nothing to measure: nothing to warm up */
    if (resume)
        fprintf(stderr, "rootspec-bench: resuming %s: %d of %d decodes done, %d to run\n", dir,
                plan->n_runs - plan->n_warmup * n_combos - n_todo,
                plan->n_runs - plan->n_warmup * n_combos, n_todo);
    else
        fprintf(stderr, "rootspec-bench: %d prompts x %d combinations = %d decodes (+%d warm-up) -> %s\n",
                n_prompts, n_combos, n_todo, n_warm, dir);

    struct sigaction sa = {0};
    g_main_thread = pthread_self();
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    set_interrupt_msg(dir, n_prior);

    if (n_todo > 0) {
        char ep[4300];
        EngineOpts eo = {.model_path = s.model, .draft_model_path = s.draft_model,
                         .draft_layers = s.draft_layers, .draft_endpoint = s.draft_endpoint,
                         .backend = s.backend, .threads = s.threads, .device = s.device,
                         .ctx = s.ctx, .draft_timeout_ms = s.draft_timeout_ms,
                         .insecure = s.insecure, .curve_dir = s.curve_dir};
        if (s.launch && need_drafter) {
            if ((rc = drafter_launch(&s, ep, sizeof ep, &e))) {
                fprintf(stderr, "rootspec-bench: %s\n", e.msg);
                status = 1;
                goto done;
            }
            eo.draft_endpoint = ep;
        }
        if ((rc = engine_open(&eo, need_drafter, &en, &e))) {
            fprintf(stderr, "rootspec-bench: %s\n", e.msg);
            status = exit_code(rc);
            goto done;
        }
        engine_ok = 1;
        int chat = en.chat != CHAT_NONE;
        if (!chat)
            fprintf(stderr,
                    "rootspec-bench: note: no known chat template for '%s'; prompts are used as "
                    "raw text\n", s.model);
        ids = rs_xcalloc((size_t)n_prompts, sizeof *ids);
        n_ids = rs_xcalloc((size_t)n_prompts, sizeof *n_ids);
        int cap = target_kv_capacity(en.target);
        /* What decode_run reserves for one round plus the largest overshoot of --max-new:
         * checked now, so no prompt fails hours into a run. */
        int reserve = 0;
        for (int c = 0; c < n_combos; c++) {
            DecodeOpts o = {.rule = rule_parse(combos[c].decoder), .budget = combos[c].budget};
            int r = decode_round_reserve(&o) + ROUND_MAX_EMIT;
            if (r > reserve) reserve = r;
        }
        for (int p = 0; p < n_prompts; p++) {
            if ((rc = engine_prompt_ids(&en, ps->items[p].text, chat, &ids[p], &n_ids[p], &e))) {
                fprintf(stderr, "rootspec-bench: prompt %s (%s:%d): %s\n", ps->items[p].id,
                        s.prompts, ps->items[p].line, e.msg);
                status = 2;
                goto done;
            }
            if (n_ids[p] + s.max_new + reserve > cap) {
                fprintf(stderr,
                        "rootspec-bench: prompt %s (%s:%d) has %d tokens: with --max-new %d it "
                        "needs --ctx >= %d (have %d)\n",
                        ps->items[p].id, s.prompts, ps->items[p].line, n_ids[p], s.max_new,
                        n_ids[p] + s.max_new + reserve, cap);
                status = 2;
                goto done;
            }
        }
        if (!resume) {
            if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
                fprintf(stderr, "rootspec-bench: cannot create directory '%s': %s\n", dir,
                        strerror(errno));
                status = 1;
                goto done;
            }
            if ((rc = settings_save(&s, dir, &e))) {
                fprintf(stderr, "rootspec-bench: %s\n", e.msg);
                status = 1;
                goto done;
            }
        }
        if ((rc = benchlog_open(dir, resume != NULL, &frounds, &fdecodes, &e))) {
            fprintf(stderr, "rootspec-bench: %s\n", e.msg);
            status = 1;
            goto done;
        }

        DecodeResult res = {0};
        res.cap = s.max_new + ROUND_MAX_EMIT;
        res.tokens = rs_xmalloc(sizeof(int) * (size_t)res.cap);
        sink.cap = s.max_new + 2; /* each round emits >= 1 token: no realloc while timed */
        sink.rounds = rs_xmalloc(sizeof *sink.rounds * (size_t)sink.cap);
        prog = bench_progress_new(stderr, n_warm + n_todo, 30);
        int n_run = 0, n_logged = n_prior;
        char label[256];
        for (int k = 0; k < plan->n_runs && status == 0; k++) {
            const BenchRun *r = &plan->runs[k];
            const Prompt *bp = &ps->items[r->prompt];
            const BenchCombo *c = &combos[r->combo];
            if (r->warmup ? n_warm == 0 : bench_done_has(done, bp->id, c)) continue;
            snprintf(label, sizeof label, "%sprompt %s %s T=%d B=%d", r->warmup ? "warm-up " : "",
                     bp->id, c->decoder, c->temp, c->budget);
            bench_progress_update(prog, n_run, label);
            DecodeOpts o = {.rule = (Rule)rule_parse(c->decoder),
                            .budget = c->budget > 0 ? c->budget : 1, /* unused by AR */
                            .temp = c->temp, .seed = s.seed, .prompt_id = (uint64_t)r->prompt,
                            .max_new = s.max_new};
            Backend *b = target_backend(en.target);
            sink.combo = c;
            sink.prompt_id = bp->id;
            sink.n = 0;
            sink.graph0 = b->n_graph_replays;
            sink.eager0 = b->n_eager_launches;
            sink.label = label;
            DecodeHooks h = {NULL, on_round, on_event, &sink};
            rc = decode_run(en.target, en.drafter, ids[r->prompt],
                            n_ids[r->prompt], &o, &h, &res, &e);
            const char *why = rc ? e.msg
                              : res.drafter_failed ? "the drafter failed (decode finished autoregressively)"
                              : res.hit_capacity ? "the KV cache filled up (raise --ctx)"
                                                 : NULL;
            if (why) {
                fprintf(stderr,
                        "\nrootspec-bench: %sdecode of prompt %s with %s T=%d B=%d failed: %s\n"
                        "rootspec-bench: stopping; %d completed decodes are kept in %s "
                        "(continue with: rootspec-bench --resume %s)\n",
                        r->warmup ? "warm-up " : "", bp->id, c->decoder, c->temp, c->budget, why,
                        n_logged, dir, dir);
                status = 1;
                break;
            }
            n_run++;
            bench_progress_update(prog, n_run, label);
            if (r->warmup) continue;
            BenchDecode d;
            memset(&d, 0, sizeof d);
            snprintf(d.prompt_id, sizeof d.prompt_id, "%s", bp->id);
            d.prompt_pos = r->prompt_pos;
            snprintf(d.decoder, sizeof d.decoder, "%s", c->decoder);
            d.temp = c->temp;
            d.budget = c->budget;
            d.tokens = res.n_tokens;
            d.time_ns = (int64_t)(res.t_end - res.t_start);
            d.speed = bench_speed(d.tokens, d.time_ns);
            d.rounds = res.rounds;
            d.mean_accepted = res.rounds ? (double)res.accepted_total / res.rounds : 0.0;
            d.hit_eos = res.hit_eos;
            d.run_index = r->run_index;
            /* Rounds first, then the decode row that marks them complete (see benchlog_open);
             * signals wait until both are on disk. */
            block_signals(1);
            int wrc = 0;
            for (int i = 0; i < sink.n && !wrc; i++) wrc = benchlog_round_write(frounds, &sink.rounds[i]);
            if (!wrc) wrc = benchlog_decode_write_row(fdecodes, &d);
            if (!wrc) set_interrupt_msg(dir, ++n_logged);
            block_signals(0);
            if (wrc) {
                fprintf(stderr, "\nrootspec-bench: cannot write the logs in %s: %s\n", dir,
                        strerror(errno));
                status = 1;
            }
        }
        free(res.tokens);
        bench_progress_finish(&prog);
    }
    if (status == 0) {
        if (frounds) fclose(frounds);
        if (fdecodes) fclose(fdecodes);
        frounds = fdecodes = NULL;
        if ((rc = bench_analyze(dir, &e))) {
            fprintf(stderr, "rootspec-bench: analysis of %s failed: %s\n", dir, e.msg);
            status = 1;
        } else {
            status = echo_summary(dir);
        }
    }

done:
    /* the logs first, so that a signal during the rest of the cleanup loses nothing */
    if (frounds) fclose(frounds);
    if (fdecodes) fclose(fdecodes);
    bench_progress_finish(&prog);
    if (engine_ok) engine_close(&en);
    drafter_stop();
    for (int p = 0; ids && p < n_prompts; p++) free(ids[p]);
    free(ids);
    free(n_ids);
    free(sink.rounds);
    bench_done_free(&done);
    bench_plan_free(&plan);
    free(combos);
    free(declist);
    prompts_free(&ps);
    settings_free(&s);
    return status;
}
