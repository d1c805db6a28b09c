/* DraftClient over ZeroMQ to a rootspec-draft process (SPEC §5). */
#ifndef ROOTSPEC_REMOTE_H
#define ROOTSPEC_REMOTE_H
#include "common/tokenizer.h"
#include "decode.h"

int remote_client_open(DraftClient *c, const char *endpoint, const Model *target,
                       uint64_t tok_hash, int timeout_ms, int insecure, const char *curve_dir,
                       RsErr *e);
void remote_client_close(DraftClient *c);

#endif
