/* JSONL writer for RoundInfo. Timestamps are the target process's monotonic ns; phases a
 * decoder does not have are written as null so readers never mistake 0 for a time. */
#include "roundlog.h"
#include <inttypes.h>
#include <math.h>

static void ts(FILE *f, const char *k, uint64_t v) {
    if (v) fprintf(f, ",\"%s\":%" PRIu64, k, v);
    else fprintf(f, ",\"%s\":null", k);
}

static void num(FILE *f, const char *k, double v) {
    if (isnan(v)) fprintf(f, ",\"%s\":null", k);
    else fprintf(f, ",\"%s\":%.6f", k, v);
}

/* --budget auto: the size and depth the planner chose, and the round's predicted and
 * realised tokens per second (null where not predicted). */
static void plan_fields(FILE *f, const RoundInfo *r) {
    if (r->plan_k < 0 && r->plan_depth == 0) return;
    fprintf(f, ",\"budget_chosen\":%d,\"depth_asked\":%d", r->plan_k < 0 ? 0 : r->plan_k,
            r->plan_depth);
    num(f, "pred_tok_s", r->plan_ns > 0 ? r->plan_tokens / r->plan_ns * 1e9 : NAN);
    uint64_t ns = r->t_commit - r->t_round_start;
    num(f, "real_tok_s", ns ? (double)r->emitted / (double)ns * 1e9 : NAN);
}

void roundlog_write(FILE *f, const RoundLogCtx *c, const RoundInfo *r) {
    fprintf(f, "{\"decoder\":\"%s\",\"temp\":%d", c->decoder, c->temp);
    if (c->budget > 0) fprintf(f, ",\"budget\":%d", c->budget);
    else fprintf(f, ",\"budget\":\"auto\"");
    fprintf(f, ",\"prompt_id\":%" PRIu64 ",\"round\":%d,\"emitted\":%d,\"dropped\":%d,"
               "\"accepted\":%d,\"tree_size\":%d",
            c->prompt_id, r->round, r->emitted, r->dropped, r->accepted, r->tree_size);
    plan_fields(f, r);
    if (c->sampling)
        fprintf(f, ",\"sampling\":{\"temperature\":%.15g,\"top_k\":%d,\"top_p\":%.15g,"
                   "\"min_p\":%.15g}",
                c->sampling->temperature, c->sampling->top_k, c->sampling->top_p,
                c->sampling->min_p);
    if (r->x1_in_pool < 0) fprintf(f, ",\"x1_in_pool\":null");
    else fprintf(f, ",\"x1_in_pool\":%s", r->x1_in_pool ? "true" : "false");
    num(f, "tau", r->tau);
    num(f, "root_margin", r->root_margin);
    fprintf(f, ",\"tree_pass_skipped\":%s,\"fallback_ar\":%s", r->tree_pass_skipped ? "true" : "false",
            r->fallback_ar ? "true" : "false");
    ts(f, "t_round_start", r->t_round_start);
    ts(f, "t_grow_sent", r->t_grow_sent);
    ts(f, "t_root_start", r->t_root_start);
    ts(f, "t_root_end", r->t_root_end);
    ts(f, "t_pool_recv", r->t_pool_recv);
    ts(f, "t_select_done", r->t_select_done);
    ts(f, "t_tree_start", r->t_tree_start);
    ts(f, "t_tree_end", r->t_tree_end);
    ts(f, "t_commit", r->t_commit);
    fprintf(f, ",\"measure_ns\":%" PRIu64, r->measure_ns);
    if (r->draft_ns) fprintf(f, ",\"draft_ns\":%" PRIu64, r->draft_ns);
    else fprintf(f, ",\"draft_ns\":null");
    if (r->draft_ns) fprintf(f, ",\"draft_commit_ns\":%" PRIu64, r->draft_commit_ns);
    else fprintf(f, ",\"draft_commit_ns\":null");
    /* null, not 0, when the drafter does not report them (a remote drafter, eagle3) */
    if (r->draft_rows) fprintf(f, ",\"draft_host_ns\":%" PRIu64, r->draft_host_ns);
    else fprintf(f, ",\"draft_host_ns\":null");
    fprintf(f, ",\"draft_rows\":%d", r->draft_rows);
    fprintf(f, ",\"graph_replays\":%" PRIu64 ",\"eager_launches\":%" PRIu64, r->graph_replays,
            r->eager_launches);
    fprintf(f, ",\"d2h_full_rows\":%" PRIu64, r->d2h_full_rows);
    if (r->have_tau_rule) {
        fprintf(f, ",\"tau_rule\":{");
        int first = 1;
        for (int k = RULE_DRAFT; k <= RULE_ORACLE; k++) {
            if (isnan(r->tau_rule[k])) continue;
            fprintf(f, "%s\"%s\":%.6f", first ? "" : ",", rule_name((Rule)k), r->tau_rule[k]);
            first = 0;
        }
        fprintf(f, "},\"tree_size_rule\":{");
        first = 1;
        for (int k = RULE_DRAFT; k <= RULE_ORACLE; k++) {
            fprintf(f, "%s\"%s\":%d", first ? "" : ",", rule_name((Rule)k), r->tree_size_rule[k]);
            first = 0;
        }
        fprintf(f, "}");
    }
    fprintf(f, ",\"tokens\":[");
    for (int i = 0; i < r->emitted; i++) fprintf(f, "%s%d", i ? "," : "", r->tokens[i]);
    fprintf(f, "]}\n");
    fflush(f);
}
