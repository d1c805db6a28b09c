/* The per-round JSONL log written by --log-rounds (one object per line, flushed per line
 * so an interrupted run keeps every completed round). */
#ifndef ROOTSPEC_ROUNDLOG_H
#define ROOTSPEC_ROUNDLOG_H
#include "decode.h"
#include <stdio.h>

typedef struct {
    const char *decoder;
    int temp, budget; /* budget 0: --budget auto */
    uint64_t prompt_id;
} RoundLogCtx;

void roundlog_write(FILE *f, const RoundLogCtx *c, const RoundInfo *r);

#endif
