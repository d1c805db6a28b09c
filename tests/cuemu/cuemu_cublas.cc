/* cuemu_cublas.cc: the cuBLAS calls rootspec makes, emulated on the CPU with C linkage
 * (handles, stream, workspace, status strings, cublasGemmEx). cublasGemmEx follows the
 * documented column-major semantics in general (op N/T on either side, any ld >= rows,
 * alpha, beta; C not read when beta == 0): bf16 (or f32) inputs are widened to f32 and
 * handed to OpenBLAS sgemm, with f32 output and CUBLAS_COMPUTE_32F*; other type
 * combinations return CUBLAS_STATUS_NOT_SUPPORTED. The call is a queued stream operation
 * (capturable into a graph, like every cuBLAS kernel), and every operand must lie inside
 * one device allocation. */
#include <cublas_v2.h>
#include "cuemu_internal.h"
#include <cblas.h>
#include <stdio.h>
#include <string.h>
#include <vector>

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
};

static cublasStatus_t check_operand(const char *what, const void *p, int rows, int cols, int ld,
                                    size_t elem) {
    if (rows == 0 || cols == 0) return CUBLAS_STATUS_SUCCESS;
    size_t n = ((size_t)(cols - 1) * ld + rows) * elem;
    if (!cuemu_is_device_range(p, n)) {
        fprintf(stderr, "cuemu: cublasGemmEx: %s (%d x %d, ld %d) at %p is not inside one device "
                        "allocation\n", what, rows, cols, ld, p);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Dense f32 copy (ld = rows) of a column-major operand. */
static void widen(const void *p, cudaDataType t, int rows, int cols, int ld, std::vector<float> &out) {
    out.resize((size_t)rows * cols);
    for (int c = 0; c < cols; c++) {
        float *o = out.data() + (size_t)c * rows;
        if (t == CUDA_R_32F) {
            memcpy(o, (const float *)p + (size_t)c * ld, (size_t)rows * 4);
        } else {
            const uint16_t *s = (const uint16_t *)p + (size_t)c * ld;
            for (int r = 0; r < rows; r++) {
                uint32_t u = (uint32_t)s[r] << 16;
                memcpy(&o[r], &u, 4);
            }
        }
    }
}

extern "C" {

/* The emulator stands for the cuBLAS of the headers it is built against. */
cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
    if (!value) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; break;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; break;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *h = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t *s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lk(cuemu_mu);
    if (bytes && !cuemu_is_device_range(ws, bytes)) {
        fprintf(stderr, "cuemu: cublasSetWorkspace: %p + %zu bytes is not device memory\n", ws, bytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    default: return "unknown error";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    int in_ok = (at == CUDA_R_16BF && bt == CUDA_R_16BF) || (at == CUDA_R_32F && bt == CUDA_R_32F);
    int comp_ok = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
                  compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_PEDANTIC;
    if (!in_ok || ct != CUDA_R_32F || !comp_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    size_t esz = at == CUDA_R_32F ? 4 : 2;
    std::lock_guard<std::mutex> lk(cuemu_mu);
    cuemu_init_locked();
    cublasStatus_t st;
    if ((st = check_operand("A", A, ar, ac, lda, esz)) || (st = check_operand("B", B, br, bc, ldb, esz)) ||
        (st = check_operand("C", C, m, n, ldc, 4)))
        return st;
    /* Host pointer mode: alpha and beta are read now, as cuBLAS does. */
    float al = *(const float *)alpha, be = *(const float *)beta;
    auto op = std::make_shared<cuemu_op_t>();
    op->what = "cublasGemmEx";
    op->type = cudaGraphNodeTypeKernel;
    op->run = [=]() {
        /* Reused across calls (ops run under cuemu_mu): fresh 100 MB vectors per GEMM
         * would spend most of the time in page faults. */
        static std::vector<float> Af, Bf;
        if (k > 0) {
            widen(A, at, ar, ac, lda, Af);
            widen(B, bt, br, bc, ldb, Bf);
        }
        float *Cf = (float *)C;
        if (be == 0.0f) /* C is output only: stale NaNs must not leak through 0 * NaN */
            for (int c = 0; c < n; c++) memset(Cf + (size_t)c * ldc, 0, (size_t)m * 4);
        if (k == 0) {
            if (be != 0.0f && be != 1.0f)
                for (int c = 0; c < n; c++)
                    for (int r = 0; r < m; r++) Cf[(size_t)c * ldc + r] *= be;
            return;
        }
        cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, Af.data(), ar,
                    Bf.data(), br, be, Cf, ldc);
    };
    cudaError_t e = cuemu_enqueue(h->stream, op);
    if (e != cudaSuccess) {
        cuemu_set_last_error(e);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
