/* The per-round JSONL log written by --log-rounds (one object per line, flushed per line
 * so an interrupted run keeps every completed round). */
#ifndef ROOTSPEC_ROUNDLOG_H
#define ROOTSPEC_ROUNDLOG_H
#include "decode.h"
#include <stdio.h>

typedef struct {
    const char *decoder;
    int temp, budget; /* temp: 0 greedy, 1 sampling (sampling_temp); budget 0: auto */
    uint64_t prompt_id;
    const Sampling *sampling; /* the law in full, written as "sampling"; NULL: left out */
} RoundLogCtx;

void roundlog_write(FILE *f, const RoundLogCtx *c, const RoundInfo *r);

#endif
