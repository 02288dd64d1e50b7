/*
 * A cuBLAS program for tests/remote/test_remote_cublas.py, linked to gpupool's libcudart.so.12 and
 * libcublas.so.12 (no NVIDIA header: the prototypes it uses are declared here, in NVIDIA's ABI).
 *
 *   cublas_probe blas        every carried call, each result compared with a CPU reference:
 *                            one line "blas name=status:ok|BAD ..."
 *   cublas_probe refused     a refused function, twice: "refused <status> <status>"
 *   cublas_probe create      "create <status>"
 *   cublas_probe hold        a handle made and kept: "handle 0x..." then sleeps (killed by the test)
 *   cublas_probe forged H    a SGEMM on handle H (another client's): "forged <status>", then a SGEMM
 *                            on its own handle: "own <status>:ok|BAD"
 *   cublas_probe outside     SGEMMs naming memory outside its allocations: "outside <status> ..."
 *                            (run with GPUPOOL_REMOTE_BLAS_SYNC=1: each call answered)
 *   cublas_probe late        the same sent without a reply: each call's status, then the status of
 *                            the synchronisation after it; the calls refused in the client at once:
 *                            "late <status> ...", then "after <status>:ok|BAD"
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *cudaStream_t;
typedef struct cublasContext *cublasHandle_t;
int cudaMalloc(void **pointer, size_t bytes);
int cudaFree(void *pointer);
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
int cudaStreamCreate(cudaStream_t *stream);
int cudaStreamSynchronize(cudaStream_t stream);
int cudaDeviceSynchronize(void);
int cublasCreate_v2(cublasHandle_t *handle);
int cublasDestroy_v2(cublasHandle_t handle);
int cublasGetVersion_v2(cublasHandle_t handle, int *version);
int cublasGetProperty(int type, int *value);
int cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
int cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream);
int cublasSetPointerMode_v2(cublasHandle_t handle, int mode);
int cublasGetPointerMode_v2(cublasHandle_t handle, int *mode);
int cublasSetMathMode(cublasHandle_t handle, int mode);
int cublasGetMathMode(cublasHandle_t handle, int *mode);
int cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes);
const char *cublasGetStatusName(int status);
const char *cublasGetStatusString(int status);
int cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a, int lda,
                   const float *b, int ldb, const float *beta, float *c, int ldc);
int cublasDgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const double *alpha, const double *a,
                   int lda, const double *b, int ldb, const double *beta, double *c, int ldc);
int cublasGemmEx(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int a_type,
                 int lda, const void *b, int b_type, int ldb, const void *beta, void *c, int c_type, int ldc,
                 int compute, int algo);
int cublasSgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                              const float *beta, float *c, int ldc, long long sc, int batch);
int cublasDgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k, const double *alpha,
                              const double *a, int lda, long long sa, const double *b, int ldb, long long sb,
                              const double *beta, double *c, int ldc, long long sc, int batch);
int cublasGemmStridedBatchedEx(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                               const void *a, int a_type, int lda, long long sa, const void *b, int b_type, int ldb,
                               long long sb, const void *beta, void *c, int c_type, int ldc, long long sc, int batch,
                               int compute, int algo);
int cublasSgemv_v2(cublasHandle_t h, int trans, int m, int n, const float *alpha, const float *a, int lda,
                   const float *x, int incx, const float *beta, float *y, int incy);
int cublasDgemv_v2(cublasHandle_t h, int trans, int m, int n, const double *alpha, const double *a, int lda,
                   const double *x, int incx, const double *beta, double *y, int incy);
int cublasSaxpy_v2(cublasHandle_t h, int n, const float *alpha, const float *x, int incx, float *y, int incy);
int cublasSscal_v2(cublasHandle_t h, int n, const float *alpha, float *x, int incx);
int cublasSdot_v2(cublasHandle_t h, int n, const float *x, int incx, const float *y, int incy, float *result);
int cublasSetMatrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb);
int cublasGetMatrix(int rows, int cols, int elem, const void *a, int lda, void *b, int ldb);
int cublasSetVector(int n, int elem, const void *x, int incx, void *y, int incy);
int cublasGetVector(int n, int elem, const void *x, int incx, void *y, int incy);
int cublasSrot_v2(cublasHandle_t h, int n, float *x, int incx, float *y, int incy, const float *c, const float *s);

#define TO_DEVICE 1
#define TO_HOST 2
#define N_OP 0
#define T_OP 1
#define R_32F 0
#define R_64F 1
#define COMPUTE_32F 68
#define COMPUTE_64F 70

static void *device(size_t bytes) {
    void *pointer = NULL;
    if (cudaMalloc(&pointer, bytes) != 0) {
        printf("cudaMalloc failed\n");
        exit(1);
    }
    return pointer;
}

static void *upload(const void *host, size_t bytes) {
    void *pointer = device(bytes);
    cudaMemcpy(pointer, host, bytes, TO_DEVICE);
    return pointer;
}

/* Deterministic values in [-1, 1). */
static double value(int seed, int i) { return (double)((seed * 7919 + i * 104729) % 2000) / 1000.0 - 1.0; }

/* C = alpha op(A) op(B) + beta C in double, column-major. */
static void reference(int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda, const double *b,
                      int ldb, double beta, double *c, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int l = 0; l < k; l++)
                sum += (ta == N_OP ? a[i + l * lda] : a[l + i * lda]) * (tb == N_OP ? b[l + j * ldb] : b[j + l * ldb]);
            c[i + j * ldc] = alpha * sum + beta * c[i + j * ldc];
        }
}

static void report(const char *name, int status, int ok) { printf(" %s=%d:%s", name, status, ok ? "ok" : "BAD"); }

/* One GEMM of each precision and form, transposes and leading dimensions > m, against the reference. */
static void gemm_case(cublasHandle_t handle, const char *name, int kind, int ta, int tb, int batch) {
    int m = 5, n = 4, k = 3, lda = (ta == N_OP ? m : k) + 2, ldb = (tb == N_OP ? k : n) + 1, ldc = m + 3;
    int a_cols = ta == N_OP ? k : m, b_cols = tb == N_OP ? n : k;
    long long sa = (long long)lda * a_cols, sb = (long long)ldb * b_cols, sc = (long long)ldc * n;
    int size_a = (int)sa * batch, size_b = (int)sb * batch, size_c = (int)sc * batch;
    double *a = malloc(sizeof(double) * size_a), *b = malloc(sizeof(double) * size_b);
    double *c = malloc(sizeof(double) * size_c), *expect = malloc(sizeof(double) * size_c);
    for (int i = 0; i < size_a; i++) a[i] = value(1, i);
    for (int i = 0; i < size_b; i++) b[i] = value(2, i);
    for (int i = 0; i < size_c; i++) c[i] = expect[i] = value(3, i);
    double alpha = 1.5, beta = -0.5;
    for (int q = 0; q < batch; q++)
        reference(ta, tb, m, n, k, alpha, a + q * sa, lda, b + q * sb, ldb, beta, expect + q * sc, ldc);
    int single = kind == 0 || kind == 2 || kind == 3 || kind == 5, status;
    size_t element = single ? 4 : 8;
    void *host[3] = {a, b, c};
    int sizes[3] = {size_a, size_b, size_c};
    void *dev[3];
    for (int t = 0; t < 3; t++) {
        if (single) {
            float *f = malloc(sizeof(float) * sizes[t]);
            for (int i = 0; i < sizes[t]; i++) f[i] = (float)((double *)host[t])[i];
            dev[t] = upload(f, element * sizes[t]);
            free(f);
        } else {
            dev[t] = upload(host[t], element * sizes[t]);
        }
    }
    float fa = (float)alpha, fb = (float)beta;
    switch (kind) {
    case 0: status = cublasSgemm_v2(handle, ta, tb, m, n, k, &fa, dev[0], lda, dev[1], ldb, &fb, dev[2], ldc); break;
    case 1: status = cublasDgemm_v2(handle, ta, tb, m, n, k, &alpha, dev[0], lda, dev[1], ldb, &beta, dev[2], ldc); break;
    case 2:
        status = cublasGemmEx(handle, ta, tb, m, n, k, &fa, dev[0], R_32F, lda, dev[1], R_32F, ldb, &fb, dev[2], R_32F,
                              ldc, COMPUTE_32F, -1);
        break;
    case 3:
        status = cublasSgemmStridedBatched(handle, ta, tb, m, n, k, &fa, dev[0], lda, sa, dev[1], ldb, sb, &fb, dev[2],
                                           ldc, sc, batch);
        break;
    case 4:
        status = cublasDgemmStridedBatched(handle, ta, tb, m, n, k, &alpha, dev[0], lda, sa, dev[1], ldb, sb, &beta,
                                           dev[2], ldc, sc, batch);
        break;
    default:
        status = cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, &fa, dev[0], R_32F, lda, sa, dev[1], R_32F, ldb,
                                            sb, &fb, dev[2], R_32F, ldc, sc, batch, COMPUTE_32F, -1);
    }
    int ok = status == 0;
    if (single) {
        float *f = malloc(sizeof(float) * size_c);
        cudaMemcpy(f, dev[2], element * size_c, TO_HOST);
        for (int i = 0; i < size_c; i++) ok = ok && fabs(f[i] - expect[i]) < 1e-4;
        free(f);
    } else {
        double *d = malloc(sizeof(double) * size_c);
        cudaMemcpy(d, dev[2], element * size_c, TO_HOST);
        for (int i = 0; i < size_c; i++) ok = ok && fabs(d[i] - expect[i]) < 1e-12;
        free(d);
    }
    report(name, status, ok);
    for (int t = 0; t < 3; t++) cudaFree(dev[t]);
    free(a), free(b), free(c), free(expect);
}

static void vectors(cublasHandle_t handle) {
    enum { M = 6, N = 4, LDA = 8 };
    float a[LDA * N], x[M * 2], y[M * 2], yt[N];
    double da[LDA * N], dx[N], dy[M];
    for (int i = 0; i < LDA * N; i++) a[i] = (float)value(4, i), da[i] = value(4, i);
    for (int i = 0; i < M * 2; i++) x[i] = (float)value(5, i), y[i] = (float)value(6, i);
    for (int i = 0; i < N; i++) dx[i] = value(5, i), yt[i] = (float)value(7, i);
    for (int i = 0; i < M; i++) dy[i] = value(6, i);
    float alpha = 2.0f, beta = 0.5f, got[M * 2];
    double dalpha = 2.0, dbeta = 0.5, dgot[M];
    float *d_a = upload(a, sizeof a), *d_x = upload(x, sizeof x), *d_y = upload(y, sizeof y), *d_yt = upload(yt, sizeof yt);
    double *d_da = upload(da, sizeof da), *d_dx = upload(dx, sizeof dx), *d_dy = upload(dy, sizeof dy);
    /* gemv, no transpose: y (M, step 2) = alpha A x (N, step 2) + beta y */
    int status = cublasSgemv_v2(handle, N_OP, M, N, &alpha, d_a, LDA, d_x, 2, &beta, d_y, 2), ok = status == 0;
    cudaMemcpy(got, d_y, sizeof got, TO_HOST);
    for (int i = 0; i < M; i++) {
        double sum = 0;
        for (int l = 0; l < N; l++) sum += (double)a[i + l * LDA] * x[l * 2];
        ok = ok && fabs(got[i * 2] - (alpha * sum + beta * y[i * 2])) < 1e-4 && got[i * 2 + 1] == y[i * 2 + 1];
    }
    report("sgemv_n", status, ok);
    /* gemv, transposed: yt (N) = alpha A^T x (M) + beta yt */
    status = cublasSgemv_v2(handle, T_OP, M, N, &alpha, d_a, LDA, d_x, 1, &beta, d_yt, 1), ok = status == 0;
    float gt[N];
    cudaMemcpy(gt, d_yt, sizeof gt, TO_HOST);
    for (int j = 0; j < N; j++) {
        double sum = 0;
        for (int l = 0; l < M; l++) sum += (double)a[l + j * LDA] * x[l];
        ok = ok && fabs(gt[j] - (alpha * sum + beta * yt[j])) < 1e-4;
    }
    report("sgemv_t", status, ok);
    status = cublasDgemv_v2(handle, N_OP, M, N, &dalpha, d_da, LDA, d_dx, 1, &dbeta, d_dy, 1), ok = status == 0;
    cudaMemcpy(dgot, d_dy, sizeof dgot, TO_HOST);
    for (int i = 0; i < M; i++) {
        double sum = 0;
        for (int l = 0; l < N; l++) sum += da[i + l * LDA] * dx[l];
        ok = ok && fabs(dgot[i] - (dalpha * sum + dbeta * dy[i])) < 1e-12;
    }
    report("dgemv", status, ok);
    /* axpy, scal, dot on fresh copies of x and y */
    cudaMemcpy(d_x, x, sizeof x, TO_DEVICE), cudaMemcpy(d_y, y, sizeof y, TO_DEVICE);
    status = cublasSaxpy_v2(handle, M, &alpha, d_x, 2, d_y, 2), ok = status == 0;
    cudaMemcpy(got, d_y, sizeof got, TO_HOST);
    for (int i = 0; i < M * 2; i++) ok = ok && fabs(got[i] - (i % 2 == 0 ? alpha * x[i] + y[i] : y[i])) < 1e-5;
    report("saxpy", status, ok);
    status = cublasSscal_v2(handle, M * 2, &beta, d_x, 1), ok = status == 0;
    cudaMemcpy(got, d_x, sizeof got, TO_HOST);
    for (int i = 0; i < M * 2; i++) ok = ok && fabs(got[i] - beta * x[i]) < 1e-6;
    report("sscal", status, ok);
    cudaMemcpy(d_x, x, sizeof x, TO_DEVICE), cudaMemcpy(d_y, y, sizeof y, TO_DEVICE);
    double dot = 0;
    for (int i = 0; i < M * 2; i++) dot += (double)x[i] * y[i];
    float result = 0;
    status = cublasSdot_v2(handle, M * 2, d_x, 1, d_y, 1, &result);
    report("sdot_host", status, status == 0 && fabs(result - dot) < 1e-4);
    /* device pointer mode: the dot into device memory, alpha and beta of a GEMV read from it */
    float *d_result = device(sizeof(float)), scalars[2] = {alpha, beta}, *d_scalars = upload(scalars, sizeof scalars);
    status = cublasSetPointerMode_v2(handle, 1);
    int mode = -1;
    cublasGetPointerMode_v2(handle, &mode);
    if (status == 0) status = cublasSdot_v2(handle, M * 2, d_x, 1, d_y, 1, d_result);
    result = 0;
    cudaMemcpy(&result, d_result, sizeof result, TO_HOST);
    report("sdot_device", status, status == 0 && mode == 1 && fabs(result - dot) < 1e-4);
    cudaMemcpy(d_yt, yt, sizeof yt, TO_DEVICE);
    status = cublasSgemv_v2(handle, T_OP, M, N, d_scalars, d_a, LDA, d_x, 1, d_scalars + 1, d_yt, 1), ok = status == 0;
    cudaMemcpy(gt, d_yt, sizeof gt, TO_HOST);
    for (int j = 0; j < N; j++) {
        double sum = 0;
        for (int l = 0; l < M; l++) sum += (double)a[l + j * LDA] * x[l];
        ok = ok && fabs(gt[j] - (alpha * sum + beta * yt[j])) < 1e-4;
    }
    report("sgemv_device_scalars", status, ok);
    cublasSetPointerMode_v2(handle, 0);
    cudaFree(d_a), cudaFree(d_x), cudaFree(d_y), cudaFree(d_yt), cudaFree(d_da), cudaFree(d_dx), cudaFree(d_dy);
    cudaFree(d_result), cudaFree(d_scalars);
}

/* Set/GetMatrix with leading dimensions on both sides, Set/GetVector with increments. */
static void copies(void) {
    enum { ROWS = 3, COLS = 4, LDA = 5, LDB = 7 };
    double a[LDA * COLS], back[LDA * COLS], zeros[LDB * COLS] = {0};
    for (int i = 0; i < LDA * COLS; i++) a[i] = value(8, i), back[i] = -7;
    double *d_b = upload(zeros, sizeof zeros);
    int set = cublasSetMatrix(ROWS, COLS, sizeof(double), a, LDA, d_b, LDB);
    int get = cublasGetMatrix(ROWS, COLS, sizeof(double), d_b, LDB, back, LDA);
    double whole[LDB * COLS];
    cudaMemcpy(whole, d_b, sizeof whole, TO_HOST);
    int ok = set == 0 && get == 0;
    for (int j = 0; j < COLS; j++)
        for (int i = 0; i < LDA; i++) {
            ok = ok && back[i + j * LDA] == (i < ROWS ? a[i + j * LDA] : -7);
            if (i < LDB) ok = ok && whole[i + j * LDB] == (i < ROWS ? a[i + j * LDA] : 0);
        }
    report("setget_matrix", set != 0 ? set : get, ok);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[4] = {0}, dev[8];
    float *d_x = upload((float[8]){0}, sizeof x);
    set = cublasSetVector(4, sizeof(float), x, 2, d_x, 2);
    get = cublasGetVector(4, sizeof(float), d_x, 2, out, 1);
    cudaMemcpy(dev, d_x, sizeof dev, TO_HOST);
    ok = set == 0 && get == 0;
    for (int i = 0; i < 4; i++) ok = ok && out[i] == x[2 * i] && dev[2 * i] == x[2 * i] && dev[2 * i + 1] == 0;
    report("setget_vector", set != 0 ? set : get, ok);
    cudaFree(d_b), cudaFree(d_x);
}

static int blas(void) {
    cublasHandle_t handle = NULL;
    int status = cublasCreate_v2(&handle), version = 0, major = 0;
    printf("blas create=%d", status);
    if (status != 0) return printf("\n"), 1;
    status = cublasGetVersion_v2(handle, &version);
    int property = cublasGetProperty(0, &major);
    report("version", status, status == 0 && property == 0 && version / 10000 == major && major >= 12);
    int math = -1;
    status = cublasSetMathMode(handle, 3 /* CUBLAS_TF32_TENSOR_OP_MATH */);
    cublasGetMathMode(handle, &math);
    report("math_mode", status, math == 3);
    cublasSetMathMode(handle, 0);
    void *workspace = device(1 << 20);
    status = cublasSetWorkspace_v2(handle, workspace, 1 << 20);
    report("workspace", status, status == 0);
    report("status_name", 0, strcmp(cublasGetStatusName(15), "CUBLAS_STATUS_NOT_SUPPORTED") == 0 &&
                                 strlen(cublasGetStatusString(7)) > 0);
    gemm_case(handle, "sgemm_nn", 0, N_OP, N_OP, 1);
    gemm_case(handle, "sgemm_tt", 0, T_OP, T_OP, 1);
    gemm_case(handle, "dgemm_nt", 1, N_OP, T_OP, 1);
    gemm_case(handle, "dgemm_tn", 1, T_OP, N_OP, 1);
    gemm_case(handle, "gemmex", 2, T_OP, N_OP, 1);
    gemm_case(handle, "sgemm_strided", 3, N_OP, T_OP, 3);
    gemm_case(handle, "dgemm_strided", 4, T_OP, T_OP, 2);
    gemm_case(handle, "gemmex_strided", 5, N_OP, N_OP, 4);
    cudaStream_t stream = NULL, got = NULL;
    cudaStreamCreate(&stream);
    status = cublasSetStream_v2(handle, stream);
    cublasGetStream_v2(handle, &got);
    report("stream", status, status == 0 && got == stream);
    gemm_case(handle, "sgemm_on_stream", 0, N_OP, N_OP, 1);
    cudaStreamSynchronize(stream);
    vectors(handle);
    copies();
    cudaFree(workspace);
    report("destroy", cublasDestroy_v2(handle), 1);
    printf("\n");
    return 0;
}

/* SGEMM of 2x2 matrices at a, b, c (device pointers): its status. */
static int small_gemm(cublasHandle_t handle, float *a, float *b, float *c, int m) {
    float alpha = 1, beta = 0;
    return cublasSgemm_v2(handle, N_OP, N_OP, m, 2, 2, &alpha, a, m, b, 2, &beta, c, m);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "blas";
    if (strcmp(mode, "blas") == 0) return blas();
    cublasHandle_t handle = NULL;
    float values[4] = {1, 2, 3, 4}, result[4] = {0};
    float *a = upload(values, sizeof values), *b = upload(values, sizeof values), *c = device(sizeof values);
    if (strcmp(mode, "forged") == 0 && argc > 2) { /* before a handle of its own (the server's may be at the same address) */
        cublasHandle_t other = (cublasHandle_t)(uintptr_t)strtoull(argv[2], NULL, 16);
        printf("forged %d\n", small_gemm(other, a, b, c, 2));
    }
    int status = cublasCreate_v2(&handle);
    if (strcmp(mode, "create") == 0) return printf("create %d\n", status), 0;
    if (status != 0) return printf("create failed %d\n", status), 1;
    if (strcmp(mode, "refused") == 0) {
        float c = 1, s = 0;
        int first = cublasSrot_v2(handle, 0, NULL, 1, NULL, 1, &c, &s), second = cublasSrot_v2(handle, 0, NULL, 1, NULL, 1, &c, &s);
        printf("refused %d %d\n", first, second);
        return 0;
    }
    if (strcmp(mode, "hold") == 0) {
        printf("handle %p\n", (void *)handle);
        sleep(60);
        return 0;
    }
    if (strcmp(mode, "forged") == 0) {
        status = small_gemm(handle, a, b, c, 2);
        cudaMemcpy(result, c, sizeof result, TO_HOST);
        /* [1 3; 2 4] squared, column-major: 7 10 15 22 */
        printf("own %d:%s\n", status, result[0] == 7 && result[1] == 10 && result[2] == 15 && result[3] == 22 ? "ok" : "BAD");
        return 0;
    }
    if (strcmp(mode, "outside") == 0) {
        float *stray = (float *)((char *)c + (1 << 20)); /* past every allocation of this program */
        int past_end = small_gemm(handle, a, b, c, 3);  /* C of 3 rows: 24 bytes past the 16 allocated */
        int beyond = small_gemm(handle, a, b, stray, 2);
        int unknown = small_gemm(handle, (float *)0x1000, b, c, 2);
        float alpha = 1;
        int dot_scalar = cublasSetPointerMode_v2(handle, 1);
        int scal = cublasSscal_v2(handle, 2, stray, a, 1); /* device alpha outside */
        (void)alpha;
        printf("outside %d %d %d %d %d\n", past_end, beyond, unknown, dot_scalar, scal);
        cublasSetPointerMode_v2(handle, 0);
        status = small_gemm(handle, a, b, c, 2);
        cudaMemcpy(result, c, sizeof result, TO_HOST);
        printf("after %d:%s\n", status, result[0] == 7 && result[3] == 22 ? "ok" : "BAD");
        return 0;
    }
    if (strcmp(mode, "late") == 0) {
        float *stray = (float *)((char *)c + (1 << 20));
        float alpha = 1, beta = 0;
        int beyond = small_gemm(handle, a, b, stray, 2);         /* sent: no answer yet */
        int device_sync = cudaDeviceSynchronize();               /* its fault */
        int clean_sync = cudaDeviceSynchronize();                /* reported once */
        int past_end = small_gemm(handle, a, b, c, 3);
        int stream_sync = cudaStreamSynchronize(NULL);
        int unknown = small_gemm(handle, (float *)0x1000, b, c, 2);
        int blas_after = cublasSetMathMode(handle, 0);           /* an answered cuBLAS call: not run */
        /* refused at once, in the client, as cuBLAS does: nothing is sent */
        int negative = cublasSgemm_v2(handle, N_OP, N_OP, -1, 2, 2, &alpha, a, 2, b, 2, &beta, c, 2);
        int transpose = cublasSgemm_v2(handle, 5, N_OP, 2, 2, 2, &alpha, a, 2, b, 2, &beta, c, 2);
        int leading = cublasSgemm_v2(handle, N_OP, N_OP, 2, 2, 2, &alpha, a, 1, b, 2, &beta, c, 2);
        int increment = cublasSgemv_v2(handle, N_OP, 2, 2, &alpha, a, 2, b, 0, &beta, c, 1);
        int never = small_gemm((cublasHandle_t)(uintptr_t)0x1234, a, b, c, 2);
        cublasHandle_t gone = NULL;
        cublasCreate_v2(&gone);
        cublasDestroy_v2(gone);
        int destroyed = small_gemm(gone, a, b, c, 2);
        int quiet_sync = cudaDeviceSynchronize();
        int device_mode = cublasSetPointerMode_v2(handle, 1);
        int scal = cublasSscal_v2(handle, 2, stray, a, 1);       /* device alpha outside */
        int scal_sync = cudaDeviceSynchronize();
        cublasSetPointerMode_v2(handle, 0);
        printf("late %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d\n", beyond, device_sync, clean_sync, past_end,
               stream_sync, unknown, blas_after, negative, transpose, leading, increment, never, destroyed, quiet_sync,
               device_mode, scal, scal_sync);
        status = small_gemm(handle, a, b, c, 2);
        int copied = cudaMemcpy(result, c, sizeof result, TO_HOST);
        printf("after %d:%s\n", status | copied, result[0] == 7 && result[3] == 22 ? "ok" : "BAD");
        return 0;
    }
    printf("unknown mode %s\n", mode);
    return 2;
}
