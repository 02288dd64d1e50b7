/*
 * gpupool's cuBLAS (docs/remote-gpu.md, "cuBLAS"): a libcublas.so.12 that forwards the cuBLAS API
 * to the GPU server, where NVIDIA's libcublas runs next to the real driver. NVIDIA's cuBLAS cannot
 * run in a client process: it calls the driver's private export tables itself, which the GPU client
 * (client.c, the libcuda.so.1 this library is linked to) cannot forward.
 *
 * Carried: handles (create, destroy, version, property, stream, pointer mode, math mode,
 * workspace), SGEMM, DGEMM, GemmEx, their strided batched forms, SGEMV, DGEMV, SAXPY, SSCAL,
 * SDOT, the status names, and Set/Get Vector/Matrix (here, as the client's copies). The calls that
 * answer nothing to the host (the GEMMs, GEMV, AXPY, SCAL, and SDOT into device memory) are sent
 * without a reply (gpupoolRemoteSend), gathered with launches and copies, as cuBLAS runs them
 * asynchronously on their stream: what cuBLAS would refuse at once (blas_checks.h, the server's own
 * rule; a handle this process did not make) is refused here at once, and what only the server can
 * judge (memory outside the client's allocations) comes back as a CUDA error at the next answered
 * call, as a kernel's fault does. GPUPOOL_REMOTE_BLAS_SYNC=1 sends every call answered (debugging).
 * Every other call is one answered request (gpupoolRemoteCall), so its status is the server's
 * cuBLAS's, or the server's refusal. Host pointer mode: alpha and beta travel by value
 * (their size from the compute type); device pointer mode: their device pointers. The stream,
 * pointer mode and math mode a handle was given are kept here as well, for the Get calls.
 *
 * Every other function of cuBLAS 12's API (cublas_refused.h) returns CUBLAS_STATUS_NOT_SUPPORTED
 * and says so once per function on stderr.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas_checks.h"
#include "protocol.h"

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *cudaStream_t;
typedef struct cublasContext *cublasHandle_t;
typedef int cublasStatus_t;

CUresult cuInit(unsigned int flags);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult gpupoolRemoteCall(uint16_t op, const void *payload, size_t length, void *answer, size_t capacity,
                           size_t *got, int32_t *status);
CUresult gpupoolRemoteSend(uint16_t op, const void *payload, size_t length);

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
};
#define CUDA_ERROR_NOT_INITIALIZED_ 3
#define CUDA_R_32F 0
#define CUDA_R_64F 1
#define STREAM_LEGACY ((cudaStream_t)0x1)
#define STREAM_PER_THREAD ((cudaStream_t)0x2)

/* ------------------------------------------------------------------------- handles, as set here */
#define MAX_HANDLES REMOTE_MAX_BLAS_HANDLES /* as many as the server makes for one client */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle_state {
    uint64_t handle; /* the server's; 0: a free slot */
    cudaStream_t stream;
    int pointer_mode, math_mode;
} handles[MAX_HANDLES];

/* Whether handle is one this process made (and has not destroyed): cuBLAS answers any other
 * CUBLAS_STATUS_NOT_INITIALIZED, which a call sent without a reply must get here. *state: what
 * this process set on it (a copy; defaults for a handle it did not make here). */
static int made_here(cublasHandle_t handle, struct handle_state *state) {
    int found = 0;
    *state = (struct handle_state){(uintptr_t)handle, NULL, 0, 0};
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_HANDLES && !found; i++)
        if ((found = handles[i].handle != 0 && handles[i].handle == (uintptr_t)handle)) *state = handles[i];
    pthread_mutex_unlock(&lock);
    return found;
}

/* What this process set on handle (defaults for a handle it did not make here, which the server
 * then refuses). */
static struct handle_state state_of(cublasHandle_t handle) {
    struct handle_state found;
    made_here(handle, &found);
    return found;
}

static void keep_state(const struct handle_state *state, int drop) {
    pthread_mutex_lock(&lock);
    size_t free_slot = MAX_HANDLES;
    for (size_t i = 0; i < MAX_HANDLES; i++) {
        if (handles[i].handle == state->handle) {
            handles[i] = *state;
            if (drop) handles[i].handle = 0;
            pthread_mutex_unlock(&lock);
            return;
        }
        if (handles[i].handle == 0 && free_slot == MAX_HANDLES) free_slot = i;
    }
    if (!drop && free_slot < MAX_HANDLES) handles[free_slot] = *state; /* past MAX_HANDLES: defaults in Get */
    pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------------------------------ calls */
/* One request; a connection that failed is CUBLAS_STATUS_NOT_INITIALIZED before cuInit worked and
 * CUBLAS_STATUS_EXECUTION_FAILED after (the server gone, the deadline passed). */
static cublasStatus_t forward(uint16_t op, const void *payload, size_t length, void *answer, size_t capacity,
                              size_t *got) {
    size_t none = 0;
    int32_t status = 0;
    CUresult result = gpupoolRemoteCall(op, payload, length, answer, capacity, got != NULL ? got : &none, &status);
    if (result == CUDA_ERROR_NOT_INITIALIZED_) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (result != 0) return CUBLAS_STATUS_EXECUTION_FAILED;
    return status;
}

/* Whether every call is sent answered: GPUPOOL_REMOTE_BLAS_SYNC=1 (read once), for debugging. */
static int every_call_answered(void) {
    static int decided = -1;
    int value = __atomic_load_n(&decided, __ATOMIC_RELAXED);
    if (value < 0) {
        const char *named = getenv("GPUPOOL_REMOTE_BLAS_SYNC");
        value = named != NULL && strcmp(named, "1") == 0;
        __atomic_store_n(&decided, value, __ATOMIC_RELAXED);
    }
    return value;
}

/* A call that answers nothing to the host: sent without a reply (its error, if the server finds
 * one, comes with a later answered call), or answered under GPUPOOL_REMOTE_BLAS_SYNC=1. */
static cublasStatus_t send_later(uint16_t op, const void *payload, size_t length) {
    if (every_call_answered()) return forward(op, payload, length, NULL, 0, NULL);
    CUresult result = gpupoolRemoteSend(op, payload, length);
    if (result == CUDA_ERROR_NOT_INITIALIZED_) return CUBLAS_STATUS_NOT_INITIALIZED;
    return result == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (handle == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    if (cuInit(0) != 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    uint64_t made[2] = {0, 0};
    size_t got = 0;
    cublasStatus_t status = forward(OP_CUBLAS_CREATE, NULL, 0, made, sizeof made, &got);
    if (status == CUBLAS_STATUS_NOT_INITIALIZED && got == 4 && (uint32_t)made[0] == REMOTE_BLAS_NO_LIBRARY) {
        static int told;
        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "gpupool cuBLAS: the GPU server cannot load cuBLAS (libcublas.so.12): "
                            "CUBLAS_STATUS_NOT_INITIALIZED\n");
    }
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (got != 8 || made[0] == 0) return CUBLAS_STATUS_INTERNAL_ERROR;
    struct handle_state state = {made[0], NULL, 0, 0};
    keep_state(&state, 0);
    *handle = (cublasHandle_t)(uintptr_t)made[0];
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    uint64_t which = (uintptr_t)handle;
    cublasStatus_t status = forward(OP_CUBLAS_DESTROY, &which, sizeof which, NULL, 0, NULL);
    if (status == CUBLAS_STATUS_SUCCESS) {
        struct handle_state state = {which, NULL, 0, 0};
        keep_state(&state, 1);
    }
    return status;
}

/* The server's cuBLAS's version, as CUBLAS_VERSION counts it (major * 10000 + minor * 100 + patch). */
API cublasStatus_t cublasGetProperty(int type, int *value) {
    if (value == NULL || type < 0 || type > 2) return CUBLAS_STATUS_INVALID_VALUE;
    if (cuInit(0) != 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    int32_t which = type, answer = 0;
    size_t got = 0;
    cublasStatus_t status = forward(OP_CUBLAS_PROPERTY, &which, sizeof which, &answer, sizeof answer, &got);
    if (status == CUBLAS_STATUS_SUCCESS && got != sizeof answer) status = CUBLAS_STATUS_INTERNAL_ERROR;
    if (status == CUBLAS_STATUS_SUCCESS) *value = answer;
    return status;
}

API cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    int part[3];
    if (version == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 3; i++) {
        cublasStatus_t status = cublasGetProperty(i, &part[i]);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    *version = part[0] * 10000 + part[1] * 100 + part[2];
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (stream == STREAM_LEGACY || stream == STREAM_PER_THREAD) stream = NULL; /* as gpupool's runtime names them */
    uint64_t args[2] = {(uintptr_t)handle, (uintptr_t)stream};
    cublasStatus_t status = forward(OP_CUBLAS_SET_STREAM, args, sizeof args, NULL, 0, NULL);
    if (status == CUBLAS_STATUS_SUCCESS) {
        struct handle_state state = state_of(handle);
        state.stream = stream;
        keep_state(&state, 0);
    }
    return status;
}

API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
    if (stream == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = state_of(handle).stream;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set_mode(cublasHandle_t handle, uint32_t which, int value) {
    struct {
        uint64_t handle;
        uint32_t which;
        int32_t value;
    } args = {(uintptr_t)handle, which, value};
    cublasStatus_t status = forward(OP_CUBLAS_SET_MODE, &args, sizeof args, NULL, 0, NULL);
    if (status == CUBLAS_STATUS_SUCCESS) {
        struct handle_state state = state_of(handle);
        *(which == REMOTE_BLAS_POINTER_MODE ? &state.pointer_mode : &state.math_mode) = value;
        keep_state(&state, 0);
    }
    return status;
}

API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, int mode) {
    if (mode != 0 && mode != 1) return CUBLAS_STATUS_INVALID_VALUE;
    return set_mode(handle, REMOTE_BLAS_POINTER_MODE, mode);
}
API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, int *mode) {
    if (mode == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = state_of(handle).pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int mode) {
    return set_mode(handle, REMOTE_BLAS_MATH_MODE, mode);
}
API cublasStatus_t cublasGetMathMode(cublasHandle_t handle, int *mode) {
    if (mode == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = state_of(handle).math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* The workspace must be the program's own device memory (cudaMalloc's): counted in its share. */
API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
    uint64_t args[3] = {(uintptr_t)handle, (uintptr_t)workspace, bytes};
    return forward(OP_CUBLAS_SET_WORKSPACE, args, sizeof args, NULL, 0, NULL);
}

API const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "<unrecognized>";
    }
}

API const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    default: return "unknown error";
    }
}

/* ------------------------------------------------------------------------------------ scalars */
/* alpha and beta into a request: copied from the program's memory (host pointer mode) or their
 * pointers (device pointer mode). beta may be NULL (axpy, scal). */
static int put_scalars(int device_mode, const void *alpha, const void *beta, size_t bytes, unsigned char *alpha_out,
                       unsigned char *beta_out, uint64_t *alpha_pointer, uint64_t *beta_pointer) {
    if (alpha == NULL || bytes == 0 || bytes > 16) return -1;
    if (device_mode) {
        *alpha_pointer = (uintptr_t)alpha, *beta_pointer = (uintptr_t)beta;
        return 0;
    }
    memcpy(alpha_out, alpha, bytes);
    if (beta != NULL) memcpy(beta_out, beta, bytes);
    return 0;
}

/* --------------------------------------------------------------------------------------- GEMM */
static cublasStatus_t gemm(int kind, cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                           const void *alpha, const void *a, int a_type, int lda, long long stride_a, const void *b,
                           int b_type, int ldb, long long stride_b, const void *beta, void *c, int c_type, int ldc,
                           long long stride_c, int batch, int compute_type, int algo) {
    struct remote_gemm request;
    memset(&request, 0, sizeof request);
    request.handle = (uintptr_t)handle;
    request.kind = kind, request.transa = transa, request.transb = transb, request.m = m, request.n = n, request.k = k;
    request.a_type = a_type, request.b_type = b_type, request.c_type = c_type, request.compute_type = compute_type;
    request.algo = algo, request.lda = lda, request.ldb = ldb, request.ldc = ldc, request.batch = batch;
    request.stride_a = stride_a, request.stride_b = stride_b, request.stride_c = stride_c;
    request.a = (uintptr_t)a, request.b = (uintptr_t)b, request.c = (uintptr_t)c;
    struct blas_reach reach;
    struct handle_state state;
    if (!made_here(handle, &state)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (blas_check_gemm(&request, &reach) != 0 || beta == NULL ||
        put_scalars(state.pointer_mode, alpha, beta, (size_t)blas_scalar_bytes(compute_type, c_type),
                    request.alpha, request.beta, &request.alpha_pointer, &request.beta_pointer) != 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    return send_later(OP_CUBLAS_GEMM, &request, sizeof request);
}


API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                  const float *alpha, const float *a, int lda, const float *b, int ldb,
                                  const float *beta, float *c, int ldc) {
    return gemm(GEMM_S, handle, transa, transb, m, n, k, alpha, a, CUDA_R_32F, lda, 0, b, CUDA_R_32F, ldb, 0, beta, c,
                CUDA_R_32F, ldc, 0, 1, 68, -1);
}

API cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                  const double *alpha, const double *a, int lda, const double *b, int ldb,
                                  const double *beta, double *c, int ldc) {
    return gemm(GEMM_D, handle, transa, transb, m, n, k, alpha, a, CUDA_R_64F, lda, 0, b, CUDA_R_64F, ldb, 0, beta, c,
                CUDA_R_64F, ldc, 0, 1, 70, -1);
}

API cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k, const void *alpha,
                                const void *a, int a_type, int lda, const void *b, int b_type, int ldb,
                                const void *beta, void *c, int c_type, int ldc, int compute_type, int algo) {
    return gemm(GEMM_EX, handle, transa, transb, m, n, k, alpha, a, a_type, lda, 0, b, b_type, ldb, 0, beta, c, c_type,
                ldc, 0, 1, compute_type, algo);
}

API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                             const float *alpha, const float *a, int lda, long long stride_a,
                                             const float *b, int ldb, long long stride_b, const float *beta, float *c,
                                             int ldc, long long stride_c, int batch) {
    return gemm(GEMM_S_STRIDED, handle, transa, transb, m, n, k, alpha, a, CUDA_R_32F, lda, stride_a, b, CUDA_R_32F,
                ldb, stride_b, beta, c, CUDA_R_32F, ldc, stride_c, batch, 68, -1);
}

API cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                             const double *alpha, const double *a, int lda, long long stride_a,
                                             const double *b, int ldb, long long stride_b, const double *beta,
                                             double *c, int ldc, long long stride_c, int batch) {
    return gemm(GEMM_D_STRIDED, handle, transa, transb, m, n, k, alpha, a, CUDA_R_64F, lda, stride_a, b, CUDA_R_64F,
                ldb, stride_b, beta, c, CUDA_R_64F, ldc, stride_c, batch, 70, -1);
}

API cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                              const void *alpha, const void *a, int a_type, int lda,
                                              long long stride_a, const void *b, int b_type, int ldb,
                                              long long stride_b, const void *beta, void *c, int c_type, int ldc,
                                              long long stride_c, int batch, int compute_type, int algo) {
    return gemm(GEMM_EX_STRIDED, handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb,
                stride_b, beta, c, c_type, ldc, stride_c, batch, compute_type, algo);
}

/* ------------------------------------------------------------------------------ levels 1 and 2 */
static cublasStatus_t vector_call(int kind, cublasHandle_t handle, int trans, int m, int n, const void *alpha,
                                  const void *a, int lda, const void *x, int incx, const void *beta, void *y, int incy,
                                  void *result, size_t scalar) {
    struct remote_vector request;
    memset(&request, 0, sizeof request);
    request.handle = (uintptr_t)handle;
    request.kind = kind, request.trans = trans, request.m = m, request.n = n, request.lda = lda;
    request.incx = incx, request.incy = incy;
    request.a = (uintptr_t)a, request.x = (uintptr_t)x, request.y = (uintptr_t)y, request.result = (uintptr_t)result;
    struct blas_reach reach;
    struct handle_state state;
    if (!made_here(handle, &state)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (blas_check_vector(&request, &reach) != 0) return CUBLAS_STATUS_INVALID_VALUE;
    int device_mode = state.pointer_mode;
    if (kind == VECTOR_SDOT) {
        if (result == NULL) return CUBLAS_STATUS_INVALID_VALUE;
        if (!device_mode) request.result = 0; /* the value comes back in the reply */
    } else if (put_scalars(device_mode, alpha, beta, scalar, request.alpha, request.beta, &request.alpha_pointer,
                           &request.beta_pointer) != 0) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (kind != VECTOR_SDOT || device_mode) return send_later(OP_CUBLAS_VECTOR, &request, sizeof request);
    double value = 0; /* a dot into host memory waits for its value */
    size_t got = 0;
    cublasStatus_t status = forward(OP_CUBLAS_VECTOR, &request, sizeof request, &value, sizeof value, &got);
    if (status == CUBLAS_STATUS_SUCCESS) { /* only a dot into host memory comes here */
        if (got != sizeof value) return CUBLAS_STATUS_INTERNAL_ERROR;
        float single = (float)value;
        memcpy(result, &single, sizeof single);
    }
    return status;
}

API cublasStatus_t cublasSgemv_v2(cublasHandle_t handle, int trans, int m, int n, const float *alpha, const float *a,
                                  int lda, const float *x, int incx, const float *beta, float *y, int incy) {
    if (beta == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    return vector_call(VECTOR_SGEMV, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy, NULL, 4);
}

API cublasStatus_t cublasDgemv_v2(cublasHandle_t handle, int trans, int m, int n, const double *alpha,
                                  const double *a, int lda, const double *x, int incx, const double *beta, double *y,
                                  int incy) {
    if (beta == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    return vector_call(VECTOR_DGEMV, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy, NULL, 8);
}

API cublasStatus_t cublasSaxpy_v2(cublasHandle_t handle, int n, const float *alpha, const float *x, int incx, float *y,
                                  int incy) {
    return vector_call(VECTOR_SAXPY, handle, 0, 0, n, alpha, NULL, 0, x, incx, NULL, y, incy, NULL, 4);
}

API cublasStatus_t cublasSscal_v2(cublasHandle_t handle, int n, const float *alpha, float *x, int incx) {
    return vector_call(VECTOR_SSCAL, handle, 0, 0, n, alpha, NULL, 0, x, incx, NULL, NULL, 0, NULL, 4);
}

API cublasStatus_t cublasSdot_v2(cublasHandle_t handle, int n, const float *x, int incx, const float *y, int incy,
                                 float *result) {
    return vector_call(VECTOR_SDOT, handle, 0, 0, n, NULL, NULL, 0, x, incx, NULL, (void *)(uintptr_t)y, incy, result,
                       4);
}

/* ------------------------------------------------------------------------- host <-> device copies */
/* Matrices column by column (a vector is a matrix of one row whose leading dimension is its
 * increment), through the client's copies: the device's side is read whole and picked from here,
 * written a column at a time (one copy when both sides are packed). */
static cublasStatus_t set_matrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb) {
    if (rows < 0 || cols < 0 || elem <= 0 || lda <= 0 || ldb <= 0 || (cols > 1 && (lda < rows || ldb < rows)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (rows == 0 || cols == 0) return CUBLAS_STATUS_SUCCESS;
    if (a == NULL || b == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    size_t column = (size_t)rows * (size_t)elem;
    if (lda == rows && ldb == rows)
        return cuMemcpyHtoD_v2((uintptr_t)b, a, column * (size_t)cols) == 0 ? CUBLAS_STATUS_SUCCESS
                                                                            : CUBLAS_STATUS_MAPPING_ERROR;
    for (int j = 0; j < cols; j++)
        if (cuMemcpyHtoD_v2((uintptr_t)b + (size_t)j * (size_t)ldb * (size_t)elem,
                            (const char *)a + (size_t)j * (size_t)lda * (size_t)elem, column) != 0)
            return CUBLAS_STATUS_MAPPING_ERROR;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t get_matrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb) {
    if (rows < 0 || cols < 0 || elem <= 0 || lda <= 0 || ldb <= 0 || (cols > 1 && (lda < rows || ldb < rows)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (rows == 0 || cols == 0) return CUBLAS_STATUS_SUCCESS;
    if (a == NULL || b == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    size_t column = (size_t)rows * (size_t)elem, span = ((size_t)(cols - 1) * (size_t)lda + (size_t)rows) * (size_t)elem;
    if (lda == rows && ldb == rows)
        return cuMemcpyDtoH_v2(b, (uintptr_t)a, span) == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_MAPPING_ERROR;
    unsigned char *whole = malloc(span);
    if (whole == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    if (cuMemcpyDtoH_v2(whole, (uintptr_t)a, span) != 0) status = CUBLAS_STATUS_MAPPING_ERROR;
    for (int j = 0; status == CUBLAS_STATUS_SUCCESS && j < cols; j++)
        memcpy((char *)b + (size_t)j * (size_t)ldb * (size_t)elem, whole + (size_t)j * (size_t)lda * (size_t)elem,
               column);
    free(whole);
    return status;
}

API cublasStatus_t cublasSetMatrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb) {
    return set_matrix(rows, cols, elem, a, lda, b, ldb);
}
API cublasStatus_t cublasGetMatrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb) {
    return get_matrix(rows, cols, elem, a, lda, b, ldb);
}
API cublasStatus_t cublasSetVector(int n, int elem, const void *x, int incx, void *y, int incy) {
    if (incx <= 0 || incy <= 0) return CUBLAS_STATUS_INVALID_VALUE;
    return set_matrix(1, n, elem, x, incx, y, incy);
}
API cublasStatus_t cublasGetVector(int n, int elem, const void *x, int incx, void *y, int incy) {
    if (incx <= 0 || incy <= 0) return CUBLAS_STATUS_INVALID_VALUE;
    return get_matrix(1, n, elem, x, incx, y, incy);
}

/* ------------------------------------------------------------------------------ the rest */
/* Every other function of cuBLAS 12's API: CUBLAS_STATUS_NOT_SUPPORTED, named once on stderr so
 * that a program that stops on it says why. */
static cublasStatus_t refuse(const char *name, int *told) {
    if (!__atomic_exchange_n(told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "gpupool cuBLAS: %s is not carried to the GPU: CUBLAS_STATUS_NOT_SUPPORTED\n", name);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
#define REFUSED(name)                    \
    API cublasStatus_t name(void) {      \
        static int told;                 \
        return refuse(#name, &told);     \
    }
#include "cublas_refused.h"
