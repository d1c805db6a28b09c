/* Block tables of the paged KV cache on the host; see cuda_pages.h. */
#include "cuda_pages.h"
#include "cuda_kernels.h"
extern "C" {
#include "common/util.h"
}
#include <stdlib.h>
#include <string.h>

static int blocks_for(int entries) { return (entries + CUK_KV_BLOCK - 1) / CUK_KV_BLOCK; }

extern "C" void cu_pages_init(CuPages *p, int n_seqs, int entries) {
    memset(p, 0, sizeof *p);
    p->n_seqs = n_seqs > 1 ? n_seqs : 1;
    p->blocks_total = blocks_for(entries);
    p->free_blocks = (int *)rs_xcalloc((size_t)p->blocks_total, sizeof(int));
    for (int i = 0; i < p->blocks_total; i++) p->free_blocks[i] = p->blocks_total - 1 - i;
    p->n_free = p->blocks_total;
    p->seqs = (CuSeq *)rs_xcalloc((size_t)p->n_seqs, sizeof(CuSeq));
    for (int i = 0; i < p->n_seqs; i++)
        p->seqs[i].blocks = (int *)rs_xcalloc((size_t)p->blocks_total, sizeof(int));
    p->seqs[0].open = 1;
}

extern "C" void cu_pages_free(CuPages *p) {
    for (int i = 0; p->seqs && i < p->n_seqs; i++) free(p->seqs[i].blocks);
    free(p->seqs);
    free(p->free_blocks);
    memset(p, 0, sizeof *p);
}

extern "C" int cu_pages_short(const CuPages *p, int seq, int entries) {
    int need = blocks_for(entries) - p->seqs[seq].n_blocks;
    return need > 0 ? need : 0;
}

extern "C" void cu_pages_grow(CuPages *p, int seq, int entries) {
    CuSeq *q = &p->seqs[seq];
    for (int k = cu_pages_short(p, seq, entries); k > 0; k--) {
        RS_ASSERT(p->n_free > 0);
        q->blocks[q->n_blocks++] = p->free_blocks[--p->n_free];
    }
}

extern "C" void cu_pages_shrink(CuPages *p, int seq, int entries) {
    CuSeq *q = &p->seqs[seq];
    int keep = blocks_for(entries);
    while (q->n_blocks > keep) p->free_blocks[p->n_free++] = q->blocks[--q->n_blocks];
}

extern "C" int cu_pages_slot(const CuPages *p, int seq, int i) {
    const CuSeq *q = &p->seqs[seq];
    RS_ASSERT(i >= 0 && i / CUK_KV_BLOCK < q->n_blocks);
    return q->blocks[i / CUK_KV_BLOCK] * CUK_KV_BLOCK + i % CUK_KV_BLOCK;
}

extern "C" int cu_pages_open(CuPages *p) {
    for (int i = 1; i < p->n_seqs; i++)
        if (!p->seqs[i].open) {
            CuSeq *q = &p->seqs[i];
            q->open = 1;
            q->nc = q->np = q->n_blocks = 0;
            return i;
        }
    return -1;
}

extern "C" void cu_pages_close(CuPages *p, int seq) {
    CuSeq *q = &p->seqs[seq];
    cu_pages_shrink(p, seq, 0);
    q->nc = q->np = 0;
    q->open = seq == 0;
}

extern "C" int cu_pages_used(const CuPages *p) { return p->blocks_total - p->n_free; }
