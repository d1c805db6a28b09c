/* rootspec-target: decodes one prompt with the target model, autoregressively or with a
 * speculative decoder, streaming text to stdout and a summary to stderr. */
#include "common/cli.h"
#include "engine_cli.h"
#include "roundlog.h"
#include "timing.h"
#include "common/prompts.h"
#include "common/eagle3.h"
#include "proto/proto.h"
#include <errno.h>
#include <inttypes.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-target --model PATH (--prompt TEXT | --prompt-ids 1,2,3 | --prompts FILE) [options]\n"
            "\n"
            "  --prompt TEXT         user prompt (UTF-8)\n"
            "  --prompt-ids LIST     prompt as comma-separated token ids (no template, no BOS)\n"
            "  --prompts FILE        decode every prompt of a jsonl file (Spec-Bench or HumanEval\n"
            "                        format) and print a per-round timing summary at the end\n"
            "  --timing              print the per-round timing summary (also for one prompt)\n"
            "  --chat                wrap the prompt in the model's chat template\n"
            "  --max-new N           output at most N new tokens (default 256)\n"
            "  --log-rounds FILE     append one JSON object per round to FILE\n"
            "  --score-all-rules     offline scoring: each round's tree pass also covers the 70\n"
            "                        expanded pool nodes, so the round log gets the expected\n"
            "                        acceptance (tau) of every rule's tree and of the oracle's,\n"
            "                        and the run ends with their means (slower: not for timing)\n"
            "  --output-ids          print emitted token ids instead of text\n"
            "  --prompt-id N         prompt id for the log and the seed stream (default 0)\n"
            "  -h, --help            this text\n"
            "\n"
            "Engine and decoder:\n");
    engine_cli_usage(f);
    fprintf(f, "\nExit status: 0 ok, 1 runtime failure, 2 bad usage or input.\n");
}

typedef struct {
    const Tokenizer *tok;
    int output_ids;
    FILE *log;
    RoundLog lc;
    char prompt_id[PROMPT_ID_MAX]; /* the log's: the file's id, or --prompt-id */
    TimingAcc *timing;
    int first_id;
    long n_scored;               /* --score-all-rules: rounds with a tau per rule */
    int taken_over;              /* the drafter reported our session taken over */
    double tau_sum[DECODER_COUNT];
} Sink;

static void on_tokens(void *u, const int *t, int n) {
    Sink *s = u;
    for (int i = 0; i < n; i++) {
        if (s->output_ids) {
            printf("%s%d", s->first_id ? "" : " ", t[i]);
            s->first_id = 0;
        } else {
            size_t k;
            const char *b = tokenizer_token_text(s->tok, t[i], &k);
            fwrite(b, 1, k, stdout);
        }
    }
    fflush(stdout);
}

static void on_round(void *u, const RoundInfo *r) {
    Sink *s = u;
    if (s->log) roundlog_write(s->log, &s->lc, r); /* a failure shows in finish's ferror */
    if (s->timing) timing_add(s->timing, r);
    if (r->have_tau_rule) {
        s->n_scored++;
        for (int k = DECODER_DRAFT; k <= DECODER_ORACLE; k++) s->tau_sum[k] += r->tau_rule[k];
    }
}

/* --score-all-rules: mean tau of each rule's tree over the scored rounds. Pearl's and
 * rootdraw's are taken given X1, which counts 1 (DESIGN.md §3), so they are compared with each
 * other (the paper's offline comparison); draft's, root's and the oracle's start at the
 * root row, so the oracle bounds those two. */
static void scores_print(FILE *f, const Sink *s) {
    if (!s->n_scored) return;
    double n = (double)s->n_scored;
    const double *m = s->tau_sum;
    fprintf(f,
            "rootspec-target: offline expected acceptance, mean tau over %ld rounds: given X1: "
            "pearl %.3f rootdraw %.3f",
            s->n_scored, m[DECODER_PEARL] / n, m[DECODER_ROOTDRAW] / n);
    if (m[DECODER_PEARL] > 0) fprintf(f, " (rootdraw %+.1f%%)", 100.0 * (m[DECODER_ROOTDRAW] / m[DECODER_PEARL] - 1));
    fprintf(f, "; from the root: draft %.3f root %.3f oracle %.3f\n", m[DECODER_DRAFT] / n,
            m[DECODER_ROOT] / n, m[DECODER_ORACLE] / n);
}

static void on_event(void *u, const char *ev, const char *detail) {
    Sink *s = u;
    if (strstr(detail, PROTO_TAKEN_OVER)) s->taken_over = 1;
    fprintf(stderr, "rootspec-target: %s: %s\n", ev, detail);
}

static int parse_ids(const char *s, int **ids, int *n, RsErr *e) {
    int cap = 16, k = 0;
    int *a = rs_xmalloc(sizeof(int) * cap);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff) {
            free(a);
            return rs_err(e, RS_EINVAL, "--prompt-ids: bad token id at '%s'", p);
        }
        if (k == cap) a = realloc(a, sizeof(int) * (cap *= 2));
        a[k++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            free(a);
            return rs_err(e, RS_EINVAL, "--prompt-ids: unexpected '%c' in '%s'", *p, s);
        }
    }
    *ids = a;
    *n = k;
    return RS_OK;
}

/* Everything the command line says; parsed before anything is opened. */
typedef struct {
    EngineOpts eo;
    CliRuntime rt; /* copied into eo once parsed */
    DecodeOpts opts;
    const char *prompt, *prompt_ids, *log_path, *prompts_path;
    int chat, output_ids, want_timing;
} Args;

/* Parse the options; returns -1 to go on, else the exit status (0 for --help, 2 for bad
 * usage), so main's exit codes stay in one place per outcome. */
static int parse_args(int argc, char **argv, Args *A) {
    EngineOpts *eo = &A->eo;
    DecodeOpts *opts = &A->opts;
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
        } else if ((rc = engine_cli_option(argc, argv, &i, eo, opts, &e)) != 0) {
            if (rc == 1) rc = 0;
        } else if (!strcmp(a, "--prompt")) { if (VAL()) A->prompt = v; }
        else if (!strcmp(a, "--prompt-ids")) { if (VAL()) A->prompt_ids = v; }
        else if (!strcmp(a, "--prompts")) { if (VAL()) A->prompts_path = v; }
        else if (!strcmp(a, "--timing")) A->want_timing = 1;
        else if (!strcmp(a, "--chat")) A->chat = 1;
        else if (!strcmp(a, "--prompt-id")) { if (VAL()) rc = cli_u64(a, v, &opts->prompt_id, &e); }
        else if (!strcmp(a, "--max-new")) { if (VAL()) rc = cli_int(a, v, 1, 1 << 20, &opts->max_new, &e); }
        else if (!strcmp(a, "--log-rounds")) { if (VAL()) A->log_path = v; }
        else if (!strcmp(a, "--score-all-rules")) opts->score_all = 1;
        else if (!strcmp(a, "--output-ids")) A->output_ids = 1;
        else rc = rs_err(&e, RS_EINVAL, "unknown option '%s' (see --help)", a);
#undef VAL
        if (rc) {
            fprintf(stderr, "rootspec-target: %s\n", e.msg);
            return 2;
        }
    }
    if (engine_cli_runtime(eo, &A->rt, &e)) {
        fprintf(stderr, "rootspec-target: %s\n", e.msg);
        return 2;
    }
    return -1;
}

/* Options that parse alone but contradict each other: refused (exit 2) before the models load,
 * which takes seconds. Returns -1 to go on. */
static int check_args(Args *A) {
    const EngineOpts *eo = &A->eo;
    if (!eo->model_path || (!!A->prompt + !!A->prompt_ids + !!A->prompts_path) != 1) {
        fprintf(stderr, "rootspec-target: need --model and exactly one of --prompt / --prompt-ids / --prompts\n");
        usage(stderr);
        return 2;
    }
    RsErr e = {0};
    if (engine_cli_check(eo, &A->opts, &e)) {
        fprintf(stderr, "rootspec-target: %s\n", e.msg);
        return 2;
    }
    if (A->opts.score_all && A->opts.budget == 0) {
        fprintf(stderr, "rootspec-target: --score-all-rules needs a fixed --budget, not auto\n");
        return 2;
    }
    if (A->opts.score_all && !decoder_needs_root_pass(A->opts.decoder)) {
        fprintf(stderr, "rootspec-target: --score-all-rules needs --decoder pearl, rootdraw or root\n");
        return 2;
    }
    return -1;
}

/* Totals over all prompts, for the --prompts summary line. */
typedef struct {
    int n_prompts;
    long tokens;
    uint64_t ns;
    uint64_t ns_decode; /* of which after each prompt's prefill */
} Totals;

/* One prompt's summary line on stderr: what ran, how fast, and why it stopped. */
static void print_prompt_summary(const DecodeOpts *opts, int n, const DecodeResult *res,
                                 const Sink *s, const Engine *en) {
    double secs = (double)(res->t_end - res->t_start) * 1e-9;
    char budget[16] = "auto", smp[SAMPLING_STR];
    if (!opts->planner) snprintf(budget, sizeof budget, "%d", opts->budget);
    fprintf(stderr,
            "rootspec-target: decoder=%s sampling=%s B=%s prompt=%d tokens, emitted %d tokens "
            "in %d rounds, %.3f s, %.2f tok/s, mean accepted %.3f%s%s%s%s%s\n",
            decoder_name(opts->decoder), sampling_str(&opts->sampling, smp, sizeof smp), budget, n,
            res->n_tokens, res->rounds, secs,
            secs > 0 ? res->n_tokens / secs : 0.0,
            res->rounds ? (double)res->accepted_total / res->rounds : 0.0,
            res->hit_eos ? ", stopped at EOS" : "",
            res->hit_capacity ? ", STOPPED: KV cache full (raise --ctx)" : "",
            res->drafter_failed ? ", drafter failed (finished autoregressively)" : "",
            s->taken_over ? ", SESSION TAKEN OVER by another client of the drafter" : "",
            en->drafter_missing[0] ? ", no drafter (decoded autoregressively)" : "");
}

/* The round log's view of the next decode: the prompt file's id (NULL: --prompt-id),
 * the decoder, T and B as the bench writes them, and the backend counters now. */
static void log_begin(Sink *s, const char *file_id, const DecodeOpts *opts, const Sampling *law,
                      Engine *en) {
    if (file_id) snprintf(s->prompt_id, sizeof s->prompt_id, "%s", file_id);
    else snprintf(s->prompt_id, sizeof s->prompt_id, "%" PRIu64, opts->prompt_id);
    s->lc = (RoundLog){.decoder = decoder_name(opts->decoder), .temp = sampling_temp(&opts->sampling),
                       .budget = opts->decoder == DECODER_AR ? 0
                                 : opts->planner       ? ROUNDLOG_BUDGET_AUTO
                                                     : opts->budget,
                       .prompt_id = s->prompt_id, .sampling = law};
    BackendStats st = backend_stats(target_backend(en->target));
    roundlog_begin(&s->lc, &st);
}

/* Decode each prompt in turn (one, or every line of --prompts), streaming through the sink;
 * stops at the first failure. Returns the exit status so far. */
static int decode_prompts(const Args *A, Engine *en, const PromptSet *ps, Sink *s, Totals *t) {
    RsErr e = {0};
    DecodeHooks h = {on_tokens, on_round, on_event, s, NULL, NULL, NULL};
    DecodeResult res = {0};
    res.cap = A->opts.max_new + ROUND_MAX_EMIT;
    res.tokens = rs_xmalloc(sizeof(int) * (size_t)res.cap);
    int exit_code = 0;
    t->n_prompts = ps ? ps->n : 1;
    for (int pi = 0; pi < t->n_prompts; pi++) {
        int *ids = NULL, n = 0;
        const char *text = ps ? ps->items[pi].text : A->prompt;
        DecodeOpts opts = A->opts;
        if (ps) opts.prompt_id = A->opts.prompt_id + (uint64_t)pi;
        if (opts.budget == 0) opts.planner = en->planner, opts.budget = TREE_MAX;
        int rc = A->prompt_ids ? parse_ids(A->prompt_ids, &ids, &n, &e)
                               : engine_prompt_ids(en, text, A->chat || (ps && en->chat != CHAT_NONE),
                                                   &ids, &n, &e);
        if (rc) {
            fprintf(stderr, "rootspec-target: %s\n", e.msg);
            exit_code = 2;
            break;
        }
        if (ps) printf("=== prompt %s: %s\n", ps->items[pi].id, text);
        log_begin(s, ps ? ps->items[pi].id : NULL, &opts, &A->opts.sampling, en);
        s->first_id = 1;
        rc = decode_run(en->target, en->drafter, ids, n, &opts, &h, &res, &e);
        free(ids);
        printf("\n");
        fflush(stdout);
        if (rc) {
            fprintf(stderr, "rootspec-target: %s\n", e.msg);
            exit_code = rc == RS_EINVAL ? 2 : 1;
            break;
        }
        t->tokens += res.n_tokens;
        t->ns += res.t_end - res.t_start;
        t->ns_decode += res.t_end - res.t_prefilled;
        print_prompt_summary(&opts, n, &res, s, en);
        s->taken_over = 0;
    }
    free(res.tokens);
    return exit_code;
}

/* The run's summaries, then the checks that our output really got written: output that
 * could not be written is lost output, so it fails the run. Returns the final exit status. */
static int finish(const Args *A, const PromptSet *ps, Sink *s, TimingAcc *timing,
                  const Totals *t, int exit_code) {
    if (s->timing && exit_code == 0) {
        if (ps)
            fprintf(stderr, "rootspec-target: %d prompts, %ld tokens in %.3f s: %.2f tok/s\n",
                    t->n_prompts, t->tokens, t->ns * 1e-9,
                    t->ns ? t->tokens / (t->ns * 1e-9) : 0.0);
        if (ps)
            fprintf(stderr, "rootspec-target: after the prompts' prefill: %ld tokens in %.3f s: "
                    "%.2f tok/s\n", t->tokens, t->ns_decode * 1e-9,
                    t->ns_decode ? t->tokens / (t->ns_decode * 1e-9) : 0.0);
        timing_print(stderr, timing);
    }
    if (exit_code == 0) scores_print(stderr, s);
    if (s->log && (ferror(s->log) | fclose(s->log))) {
        fprintf(stderr, "rootspec-target: writing --log-rounds '%s' failed\n", A->log_path);
        if (!exit_code) exit_code = 1;
    }
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "rootspec-target: writing the output to stdout failed\n");
        if (!exit_code) exit_code = 1;
    }
    return exit_code;
}

int main(int argc, char **argv) {
    Args A = {.eo = {.draft_timeout_ms = 10000}, .rt = cli_runtime_defaults(),
              .opts = {.decoder = DECODER_AR, .budget = 59, .seed = 1, .max_new = 256}};
    int rc = parse_args(argc, argv, &A);
    if (rc < 0) rc = check_args(&A);
    if (rc >= 0) return rc;
    RsErr e = {0};
    PromptSet *ps = NULL;
    if (A.prompts_path && prompts_load(A.prompts_path, &ps, &e)) {
        fprintf(stderr, "rootspec-target: %s\n", e.msg);
        return 2;
    }
    Engine *en = NULL;
    rc = engine_cli_open("rootspec-target", &A.eo, &A.opts, &en);
    if (rc >= 0) {
        prompts_destroy(&ps);
        return rc;
    }
    TimingAcc *timing = NULL;
    timing_create(&timing);
    Sink s = {.tok = en->tok, .output_ids = A.output_ids || !en->tok, .first_id = 1};
    if (A.want_timing || A.prompts_path) s.timing = timing;
    if (A.log_path) {
        s.log = fopen(A.log_path, "a");
        if (!s.log) {
            fprintf(stderr, "rootspec-target: cannot open --log-rounds '%s': %s\n", A.log_path,
                    strerror(errno));
            engine_destroy(&en);
            prompts_destroy(&ps);
            return 2;
        }
    }
    Totals t = {0};
    int exit_code = decode_prompts(&A, en, ps, &s, &t);
    exit_code = finish(&A, ps, &s, timing, &t, exit_code);
    timing_destroy(&timing);
    prompts_destroy(&ps);
    engine_destroy(&en);
    return exit_code;
}
