/* The drafter process's request loop: a ZeroMQ ROUTER that serves one target session at a
 * time (a new HELLO takes over and frees every sequence's context), keeps one Drafter per
 * sequence id of the session (a batching target drafts for several sequences; the first is
 * made on the sequence's first message, freed by CLOSE), prefills RESET's prompt, grows
 * pools on COMMIT_GROW, and answers every malformed frame with ERROR instead of crashing or
 * hanging. Between a POOL reply and the next request it lets the sequence's drafter run
 * ahead (drafter_ahead), stopping as soon as a frame arrives. After a failed request of a
 * sequence, its COMMIT_GROW is refused until RESET. */
#ifndef ROOTSPEC_DRAFT_SERVER_H
#define ROOTSPEC_DRAFT_SERVER_H
#include "common/tokenizer.h"
#include "drafter.h"

typedef struct {
    const char *endpoint;
    int insecure;
    const char *curve_dir;
    const char *name;        /* reported in HELLO_OK */
    uint32_t caps;           /* HELLO_OK capability bits beside PROTO_CAP_POOL_V1 (CUDA) */
    int max_requests;        /* > 0: exit after this many requests (tests) */
    int no_ahead;            /* 1: idle between requests instead of running ahead */
    volatile int *stop;      /* set by a signal handler */
    /* More sequences: opens another drafter like `d` (NULL: the session holds one sequence
     * at a time); max_seqs bounds how many the session holds at once (0: 1). */
    int (*open_seq)(void *arg, Drafter **out, RsErr *e);
    void *open_arg;
    int max_seqs;
} DraftServerOpts;

#define DRAFT_SEQS_MAX 4096 /* --max-seqs' bound */

/* Serves `d` (borrowed; any kind; the first sequence's drafter) and the drafters open_seq
 * makes (owned, freed on CLOSE, HELLO and return) until *stop or max_requests; returns RS_OK
 * or a set-up error. tok_hash: the drafter's tokenizer identity, which a target's HELLO must
 * match. */
int draft_server_run(Drafter *d, uint64_t tok_hash, const DraftServerOpts *o, RsErr *e);

#endif
