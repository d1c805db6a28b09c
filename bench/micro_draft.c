/* rootspec-micro's drafter figure; see micro_draft.h. */
#include "micro_draft.h"
#include "common/pool.h"
#include "common/rng.h"
#include "common/tokenizer.h"
#include "draft_proc/model_drafter.h"
#include "stats.h"
#include <stdio.h>
#include <stdlib.h>

/* What the drafter reads: an ordinary English paragraph. */
static const char *const TEXT =
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "as his father had taught him. From the lamp room he could see the fishing boats "
    "returning to the harbour, their lights swaying on the dark water, and beyond them "
    "the long line of the coast where the town slowly fell asleep.";

/* The context's ids, (*n); the caller frees them. */
static int context_ids(const Model *m, int **ids, int *n, RsErr *e) {
    Tokenizer *tok = NULL;
    int rc = tokenizer_load_model(m, &tok, e);
    if (rc) return rc;
    if (tok) {
        rc = tokenizer_encode(tok, TEXT, ids, n, e);
        tokenizer_destroy(&tok);
        return rc;
    }
    Rng r;
    rng_seed(&r, 7);
    *n = 64;
    *ids = rs_xmalloc(sizeof(int) * 64);
    for (int i = 0; i < 64; i++) (*ids)[i] = (int)(rng_uniform(&r) * m->cfg.vocab_size);
    return RS_OK;
}

int micro_drafter_host(const Model *m, int threads, const char *family,
                       const BackendSwitches *sw, int rounds,
                       double *us_row, RsErr *e) {
    int *ids = NULL, n = 0, rc = context_ids(m, &ids, &n, e);
    if (rc) return rc;
    char layers[32];
    int half = m->cfg.n_layers / 2 > 0 ? m->cfg.n_layers / 2 : 1;
    snprintf(layers, sizeof layers, "0-%d", half - 1);
    Drafter *d = NULL;
    BackendParams bp = {.kv_capacity = n + rounds + POOL_N_EXPANDED + 8, .threads = threads,
                        .cpu_kernels = family, .sw = *sw};
    rc = drafter_self_create(m, layers, &cpu_backend_ops, &bp, &d, e);
    Pool *p = rs_xmalloc(sizeof(Pool));
    double *per = rs_xmalloc(sizeof(double) * (size_t)(rounds > 0 ? rounds : 1));
    double draft_ms = 0;
    int rows = 0;
    if (!rc) rc = drafter_commit_grow(d, ids, n, p, e); /* the context: not timed */
    for (int r = 0; r < rounds && !rc; r++) {
        int next = p->token[p->root_first_child];
        if (!(rc = drafter_commit_grow(d, &next, 1, p, e))) {
            per[r] = p->draft_rows ? p->draft_host_ns / 1e3 / p->draft_rows : 0;
            draft_ms += p->draft_ns / 1e6;
            rows = p->draft_rows;
        }
    }
    if (!rc && rounds > 0) {
        bench_sort(per, rounds);
        *us_row = per[rounds / 2];
        printf("drafter (layers %s, %d thread%s, %d-token context): host work %.1f us a "
               "logits row (median of %d rounds, %d rows a round), drafting %.1f ms a round\n"
               "drafter_host_us_row_t%d=%.1f\n",
               layers, threads, threads > 1 ? "s" : "", n, *us_row, rounds, rows,
               draft_ms / rounds, threads, *us_row);
    }
    free(per);
    free(p);
    drafter_destroy(&d);
    free(ids);
    return rc;
}
