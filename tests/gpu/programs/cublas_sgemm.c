/*
 * One SGEMM of N x N (argv[1]) through whichever libcudart.so.12 and libcublas.so.12 the loader
 * finds (NVIDIA's on the GPU's own machine, gpupool's through the GPU client): C = A B with
 * deterministic A and B, written to argv[2] as N * N floats, column-major. Prints
 * "timing create_ms upload_ms gemm_ms download_ms" (gemm: the call and a device synchronize, the
 * best of 5 runs after one warm-up). For tests/gpu/test_remote_cublas_gpu.py; no NVIDIA header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct cublasContext *cublasHandle_t;
int cudaMalloc(void **pointer, size_t bytes);
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
int cudaDeviceSynchronize(void);
int cudaFree(void *pointer);
int cublasCreate_v2(cublasHandle_t *handle);
int cublasDestroy_v2(cublasHandle_t handle);
int cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a, int lda,
                   const float *b, int ldb, const float *beta, float *c, int ldc);

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: cublas_sgemm N OUT\n"), 2;
    int n = atoi(argv[1]);
    size_t bytes = sizeof(float) * (size_t)n * (size_t)n;
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes), *da, *db, *dc, alpha = 1, beta = 0;
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
        a[i] = (float)((i * 7919u) % 2001u) / 1000.0f - 1.0f;
        b[i] = (float)((i * 104729u) % 2003u) / 1000.0f - 1.0f;
    }
    double start = now_ms();
    cublasHandle_t handle;
    int status = cublasCreate_v2(&handle);
    if (status != 0) return printf("create %d\n", status), 1;
    double created = now_ms();
    if (cudaMalloc((void **)&da, bytes) || cudaMalloc((void **)&db, bytes) || cudaMalloc((void **)&dc, bytes))
        return printf("cudaMalloc failed\n"), 1;
    cudaMemcpy(da, a, bytes, 1), cudaMemcpy(db, b, bytes, 1);
    cudaDeviceSynchronize();
    double uploaded = now_ms(), best = 1e30;
    for (int run = 0; run < 6; run++) {
        double before = now_ms();
        status = cublasSgemm_v2(handle, 0, 0, n, n, n, &alpha, da, n, db, n, &beta, dc, n);
        int synced = cudaDeviceSynchronize();
        if (status != 0 || synced != 0) return printf("sgemm %d %d\n", status, synced), 1;
        if (run > 0 && now_ms() - before < best) best = now_ms() - before;
    }
    double fetched = now_ms();
    cudaMemcpy(c, dc, bytes, 2);
    double done = now_ms();
    FILE *out = fopen(argv[2], "wb");
    if (out == NULL || fwrite(c, 1, bytes, out) != bytes || fclose(out) != 0) return printf("cannot write\n"), 1;
    printf("timing %.3f %.3f %.3f %.3f\n", created - start, uploaded - created, best, done - fetched);
    cudaFree(da), cudaFree(db), cudaFree(dc), cublasDestroy_v2(handle);
    return 0;
}
