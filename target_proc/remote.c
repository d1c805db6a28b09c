/* Remote drafter client: placeholder until the two-process pipeline lands. */
#include "remote.h"

int remote_client_open(DraftClient *c, const char *endpoint, const Model *target,
                       const Tokenizer *tok, int timeout_ms, int insecure, const char *curve_dir,
                       RsErr *e) {
    return rs_err(e, RS_EUNSUPPORTED, "--draft-endpoint '%s': remote drafters are not built yet",
                  endpoint);
}

void remote_client_close(DraftClient *c) { (void)c; }
