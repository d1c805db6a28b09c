/* rootspec-bench: the DESIGN.md §6 timing protocol. Runs every prompt of a prompt file through
 * every decoder x T x B combination (plus an AR baseline per T) in the seeded, rotated order
 * of bench_plan_create, logs every round (rounds.jsonl) and every decode (decodes.csv), and
 * ends with bench_analyze so summary.md and the plots come from the same code as --analyze.
 * The run's settings live in DIR/run.json so --resume continues exactly the same run.
 * main reads as its four steps: parse (the command line), plan (settings, run directory
 * checks, prompts, combinations, what is left to run), run (engine, tokens, every decode),
 * analyze (summary.md and the plots). */
#include "bench/outdir.h"
#include "bench/analyze.h"
#include "bench/benchlog.h"
#include "bench/stats.h"
#include "common/cli.h"
#include "common/prompts.h"
#include "target_proc/engine.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
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
            "Runs the timing protocol of docs/DESIGN.md §6: warm-up decodes on the first\n"
            "prompts, then every prompt runs every decoder x T x B combination (and an AR\n"
            "baseline per T) once, in an order rotated by the prompt's position in a seeded\n"
            "shuffle.\n"
            "\n"
            "  --model PATH          target model: GGUF file or Hugging Face directory\n"
            "  --draft-model PATH    drafter model sharing the target's tokenizer\n"
            "  --draft-layers SPEC   self-drafter from target layers, e.g. 0-5,24-29, or half\n"
            "                        (the first half) or short (the first eighth) (default %s)\n"
            "  --drafter KIND        self | model | eagle3 | suffix (default: --draft-model's\n"
            "                        kind, else self); suffix is model-free (rootspec-target\n"
            "                        --help)\n"
            "  --draft-corpus FILE   suffix drafter: a text file it also looks in\n"
            "  --draft-endpoint EP   use a running rootspec-draft at EP (ipc://, tcp://)\n"
            "  --launch-drafter      start build/rootspec-draft (next to this binary) on a private\n"
            "                        ipc:// endpoint with the drafter options, stop it at exit\n"
            "                        (default without either: in-process drafter)\n"
            "  --draft-timeout-ms N  remote drafter reply timeout (default 10000)\n"
            "  --insecure            allow plain tcp:// to the drafter (no CURVE)\n"
            "  --curve-dir DIR       CURVE key files for tcp://\n"
            "  --prompts FILE        prompt file (JSON lines, see below)\n"
            "  --limit N             use only the first N prompts of the file (default all)\n"
            "  --max-new N           output at most N new tokens (default 256)\n"
            "  --ignore-eos          decode past end-of-sequence tokens: every decode emits\n"
            "                        --max-new tokens, so at T=1 a decoder and AR compare on\n"
            "                        equal lengths (per-prompt speedups), not on where their\n"
            "                        samples happened to stop\n"
            "  --decoders LIST       comma list of draft, pearl, rootdraw, root, ar\n"
            "                        (default draft,pearl,rootdraw,root)\n"
            "  --temps LIST          comma list of 0 (greedy) and 1 (sampling) (default 0,1)\n"
            "  --temp T              temperature of the T=1 combinations (1e-5..1e6; default 1)\n"
            "  --top-k N             their top-k (default 0: off)\n"
            "  --top-p P             their top-p (default 0: off; 1 is off too)\n"
            "  --min-p P             their min-p (default 0: off). The law and its order are\n"
            "                        rootspec-target's; run.json records it as \"sampling\",\n"
            "                        the logs keep the label T=1\n"
            "  --budgets LIST        comma list of tree budgets: B in 1..%d, or auto (the\n"
            "                        cost-aware budget of rootspec-target --budget auto, one\n"
            "                        planner per run, learning as it goes) (default 8,59)\n"
            "  --no-ar               no autoregressive baseline: exactly the 16 combinations of\n"
            "                        docs/DESIGN.md §6 (default: one AR decode per T joins\n"
            "                        each prompt's rotation, 18 in all, for every decoder's\n"
            "                        speedup over AR)\n"
            "  --pool-shape D,W      the drafter's pools: D levels, W nodes expanded a level\n"
            "                        (rootspec-target --help; default 8,10, or the planner's\n"
            "                        choice under auto)\n"
            "  --warmup N            prompts whose combinations run once first, unlogged\n"
            "                        (default 2)\n"
            "  --repeats N           every prompt runs its combinations N times, each time in\n"
            "                        another rotation (default 1); the summary takes each\n"
            "                        (prompt, decoder, T, B)'s median decode, so a slow spell\n"
            "                        of a shared machine does not decide a per-prompt speedup\n"
            "  --seed S              plan shuffle and sampling seed (default 1); each decode uses\n"
            "                        (S, prompt index, decoder, T, B) so runs are reproducible\n"
            "  --threads N           CPU threads (default 1)\n"
            "  --ctx N               KV cache entries per model (default 2048)\n"
            "  --backend NAME        cpu | cuda (default cpu)\n"
            "  --device N            CUDA device ordinal (default 0)\n"
            "  --batch-invariant     CUDA: a row's logits do not depend on the batch (own GEMMs,\n"
            "                        fixed attention splits; T=0 ids equal AR's; default off)\n"
            "  --out DIR             run directory: new, or empty (FIFOs aside)\n"
            "  --resume DIR          continue an interrupted run with the settings in DIR/run.json;\n"
            "                        refused when the prompt file changed since\n"
            "  --analyze DIR         rebuild DIR/summary.md and the plots from the logs\n"
            "  -h, --help            this text\n"
            "\n"
            "Exit status: 0 ok, 1 runtime failure, 2 bad usage or input, 130 interrupted\n"
            "(completed decodes are kept; continue with --resume DIR).\n"
            "\n",
            DRAFTER_DEFAULT_LAYERS, TREE_MAX);
    fputs(bench_help_outputs(), f);
    fputs("\n", f);
    fputs(prompts_help(), f);
}

/* ---- settings (command line or DIR/run.json) ---- */

typedef struct {
    char *model, *draft_model, *draft_layers, *draft_endpoint, *curve_dir, *backend;
    char *drafter, *draft_corpus; /* --drafter, --draft-corpus (NULL: not given) */
    char *prompts, *decoders, *temps, *budgets;
    char prompts_hash[17]; /* FNV-1a 64 of the prompt file's bytes, hex */
    int launch, insecure, draft_timeout_ms, device;
    int batch_invariant; /* --batch-invariant: BackendParams.batch_invariant */
    int limit, max_new, no_ar, warmup, repeats, threads, ctx, ignore_eos;
    int pool_depth, pool_width; /* --pool-shape (0: the full shape, or the planner's) */
    uint64_t seed;
    Sampling sampling; /* the law of the T=1 combinations (T=0 ones are greedy) */
} Settings;

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void settings_free(Settings *s) {
    char **f[] = {&s->model, &s->draft_model, &s->draft_layers, &s->draft_endpoint,
                  &s->curve_dir, &s->backend, &s->prompts, &s->decoders, &s->temps, &s->budgets,
                  &s->drafter, &s->draft_corpus};
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
    json_str(o, "drafter", s->drafter);
    json_str(o, "draft_corpus", s->draft_corpus);
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
    cJSON_AddBoolToObject(o, "ignore_eos", s->ignore_eos);
    cJSON_AddNumberToObject(o, "warmup", s->warmup);
    cJSON_AddNumberToObject(o, "repeats", s->repeats);
    cJSON_AddNumberToObject(o, "pool_depth", s->pool_depth);
    cJSON_AddNumberToObject(o, "pool_width", s->pool_width);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed); /* a string: doubles lose 64-bit seeds */
    json_str(o, "seed", seed);
    cJSON_AddNumberToObject(o, "threads", s->threads);
    cJSON_AddNumberToObject(o, "ctx", s->ctx);
    json_str(o, "backend", s->backend);
    cJSON_AddNumberToObject(o, "device", s->device);
    cJSON *smp = cJSON_AddObjectToObject(o, "sampling");
    cJSON_AddNumberToObject(smp, "temperature", s->sampling.temperature);
    cJSON_AddNumberToObject(smp, "top_k", s->sampling.top_k);
    cJSON_AddNumberToObject(smp, "top_p", s->sampling.top_p);
    cJSON_AddNumberToObject(smp, "min_p", s->sampling.min_p);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = NULL;
    int rc = bench_file_open(tmp, BENCH_FILE_NEW, &f, e);
    if (rc) {
        free(text);
        return rc;
    }
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = 0;
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

/* An optional integer: def when absent, as in runs from before it. */
static int jget_opt_int(const cJSON *o, const char *path, const char *k, int min, int max,
                        int def, int *out, RsErr *e) {
    if (!cJSON_GetObjectItemCaseSensitive(o, k)) {
        *out = def;
        return RS_OK;
    }
    return jget_int(o, path, k, min, max, out, e);
}

/* An optional boolean (false when absent). */
static int jget_opt_bool(const cJSON *o, const char *path, const char *k, int *out, RsErr *e) {
    return jget_opt_int(o, path, k, 0, 1, 0, out, e);
}

/* run.json's "sampling" (absent in runs from before it: plain T=1 sampling). */
static int sampling_load(const cJSON *o, const char *path, Sampling *out, RsErr *e) {
    const cJSON *smp = cJSON_GetObjectItemCaseSensitive(o, "sampling");
    *out = SAMPLING_PLAIN;
    if (!smp) return RS_OK;
    const char *k[4] = {"temperature", "top_k", "top_p", "min_p"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(smp, k[i]);
        if (!cJSON_IsNumber(x))
            return rs_err(e, RS_EFORMAT, "%s: \"sampling\".\"%s\" missing or not a number", path,
                          k[i]);
        v[i] = x->valuedouble;
    }
    if (v[1] != floor(v[1]) || v[1] > INT_MAX || v[1] < 0)
        return rs_err(e, RS_EFORMAT, "%s: \"sampling\".\"top_k\" = %g is not an integer >= 0",
                      path, v[1]);
    *out = (Sampling){v[0], (int)v[1], v[2], v[3]};
    RsErr why = {0};
    if (sampling_check(out, &why) || out->temperature == 0)
        return rs_err(e, RS_EFORMAT, "%s: \"sampling\": %s", path,
                      why.code ? why.msg : "temperature 0 (the T=1 runs must sample)");
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
        (rc = jget_str(o, path, "drafter", 1, &s->drafter, e)) ||
        (rc = jget_str(o, path, "draft_corpus", 1, &s->draft_corpus, e)) ||
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
        (rc = jget_opt_bool(o, path, "ignore_eos", &s->ignore_eos, e)) ||
        (rc = jget_int(o, path, "warmup", 0, 1 << 20, &s->warmup, e)) ||
        (rc = jget_opt_int(o, path, "repeats", 1, 1000, 1, &s->repeats, e)) ||
        (rc = jget_opt_int(o, path, "pool_depth", 0, POOL_MAX_DEPTH, 0, &s->pool_depth, e)) ||
        (rc = jget_opt_int(o, path, "pool_width", 0, POOL_EXPAND, 0, &s->pool_width, e)) ||
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
    if ((rc = sampling_load(o, path, &s->sampling, e))) goto out;
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

/* rootspec-draft's command line for the run's drafter options (nums: the numbers' text). */
static void drafter_argv(const Settings *s, const char *bin, const char *endpoint,
                         char nums[3][16], const char *argv[24]) {
    snprintf(nums[0], 16, "%d", s->threads);
    snprintf(nums[1], 16, "%d", s->ctx);
    snprintf(nums[2], 16, "%d", s->device);
    int suffix = s->drafter && !strcmp(s->drafter, "suffix");
    const char *layers = s->draft_model || suffix ? NULL
                         : s->draft_layers        ? s->draft_layers
                                                  : DRAFTER_DEFAULT_LAYERS;
    int a = 0;
    argv[a++] = bin;
    argv[a++] = "--model";
    argv[a++] = s->draft_model ? s->draft_model : s->model;
    if (layers) argv[a++] = "--draft-layers", argv[a++] = layers;
    if (suffix) argv[a++] = "--drafter", argv[a++] = "suffix";
    if (suffix && s->draft_corpus) argv[a++] = "--corpus", argv[a++] = s->draft_corpus;
    argv[a++] = "--bind";
    argv[a++] = endpoint;
    argv[a++] = "--backend";
    argv[a++] = s->backend;
    argv[a++] = "--device";
    argv[a++] = nums[2];
    if (s->batch_invariant) argv[a++] = "--batch-invariant";
    argv[a++] = "--threads";
    argv[a++] = nums[0];
    argv[a++] = "--ctx";
    argv[a++] = nums[1];
    argv[a] = NULL;
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
    char nums[3][16];
    const char *argv[24];
    drafter_argv(s, bin, endpoint, nums, argv);
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
    return RS_OK; /* engine_create's HELLO (with its timeout) confirms that it answers */
}

/* ---- per-decode round capture ---- */

typedef struct {
    RoundInfo *rounds; // (cap) buffered, written after the decode so no I/O is timed
    int n, cap;
    RoundLog log;      /* the decode as its rounds' log lines name it */
    Sampling law;      /* the decode's sampling law, which log.sampling points to */
    const char *label;
} Sink;

static void on_round(void *u, const RoundInfo *ri) {
    Sink *s = u;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->rounds = realloc(s->rounds, sizeof *s->rounds * (size_t)s->cap);
        RS_ASSERT(s->rounds);
    }
    s->rounds[s->n++] = *ri;
}

static void on_event(void *u, const char *ev, const char *detail) {
    Sink *s = u;
    fprintf(stderr, "\nrootspec-bench: %s: %s: %s\n", s->label, ev, detail);
}

/* ---- parse: the command line ---- */

/* Prints "rootspec-bench: <message>" and returns status, so a step can `return fail(2, ...)`. */
static int fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rootspec-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

/* The command line as given: numeric options land in s (over the defaults), text options
 * stay as argv strings until settings_from_args() makes them absolute and owned. */
typedef struct {
    Settings s;
    const char *model, *draft_model, *draft_layers, *endpoint, *curve, *backend, *prompts;
    const char *drafter, *corpus;
    const char *decoders, *temps, *budgets, *out, *resume, *analyze;
    const char *first_setting; /* options that --resume and --analyze must not be combined with */
} Cli;

static void cli_defaults(Cli *c) {
    memset(c, 0, sizeof *c);
    c->s.threads = 1;
    c->s.ctx = 2048;
    c->s.max_new = 256;
    c->s.warmup = 2;
    c->s.repeats = 1;
    c->s.seed = 1;
    c->s.sampling = SAMPLING_PLAIN;
    c->s.draft_timeout_ms = 10000;
    c->backend = "cpu";
    c->decoders = "draft,pearl,rootdraw,root";
    c->temps = "0,1";
    c->budgets = "8,59";
}

/* One option at argv[*i] (its value, if any, consumed). Sets *setting to 0 for the options
 * that name a run directory instead of a setting. */
static int parse_option(int argc, char **argv, int *i, Cli *c, int *setting, RsErr *e) {
    const char *a = argv[*i], *v = NULL;
    Settings *s = &c->s;
    int rc = 0;
#define VAL() (rc = cli_value(argc, argv, *i, &v, e), *i += !rc, rc == 0)
    if (!strcmp(a, "--model")) { if (VAL()) c->model = v; }
    else if (!strcmp(a, "--draft-model")) { if (VAL()) c->draft_model = v; }
    else if (!strcmp(a, "--draft-layers")) { if (VAL()) c->draft_layers = v; }
    else if (!strcmp(a, "--draft-endpoint")) { if (VAL()) c->endpoint = v; }
    else if (!strcmp(a, "--drafter")) {
        DrafterKind k;
        if (VAL() && !(rc = drafter_kind_option(v, &k, e))) c->drafter = v;
    } else if (!strcmp(a, "--draft-corpus")) { if (VAL()) c->corpus = v; }
    else if (!strcmp(a, "--launch-drafter")) s->launch = 1;
    else if (!strcmp(a, "--draft-timeout-ms")) { if (VAL()) rc = cli_int(a, v, 1, 3600000, &s->draft_timeout_ms, e); }
    else if (!strcmp(a, "--insecure")) s->insecure = 1;
    else if (!strcmp(a, "--curve-dir")) { if (VAL()) c->curve = v; }
    else if (!strcmp(a, "--prompts")) { if (VAL()) c->prompts = v; }
    else if (!strcmp(a, "--limit")) { if (VAL()) rc = cli_int(a, v, 1, INT_MAX, &s->limit, e); }
    else if (!strcmp(a, "--max-new")) { if (VAL()) rc = cli_int(a, v, 1, 1 << 20, &s->max_new, e); }
    else if (!strcmp(a, "--decoders")) { if (VAL()) c->decoders = v; }
    else if (!strcmp(a, "--temps")) { if (VAL()) c->temps = v; }
    else if (!strcmp(a, "--temp")) {
        if (VAL())
            rc = cli_double(a, v, SAMPLING_TEMP_MIN, SAMPLING_TEMP_MAX, &s->sampling.temperature, e);
    }
    else if (!strcmp(a, "--top-k")) { if (VAL()) rc = cli_int(a, v, 0, 1 << 30, &s->sampling.top_k, e); }
    else if (!strcmp(a, "--top-p")) { if (VAL()) rc = cli_double(a, v, 0, 1, &s->sampling.top_p, e); }
    else if (!strcmp(a, "--min-p")) { if (VAL()) rc = cli_double(a, v, 0, 1, &s->sampling.min_p, e); }
    else if (!strcmp(a, "--budgets")) { if (VAL()) c->budgets = v; }
    else if (!strcmp(a, "--pool-shape")) { if (VAL()) rc = cli_pool_shape(v, &s->pool_depth, &s->pool_width, e); }
    else if (!strcmp(a, "--no-ar")) s->no_ar = 1;
    else if (!strcmp(a, "--ignore-eos")) s->ignore_eos = 1;
    else if (!strcmp(a, "--warmup")) { if (VAL()) rc = cli_int(a, v, 0, 1 << 20, &s->warmup, e); }
    else if (!strcmp(a, "--repeats")) { if (VAL()) rc = cli_int(a, v, 1, 1000, &s->repeats, e); }
    else if (!strcmp(a, "--seed")) { if (VAL()) rc = cli_u64(a, v, &s->seed, e); }
    else if (!strcmp(a, "--threads")) { if (VAL()) rc = cli_int(a, v, 1, 256, &s->threads, e); }
    else if (!strcmp(a, "--ctx")) { if (VAL()) rc = cli_int(a, v, 256, 1 << 20, &s->ctx, e); }
    else if (!strcmp(a, "--backend")) { if (VAL()) c->backend = v; }
    else if (!strcmp(a, "--device")) { if (VAL()) rc = cli_int(a, v, 0, 64, &s->device, e); }
    else if (!strcmp(a, "--batch-invariant")) s->batch_invariant = 1;
    else if (!strcmp(a, "--out")) { if (VAL()) c->out = v; }
    else if (!strcmp(a, "--resume")) { *setting = 0; if (VAL()) c->resume = v; }
    else if (!strcmp(a, "--analyze")) { *setting = 0; if (VAL()) c->analyze = v; }
    else rc = rs_err(e, RS_EINVAL, "unknown option '%s' (see --help)", a);
#undef VAL
    return rc;
}

/* Reads the command line into c. Returns -1 when the run goes on, else the exit status
 * (0 after --help, 2 for bad usage). */
static int bench_parse(int argc, char **argv, Cli *c) {
    cli_defaults(c);
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        int setting = 1;
        if (parse_option(argc, argv, &i, c, &setting, &e)) return fail(2, "%s", e.msg);
        if (setting && !c->first_setting) c->first_setting = a;
    }
    if (c->analyze && (c->resume || c->first_setting))
        return fail(2, "--analyze DIR takes no other option (got '%s')",
                    c->resume ? "--resume" : c->first_setting);
    if (c->resume && c->first_setting)
        return fail(2, "--resume DIR takes its settings from DIR/run.json; do not combine it "
                       "with '%s'", c->first_setting);
    if (sampling_greedy(&c->s.sampling))
        return fail(2, "--top-k 1 makes the T=1 combinations greedy; use --temps 0 for greedy");
    const char *const dirs[3][2] = {{"--out", c->out}, {"--resume", c->resume},
                                    {"--analyze", c->analyze}};
    RsErr pe = {0};
    for (int i = 0; i < 3; i++)
        if (dirs[i][1] && bench_path_check(dirs[i][0], dirs[i][1], &pe)) return fail(2, "%s", pe.msg);
    return -1;
}

/* ---- plan: the run's settings, its directory, its prompts and its decode list ---- */

/* The --out check, made before any model loads: DIR must not hold a run already, and DIR
 * (or the parent it will be created in) must be a writable directory. The directory itself
 * is made only once the prompts are tokenized. Returns 0 or exit status 2. */
static int out_dir_check(const char *dir) {
    char rj[4200];
    snprintf(rj, sizeof rj, "%s/run.json", dir);
    if (access(rj, F_OK) == 0)
        return fail(2, "'%s' already holds a run (%s); continue it with --resume %s or choose "
                       "another --out", dir, rj, dir);
    RsErr e = {0};
    if (bench_outdir_check(dir, &e)) return fail(2, "%s", e.msg); /* others' logs are not ours */
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
    if (!why) return 0;
    if (strcmp(where, dir)) return fail(2, "--out '%s': cannot create it in '%s': %s", dir, where, why);
    return fail(2, "--out '%s': %s", dir, why);
}

/* A new run: checks the options that go together and the run directory, then fills s. */
static int settings_from_args(const Cli *c, Settings *s) {
    if (!c->model || !c->prompts || !c->out) {
        fail(2, "need --model, --prompts and --out (or --resume DIR / --analyze DIR)");
        usage(stderr);
        return 2;
    }
    if (c->draft_model && c->draft_layers)
        return fail(2, "give --draft-model or --draft-layers, not both");
    if (c->endpoint && c->s.launch)
        return fail(2, "give --draft-endpoint or --launch-drafter, not both");
    if (c->corpus && (!c->drafter || strcmp(c->drafter, "suffix")))
        return fail(2, "--draft-corpus is for --drafter suffix");
    if (c->drafter && c->endpoint)
        return fail(2, "--drafter chooses the drafter this run starts; --draft-endpoint uses the "
                       "one of the rootspec-draft process there");
    int st = out_dir_check(c->out);
    if (st) return st;
    *s = c->s;
    s->model = abs_path(c->model);
    s->draft_model = abs_path(c->draft_model);
    s->draft_layers = dup_or_null(c->draft_layers);
    s->draft_endpoint = dup_or_null(c->endpoint);
    s->drafter = dup_or_null(c->drafter);
    s->draft_corpus = abs_path(c->corpus);
    s->curve_dir = abs_path(c->curve);
    s->backend = strdup(c->backend);
    s->prompts = abs_path(c->prompts);
    s->temps = strdup(c->temps);
    s->budgets = strdup(c->budgets);
    s->decoders = strdup(c->decoders);
    RsErr e = {0};
    if (file_hash(s->prompts, s->prompts_hash, &e)) return fail(2, "--prompts: %s", e.msg);
    return 0;
}

/* A resumed run: the settings of DIR/run.json, refused when the prompt file has changed. */
static int settings_from_resume(const char *dir, Settings *s) {
    RsErr e = {0};
    if (bench_run_files_check(dir, &e)) return fail(2, "--resume: %s", e.msg);
    if (settings_load(s, dir, &e)) return fail(2, "%s", e.msg);
    char now[17];
    if (file_hash(s->prompts, now, &e))
        return fail(2, "--resume: prompt file of the run: %s", e.msg);
    if (strcmp(now, s->prompts_hash) != 0)
        return fail(2, "--resume: prompt file '%s' changed since the run started (FNV-1a %s, "
                       "run.json has %s); start a new run with --out",
                    s->prompts, now, s->prompts_hash);
    return 0;
}

/* Everything a run holds; bench_release() frees it whatever step stopped the run. */
typedef struct {
    Settings s;
    const char *dir;
    int resume;
    PromptSet *ps;
    int n_prompts;
    BenchCombo *combos; // (n_combos)
    int n_combos, need_drafter;
    BenchPlan *plan;
    BenchDoneSet *done;
    int n_todo, n_warm, n_prior; /* decodes to measure, warm-ups to run, decodes logged before */
    Engine *en;
    int engine_ok;
    int **ids, *n_ids; // (n_prompts) token ids of each prompt
    FILE *frounds, *fdecodes;
    Sink sink;
    BenchProgress *prog;
} Bench;

/* The combination list: the AR baseline (one per T) comes first unless --no-ar or listed
 * already; every decoder must be one the engine runs online. */
static int combos_build(Bench *b) {
    const Settings *s = &b->s;
    RsErr e = {0};
    int has_ar = 0;
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", s->decoders);
    for (char *save, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (!strcmp(t, "ar")) has_ar = 1;
    size_t dl = strlen(s->decoders) + 4;
    char *declist = rs_xmalloc(dl);
    snprintf(declist, dl, "%s%s", !s->no_ar && !has_ar ? "ar," : "", s->decoders);
    /* Check the lists as given first, so a message quotes the user's --decoders. */
    int rc = bench_combos_parse(s->decoders, s->temps, s->budgets, &b->combos, &b->n_combos, &e);
    if (rc == 0) {
        free(b->combos);
        b->combos = NULL;
        rc = bench_combos_parse(declist, s->temps, s->budgets, &b->combos, &b->n_combos, &e);
    }
    free(declist);
    if (rc) return fail(2, "%s", e.msg);
    for (int c = 0; c < b->n_combos; c++) {
        int r = decoder_parse(b->combos[c].decoder);
        if (r < 0 || r == DECODER_ORACLE)
            return fail(2, "--decoders: unknown decoder '%s' (draft, pearl, rootdraw, root, ar)",
                        b->combos[c].decoder);
        if (r != DECODER_AR) b->need_drafter = 1;
    }
    if (b->n_combos == 0) return fail(2, "no combinations to run");
    return 0;
}

/* Loads the prompts, builds the combinations and the seeded plan, and counts what is left
 * to run after the decodes a resumed run has logged already. */
static int bench_plan(Bench *b) {
    RsErr e = {0};
    int rc = prompts_load(b->s.prompts, &b->ps, &e);
    if (rc) return fail(2, "%s", e.msg);
    b->n_prompts = b->s.limit > 0 && b->s.limit < b->ps->n ? b->s.limit : b->ps->n;
    if ((rc = combos_build(b))) return rc;
    b->plan = bench_plan_create(b->n_prompts, b->n_combos, b->s.warmup, b->s.repeats, b->s.seed);
    if ((rc = bench_resume_load(b->dir, &b->done, &e))) return fail(cli_exit_status(rc), "%s", e.msg);
    const BenchPlan *plan = b->plan;
    b->n_prior = bench_done_count(b->done);
    for (int k = 0; k < plan->n_runs; k++) {
        const BenchRun *r = &plan->runs[k];
        if (r->warmup) b->n_warm++;
        else if (!bench_done_has(b->done, b->ps->items[r->prompt].id, &b->combos[r->combo], r->rep))
            b->n_todo++;
    }
    if (b->n_todo == 0) b->n_warm = 0; /* nothing to measure: nothing to warm up */
    int n_measured = plan->n_runs - plan->n_warmup * b->n_combos;
    if (b->resume)
        fprintf(stderr, "rootspec-bench: resuming %s: %d of %d decodes done, %d to run\n", b->dir,
                n_measured - b->n_todo, n_measured, b->n_todo);
    else
        fprintf(stderr, "rootspec-bench: %d prompts x %d combinations x %d = %d decodes (+%d "
                "warm-up) -> %s\n", b->n_prompts, b->n_combos, b->s.repeats, b->n_todo,
                b->n_warm, b->dir);
    return 0;
}

/* ---- run: the engine, the prompts' tokens, the run directory, then every decode ---- */

static void signals_install(const char *dir, int n_prior) {
    struct sigaction sa = {0};
    g_main_thread = pthread_self();
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    set_interrupt_msg(dir, n_prior);
}

/* Starts the drafter (--launch-drafter) and opens the engine. */
static int engine_setup(Bench *b) {
    const Settings *s = &b->s;
    RsErr e = {0};
    char ep[4300];
    EngineOpts eo = {.model_path = s->model, .draft_model_path = s->draft_model,
                     .draft_layers = s->draft_layers, .draft_endpoint = s->draft_endpoint,
                     .backend = s->backend, .threads = s->threads, .device = s->device,
                     .ctx = s->ctx, .batch_invariant = s->batch_invariant,
                     .draft_timeout_ms = s->draft_timeout_ms,
                     .insecure = s->insecure, .curve_dir = s->curve_dir,
                     .draft_corpus = s->draft_corpus};
    /* the environment's backend settings, read here once */
    if (cli_backend_env(&eo.cpu_kernels, &eo.sw, &e)) return fail(2, "%s", e.msg);
    if (s->drafter) drafter_kind_option(s->drafter, &eo.drafter_kind, NULL);
    if (s->launch && b->need_drafter) {
        if (drafter_launch(s, ep, sizeof ep, &e)) return fail(1, "%s", e.msg);
        eo.draft_endpoint = ep;
        eo.drafter_kind = DRAFTER_KIND_AUTO;
        eo.draft_corpus = NULL;
    }
    int rc = engine_create(&eo, b->need_drafter, &b->en, &e);
    if (rc) return fail(cli_exit_status(rc), "%s", e.msg);
    if (b->en->vocab_note[0]) fprintf(stderr, "rootspec-bench: note: %s\n", b->en->vocab_note);
    b->engine_ok = 1;
    return 0;
}

/* Tokenizes every prompt and checks that each fits the KV cache with --max-new and the
 * largest round any combination can add, so no prompt fails hours into a run. */
static int prompts_tokenize(Bench *b) {
    const Settings *s = &b->s;
    RsErr e = {0};
    int chat = b->en->chat != CHAT_NONE;
    if (!chat)
        fprintf(stderr, "rootspec-bench: note: no known chat template for '%s'; prompts are used "
                        "as raw text\n", s->model);
    b->ids = rs_xcalloc((size_t)b->n_prompts, sizeof *b->ids);
    b->n_ids = rs_xcalloc((size_t)b->n_prompts, sizeof *b->n_ids);
    int cap = target_kv_capacity(b->en->target);
    /* What decode_run reserves for one round plus the largest overshoot of --max-new. */
    int reserve = 0;
    for (int c = 0; c < b->n_combos; c++) {
        int B = b->combos[c].budget;
        DecodeOpts opts = {.decoder = decoder_parse(b->combos[c].decoder),
                           .budget = B == BENCH_BUDGET_AUTO ? TREE_MAX : B};
        int r = decode_round_reserve(&opts) + ROUND_MAX_EMIT;
        if (r > reserve) reserve = r;
    }
    for (int p = 0; p < b->n_prompts; p++) {
        const Prompt *pr = &b->ps->items[p];
        if (engine_prompt_ids(b->en, pr->text, chat, &b->ids[p], &b->n_ids[p], &e))
            return fail(2, "prompt %s (%s:%d): %s", pr->id, s->prompts, pr->line, e.msg);
        int need = b->n_ids[p] + s->max_new + reserve;
        if (need > cap)
            return fail(2, "prompt %s (%s:%d) has %d tokens: with --max-new %d it needs --ctx >= "
                           "%d (have %d)", pr->id, s->prompts, pr->line, b->n_ids[p], s->max_new,
                        need, cap);
    }
    return 0;
}

/* A new run makes its directory and run.json; either way the logs are opened for append. */
static int run_dir_open(Bench *b) {
    RsErr e = {0};
    if (!b->resume) {
        if (mkdir(b->dir, 0777) != 0 && errno != EEXIST)
            return fail(1, "cannot create directory '%s': %s", b->dir, strerror(errno));
        if (settings_save(&b->s, b->dir, &e)) return fail(1, "%s", e.msg);
    }
    if (benchlog_open(b->dir, b->resume, &b->frounds, &b->fdecodes, &e)) return fail(1, "%s", e.msg);
    return 0;
}

/* Runs one decode of the plan, its rounds captured into b->sink. Returns 0 or 1 (reported). */
static int decode_one(Bench *b, const BenchRun *r, const char *label, DecodeResult *res,
                      int n_logged) {
    const Prompt *bp = &b->ps->items[r->prompt];
    const BenchCombo *c = &b->combos[r->combo];
    RsErr e = {0};
    int automatic = c->budget == BENCH_BUDGET_AUTO;
    DecodeOpts opts = {.decoder = (DecoderKind)decoder_parse(c->decoder),
                       .budget = automatic ? TREE_MAX : c->budget > 0 ? c->budget : 1, /* 1: AR */
                       .planner = automatic ? b->en->planner : NULL,
                       .sampling = c->temp ? b->s.sampling : SAMPLING_GREEDY, .seed = b->s.seed,
                       .prompt_id = (uint64_t)r->prompt,
                       .max_new = b->s.max_new, .ignore_eos = b->s.ignore_eos,
                       .pool_depth = b->s.pool_depth, .pool_width = b->s.pool_width};
    Backend *be = target_backend(b->en->target);
    Sink *sink = &b->sink;
    sink->n = 0;
    sink->law = opts.sampling;
    sink->log = (RoundLog){.decoder = c->decoder, .temp = c->temp, .budget = c->budget,
                           .prompt_id = bp->id, .rep = r->rep, .sampling = &sink->law};
    BackendStats st = backend_stats(be);
    roundlog_begin(&sink->log, &st);
    sink->label = label;
    DecodeHooks h = {NULL, on_round, on_event, sink, NULL, NULL, NULL};
    int rc = decode_run(b->en->target, b->en->drafter, b->ids[r->prompt],
                        b->n_ids[r->prompt], &opts, &h, res, &e);
    const char *why = rc ? e.msg
                      : res->drafter_failed ? "the drafter failed (decode finished autoregressively)"
                      : res->hit_capacity ? "the KV cache filled up (raise --ctx)"
                                          : NULL;
    if (!why) return 0;
    fprintf(stderr,
            "\nrootspec-bench: %sdecode of prompt %s with %s T=%d B=%s failed: %s\n"
            "rootspec-bench: stopping; %d completed decodes are kept in %s "
            "(continue with: rootspec-bench --resume %s)\n",
            r->warmup ? "warm-up " : "", bp->id, c->decoder, c->temp,
            bench_budget_str(c->budget, (char[16]){0}), why, n_logged,
            b->dir, b->dir);
    return 1;
}

/* Writes a measured decode: its rounds first, then the decodes.csv row that marks them
 * complete (see benchlog_open), with the signals held until both are on disk. */
static int decode_log(Bench *b, const BenchRun *r, const DecodeResult *res, int *n_logged) {
    const BenchCombo *c = &b->combos[r->combo];
    BenchDecode d;
    memset(&d, 0, sizeof d);
    snprintf(d.prompt_id, sizeof d.prompt_id, "%s", b->ps->items[r->prompt].id);
    d.prompt_pos = r->prompt_pos;
    snprintf(d.decoder, sizeof d.decoder, "%s", c->decoder);
    d.temp = c->temp;
    d.budget = c->budget;
    d.tokens = res->n_tokens;
    d.time_ns = (int64_t)(res->t_end - res->t_start);
    d.speed = bench_speed(d.tokens, d.time_ns);
    d.rounds = res->rounds;
    d.mean_accepted = res->rounds ? (double)res->accepted_total / res->rounds : 0.0;
    d.hit_eos = res->hit_eos;
    d.run_index = r->run_index;
    d.rep = r->rep;
    block_signals(1);
    int wrc = 0;
    for (int i = 0; i < b->sink.n && !wrc; i++) wrc = roundlog_write(b->frounds, &b->sink.log, &b->sink.rounds[i]);
    if (!wrc) wrc = benchlog_decode_write_row(b->fdecodes, &d);
    if (!wrc) set_interrupt_msg(b->dir, ++*n_logged);
    block_signals(0);
    if (!wrc) return 0;
    fprintf(stderr, "\nrootspec-bench: cannot write the logs in %s: %s\n", b->dir, strerror(errno));
    return 1;
}

/* The plan in order: warm-ups (unlogged) and every decode not logged yet. */
static int decodes_run(Bench *b) {
    DecodeResult res = {0};
    res.cap = b->s.max_new + ROUND_MAX_EMIT;
    res.tokens = rs_xmalloc(sizeof(int) * (size_t)res.cap);
    b->sink.cap = b->s.max_new + 2; /* each round emits >= 1 token: no realloc while timed */
    b->sink.rounds = rs_xmalloc(sizeof *b->sink.rounds * (size_t)b->sink.cap);
    b->prog = bench_progress_create(stderr, b->n_warm + b->n_todo, 30);
    int status = 0, n_run = 0, n_logged = b->n_prior;
    char label[256];
    for (int k = 0; k < b->plan->n_runs && status == 0; k++) {
        const BenchRun *r = &b->plan->runs[k];
        const Prompt *bp = &b->ps->items[r->prompt];
        const BenchCombo *c = &b->combos[r->combo];
        if (r->warmup ? b->n_warm == 0 : bench_done_has(b->done, bp->id, c, r->rep)) continue;
        char bb[16];
        snprintf(label, sizeof label, "%sprompt %s %s T=%d B=%s", r->warmup ? "warm-up " : "",
                 bp->id, c->decoder, c->temp, bench_budget_str(c->budget, bb));
        bench_progress_update(b->prog, n_run, label);
        if ((status = decode_one(b, r, label, &res, n_logged))) break;
        n_run++;
        bench_progress_update(b->prog, n_run, label);
        if (!r->warmup) status = decode_log(b, r, &res, &n_logged);
    }
    free(res.tokens);
    bench_progress_destroy(&b->prog);
    return status;
}

static int bench_run(Bench *b) {
    signals_install(b->dir, b->n_prior);
    if (b->n_todo == 0) return 0;
    int st = engine_setup(b);
    if (!st) st = prompts_tokenize(b);
    if (!st) st = run_dir_open(b);
    if (!st) st = decodes_run(b);
    return st;
}

/* ---- analyze: summary.md and the plots, from the logs on disk ---- */

static int echo_summary(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/summary.md", dir);
    char *text;
    size_t n;
    RsErr e = {0};
    if (rs_read_file(path, &text, &n, &e)) return fail(1, "%s", e.msg);
    fwrite(text, 1, n, stdout);
    free(text);
    printf("\nrootspec-bench: summary: %s\n", path);
    fflush(stdout);
    return 0;
}

/* After a run the logs are closed first, so the analysis reads every line written. */
static int bench_report(Bench *b) {
    if (b->frounds) fclose(b->frounds);
    if (b->fdecodes) fclose(b->fdecodes);
    b->frounds = b->fdecodes = NULL;
    RsErr e = {0};
    if (bench_analyze(b->dir, &e)) return fail(1, "analysis of %s failed: %s", b->dir, e.msg);
    return echo_summary(b->dir);
}

/* --analyze DIR: the same analysis from the logs of an earlier run. */
static int analyze_only(const char *dir) {
    RsErr e = {0};
    if (bench_run_files_check(dir, &e)) return fail(2, "--analyze: %s", e.msg);
    int rc = bench_analyze(dir, &e);
    if (rc) return fail(cli_exit_status(rc), "--analyze %s: %s", dir, e.msg);
    return echo_summary(dir);
}

static void bench_release(Bench *b) {
    /* the logs first, so that a signal during the rest of the cleanup loses nothing */
    if (b->frounds) fclose(b->frounds);
    if (b->fdecodes) fclose(b->fdecodes);
    bench_progress_destroy(&b->prog);
    if (b->engine_ok) engine_destroy(&b->en);
    drafter_stop();
    for (int p = 0; b->ids && p < b->n_prompts; p++) free(b->ids[p]);
    free(b->ids);
    free(b->n_ids);
    free(b->sink.rounds);
    bench_done_destroy(&b->done);
    bench_plan_destroy(&b->plan);
    free(b->combos);
    prompts_destroy(&b->ps);
    settings_free(&b->s);
}

int main(int argc, char **argv) {
    Cli cli;
    int status = bench_parse(argc, argv, &cli);
    if (status >= 0) return status;
    if (cli.analyze) return analyze_only(cli.analyze);
    Bench b = {.dir = cli.resume ? cli.resume : cli.out, .resume = cli.resume != NULL};
    status = b.resume ? settings_from_resume(b.dir, &b.s) : settings_from_args(&cli, &b.s);
    if (!status) status = bench_plan(&b);
    if (!status) status = bench_run(&b);
    if (!status) status = bench_report(&b);
    bench_release(&b);
    return status;
}
