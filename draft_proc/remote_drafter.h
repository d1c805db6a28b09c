/* The remote kind of Drafter (draft_proc/drafter.h): a rootspec-draft process over ZeroMQ
 * (DESIGN.md §5, proto/PROTOCOL.md). */
#ifndef ROOTSPEC_REMOTE_DRAFTER_H
#define ROOTSPEC_REMOTE_DRAFTER_H
#include "common/model.h"
#include "draft_proc/drafter.h"
#include <stddef.h>

/* Connects and handshakes (HELLO: the target's vocabulary and tokenizer hash must match
 * the drafter's). Borrows `target` (its fingerprint and vocabulary). tcp:// needs CURVE
 * keys in curve_dir unless insecure. Errors: RS_EINVAL for a refused endpoint, RS_EIO,
 * RS_ETIMEOUT, RS_EPEER (refused or mismatched), RS_EPROTO. */
int drafter_remote_create(const char *endpoint, const Model *target, uint64_t tok_hash,
                          int timeout_ms, int insecure, const char *curve_dir, Drafter **out,
                          RsErr *e);

/* Another sequence on d's connection (d must be of this kind): a handle with a sequence id
 * of its own (protocol v4), whose context the drafter keeps apart from the others'; its
 * first reset starts it. Handles may be used from threads of their own; the connection
 * closes with the last one, and each handle's destroy CLOSEs its sequence. RS_EINVAL when
 * d is not remote. */
int drafter_remote_share(Drafter *d, Drafter **out, RsErr *e);

/* Test hook: the feature payload bound at which the remote kind splits a message (RESET /
 * COMMIT_GROW into RESET + APPEND... / APPEND... + COMMIT_GROW); 0 restores
 * PROTO_MAX_FEAT_BYTES. Process-wide. */
void remote_set_feat_chunk_bytes(size_t bytes);

#endif
