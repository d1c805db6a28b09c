/* Extras of the CPU backend beyond kernels/backend.h (kernels/cpu/cpu_backend.c), for
 * benchmarks and tests that report what the backend picked. */
#ifndef ROOTSPEC_CPU_BACKEND_H
#define ROOTSPEC_CPU_BACKEND_H
#include "kernels/backend.h"

/* The CPU backend's kernel family ("avx2", "scalar", "ref", ...; BackendParams.cpu_kernels
 * names one at create()) and thread count. b must be a CPU backend. */
const char *cpu_backend_kernels(const Backend *b);
int cpu_backend_threads(const Backend *b);
/* The element type of its KV caches: "f16" where the family has f16 attention (the x86
 * families), else "f32"; BackendParams.sw.cpu_kv_f32 forces f32 at create(). */
const char *cpu_backend_kv(const Backend *b);

#endif
