/* rootspec-schedsim: the batch scheduler's passes (batch_pick, target_proc/batch.h) over a
 * load of requests, timed by a linear model of a pass's cost instead of a model: what an
 * order, a row budget or a prompt chunk does to the time to first token and the aggregate,
 * free of the machine's load. Clients as tools/serve_load.py's: --concurrency of them, each
 * sending its next request when its last one ends, --requests in all, the first
 * --concurrency at once (a burst). A request is its prompt's rows (handed over
 * --prefill-chunk at a time), one first-token row, then one row a pass until --new-tokens
 * tokens (an AR decode). A pass costs a + p x prompt rows + k x rows that keep logits, plus
 * h of host work between passes (--cost a,p,k,h in ms: fit them with rootspec-passes). */
#include "bench/stats.h"
#include "common/cli.h"
#include "target_proc/batch.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQ_MAX 1024

typedef struct {
    int rows[REQ_MAX], n;         /* each request's prompt rows to compute */
    int conc, budget, chunk, new_tokens;
    double a, p, k, h;
} Opts;

typedef struct {
    int left, piece; /* prompt rows still to run; of the piece in hand, rows left */
    int toks;        /* tokens out: 0 until its first-token pass */
    int joined;      /* the pass count when it arrived */
    double sent;     /* ms */
} Req;

static void usage(FILE *f) {
    fprintf(f, "usage: rootspec-schedsim --rows N,N,... [--concurrency C] [--batch-rows R]\n"
               "                         [--prefill-chunk P] [--new-tokens T] [--cost a,p,k,h]\n"
               "  --rows LIST          each request's prompt rows to compute (1..%d requests)\n"
               "  --concurrency C      clients, each sending its next request when its last\n"
               "                       ends; the first C at once (default 16)\n"
               "  --batch-rows R       the row budget of a pass (default 64)\n"
               "  --prefill-chunk P    prompt rows a request hands over at once (default 256)\n"
               "  --new-tokens T       tokens each request decodes (default 64)\n"
               "  --cost a,p,k,h       ms: a pass, a prompt row, a row that keeps logits, the\n"
               "                       host work between passes (default 1.56,0.89,1.14,0.5)\n"
               "Prints TTFT p50 and p90 (ms), the aggregate tok/s and the passes.\n", REQ_MAX);
}

static int parse(int argc, char **argv, Opts *o) {
    *o = (Opts){.conc = 16, .budget = 64, .chunk = 256, .new_tokens = 64, .a = 1.56, .p = 0.89,
                .k = 1.14, .h = 0.5};
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "rootspec-schedsim: %s needs a value\n", f);
            return 2;
        }
        i++;
        int rc = 0;
        if (!strcmp(f, "--rows")) {
            for (char *s = (char *)v, *end; *s && o->n < REQ_MAX; s = *end ? end + 1 : end) {
                o->rows[o->n++] = (int)strtol(s, &end, 10);
                if (end == s || o->rows[o->n - 1] < 1) {
                    fprintf(stderr, "rootspec-schedsim: --rows '%s': not a list of counts >= 1\n", v);
                    return 2;
                }
            }
        } else if (!strcmp(f, "--concurrency")) rc = cli_int(f, v, 1, REQ_MAX, &o->conc, &e);
        else if (!strcmp(f, "--batch-rows")) rc = cli_int(f, v, 1, INT_MAX, &o->budget, &e);
        else if (!strcmp(f, "--prefill-chunk")) rc = cli_int(f, v, 1, INT_MAX, &o->chunk, &e);
        else if (!strcmp(f, "--new-tokens")) rc = cli_int(f, v, 1, INT_MAX, &o->new_tokens, &e);
        else if (!strcmp(f, "--cost")) {
            if (sscanf(v, "%lf,%lf,%lf,%lf", &o->a, &o->p, &o->k, &o->h) != 4) {
                fprintf(stderr, "rootspec-schedsim: --cost '%s': want a,p,k,h\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "rootspec-schedsim: unknown option %s\n", f);
            usage(stderr);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "rootspec-schedsim: %s\n", e.msg);
            return 2;
        }
    }
    if (o->n < 1) {
        fprintf(stderr, "rootspec-schedsim: --rows is required\n");
        return 2;
    }
    return 0;
}

/* The candidates of the requests in flight, as the batcher's pass_pick ranks them. */
static int candidates(const Opts *o, Req *r, const int *live, int n_live, int pass,
                      BatchCand *c) {
    for (int j = 0; j < n_live; j++) {
        Req *q = &r[live[j]];
        if (q->left > 0 && q->piece == 0) q->piece = q->left < o->chunk ? q->left : o->chunk;
        int rank = q->left > 0 ? BATCH_PREFILL : q->toks == 0 ? BATCH_FIRST_TOKEN : BATCH_DECODE;
        c[j] = (BatchCand){rank == BATCH_PREFILL ? q->piece : 1, rank, (uint64_t)live[j] + 1,
                           pass - q->joined};
    }
    return n_live;
}

int main(int argc, char **argv) {
    static Opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    static Req r[REQ_MAX];
    static double ttft[REQ_MAX];
    static BatchCand c[REQ_MAX];
    static int live[REQ_MAX], out[REQ_MAX], take[REQ_MAX];
    int n_live = 0, next = 0, ended = 0, pass = 0;
    double t = 0;
    while (ended < o.n) {
        while (n_live < o.conc && next < o.n) { /* a free client sends its next request */
            r[next] = (Req){.left = o.rows[next], .joined = pass, .sent = t};
            live[n_live++] = next++;
        }
        int k = batch_pick(c, candidates(&o, r, live, n_live, pass, c), o.budget, out, take);
        int prompt = 0, kept = 0;
        for (int j = 0; j < k; j++)
            if (c[out[j]].rank == BATCH_PREFILL) prompt += take[j];
            else kept++;
        t += o.a + o.p * prompt + o.k * kept + o.h;
        pass++;
        for (int j = 0; j < k; j++) {
            Req *q = &r[live[out[j]]];
            if (c[out[j]].rank == BATCH_PREFILL) {
                q->left -= take[j];
                q->piece -= take[j];
            } else if (q->toks++ == 0) {
                ttft[live[out[j]]] = t - q->sent;
            }
        }
        for (int j = 0; j < n_live; j++) /* the ended leave; their clients send again */
            if (r[live[j]].toks >= o.new_tokens) {
                live[j--] = live[--n_live];
                ended++;
            }
    }
    bench_sort(ttft, o.n);
    printf("schedsim requests=%d concurrency=%d batch_rows=%d prefill_chunk=%d ttft_p50_ms=%.0f "
           "ttft_p90_ms=%.0f agg_tok_s=%.1f passes=%d\n", o.n, o.conc, o.budget, o.chunk,
           ttft[o.n / 2], ttft[o.n * 9 / 10 < o.n ? o.n * 9 / 10 : o.n - 1],
           o.n * o.new_tokens / t * 1e3, pass);
    return 0;
}
