/*
 * gpupool's cuBLASLt (docs/remote-gpu.md, "cuBLAS"): a libcublasLt.so.12 that refuses the
 * cuBLASLt matmul API cleanly instead of letting NVIDIA's copy run in a client process.
 *
 * Why it exists: NVIDIA's libcublasLt.so.12 cannot run on the GPU client (it calls the driver's
 * private export tables, which the client cannot forward), and PyTorch hands it its cuBLAS handle
 * (reinterpret_cast to cublasLtHandle_t): with gpupool's cuBLAS that handle is the GPU server's
 * value, not an address in this process, and NVIDIA's cuBLASLt dereferencing it crashed the
 * program (F.linear with a bias, through cublasLtMatmulAlgoGetHeuristic). Nothing of cuBLASLt is
 * forwarded to the server yet.
 *
 * Answered here: the handle calls (a handle is a slot of this library's own table, never
 * dereferenced; destroying one it did not make is CUBLAS_STATUS_INVALID_VALUE), the version
 * and properties (the GPU server's cuBLAS's, asked through gpupool's libcublas.so.12, which this
 * library is linked to), the CUDA runtime version (gpupool's runtime's), the status names, the
 * CPU instruction mask (kept, unused). Every call of the matmul path (descriptor, layout,
 * preference and transform creation, initialisation and attributes, heuristics, algorithms,
 * cublasLtMatmul, cublasLtMatrixTransform), the heuristics cache and the logger return
 * CUBLAS_STATUS_NOT_SUPPORTED and say so once per function on stderr. They read none of their
 * arguments; a create writes NULL to its documented output, the heuristic query 0 results. A
 * descriptor's destroy accepts NULL (nothing was made) and refuses anything else with
 * CUBLAS_STATUS_INVALID_VALUE: this library never made one.
 *
 * The names: every function CUDA 12.6's cublasLt.h declares (45; the static inline *Init helpers
 * call the *Init_internal functions). tests/remote/test_remote_cublaslt.py holds the list and
 * checks that the library exports exactly it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define API __attribute__((visibility("default")))

typedef int cublasStatus_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasContext *cublasHandle_t;

/* gpupool's cuBLAS (cublas.c), beside this library. */
cublasStatus_t cublasGetProperty(int type, int *value);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
#define RUNTIME_VERSION 12090 /* gpupool's libcudart.so.12 (cudart.c's RUNTIME_VERSION) */

/* ----------------------------------------------------------------------------------- refusals */
static cublasStatus_t refuse(const char *name, int *told) {
    if (!__atomic_exchange_n(told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "gpupool cuBLASLt: %s is not carried to the GPU: CUBLAS_STATUS_NOT_SUPPORTED\n", name);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
#define REFUSE(name)                                                                               \
    do {                                                                                           \
        static int told;                                                                           \
        return refuse(#name, &told);                                                               \
    } while (0)

/* ------------------------------------------------------------------------------------ handles */
/* A handle is the address of one of these slots: a value of this library's own, unique while in
 * use, that nothing here (or in NVIDIA's code) reads through. */
#define MAX_HANDLES 256
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char in_use[MAX_HANDLES];

API cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    if (handle == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_HANDLES; i++)
        if (!in_use[i]) {
            in_use[i] = 1;
            pthread_mutex_unlock(&lock);
            *handle = (cublasLtHandle_t)(void *)&in_use[i];
            return CUBLAS_STATUS_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return CUBLAS_STATUS_ALLOC_FAILED;
}

/* Compared as a number only: a handle of gpupool's cuBLAS (PyTorch's cast) is not in the table. */
API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    uintptr_t value = (uintptr_t)handle, first = (uintptr_t)&in_use[0];
    if (value < first || value >= first + MAX_HANDLES) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t status = CUBLAS_STATUS_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (in_use[value - first]) {
        in_use[value - first] = 0;
        status = CUBLAS_STATUS_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* ---------------------------------------------------------------------------- version, names */
/* The GPU server's cuBLAS's (cuBLASLt ships with it, same version): major, minor, patch. */
API cublasStatus_t cublasLtGetProperty(int type, int *value) { return cublasGetProperty(type, value); }

/* major * 10000 + minor * 100 + patch, as CUBLAS_VERSION; 0 when the server's cuBLAS cannot be
 * asked (no server, no cuBLAS there): the function has no way to say why. */
API size_t cublasLtGetVersion(void) {
    int part[3];
    for (int i = 0; i < 3; i++)
        if (cublasGetProperty(i, &part[i]) != CUBLAS_STATUS_SUCCESS) return 0;
    return (size_t)part[0] * 10000 + (size_t)part[1] * 100 + (size_t)part[2];
}

API size_t cublasLtGetCudartVersion(void) { return RUNTIME_VERSION; }

API const char *cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }
API const char *cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

/* Which CPU instructions cuBLASLt's host code may use: nothing runs here, the mask is only kept. */
static unsigned cpu_mask;
API unsigned cublasLtDisableCpuInstructionsSetMask(unsigned mask) {
    return __atomic_exchange_n(&cpu_mask, mask, __ATOMIC_RELAXED);
}

/* --------------------------------------------------------------------------------- matmul path */
API cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, void *desc, const void *alpha, const void *a, void *adesc,
                                  const void *b, void *bdesc, const void *beta, const void *c, void *cdesc, void *d,
                                  void *ddesc, const void *algo, void *workspace, size_t workspace_bytes,
                                  void *stream) {
    REFUSE(cublasLtMatmul);
}

API cublasStatus_t cublasLtMatrixTransform(cublasLtHandle_t handle, void *desc, const void *alpha, const void *a,
                                           void *adesc, const void *beta, const void *b, void *bdesc, void *c,
                                           void *cdesc, void *stream) {
    REFUSE(cublasLtMatrixTransform);
}

/* The four descriptors: create writes NULL to its output (the first argument; the others, the
 * types and sizes, are not read) and refuses; init, set and get refuse; destroy takes NULL and
 * nothing else. */
#define DESCRIPTOR(kind)                                                                           \
    API cublasStatus_t cublasLt##kind##Create(void **made) {                                       \
        if (made != NULL) *made = NULL;                                                            \
        REFUSE(cublasLt##kind##Create);                                                            \
    }                                                                                              \
    API cublasStatus_t cublasLt##kind##Destroy(void *desc) {                                       \
        return desc == NULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;                 \
    }                                                                                              \
    API cublasStatus_t cublasLt##kind##Init_internal(void) { REFUSE(cublasLt##kind##Init_internal); } \
    API cublasStatus_t cublasLt##kind##SetAttribute(void) { REFUSE(cublasLt##kind##SetAttribute); }   \
    API cublasStatus_t cublasLt##kind##GetAttribute(void) { REFUSE(cublasLt##kind##GetAttribute); }
DESCRIPTOR(MatrixLayout)
DESCRIPTOR(MatmulDesc)
DESCRIPTOR(MatrixTransformDesc)
DESCRIPTOR(MatmulPreference)

/* No algorithm is offered: 0 results written, the call refused (PyTorch raises on the status). */
API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, void *desc, void *adesc, void *bdesc,
                                                  void *cdesc, void *ddesc, void *preference, int requested,
                                                  void *results, int *returned) {
    if (returned != NULL) *returned = 0;
    REFUSE(cublasLtMatmulAlgoGetHeuristic);
}

#define REFUSED(name)                                                                              \
    API cublasStatus_t name(void) { REFUSE(name); }
REFUSED(cublasLtMatmulAlgoGetIds)
REFUSED(cublasLtMatmulAlgoInit)
REFUSED(cublasLtMatmulAlgoCheck)
REFUSED(cublasLtMatmulAlgoCapGetAttribute)
REFUSED(cublasLtMatmulAlgoConfigSetAttribute)
REFUSED(cublasLtMatmulAlgoConfigGetAttribute)
REFUSED(cublasLtHeuristicsCacheGetCapacity)
REFUSED(cublasLtHeuristicsCacheSetCapacity)
REFUSED(cublasLtLoggerSetCallback)
REFUSED(cublasLtLoggerSetFile)
REFUSED(cublasLtLoggerOpenFile)
REFUSED(cublasLtLoggerSetLevel)
REFUSED(cublasLtLoggerSetMask)
REFUSED(cublasLtLoggerForceDisable)
