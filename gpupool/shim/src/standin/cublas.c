/*
 * A stand-in libcublas.so.12 for the remote GPU tests (tests/remote/test_remote_cublas.py): the
 * calls gpupool's GPU server runs for its clients' cuBLAS (server.c, "cuBLAS"), computed on the
 * CPU over the stand-in driver's device memory (its allocations are host memory behind
 * cuMemcpyDtoH/HtoD). Handles are heap blocks that remember what they were set to.
 *
 * GPUPOOL_STANDIN_CUBLAS_LOG names a file each handle's creation, destruction and stream is
 * appended to ("<pid> create|destroy <handle>", "<pid> stream <handle> <stream>"), so a test sees
 * that the server released a client's handles. Its version is 12.9.1.
 *
 * GPUPOOL_STANDIN_CUBLAS_NO_MATH=1: a GEMM checks its arguments and returns, reading and writing
 * no device memory (bench/remote.py: what is timed is then the relay, not the stand-in driver's
 * memory lookups, which cost more than a 16 x 16 product).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);

enum { SUCCESS = 0, NOT_INITIALIZED = 1, ALLOC_FAILED = 3, INVALID_VALUE = 7, MAPPING_ERROR = 11, NOT_SUPPORTED = 15 };
#define R_32F 0
#define R_64F 1
#define MAGIC 0x626c6173u

struct handle {
    unsigned magic;
    void *stream;
    int pointer_mode, math_mode;
    void *workspace;
    size_t workspace_bytes;
};

static void note(const char *what, const void *a, const void *b) {
    const char *path = getenv("GPUPOOL_STANDIN_CUBLAS_LOG");
    if (path == NULL || path[0] == '\0') return;
    FILE *log = fopen(path, "ae");
    if (log == NULL) return;
    if (b == (const void *)-1) fprintf(log, "%d %s %p\n", (int)getpid(), what, a);
    else fprintf(log, "%d %s %p %p\n", (int)getpid(), what, a, b);
    fclose(log);
}

static struct handle *checked(void *h) {
    struct handle *handle = h;
    return handle != NULL && handle->magic == MAGIC ? handle : NULL;
}

API int cublasCreate_v2(void **out) {
    struct handle *handle = calloc(1, sizeof *handle);
    if (out == NULL || handle == NULL) return free(handle), ALLOC_FAILED;
    handle->magic = MAGIC;
    *out = handle;
    note("create", handle, (const void *)-1);
    return SUCCESS;
}

API int cublasDestroy_v2(void *h) {
    struct handle *handle = checked(h);
    if (handle == NULL) return NOT_INITIALIZED;
    note("destroy", handle, (const void *)-1);
    handle->magic = 0;
    free(handle);
    return SUCCESS;
}

API int cublasSetStream_v2(void *h, void *stream) {
    struct handle *handle = checked(h);
    if (handle == NULL) return NOT_INITIALIZED;
    handle->stream = stream;
    note("stream", handle, stream);
    return SUCCESS;
}

API int cublasSetPointerMode_v2(void *h, int mode) {
    struct handle *handle = checked(h);
    if (handle == NULL) return NOT_INITIALIZED;
    handle->pointer_mode = mode;
    return SUCCESS;
}

API int cublasSetMathMode(void *h, int mode) {
    struct handle *handle = checked(h);
    if (handle == NULL) return NOT_INITIALIZED;
    handle->math_mode = mode;
    return SUCCESS;
}

API int cublasSetWorkspace_v2(void *h, void *workspace, size_t bytes) {
    struct handle *handle = checked(h);
    if (handle == NULL) return NOT_INITIALIZED;
    handle->workspace = workspace, handle->workspace_bytes = bytes;
    return SUCCESS;
}

API int cublasGetProperty(int type, int *value) {
    static const int version[3] = {12, 9, 1};
    if (value == NULL || type < 0 || type > 2) return INVALID_VALUE;
    *value = version[type];
    return SUCCESS;
}

/* ------------------------------------------------------------------------- device memory here */
/* bytes of device memory at pointer, copied to the host (NULL: the copy failed or no memory). */
static void *fetch(const void *pointer, size_t bytes) {
    void *host = malloc(bytes > 0 ? bytes : 1);
    if (host != NULL && bytes > 0 && cuMemcpyDtoH_v2(host, (uintptr_t)pointer, bytes) != 0) free(host), host = NULL;
    return host;
}

static int store(void *pointer, const void *host, size_t bytes) {
    return bytes == 0 || cuMemcpyHtoD_v2((uintptr_t)pointer, host, bytes) == 0 ? SUCCESS : MAPPING_ERROR;
}

/* A scalar as a double: read from the host or, in device pointer mode, from the device. */
static int scalar(const struct handle *handle, const void *at, int type, double *out) {
    unsigned char bytes[8];
    size_t size = type == R_64F ? 8 : 4;
    if (at == NULL) return INVALID_VALUE;
    if (handle->pointer_mode) {
        if (cuMemcpyDtoH_v2(bytes, (uintptr_t)at, size) != 0) return MAPPING_ERROR;
    } else {
        memcpy(bytes, at, size);
    }
    if (type == R_64F) memcpy(out, bytes, 8);
    else {
        float single;
        memcpy(&single, bytes, 4);
        *out = single;
    }
    return SUCCESS;
}

static double element(const void *base, int type, size_t index) {
    if (type == R_64F) return ((const double *)base)[index];
    return ((const float *)base)[index];
}

static void put(void *base, int type, size_t index, double value) {
    if (type == R_64F) ((double *)base)[index] = value;
    else ((float *)base)[index] = (float)value;
}

static size_t span(long long rows, long long cols, long long ld, long long stride, long long batch, int type) {
    if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
    return (size_t)(((batch - 1) * stride + (cols - 1) * ld + rows) * (type == R_64F ? 8 : 4));
}

/* GPUPOOL_STANDIN_CUBLAS_NO_MATH=1 (read once): a GEMM or GEMV checks its arguments and returns. */
static int no_math(void) {
    static int value = -1;
    if (value < 0) value = getenv("GPUPOOL_STANDIN_CUBLAS_NO_MATH") != NULL &&
                           strcmp(getenv("GPUPOOL_STANDIN_CUBLAS_NO_MATH"), "1") == 0;
    return value;
}

/* C = alpha op(A) op(B) + beta C over batch matrices, in double, on copies of the device's bytes. */
static int gemm(void *h, int ta, int tb, int m, int n, int k, const void *alpha_at, const void *a, int lda,
                long long sa, const void *b, int ldb, long long sb, const void *beta_at, void *c, int ldc, long long sc,
                int batch, int type) {
    struct handle *handle = checked(h);
    double alpha, beta;
    int status;
    if (handle == NULL) return NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ta < 0 || ta > 2 || tb < 0 || tb > 2) return INVALID_VALUE;
    if ((status = scalar(handle, alpha_at, type, &alpha)) != 0 || (status = scalar(handle, beta_at, type, &beta)) != 0)
        return status;
    if (no_math()) return SUCCESS;
    size_t a_bytes = span(ta == 0 ? m : k, ta == 0 ? k : m, lda, sa, batch, type);
    size_t b_bytes = span(tb == 0 ? k : n, tb == 0 ? n : k, ldb, sb, batch, type);
    size_t c_bytes = span(m, n, ldc, sc, batch, type);
    void *ha = fetch(a, a_bytes), *hb = fetch(b, b_bytes), *hc = fetch(c, c_bytes);
    if (ha == NULL || hb == NULL || hc == NULL) status = MAPPING_ERROR;
    for (long long q = 0; status == 0 && q < batch; q++)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double sum = 0;
                for (int l = 0; l < k; l++) {
                    size_t ai = (size_t)(q * sa + (ta == 0 ? i + (long long)l * lda : l + (long long)i * lda));
                    size_t bi = (size_t)(q * sb + (tb == 0 ? l + (long long)j * ldb : j + (long long)l * ldb));
                    sum += element(ha, type, ai) * element(hb, type, bi);
                }
                size_t ci = (size_t)(q * sc + i + (long long)j * ldc);
                put(hc, type, ci, alpha * sum + (beta == 0 ? 0 : beta * element(hc, type, ci)));
            }
    if (status == 0) status = store(c, hc, c_bytes);
    free(ha), free(hb), free(hc);
    return status;
}

API int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a, int lda,
                       const float *b, int ldb, const float *beta, float *c, int ldc) {
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, R_32F);
}
API int cublasDgemm_v2(void *h, int ta, int tb, int m, int n, int k, const double *alpha, const double *a, int lda,
                       const double *b, int ldb, const double *beta, double *c, int ldc) {
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, R_64F);
}
API int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a,
                                  int lda, long long sa, const float *b, int ldb, long long sb, const float *beta,
                                  float *c, int ldc, long long sc, int batch) {
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, R_32F);
}
API int cublasDgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const double *alpha, const double *a,
                                  int lda, long long sa, const double *b, int ldb, long long sb, const double *beta,
                                  double *c, int ldc, long long sc, int batch) {
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, R_64F);
}

/* The Ex forms: float or double throughout (CUBLAS_COMPUTE_32F 68 or 64F 70), else not supported. */
static int ex_type(int a_type, int b_type, int c_type, int compute) {
    if (a_type == R_32F && b_type == R_32F && c_type == R_32F && compute == 68) return R_32F;
    if (a_type == R_64F && b_type == R_64F && c_type == R_64F && compute == 70) return R_64F;
    return -1;
}
API int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int a_type,
                     int lda, const void *b, int b_type, int ldb, const void *beta, void *c, int c_type, int ldc,
                     int compute, int algo) {
    int type = ex_type(a_type, b_type, c_type, compute);
    if (type < 0) return NOT_SUPPORTED;
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, type);
}
API int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a,
                                   int a_type, int lda, long long sa, const void *b, int b_type, int ldb, long long sb,
                                   const void *beta, void *c, int c_type, int ldc, long long sc, int batch,
                                   int compute, int algo) {
    int type = ex_type(a_type, b_type, c_type, compute);
    if (type < 0) return NOT_SUPPORTED;
    return gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, type);
}

/* y = alpha op(A) x + beta y: a GEMM of op(A) (m x n or n x m) by the vector x. Positive increments only. */
static int gemv(void *h, int trans, int m, int n, const void *alpha_at, const void *a, int lda, const void *x, int incx,
                const void *beta_at, void *y, int incy, int type) {
    struct handle *handle = checked(h);
    double alpha, beta;
    int status;
    if (handle == NULL) return NOT_INITIALIZED;
    if (m < 0 || n < 0 || incx <= 0 || incy <= 0) return INVALID_VALUE;
    if ((status = scalar(handle, alpha_at, type, &alpha)) != 0 || (status = scalar(handle, beta_at, type, &beta)) != 0)
        return status;
    if (no_math()) return SUCCESS;
    int rows = trans == 0 ? m : n, cols = trans == 0 ? n : m; /* y has rows elements, x cols */
    void *ha = fetch(a, span(m, n, lda, 0, 1, type)), *hx = fetch(x, span(1, cols, incx, 0, 1, type));
    void *hy = fetch(y, span(1, rows, incy, 0, 1, type));
    if (ha == NULL || hx == NULL || hy == NULL) status = MAPPING_ERROR;
    for (int i = 0; status == 0 && i < rows; i++) {
        double sum = 0;
        for (int l = 0; l < cols; l++)
            sum += element(ha, type, (size_t)(trans == 0 ? i + (long long)l * lda : l + (long long)i * lda)) *
                   element(hx, type, (size_t)l * (size_t)incx);
        size_t yi = (size_t)i * (size_t)incy;
        put(hy, type, yi, alpha * sum + (beta == 0 ? 0 : beta * element(hy, type, yi)));
    }
    if (status == 0) status = store(y, hy, span(1, rows, incy, 0, 1, type));
    free(ha), free(hx), free(hy);
    return status;
}
API int cublasSgemv_v2(void *h, int trans, int m, int n, const float *alpha, const float *a, int lda, const float *x,
                       int incx, const float *beta, float *y, int incy) {
    return gemv(h, trans, m, n, alpha, a, lda, x, incx, beta, y, incy, R_32F);
}
API int cublasDgemv_v2(void *h, int trans, int m, int n, const double *alpha, const double *a, int lda,
                       const double *x, int incx, const double *beta, double *y, int incy) {
    return gemv(h, trans, m, n, alpha, a, lda, x, incx, beta, y, incy, R_64F);
}

/* axpy (y = alpha x + y), scal (x = alpha x) and dot, float, positive increments. */
static int level1(void *h, int what, int n, const void *alpha_at, const void *x, int incx, void *y, int incy,
                  float *result) {
    struct handle *handle = checked(h);
    double alpha = 0, sum = 0;
    int status = 0;
    if (handle == NULL) return NOT_INITIALIZED;
    if (n < 0 || incx <= 0 || (what != 1 && incy <= 0)) return INVALID_VALUE;
    if (what != 2 && (status = scalar(handle, alpha_at, R_32F, &alpha)) != 0) return status;
    size_t x_bytes = span(1, n, incx, 0, 1, R_32F), y_bytes = what == 1 ? 0 : span(1, n, incy, 0, 1, R_32F);
    float *hx = fetch(x, x_bytes), *hy = fetch(y, y_bytes);
    if (hx == NULL || hy == NULL) status = MAPPING_ERROR;
    for (int i = 0; status == 0 && i < n; i++) {
        size_t xi = (size_t)i * (size_t)incx, yi = (size_t)i * (size_t)(what == 1 ? 1 : incy);
        if (what == 0) hy[yi] = (float)(alpha * hx[xi] + hy[yi]);
        else if (what == 1) hx[xi] = (float)(alpha * hx[xi]);
        else sum += (double)hx[xi] * hy[yi];
    }
    if (status == 0 && what == 0) status = store(y, hy, y_bytes);
    if (status == 0 && what == 1) status = store((void *)(uintptr_t)x, hx, x_bytes);
    if (status == 0 && what == 2) {
        float value = (float)sum;
        if (handle->pointer_mode) status = store(result, &value, sizeof value);
        else *result = value;
    }
    free(hx), free(hy);
    return status;
}
API int cublasSaxpy_v2(void *h, int n, const float *alpha, const float *x, int incx, float *y, int incy) {
    return level1(h, 0, n, alpha, x, incx, y, incy, NULL);
}
API int cublasSscal_v2(void *h, int n, const float *alpha, float *x, int incx) {
    return level1(h, 1, n, alpha, x, incx, NULL, 1, NULL);
}
API int cublasSdot_v2(void *h, int n, const float *x, int incx, const float *y, int incy, float *result) {
    if (result == NULL) return INVALID_VALUE;
    return level1(h, 2, n, NULL, x, incx, (void *)(uintptr_t)y, incy, result);
}
