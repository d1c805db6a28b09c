/* The drafter process's request loop: a ZeroMQ ROUTER that serves any Drafter to one
 * target session at a time (a new HELLO takes over and resets the drafter's context),
 * prefills RESET's prompt, grows pools on COMMIT_GROW, and answers every malformed frame
 * with ERROR instead of crashing or hanging. Between a POOL reply and the next request it
 * lets the drafter run ahead (drafter_ahead), stopping as soon as a frame arrives. After a failed request of the session, COMMIT_GROW is refused until RESET. */
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
} DraftServerOpts;

/* Serves `d` (borrowed; any kind) until *stop or max_requests; returns RS_OK or a set-up
 * error. tok_hash: the drafter's tokenizer identity, which a target's HELLO must match. */
int draft_server_run(Drafter *d, uint64_t tok_hash, const DraftServerOpts *o, RsErr *e);

#endif
