/* Loader plumbing shared by the GGUF and Hugging Face parsers (gguf.c, hf.c): the list of
 * weights a Config needs, with both naming schemes and the shapes to check (vectors laid
 * out in one f32 arena, matrices described by a QTensor the parser points at the file's
 * bytes); config sanity checks; and the model fingerprint. */
#ifndef ROOTSPEC_LOADER_H
#define ROOTSPEC_LOADER_H
#include "model.h"

typedef struct {
    char hf_name[96];   /* model.layers.3.self_attn.q_proj.weight */
    char gguf_name[96]; /* blk.3.attn_q.weight */
    float **slot;       /* vectors: where the weight's arena pointer goes (inside m->w) */
    QTensor *qt;        /* matrices: the descriptor to fill (inside m->w); else NULL */
    int64_t rows, cols; /* (out, in) for matrices; cols == 0 for vectors of `rows` */
    int perm_heads;     /* GGUF llama q/k rows to un-permute: head count, else 0 */
} WeightReq;

/* Checks cfg for values no model has (zero/negative sizes, heads not dividing, absurd
 * sizes that would overflow the arena). `src` names the file for the message. */
int loader_check_config(const Config *c, const char *src, RsErr *e);

/* Allocates m->w.layers and m->arena (the vectors) for m->cfg and returns the weight list
 * (*reqs malloc'd, caller frees). Every vector slot already points into the arena; each
 * matrix's qt has rows/cols set and waits for its type and data. */
int loader_plan(Model *m, WeightReq **reqs, int *n, RsErr *e);

/* Running 64-bit FNV-1a used for the fingerprint. */
uint64_t loader_fnv(uint64_t h, const void *p, size_t n);
/* Hashes cfg into h (field by field, so struct padding never matters). */
uint64_t loader_fnv_config(uint64_t h, const Config *c);

#endif
