/* rootspec-passes: what a batched pass costs by its rows, masks and kept (logits) rows.
 * --seqs sequences, each with --ctx committed entries, run passes of R rows each (a chain
 * at the next positions) in one backend_forward_batch; each case is a row count, whether
 * the rows carry a tree mask (a chain's, so the same attention as without one) and whether
 * every row keeps logits (a tree's verification) or each sequence's last (an AR step, a
 * prompt chunk's end). For each case: the minimum over --reps of the wall time and of the
 * process's CPU time (all threads; on a shared machine the CPU time is what means
 * something), then the least-squares line a + b rows + c kept rows over the cases' CPU
 * times: c is what a logits row costs beyond a row that keeps none. */
#include "common/util.h"
#include "kernels/backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEQS_MAX 64
#define ROWS_MAX 4

typedef struct {
    const char *model;
    int seqs, ctx, threads, reps;
} Opts;

static void usage(FILE *f) {
    fprintf(f, "usage: rootspec-passes [--model PATH] [--seqs N] [--ctx C] [--threads T]\n"
               "                       [--reps K]\n"
               "  --model PATH  GGUF (default models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
               "  --seqs N      sequences in every pass, 1..%d (default 16)\n"
               "  --ctx C       committed entries of each, 1..4096 (default 200)\n"
               "  --threads T   CPU threads (default 1)\n"
               "  --reps K      timed passes per case, the minimum is reported (default 15)\n",
            SEQS_MAX);
}

static double now_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int opt_int(const char *name, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "rootspec-passes: %s %s outside [%d, %d]\n", name, v ? v : "(missing)",
                lo, hi);
        return RS_EINVAL;
    }
    *out = (int)x;
    return RS_OK;
}

static int parse(int argc, char **argv, Opts *o) {
    *o = (Opts){"models/SmolLM2-135M-Instruct.Q4_1.gguf", 16, 200, 1, 15};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = RS_OK;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--model") && !v) {
            fprintf(stderr, "rootspec-passes: --model needs a path\n");
            return RS_EINVAL;
        } else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--seqs")) rc = opt_int(a, v, 1, SEQS_MAX, &o->seqs);
        else if (!strcmp(a, "--ctx")) rc = opt_int(a, v, 1, 4096, &o->ctx);
        else if (!strcmp(a, "--threads")) rc = opt_int(a, v, 1, 256, &o->threads);
        else if (!strcmp(a, "--reps")) rc = opt_int(a, v, 1, 1000, &o->reps);
        else {
            fprintf(stderr, "rootspec-passes: unknown option %s\n", a);
            usage(stderr);
            return RS_EINVAL;
        }
        if (rc) return rc;
        i++;
    }
    return RS_OK;
}

typedef struct {
    Backend *b;
    int seq[SEQS_MAX], n;
} Bed;

/* Opens o->seqs sequences of o->ctx committed entries each. */
static int bed_open(Bed *d, const Model *m, const Opts *o, RsErr *e) {
    BackendParams bp = {.kv_capacity = o->seqs * (o->ctx + 2 * BACKEND_KV_BLOCK) + 64,
                        .max_batch = o->ctx > SEQS_MAX * ROWS_MAX ? o->ctx : SEQS_MAX * ROWS_MAX,
                        .threads = o->threads, .max_seqs = o->seqs + 1};
    bp.max_pending = bp.max_batch;
    int rc = backend_create(&cpu_backend_ops, m, &bp, &d->b, e);
    int *tok = rs_xmalloc(sizeof(int) * (size_t)o->ctx), *pos = rs_xmalloc(sizeof(int) * (size_t)o->ctx);
    for (int i = 0; i < o->ctx; i++) tok[i] = 100 + (i * 37) % 1000, pos[i] = i;
    int last = o->ctx - 1;
    for (d->n = 0; !rc && d->n < o->seqs; d->n++) {
        BackendSeg g = {0, tok, pos, o->ctx, NULL};
        if ((rc = backend_seq_open(d->b, &d->seq[d->n], e))) break;
        g.seq = d->seq[d->n];
        rc = backend_forward_batch(d->b, &g, 1, &last, 1, NULL, e);
        if (!rc) rc = backend_seq_commit(d->b, g.seq, pos, o->ctx, e); /* pos: 0..ctx-1 */
    }
    free(tok);
    free(pos);
    return rc;
}

typedef struct {
    int rows, masked, all_kept;
    double wall, cpu; /* ms, minima */
} Case;

static int case_run(Bed *d, const Opts *o, Case *c, RsErr *e) {
    static int tok[SEQS_MAX][ROWS_MAX], pos[SEQS_MAX][ROWS_MAX], out[SEQS_MAX * ROWS_MAX];
    static uint8_t mask[ROWS_MAX * ROWS_MAX];
    BackendSeg segs[SEQS_MAX];
    int R = c->rows, n_out = 0;
    memset(mask, 0, sizeof mask);
    for (int i = 0; i < R; i++)
        for (int j = 0; j <= i; j++) mask[i * R + j] = 1;
    for (int s = 0; s < d->n; s++) {
        for (int i = 0; i < R; i++) tok[s][i] = 200 + i, pos[s][i] = o->ctx + i;
        segs[s] = (BackendSeg){d->seq[s], tok[s], pos[s], R, c->masked ? mask : NULL};
        for (int i = c->all_kept ? 0 : R - 1; i < R; i++) out[n_out++] = s * R + i;
    }
    c->wall = c->cpu = 1e30;
    for (int r = 0; r < o->reps; r++) {
        double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
        int rc = backend_forward_batch(d->b, segs, d->n, out, n_out, NULL, e);
        double w = now_ms(CLOCK_MONOTONIC) - w0, cp = now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
        for (int s = 0; !rc && s < d->n; s++) rc = backend_seq_commit(d->b, d->seq[s], NULL, 0, e);
        if (rc) return rc;
        c->wall = w < c->wall ? w : c->wall;
        c->cpu = cp < c->cpu ? cp : c->cpu;
    }
    return RS_OK;
}

/* Least squares of cpu = a + b rows + c kept over the cases (normal equations, 3x3). */
static void fit(const Case *cs, int n, int seqs, double abc[3]) {
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++) {
        double x[3] = {1, (double)cs[i].rows * seqs, (double)(cs[i].all_kept ? cs[i].rows : 1) * seqs};
        for (int r = 0; r < 3; r++) {
            for (int k = 0; k < 3; k++) A[r][k] += x[r] * x[k];
            A[r][3] += x[r] * cs[i].cpu;
        }
    }
    for (int p = 0; p < 3; p++) /* Gauss-Jordan; the cases make the system regular */
        for (int r = 0; r < 3; r++) {
            if (r == p) continue;
            double f = A[r][p] / A[p][p];
            for (int k = p; k < 4; k++) A[r][k] -= f * A[p][k];
        }
    for (int r = 0; r < 3; r++) abc[r] = A[r][3] / A[r][r];
}

int main(int argc, char **argv) {
    Opts o;
    if (parse(argc, argv, &o)) return 2;
    RsErr e = {0};
    Model *m = NULL;
    BackendParams lp = {.threads = o.threads};
    if (backend_model_load(&cpu_backend_ops, o.model, &lp, &m, &e)) {
        fprintf(stderr, "rootspec-passes: %s\n", e.msg);
        return 2;
    }
    Bed d = {0};
    int rc = bed_open(&d, m, &o, &e);
    Case cs[16];
    int n = 0;
    for (int R = 1; !rc && R <= 3; R++)
        for (int kept = 0; kept < 2; kept++)
            for (int masked = 0; masked < 2; masked++) {
                if (R == 1 && kept) continue; /* one row: kept either way */
                cs[n] = (Case){R, masked, kept || R == 1, 0, 0};
                if ((rc = case_run(&d, &o, &cs[n], &e))) break;
                printf("passes seqs=%d ctx=%d threads=%d rows=%d kept=%d masked=%d wall_ms=%.2f "
                       "cpu_ms=%.2f\n", o.seqs, o.ctx, o.threads, R * o.seqs,
                       (cs[n].all_kept ? R : 1) * o.seqs, masked, cs[n].wall, cs[n].cpu);
                n++;
            }
    if (!rc) {
        double abc[3];
        fit(cs, n, o.seqs, abc);
        printf("passes fit cpu_ms = %.2f + %.3f rows + %.3f kept (a kept row: %.2fx a row)\n",
               abc[0], abc[1], abc[2], (abc[1] + abc[2]) / abc[1]);
    }
    backend_destroy(&d.b);
    model_destroy(&m);
    if (rc) fprintf(stderr, "rootspec-passes: %s\n", e.msg);
    return rc ? 1 : 0;
}
