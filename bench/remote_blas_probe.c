/*
 * cuBLAS calls per second for bench/remote.py: a program on gpupool's runtime and cuBLAS (linked to
 * the client's libcudart.so.12 and libcublas.so.12; NVIDIA's ABI declared here, no header) makes
 * COUNT SGEMMs of SIZE x SIZE matrices on one handle, then one cudaDeviceSynchronize, after a warm-up
 * of 100 (the handle made, the connection open). Prints one JSON line, or "error ..." on a failure.
 *
 *   remote_blas_probe COUNT SIZE
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct cublasContext *cublasHandle_t;
int cudaMalloc(void **pointer, size_t bytes);
int cudaDeviceSynchronize(void);
int cublasCreate_v2(cublasHandle_t *handle);
int cublasDestroy_v2(cublasHandle_t handle);
int cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a, int lda,
                   const float *b, int ldb, const float *beta, float *c, int ldc);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* count SGEMMs then one synchronisation: 0, or the first failing status. */
static int gemms(cublasHandle_t handle, int count, int size, float *a, float *b, float *c) {
    float alpha = 1, beta = 0;
    for (int i = 0; i < count; i++) {
        int status = cublasSgemm_v2(handle, 0, 0, size, size, size, &alpha, a, size, b, size, &beta, c, size);
        if (status != 0) return status;
    }
    return cudaDeviceSynchronize();
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 20000, size = argc > 2 ? atoi(argv[2]) : 16;
    size_t bytes = (size_t)size * (size_t)size * sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL;
    cublasHandle_t handle = NULL;
    int status;
    if ((status = cudaMalloc((void **)&a, bytes)) != 0 || (status = cudaMalloc((void **)&b, bytes)) != 0 ||
        (status = cudaMalloc((void **)&c, bytes)) != 0)
        return printf("error cudaMalloc %d\n", status), 1;
    if ((status = cublasCreate_v2(&handle)) != 0) return printf("error cublasCreate %d\n", status), 1;
    if ((status = gemms(handle, 100, size, a, b, c)) != 0) return printf("error warm-up %d\n", status), 1;
    double start = now();
    if ((status = gemms(handle, count, size, a, b, c)) != 0) return printf("error sgemm %d\n", status), 1;
    double seconds = now() - start;
    cublasDestroy_v2(handle);
    printf("{\"sgemm_per_s\": %.0f, \"sgemms\": %d, \"size\": %d}\n", count / seconds, count, size);
    return 0;
}
