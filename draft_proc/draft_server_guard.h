/* What the drafter's server accepts from peers it does not know, kept apart from the request
 * loop (server.c): the ipc:// socket path policy, a bound on live connections (idle peers
 * are closed oldest first, so a flood of them cannot exhaust file descriptors and abort
 * libzmq), and the rate-limited report of session takeovers. */
#ifndef ROOTSPEC_DRAFT_SERVER_GUARD_H
#define ROOTSPEC_DRAFT_SERVER_GUARD_H
#include "common/util.h"

typedef struct DraftServerGuard DraftServerGuard;

/* Call before zmq_bind(sock, endpoint): refuses an ipc:// path that exists and is not a
 * socket (RS_EINVAL, naming it), raises RLIMIT_NOFILE to its hard limit, sets the
 * handshake deadline and starts the connection monitor on `sock` (of context `ctx`). */
int draft_server_guard_create(void *ctx, void *sock, const char *endpoint, DraftServerGuard **out,
                        RsErr *e);
/* Call after zmq_bind succeeded: the socket file is ours, removed by draft_server_guard_destroy. */
void draft_server_guard_bound(DraftServerGuard *g);
/* A frame arrived on connection `fd` (zmq_msg_get(msg, ZMQ_SRCFD); < 0 is ignored). */
void draft_server_guard_seen(DraftServerGuard *g, int fd);
/* A HELLO on `fd` started a session; `replaced`: it displaced the session `old_session` of
 * another client. Takeovers are logged at most once a second, with a count of the rest. */
void draft_server_guard_hello(DraftServerGuard *g, int fd, int replaced, uint64_t old_session);
/* ERROR text for a RESET/COMMIT_GROW outside the current session: PROTO_TAKEN_OVER when
 * `session` is one a takeover replaced, so that target learns why. */
const char *draft_server_guard_no_session(const DraftServerGuard *g, uint64_t session);
/* Stops the monitor (before zmq_close of the socket) and removes our ipc socket file. */
void draft_server_guard_destroy(DraftServerGuard **g);

#endif
