/* The target side of a decode: plain autoregressive decoding and the speculative round
 * (root pass, selection, one tree-masked pass, exhaustive target sampling, KV compaction)
 * against any Drafter (draft_proc/drafter.h: in-process, threaded or over ZeroMQ). */
#ifndef ROOTSPEC_DECODE_H
#define ROOTSPEC_DECODE_H
#include "common/pool.h"
#include "draft_proc/drafter.h"
#include "kernels/backend.h"
#include "planner.h"
#include "select.h"
#include "target.h"

typedef struct {
    DecoderKind decoder;
    int budget;        /* B, 1..TREE_MAX; with a planner the most it may pick */
    Planner *planner;  /* --budget auto: the cost-aware budget (planner.h) picks each round
                          whether to ask the drafter, the pool depth and the tree size;
                          NULL: every round verifies the rule's B-node tree */
    Sampling sampling; /* the law of every target draw (common/logits.h); zeroed: greedy */
    uint64_t seed;
    uint64_t prompt_id;
    int max_new;       /* >= 1: the output's cap; a round's tokens past it are dropped (the
                          decode ends with that round) */
    int ignore_eos;    /* benchmarks: decode past end-of-sequence tokens, so every decode
                          emits max_new tokens and decoders compare on equal lengths */
    int score_all;     /* offline scoring (root-pass rules): the tree pass also covers every
                          expanded pool node, so each rule's tree and the oracle's get a tau */
    int pool_depth, pool_width; /* --pool-shape: the pool's depth (1..POOL_MAX_DEPTH) and
                                   nodes expanded a level (1..POOL_EXPAND); 0: the
                                   planner's choice, or the full 8 and 10 without one */
    int test_wrong_x1; /* tests only: draw X1 from the drafter's first level instead of
                          p0 (a deliberately wrong verifier that must fail exactness) */
} DecodeOpts;

#define ROUND_MAX_EMIT (TREE_MAX + 2)
/* Nodes of one tree pass (target.h). */
#define DECODE_PASS_MAX TARGET_PASS_MAX
/* KV entries a round may hold beyond the committed ones (the root and the pass), for any
 * options: what decode_round_reserve() returns at most. */
#define DECODE_ROUND_RESERVE (DECODE_PASS_MAX + 1)

typedef struct {
    int round;
    int emitted, accepted, tree_size; /* emitted: what the round verified (accepted + the
                                         continuation), dropped ones included */
    int dropped; /* of emitted, the last ones the output does not take: past --max-new or
                    after the first EOS (the decode ends with this round) */
    int x1_in_pool;        /* -1: rule has no X1 */
    int tree_pass_skipped; /* root rule, X1 off the tree */
    double tau;            /* expected acceptance of the verified tree (pearl, rootdraw,
                              root: given the round's X1); NAN if unknown */
    /* root pass ran: its best logit minus the runner-up (a small margin means a greedy
     * choice that last-bit differences between batch shapes may flip); NAN otherwise */
    double root_margin;
    int have_tau_rule;
    double tau_rule[DECODER_COUNT]; /* with score_all: tau of each rule's tree, the oracle's
                                    included (NAN: n/a); pearl/rootdraw given X1 */
    int tree_size_rule[DECODER_COUNT];
    /* monotonic ns, target process clock; 0 where the decoder has no such phase */
    uint64_t t_round_start, t_grow_sent, t_root_start, t_root_end, t_pool_recv,
        t_select_done, t_tree_start, t_tree_end, t_commit;
    /* ns this round spent measuring (tau, root_margin), kept off the decode's clock: the
     * timestamps and the decode's time are what decoding alone would take */
    uint64_t measure_ns;
    uint64_t draft_ns; /* drafter's own time from its pool */
    uint64_t draft_commit_ns; /* of which its commit pass */
    uint64_t draft_host_ns; /* of which host-side work outside its backend (Pool.draft_host_ns) */
    int draft_rows;         /* logits rows the drafter reduced (0: it does not say) */
    int fallback_ar;   /* this round ran autoregressively because the drafter failed */
    /* --budget auto: the tree size chosen (-1 without a planner), the pool depth asked
     * (0: the drafter was not asked, an AR step) and the predicted tokens and ns of the
     * round (NAN when not predicted) */
    int plan_k, plan_depth, plan_width; /* plan_width: the pool width asked (0: not asked) */
    double plan_tokens, plan_ns;
    uint64_t graph_replays, eager_launches; /* backend counters, cumulative */
    uint64_t d2h_full_rows; /* target backend: whole logits rows copied to the host,
                               cumulative (0: every row stayed where it was computed) */
    int walk_queries; /* backend_rows_stats calls of the walk down the tree: 1 where the
                         backend batches its row queries, else one per draw */
    int tokens[ROUND_MAX_EMIT];
} RoundInfo;

typedef struct {
    void (*on_tokens)(void *user, const int *tokens, int n); /* streaming, before EOS */
    void (*on_round)(void *user, const RoundInfo *r);
    void (*on_event)(void *user, const char *event, const char *detail);
    void *user;
    /* NULL or checked before each round: nonzero ends the decode there (a server's client
     * went away or a stop string matched); the tokens emitted so far stay in the result */
    int (*should_stop)(void *user);
    /* NULL or called once a round with the target logits rows the round's output tokens
     * were drawn from (rows[i]: tokens[i]'s, vocab floats on the host; the tokens on_tokens
     * gets): a server's log-probabilities. Valid during the call only. Setting it copies
     * those rows to the host each round, which a decode otherwise never does. */
    void (*on_rows)(void *user, const float *const *rows, const int *tokens, int n, int vocab);
    /* NULL or called during the prefill with the prompt's own rows (a server's echo): rows
     * (n, vocab) follow prompt tokens first..first+n-1, so row i predicts prompt token
     * first+i+1; tokens 1..n_prompt-1 are covered, in order. Setting it prefills without
     * the prefix cache and copies every prompt row to the host. */
    void (*on_prompt_rows)(void *user, const float *rows, int first, int n, int vocab);
} DecodeHooks;

typedef struct {
    int *tokens;   // (cap) emitted tokens, caller-owned storage
    int cap;
    int n_tokens;  /* emitted up to and including the first EOS, at most max_new and cap;
                      speeds count these */
    int hit_eos;
    int hit_capacity; /* stopped because the KV cache is full (reported, never silent) */
    int rounds;
    long accepted_total;
    double tau_total;
    uint64_t t_start, t_end; /* prefill start, last commit */
    uint64_t t_prefilled;    /* prefill end: what follows is decoding */
    int drafter_failed;
    int stopped; /* DecodeHooks.should_stop ended the decode */
    int prompt_cached; /* prompt entries the prefix cache supplied (target_prefill) */
} DecodeResult;

/* KV entries decode_run keeps free for one round with these options (checked before the
 * prefill and before every round): 1 for AR, 1 + B for a tree, more for score_all. */
int decode_round_reserve(const DecodeOpts *opts);

/* Runs one decode. drafter may be NULL for DECODER_AR. On a drafter failure mid-decode the
 * target finishes autoregressively, keeps every emitted token, and reports the event. */
int decode_run(Target *t, Drafter *d, const int *prompt, int n_prompt,
               const DecodeOpts *opts, const DecodeHooks *h, DecodeResult *res, RsErr *e);

#endif
