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

/* Test hook: the feature payload bound at which the remote kind splits a message (RESET /
 * COMMIT_GROW into RESET + APPEND... / APPEND... + COMMIT_GROW); 0 restores
 * PROTO_MAX_FEAT_BYTES. Process-wide. */
void remote_set_feat_chunk_bytes(size_t bytes);

#endif
