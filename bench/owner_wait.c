/*
 * One allocation, timed, for bench/owner_wait.py: allocate MIB on card 0 and print
 * "<CUresult> <nanoseconds>"; with "hold", keep it until stdin closes (a container holding memory).
 * Usage: owner_wait MIB [hold]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 3;
    CUdeviceptr pointer;
    double start = now_ns();
    CUresult rc = cuMemAlloc_v2(&pointer, (size_t)strtoull(argv[1], NULL, 10) << 20);
    printf("%d %.0f\n", (int)rc, now_ns() - start);
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "hold") == 0) {
        char buffer[64];
        while (fgets(buffer, sizeof buffer, stdin) != NULL) {
        }
    }
    if (rc == CUDA_SUCCESS) cuMemFree_v2(pointer);
    return 0;
}
