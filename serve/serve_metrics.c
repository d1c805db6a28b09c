/* Prometheus metrics in the text exposition format. Debian ships no C client library for
 * Prometheus (prometheus-cpp is C++), and the format is a few lines of text per metric. */
#include "serve.h"
#include <pthread.h>
#include <string.h>

#define HIST_MAX 16

typedef struct {
    const char *name, *help;
    int n;
    double le[HIST_MAX];
    uint64_t count[HIST_MAX + 1]; /* the last: above every bound (+Inf only) */
    double sum;
} Hist;

static const int STATUS_CODES[] = {200, 400, 404, 405, 413, 429, 500, 503};
#define N_STATUS ((int)(sizeof STATUS_CODES / sizeof STATUS_CODES[0]))
static const char *const FINISH_NAMES[FINISH_COUNT] = {"stop", "length", "cancelled", "error"};

struct ServeMetrics {
    pthread_mutex_t mu;
    uint64_t requests[N_STATUS + 1]; /* the last: any other status */
    uint64_t finished[FINISH_COUNT];
    uint64_t prompt_tokens, gen_tokens, rounds, fallback_rounds, fallback_requests;
    uint64_t prompt_cached, prompt_computed;
    Hist ttft, itl, per_round;
};

static void hist_init(Hist *h, const char *name, const char *help, const double *le, int n) {
    RS_ASSERT(n <= HIST_MAX);
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n = n;
    memcpy(h->le, le, sizeof(double) * (size_t)n);
}

static void hist_add(Hist *h, double v, int times) {
    int b = 0;
    while (b < h->n && v > h->le[b]) b++;
    h->count[b] += (uint64_t)times;
    h->sum += v * times;
}

void serve_metrics_create(ServeMetrics **out) {
    static const double ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    static const double rnd[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
    ServeMetrics *m = rs_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, "rootspec_time_to_first_token_seconds",
              "Time from a request's arrival to its first output token.", ttft, 12);
    hist_init(&m->itl, "rootspec_inter_token_latency_seconds",
              "Time between output tokens (a round's tokens share its gap).", itl, 10);
    hist_init(&m->per_round, "rootspec_tokens_per_round",
              "Tokens a decode round emitted (1 for autoregressive rounds).", rnd, 12);
    *out = m;
}

void serve_metrics_destroy(ServeMetrics **m) {
    if (!m || !*m) return;
    pthread_mutex_destroy(&(*m)->mu);
    free(*m);
    *m = NULL;
}

void serve_metrics_request(ServeMetrics *m, int status) {
    int i = 0;
    while (i < N_STATUS && STATUS_CODES[i] != status) i++;
    pthread_mutex_lock(&m->mu);
    m->requests[i]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_finish(ServeMetrics *m, ServeFinish f, int prompt_tokens, int tokens,
                          int drafter_failed) {
    pthread_mutex_lock(&m->mu);
    m->finished[f]++;
    m->prompt_tokens += (uint64_t)prompt_tokens;
    m->gen_tokens += (uint64_t)tokens;
    m->fallback_requests += drafter_failed != 0;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_prompt(ServeMetrics *m, int cached, int computed) {
    pthread_mutex_lock(&m->mu);
    m->prompt_cached += (uint64_t)cached;
    m->prompt_computed += (uint64_t)computed;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ttft(ServeMetrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, s, 1);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_itl(ServeMetrics *m, double gap, int n) {
    if (n < 1) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, gap / n, n);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_round(ServeMetrics *m, int tokens, int fallback_ar) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->per_round, tokens, 1);
    m->rounds++;
    m->fallback_rounds += fallback_ar != 0;
    pthread_mutex_unlock(&m->mu);
}

static void hist_print(FILE *f, const Hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->le[b], (unsigned long long)cum);
    }
    cum += h->count[h->n];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", h->name,
            (unsigned long long)cum, h->name, h->sum, h->name, (unsigned long long)cum);
}

static void counter_print(FILE *f, const char *name, const char *help, uint64_t v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
            (unsigned long long)v);
}

static void labelled_print(FILE *f, const ServeMetrics *m) {
    fprintf(f, "# HELP rootspec_requests_total HTTP requests answered, by status code.\n"
               "# TYPE rootspec_requests_total counter\n");
    for (int i = 0; i < N_STATUS; i++)
        fprintf(f, "rootspec_requests_total{code=\"%d\"} %llu\n", STATUS_CODES[i],
                (unsigned long long)m->requests[i]);
    fprintf(f, "rootspec_requests_total{code=\"other\"} %llu\n",
            (unsigned long long)m->requests[N_STATUS]);
    fprintf(f, "# HELP rootspec_decodes_finished_total Decodes ended, by why.\n"
               "# TYPE rootspec_decodes_finished_total counter\n");
    for (int i = 0; i < FINISH_COUNT; i++)
        fprintf(f, "rootspec_decodes_finished_total{reason=\"%s\"} %llu\n", FINISH_NAMES[i],
                (unsigned long long)m->finished[i]);
}

/* The batcher's part of /metrics. */
static void batch_print(FILE *f, int queued, const BatchStats *b) {
    fprintf(f, "# HELP rootspec_sequences_running Sequences decoding in the batch now.\n"
               "# TYPE rootspec_sequences_running gauge\nrootspec_sequences_running %d\n",
            b->active);
    fprintf(f, "# HELP rootspec_sequences_waiting Requests waiting for a place in the batch.\n"
               "# TYPE rootspec_sequences_waiting gauge\nrootspec_sequences_waiting %d\n", queued);
    counter_print(f, "rootspec_batch_passes_total", "Batched forward passes.", b->passes);
    counter_print(f, "rootspec_batch_rows_total",
                  "Rows those passes carried (rows per pass: its rate over the passes').", b->rows);
    counter_print(f, "rootspec_batch_kept_rows_total",
                  "Of those rows, the ones whose logits were kept (they pay the output head).",
                  b->kept_rows);
    counter_print(f, "rootspec_batch_prompt_rows_total", "Of those rows, prompts' rows.",
                  b->prompt_rows);
    fprintf(f, "# HELP rootspec_batch_pass_seconds_total Time the passes took.\n"
               "# TYPE rootspec_batch_pass_seconds_total counter\nrootspec_batch_pass_seconds_total %.6f\n",
            b->pass_ns * 1e-9);
    fprintf(f, "# HELP rootspec_batch_last_rows Rows of the last pass.\n"
               "# TYPE rootspec_batch_last_rows gauge\nrootspec_batch_last_rows %d\n", b->last_rows);
    fprintf(f, "# HELP rootspec_kv_blocks_used KV cache blocks held by sequences.\n"
               "# TYPE rootspec_kv_blocks_used gauge\nrootspec_kv_blocks_used %d\n", b->blocks_used);
    fprintf(f, "# HELP rootspec_kv_blocks_free KV cache blocks free.\n"
               "# TYPE rootspec_kv_blocks_free gauge\nrootspec_kv_blocks_free %d\n",
            b->blocks_total - b->blocks_used);
    fprintf(f, "# HELP rootspec_kv_blocks_cached KV cache blocks in the prefix cache (held or "
               "idle; idle ones count as free).\n"
               "# TYPE rootspec_kv_blocks_cached gauge\nrootspec_kv_blocks_cached %d\n",
            b->blocks_cached);
    counter_print(f, "rootspec_preemptions_total",
                  "Decodes preempted for KV blocks (recomputed later).", b->preemptions);
}

char *serve_metrics_render(ServeMetrics *m, int queued, int running) {
    return serve_metrics_render_batch(m, queued, running, NULL);
}

char *serve_metrics_render_batch(ServeMetrics *m, int queued, int running, const BatchStats *batch) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    RS_ASSERT(f);
    pthread_mutex_lock(&m->mu);
    labelled_print(f, m);
    counter_print(f, "rootspec_prompt_tokens_total", "Prompt tokens of finished decodes.", m->prompt_tokens);
    counter_print(f, "rootspec_prompt_tokens_cached_total",
                  "Prompt tokens whose KV blocks came from the prefix cache.", m->prompt_cached);
    counter_print(f, "rootspec_prompt_tokens_computed_total",
                  "Prompt tokens the target computed (not from the prefix cache).",
                  m->prompt_computed);
    counter_print(f, "rootspec_generation_tokens_total", "Tokens generated.", m->gen_tokens);
    counter_print(f, "rootspec_rounds_total", "Decode rounds.", m->rounds);
    counter_print(f, "rootspec_drafter_fallback_rounds_total",
                  "Rounds run autoregressively because the drafter had failed.", m->fallback_rounds);
    counter_print(f, "rootspec_drafter_fallbacks_total",
                  "Requests whose drafter failed mid-decode (finished autoregressively).",
                  m->fallback_requests);
    hist_print(f, &m->ttft);
    hist_print(f, &m->itl);
    hist_print(f, &m->per_round);
    pthread_mutex_unlock(&m->mu);
    fprintf(f, "# HELP rootspec_queue_depth Requests waiting for the decoder.\n"
               "# TYPE rootspec_queue_depth gauge\nrootspec_queue_depth %d\n", queued);
    fprintf(f, "# HELP rootspec_requests_running Requests decoding now.\n"
               "# TYPE rootspec_requests_running gauge\nrootspec_requests_running %d\n", running);
    if (batch) batch_print(f, queued, batch);
    int rc = fclose(f);
    RS_ASSERT(rc == 0 && text);
    return text;
}
