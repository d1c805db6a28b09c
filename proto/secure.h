/* Endpoint policy and ZeroMQ CURVE set-up for tcp:// links between the processes.
 * ipc:// stays local and needs nothing (inproc:// is refused: the peers are two
 * processes). tcp:// needs CURVE keys (a key directory made by `rootspec-draft --gen-keys
 * DIR`) unless the user passes --insecure.
 * Key directory: server.key / server.pub (drafter), client.key / client.pub (target),
 * each one Z85 line. The drafter admits only the client key found in its directory (ZAP). */
#ifndef ROOTSPEC_SECURE_H
#define ROOTSPEC_SECURE_H
#include "common/util.h"

/* RS_EINVAL for an unknown scheme, or tcp:// with neither curve_dir nor insecure. */
int secure_check_endpoint(const char *endpoint, int insecure, const char *curve_dir, RsErr *e);
int secure_gen_keys(const char *dir, RsErr *e);
/* Server side: CURVE server keys + a ZAP handler thread admitting client.pub.
 * `ctx` is the ZeroMQ context of `sock`. */
int secure_server_setup(void *ctx, void *sock, const char *dir, RsErr *e);
int secure_client_setup(void *sock, const char *dir, RsErr *e);
/* Call after zmq_ctx_shutdown(ctx) and before zmq_ctx_term(ctx). */
void secure_server_shutdown(void);

#endif
