/* The x4 layout's repack (common/quant.h: four rows interleaved): the CPU backend's load
 * rewrites the resident matrices its kernel family has x4 tiles for, once, in place.
 * The x86 families' register tiles read it; the portable families unpack a row when they
 * meet one. */
#ifndef ROOTSPEC_X4_PACK_H
#define ROOTSPEC_X4_PACK_H
#include "common/model.h"

/* Rewrites the resident matrices of the types `want` accepts (ctx passed through) into
 * the x4 layout in place (QTensor.packed; logical row order, perm_hd 0), bytes and sizes
 * unchanged: the CPU kernels then stream one region per four rows (backend_model_load,
 * through BackendOps.prepare_weights). A matrix whose row count or GGUF head size is not a
 * multiple of 4, or without x4 layout, stays as it is; a tied head follows its embeddings.
 * No-op unless the model is resident (model_make_resident); call before making views.
 * Returns the number of matrices packed. */
int model_pack_x4(Model *m, int (*want)(uint32_t type, const void *ctx), const void *ctx);

/* t (in memory the caller may rewrite) into the x4 layout in place, as model_pack_x4
 * does: 1, or 0 when t has no x4 layout, is packed already or its rows (or GGUF head size)
 * are not a multiple of 4. */
int qtensor_pack_x4(QTensor *w);

#endif
