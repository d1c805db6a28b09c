/* The cost-aware budget's choices under fixed costs (planner_fix_costs), against values
 * worked out by hand here: a sure chain is verified whole when rows are cheap and not at
 * all when they cost more than the tokens they bring; what acceptance it measured moves the
 * choice; an expensive drafter is not asked, except to refresh its estimates now and then;
 * measured pass times are interpolated. */
#include "target_proc/planner.h"
#include "testutil.h"
#include <math.h>

/* A pool that is one chain of `n` candidates (tokens 1..n) with draft probability q each,
 * plus a sibling of the first with probability qs (0: none). */
static void chain_pool(Pool *p, int n, double q, double qs) {
    memset(p, 0, sizeof *p);
    int k = 0;
    p->token[k] = 1, p->parent[k] = -1, p->depth[k] = 1, p->logq[k++] = (float)log(q);
    if (qs > 0) p->token[k] = 50, p->parent[k] = -1, p->depth[k] = 1, p->logq[k++] = (float)log(qs);
    for (int i = 1; i < n; i++, k++) {
        p->token[k] = 1 + i;
        p->parent[k] = i == 1 ? 0 : k - 1;
        p->depth[k] = (uint8_t)(i + 1);
        p->logq[k] = (float)log(q);
    }
    p->n = k;
    RsErr e = {0};
    ck_assert_msg(pool_finalize(p, 100, &e) == RS_OK, "%s", e.msg);
}

/* A chain pool (chain_pool) and the draft rule's selection of it at the cap. */
static Pool *chain_selected(int n, double q, Selection *sel) {
    Pool *p = calloc(1, sizeof *p);
    chain_pool(p, n, q, 0);
    select_draft(p, TREE_MAX, sel);
    return p;
}

static Planner *fixed_planner(double pass1_ns, double row_ns, double draft_ns) {
    Planner *pl = planner_create();
    planner_fix_costs(pl, pass1_ns, row_ns, draft_ns);
    return pl;
}

/* A planner that measured one-row passes of 10 ms and 9-row passes of 40 ms. */
static Planner *measured_planner(void) {
    Planner *pl = planner_create();
    for (int i = 0; i < 5; i++) {
        planner_observe_pass(pl, 1, 10000000);
        planner_observe_pass(pl, 9, 40000000);
    }
    return pl;
}

START_TEST(test_planner_sure_chain) {
    Selection sel;
    Pool *p = chain_selected(8, 0.99, &sel);
    /* rows cost a tenth of a pass: every node brings ~0.9 tokens, costs 0.1 */
    Planner *pl = fixed_planner(10e6, 1e6, 0);
    PlanChoice c = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    ck_assert_int_eq(c.k, 8);
    double want = 1;
    for (int i = 1; i <= 8; i++) want += pow(0.99, i);
    ck_assert_double_eq_tol(c.tokens, want, 1e-6);
    ck_assert_double_eq_tol(c.ns, 10e6 + 8 * 1e6, 1);
    planner_destroy(&pl);
    /* rows cost two passes each: no node pays for itself */
    pl = fixed_planner(10e6, 20e6, 0);
    c = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    ck_assert_int_eq(c.k, 0);
    ck_assert_double_eq_tol(c.tokens, 1, 1e-12);
    planner_destroy(&pl);
    ck_assert_ptr_null(pl);
    free(p);
}
END_TEST

START_TEST(test_planner_breakeven) {
    /* q = 0.5 a node: node i is reached and accepted with 0.5^i. With rows at 0.3 of a pass
     * the first node (0.5) pays, the second (0.25) does not: k = 1. */
    Selection sel;
    Pool *p = chain_selected(4, 0.5, &sel);
    Planner *pl = fixed_planner(10e6, 3e6, 0);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 1, p, &sel, -1, POOL_MAX_DEPTH).k, 1);
    planner_destroy(&pl);
    free(p);
}
END_TEST

/* In a batch a row costs what it adds to the shared pass, priced at the batch's rate: with
 * passes of 10 ms + 2.5 ms a row, alone (rate 1 / 10 ms) a node pays when its path
 * probability beats 0.25, so a chain of 0.9 nodes is verified whole; with 5 others (6
 * sequences, rate 6 / 22.5 ms) only beyond 0.667: 0.9, 0.81 and 0.729; with 15 others
 * (16 / 47.5 ms) beyond 0.842: the first node only. Alone again, the whole chain. */
START_TEST(test_planner_batch_fades) {
    Selection sel;
    Pool *p = chain_selected(8, 0.9, &sel);
    Planner *pl = fixed_planner(10e6, 2.5e6, 0);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    planner_set_batch(pl, 5, 6);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 3);
    planner_set_batch(pl, 15, 16);
    PlanChoice c = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    ck_assert_int_eq(c.k, 1);
    ck_assert_double_eq_tol(c.ns, 10e6 + 16 * 2.5e6, 1); /* the whole pass it joins */
    /* the others' trees (45 rows for 15 sequences) make the pass dearer, not the rows
     * cheaper: the batch's AR step is still 16 rows */
    planner_set_batch(pl, 45, 16);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 1);
    planner_set_batch(pl, 0, 1);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    planner_destroy(&pl);
    /* measured: a batched decode's own pass times (one sequence's rows of a shared pass)
     * are ignored, the batch's passes by their total rows count */
    pl = measured_planner(); /* 10 ms a row, 40 ms 9 rows */
    planner_set_batch(pl, 0, 1);
    for (int i = 0; i < 20; i++) planner_observe_pass(pl, 9, 400000000);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    for (int i = 0; i < 20; i++) planner_observe_batch_pass(pl, 9, 400000000);
    ck_assert_int_lt(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    planner_destroy(&pl);
    /* noisy passes of 16 and 17 rows (20 ms apart): a batched decode prices its rows by
     * the line through all sizes (19.7 ms + 3.89 ms a row: at 16 / 78 ms a row costs 0.797
     * tokens, so the 0.9 and 0.81 nodes pay), not by the difference of the two averages
     * (which would make the first row cost 4.6 tokens) */
    pl = planner_create();
    planner_set_batch(pl, 15, 16);
    const int rows[4] = {1, 16, 17, 32};
    const uint64_t ms[4] = {20, 70, 90, 140};
    for (int i = 0; i < 12; i++) planner_observe_batch_pass(pl, rows[i % 4], ms[i % 4] * 1000000);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 2);
    planner_destroy(&pl);
    free(p);
}
END_TEST

/* A step in the measured passes (4 rows 4.5 ms, 5 rows 7 ms: four rows read the weights
 * once, a fifth takes other kernels): the line through every size (3 + 0.8 ms a row or so)
 * prices a row beside 3 others at ~0.75 tokens, so the 0.9 node pays; once both sizes
 * were seen often enough for their averages to show the step, the first row costs ~2.2
 * tokens and no node pays. */
START_TEST(test_planner_batch_step) {
    Selection sel;
    Pool *p = chain_selected(8, 0.9, &sel);
    for (int seen = 3; seen <= 10; seen += 7) {
        Planner *pl = planner_create();
        planner_set_batch(pl, 3, 4);
        for (int i = 0; i < seen; i++)
            for (int n = 1; n <= 8; n++)
                planner_observe_batch_pass(pl, n, (uint64_t)((n <= 4 ? 3 + 0.5 * (n - 1) : 7 + 0.5 * (n - 5)) * 1e6));
        int k = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k;
        if (seen < 8) ck_assert_msg(k >= 1, "the line alone: %d nodes", k);
        else ck_assert_msg(k == 0, "the step seen: %d nodes verified", k);
        planner_destroy(&pl);
    }
    free(p);
}
END_TEST

START_TEST(test_planner_batch_shared_passes) {
    /* The step recorded in the batch's table (planner_share_passes) prices a decode's
     * rows, whatever its own planner saw (a line alone, which lets the chain through a
     * planner that reads its own). */
    Selection sel;
    Pool *p = chain_selected(8, 0.9, &sel);
    Planner *batch = planner_create(), *pl = planner_create();
    for (int i = 0; i < 10; i++)
        for (int n = 1; n <= 8; n++)
            planner_observe_batch_pass(batch, n, (uint64_t)((n <= 4 ? 3 + 0.5 * (n - 1) : 7 + 0.5 * (n - 5)) * 1e6));
    for (int n = 1; n <= 8; n++) planner_observe_batch_pass(pl, n, (uint64_t)((3 + 0.5 * (n - 1)) * 1e6));
    planner_set_batch(pl, 3, 4);
    planner_share_passes(pl, batch);
    int k = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k;
    ck_assert_msg(k == 0, "the batch's step seen: %d nodes verified", k);
    Planner *own = planner_create();
    for (int n = 1; n <= 8; n++) planner_observe_batch_pass(own, n, (uint64_t)((3 + 0.5 * (n - 1)) * 1e6));
    planner_set_batch(own, 3, 4);
    k = planner_choose(own, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k;
    ck_assert_msg(k >= 1, "its own line: %d nodes", k);
    planner_destroy(&own);
    planner_destroy(&pl);
    planner_destroy(&batch);
    free(p);
}
END_TEST

START_TEST(test_planner_learns_rejections) {
    /* The drafter says 0.99, but 200 such nodes were all rejected: the chain stops paying. */
    Selection sel;
    Pool *p = chain_selected(8, 0.99, &sel);
    Planner *pl = fixed_planner(10e6, 1e6, 0);
    for (int i = 0; i < 200; i++) planner_observe_accept(pl, DECODER_DRAFT, 0, p, &sel, 8, NULL, 0);
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 0);
    /* a T=1 decode keeps its own calibration */
    ck_assert_int_eq(planner_choose(pl, DECODER_DRAFT, 1, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    planner_destroy(&pl);
    /* a batch's planners learn acceptance together: what one saw moves the other's
     * choices, and each keeps its own once unshared */
    Planner *a = fixed_planner(10e6, 1e6, 0), *b = fixed_planner(10e6, 1e6, 0);
    planner_share_accept(b, a);
    for (int i = 0; i < 200; i++) planner_observe_accept(b, DECODER_DRAFT, 0, p, &sel, 8, NULL, 0);
    ck_assert_int_eq(planner_choose(a, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 0);
    ck_assert_int_eq(planner_choose(b, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 0);
    planner_share_accept(b, NULL);
    ck_assert_int_eq(planner_choose(b, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH).k, 8);
    planner_destroy(&b);
    planner_destroy(&a);
    free(p);
}
END_TEST

START_TEST(test_planner_root_rule_uses_x1) {
    /* Root selection knows X1 before it chooses: a tree under another first token is
     * worth nothing, and with X1 on the chain the chain is verified. */
    Pool *p = calloc(1, sizeof *p);
    chain_pool(p, 6, 0.9, 0.05);
    Selection sel;
    double lp1[POOL_TOPK] = {log(0.9), log(0.05)};
    Planner *pl = fixed_planner(10e6, 1e6, 0);
    select_root_logp(p, TREE_MAX, lp1, 50, &sel); /* X1 = the sibling, a leaf */
    PlanChoice c = planner_choose(pl, DECODER_ROOT, 0, p, &sel, 50, POOL_MAX_DEPTH);
    ck_assert_double_le(c.tokens, 2.0 + 1e-9); /* X1 and the continuation at most */
    select_root_logp(p, TREE_MAX, lp1, 1, &sel);  /* X1 = the chain's head */
    c = planner_choose(pl, DECODER_ROOT, 0, p, &sel, 1, POOL_MAX_DEPTH);
    ck_assert_int_ge(c.k, 6);
    ck_assert_double_gt(c.tokens, 5.0);
    planner_destroy(&pl);
    free(p);
}
END_TEST

START_TEST(test_planner_asks_when_it_pays) {
    Selection sel;
    Pool *p = chain_selected(8, 0.99, &sel);
    /* a free drafter: the first (exploring) ask is shallow; once a pool has shown what its
     * levels are worth, it keeps asking, for the deepest pool (free levels tie) */
    Planner *pl = fixed_planner(10e6, 1e6, 0);
    PlanAsk a = planner_before_round(pl, DECODER_DRAFT, 0, 1);
    ck_assert(a.ask && a.explore && a.depth == 2);
    planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, a.depth);
    a = planner_before_round(pl, DECODER_DRAFT, 0, 1);
    ck_assert(a.ask && !a.explore);
    ck_assert_int_eq(a.depth, POOL_MAX_DEPTH);
    planner_destroy(&pl);
    /* a drafter whose levels cost a fifth of a pass: an untried depth is worth no more than
     * the deepest tried, less its levels, so it stays at the depth it has seen pay (depth 2:
     * 1.22 tokens over an AR step less 0.3 of waiting; depth 3 would wait 0.5) */
    pl = measured_planner();
    p->n_passes = 2; /* a commit of 1 ms and one level of 2 ms, waited for */
    p->commit_pass_ns = 1000000;
    p->draft_ns = 3000000;
    planner_observe_pool(pl, p, 1, 3000000, 3000000);
    planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, 2);
    a = planner_before_round(pl, DECODER_DRAFT, 0, 1);
    ck_assert(a.ask && !a.explore);
    ck_assert_int_eq(a.depth, 2);
    planner_destroy(&pl);
    /* a drafter costing 100 passes: not asked, until AR steps have cost 40 times an ask */
    pl = fixed_planner(10e6, 1e6, 1000e6);
    planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    a = planner_before_round(pl, DECODER_DRAFT, 0, 1);
    ck_assert(!a.ask);
    int steps = 0;
    while (!(a = planner_before_round(pl, DECODER_DRAFT, 0, 1)).ask && steps < 10000) {
        planner_observe_round(pl, DECODER_DRAFT, 0, 1, 10000000, 0);
        steps++;
    }
    ck_assert(a.explore);
    ck_assert_int_ge(steps, 40 * 100 - 1);
    ck_assert_int_le(steps, 40 * 100 + 1);
    planner_destroy(&pl);
    free(p);
}
END_TEST

START_TEST(test_planner_long_commit_not_asked) {
    /* Measured: one-row passes of 10 ms, 9-row passes of 40 ms, a pool whose 2-token commit
     * took 2 ms. A sure chain pays with 2 pending tokens; with 2000 pending (a commit like a
     * prefill, ~2 s) it does not. */
    Selection sel;
    Pool *p = chain_selected(8, 0.999, &sel);
    Planner *pl = measured_planner();
    p->commit_pass_ns = p->draft_ns = 2000000;
    planner_observe_pool(pl, p, 2, 2000000, 2000000);
    planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    ck_assert(planner_before_round(pl, DECODER_DRAFT, 0, 2).ask);
    ck_assert(!planner_before_round(pl, DECODER_DRAFT, 0, 2000).ask);
    planner_destroy(&pl);
    free(p);
}
END_TEST

/* A first pool after the prompt's prefill (50 tokens committed in 100 ms, one level of
 * 2 ms, 10 ms target passes) does not price the next rounds' one-token commits like that
 * prefill: the planner asks again; a measured round commit then counts as it is. */
START_TEST(test_planner_prefill_commit) {
    Selection sel;
    Pool *p = chain_selected(8, 0.999, &sel);
    Planner *pl = measured_planner();
    p->n_passes = 2;
    p->commit_pass_ns = 100000000;
    p->draft_ns = 102000000;
    planner_observe_pool(pl, p, 50, 102000000, 92000000);
    planner_choose(pl, DECODER_ROOTDRAW, 0, p, &sel, 1, 2);
    ck_assert(planner_before_round(pl, DECODER_ROOTDRAW, 0, 1).ask);
    p->commit_pass_ns = 60000000; /* a 2-token commit of 60 ms: six target passes */
    p->draft_ns = 62000000;
    for (int i = 0; i < 20; i++) planner_observe_pool(pl, p, 2, 62000000, 52000000);
    ck_assert(!planner_before_round(pl, DECODER_ROOTDRAW, 0, 1).ask);
    planner_destroy(&pl);
    free(p);
}
END_TEST

START_TEST(test_planner_measured_costs) {
    /* Measured passes of 1 and 9 rows; a 5-row pass is interpolated between them, and the
     * choice follows: with 9 rows at 4 passes a sure chain of 8 pays (~8 tokens for 4). */
    Selection sel;
    Pool *p = chain_selected(8, 0.999, &sel);
    Planner *pl = measured_planner();
    PlanChoice c = planner_choose(pl, DECODER_DRAFT, 0, p, &sel, -1, POOL_MAX_DEPTH);
    ck_assert_int_eq(c.k, 8);
    ck_assert_double_eq_tol(c.ns, 40e6, 1);
    Pool *short_pool = chain_selected(4, 0.999, &sel); /* 5 rows: 25 ms, ~5 tokens: pays */
    c = planner_choose(pl, DECODER_DRAFT, 0, short_pool, &sel, -1, POOL_MAX_DEPTH);
    ck_assert_int_eq(c.k, 4);
    ck_assert_double_eq_tol(c.ns, 25e6, 1);
    planner_destroy(&pl);
    free(short_pool);
    free(p);
}
END_TEST

/* The pool's width: the full ten until a level was measured and while a level costs at
 * most an eighth of a one-row target pass (10 ms here); one node a level once levels cost
 * more (a full-model drafter), and ten again when they turn cheap. */
START_TEST(test_planner_pool_width) {
    Selection sel;
    Pool *p = chain_selected(8, 0.99, &sel);
    Planner *pl = measured_planner();
    PlanAsk a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1);
    ck_assert(a.ask);
    ck_assert_int_eq(a.width, POOL_EXPAND);
    p->n_passes = 2; /* a commit of 1 ms and one level of 5 ms: half a target pass */
    p->commit_pass_ns = 1000000;
    p->draft_ns = 6000000;
    planner_observe_pool(pl, p, 1, 6000000, 0);
    planner_choose(pl, DECODER_ROOTDRAW, 0, p, &sel, 1, 2);
    a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1);
    ck_assert(a.ask);
    ck_assert_int_eq(a.width, 1);
    for (int i = 0; i < 40; i++) { /* levels of 0.5 ms: a twentieth */
        p->draft_ns = 1500000;
        planner_observe_pool(pl, p, 1, 1500000, 0);
    }
    a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1);
    ck_assert(a.ask);
    ck_assert_int_eq(a.width, POOL_EXPAND);
    planner_destroy(&pl);
    free(p);
}
END_TEST

/* A full-model drafter: its first (ten-wide) level costs 8 ms against 10 ms target passes,
 * so the pools turn into chains. A chain's level is priced by what chains cost, not by
 * that wide level: until one is measured at a tenth of it (0.8 ms a level, hidden behind
 * the root pass down to depth 8), then as measured (5 ms: depth 8 would wait 26 ms).
 * A root-pass rule never asks for a depth-1 pool (nothing below X1), not even to refresh
 * its estimates when nothing pays. */
START_TEST(test_planner_chain_levels) {
    Pool *p = calloc(1, sizeof *p);
    chain_pool(p, 8, 0.99, 0);
    Selection sel;
    select_rootdraw(p, TREE_MAX, 1, &sel);
    Planner *pl = measured_planner();
    p->n_passes = 2, p->n_expanded = POOL_EXPAND; /* a commit of 1 ms, a wide level of 8 */
    p->commit_pass_ns = 1000000;
    p->draft_ns = 9000000;
    planner_observe_pool(pl, p, 1, 9000000, 0);
    planner_choose(pl, DECODER_ROOTDRAW, 0, p, &sel, 1, 2);
    PlanAsk a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1);
    ck_assert_int_eq(a.width, 1);
    ck_assert_msg(a.ask && a.depth == POOL_MAX_DEPTH, "ask %d depth %d", a.ask, a.depth);
    p->n_passes = 8, p->n_expanded = 7; /* a chain: 1 ms and seven levels of 5 ms */
    p->draft_ns = 36000000;
    for (int i = 0; i < 30; i++) planner_observe_pool(pl, p, 1, 36000000, 16000000);
    planner_choose(pl, DECODER_ROOTDRAW, 0, p, &sel, 1, 8);
    a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1);
    ck_assert_int_eq(a.width, 1);
    ck_assert(a.ask && a.depth >= 2);
    /* levels of 60 ms: nothing pays; the ask that refreshes the estimates after AR steps
     * goes to depth 2, not to a depth-1 pool whose tree would hold X1 alone */
    p->draft_ns = 421000000;
    for (int i = 0; i < 30; i++) planner_observe_pool(pl, p, 1, 421000000, 411000000);
    int steps = 0;
    while (!(a = planner_before_round(pl, DECODER_ROOTDRAW, 0, 1)).ask && steps++ < 100000)
        planner_observe_round(pl, DECODER_ROOTDRAW, 0, 1, 10000000, 0);
    ck_assert_msg(steps > 0 && a.ask && a.depth == 2, "after %d AR steps: ask %d depth %d",
                  steps, a.ask, a.depth);
    planner_destroy(&pl);
    free(p);
}
END_TEST

Suite *suite_planner(void) {
    Suite *s = suite_create("planner");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_planner_sure_chain);
    tcase_add_test(tc, test_planner_breakeven);
    tcase_add_test(tc, test_planner_batch_fades);
    tcase_add_test(tc, test_planner_batch_step);
    tcase_add_test(tc, test_planner_batch_shared_passes);
    tcase_add_test(tc, test_planner_learns_rejections);
    tcase_add_test(tc, test_planner_root_rule_uses_x1);
    tcase_add_test(tc, test_planner_asks_when_it_pays);
    tcase_add_test(tc, test_planner_measured_costs);
    tcase_add_test(tc, test_planner_long_commit_not_asked);
    tcase_add_test(tc, test_planner_pool_width);
    tcase_add_test(tc, test_planner_prefill_commit);
    tcase_add_test(tc, test_planner_chain_levels);
    suite_add_tcase(s, tc);
    return s;
}
