/* rootspec-micro's compute roof: how long a pass's matrix products take on one core when
 * their weights are already in cache, so the pass table can say which unit limits a
 * pass: memory (n = 1 near the read stream) or the kernels' arithmetic (many rows). */
#ifndef ROOTSPEC_MICRO_ROOF_H
#define ROOTSPEC_MICRO_ROOF_H
#include "common/model.h"

typedef struct {
    double ms_n1;  /* one row through every matrix of m, weights in cache, one thread */
    double ms_n65; /* 65 rows (16 kernel groups of 4 tokens + 1) */
    double gw_n1, gw_n4; /* weight-token products per ns: one token, a 4-token group */
} MicroRoof;

/* Times each of layer 0's matrices and the head on a slice of its rows that stays in L2
 * (<= 128 KB), for 1 and 4 tokens, with the kernel family the backend picks for `family`
 * (BackendParams.cpu_kernels), and scales each to the model's parameters. Attention is
 * left out (at the bench's 128-token context it is under 1% of the products). */
int micro_compute_roof(const Model *m, const char *family, MicroRoof *out, RsErr *e);
/* The same over any n matrices, matrix i counted uses[i] times (a model's layers). */
int micro_roof_mats(const QTensor *const *mats, const double *uses, int n, const char *family,
                    MicroRoof *out, RsErr *e);

#endif
