/* The block tables of the CUDA backend's paged KV cache (kernels/backend.h: Sequences), kept
 * on the host: sequences, their blocks of CUK_KV_BLOCK entries and the free list. The
 * same bookkeeping as the CPU backend's (kernels/cpu/cpu_backend.c), without its prefix
 * cache; what the device sees of it is staged per call (cuda_kernels.h: CuPaged). */
#ifndef ROOTSPEC_CUDA_PAGES_H
#define ROOTSPEC_CUDA_PAGES_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int open;
    int nc, np;   /* committed and pending entries */
    int n_blocks;
    int *blocks;  /* (blocks_total) the block table */
} CuSeq;

typedef struct {
    int n_seqs, blocks_total, n_free;
    int *free_blocks; /* (blocks_total) a stack: the lowest ids go first */
    CuSeq *seqs;      /* (n_seqs); seqs[0] is always open */
} CuPages;

/* n_seqs sequences (sequence 0 open) over the blocks of `entries` cache entries. */
void cu_pages_init(CuPages *p, int n_seqs, int entries);
void cu_pages_free(CuPages *p);
/* Blocks sequence seq lacks to hold `entries` entries. */
int cu_pages_short(const CuPages *p, int seq, int entries);
/* Takes the blocks seq lacks for `entries` entries (the caller checked they are free). */
void cu_pages_grow(CuPages *p, int seq, int entries);
/* Gives back seq's blocks past its first `entries` entries. */
void cu_pages_shrink(CuPages *p, int seq, int entries);
/* Cache slot of entry i of seq (i within its blocks). */
int cu_pages_slot(const CuPages *p, int seq, int i);
/* Opens a closed sequence: its id, or -1 when all are open. */
int cu_pages_open(CuPages *p);
/* Gives back every block of seq and closes it (sequence 0 stays open, empty). */
void cu_pages_close(CuPages *p, int seq);
/* Blocks the open sequences hold. */
int cu_pages_used(const CuPages *p);

#ifdef __cplusplus
}
#endif
#endif
