/*
 * Per-call cost of the driver calls the interception library wraps, against the stand-in driver
 * (bench/shim.py runs it with and without the library and takes the difference).
 * Usage: shim_bench ALLOCATIONS LAUNCHES LOOKUPS ; prints "alloc_ns A free_ns F launch_ns L lookup_ns K
 * lookup_past_ns P": K per cuGetProcAddress_v2 of four wrapped base names (cuMemAlloc among them) at
 * CUDA 12.8, P per lookup of cuMemAlloc at 13.5 (past the newest version the library's table knows;
 * the stand-in exports a newer cuMemAlloc_v3, so a driver answering with an internal address costs
 * the library one more lookup there: variants.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);

#define ALLOCATION_BYTES 4096

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    static const char *const names[] = {"cuMemAlloc", "cuMemFree", "cuLaunchKernel", "cuMemGetInfo"};
    if (argc != 4) return 2;
    int allocations = atoi(argv[1]), launches = atoi(argv[2]), lookups = atoi(argv[3]);
    CUdeviceptr *pointers = calloc((size_t)allocations, sizeof *pointers);
    CUcontext ctx;
    if (pointers == NULL || cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 3;
    double start = now_ns();
    for (int i = 0; i < allocations; i++)
        if (cuMemAlloc_v2(&pointers[i], ALLOCATION_BYTES) != CUDA_SUCCESS) return 4;
    double allocated = now_ns();
    for (int i = 0; i < allocations; i++)
        if (cuMemFree_v2(pointers[i]) != CUDA_SUCCESS) return 5;
    double freed = now_ns();
    for (int i = 0; i < launches; i++)
        if (cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) return 6;
    double launched = now_ns();
    void *pfn;
    CUdriverProcAddressQueryResult status;
    for (int i = 0; i < lookups; i++)
        if (cuGetProcAddress_v2(names[i % 4], &pfn, 12080, 0, &status) != CUDA_SUCCESS) return 7;
    double looked_up = now_ns();
    for (int i = 0; i < lookups; i++)
        if (cuGetProcAddress_v2("cuMemAlloc", &pfn, 13050, 0, &status) != CUDA_SUCCESS) return 8;
    double looked_up_past = now_ns();
    printf("alloc_ns %.1f free_ns %.1f launch_ns %.1f lookup_ns %.1f lookup_past_ns %.1f\n",
           (allocated - start) / allocations, (freed - allocated) / allocations, (launched - freed) / launches,
           (looked_up - launched) / lookups, (looked_up_past - looked_up) / lookups);
    free(pointers);
    return 0;
}
