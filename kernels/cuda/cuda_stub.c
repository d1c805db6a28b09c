/* CPU-only builds link this instead of kernels/cuda/cuda_backend.cu: there is no CUDA backend,
 * so callers that ask for one get NULL and can report "built without CUDA". The CUDA
 * build (kernels/cuda/cuda.mk) leaves this object out and links the real one. */
#include "kernels/backend.h"
#include "kernels/eagle3_layer.h"

const BackendOps *cuda_backend_ops_get(void) { return NULL; }
