/*
 * A share of two cards seen through the GPU client (tests/remote/test_remote_multicard.py): one line
 * per check, "name value..." so the test compares the whole output. Argument: the booked MiB per card.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef struct {
    char bytes[16];
} CUuuid;

CUresult cuInit(unsigned int);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetUuid(CUuuid *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyPeer(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);

static const char image[] = "gpupool-standin-module\nvector_add\nscale\n";

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        CUresult status_ = (call);                                                                       \
        if (status_ != 0) {                                                                              \
            printf("error %d at %s\n", status_, #call);                                                  \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

int main(int argc, char **argv) {
    size_t booked = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20, free_bytes, total;
    int count = 0;
    CUdevice device, bad;
    CUcontext context[2];
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    printf("count %d third %d\n", count, cuDeviceGet(&bad, 2));
    CUuuid uuid[2];
    for (int i = 0; i < 2; i++) {
        CHECK(cuDeviceGet(&device, i));
        CHECK(cuDeviceGetUuid(&uuid[i], device));
        CHECK(cuDevicePrimaryCtxRetain(&context[i], device));
    }
    printf("uuids differ %d\n", memcmp(uuid[0].bytes, uuid[1].bytes, 16) != 0);
    /* Each card holds the whole booked share: all of it on device 0, then all of it on device 1. */
    CUdeviceptr whole[2], more;
    for (int i = 0; i < 2; i++) {
        CHECK(cuCtxSetCurrent(context[i]));
        CHECK(cuCtxGetDevice(&device));
        CHECK(cuMemAlloc_v2(&whole[i], booked));
        CUresult over = cuMemAlloc_v2(&more, 1 << 20);
        CHECK(cuMemGetInfo_v2(&free_bytes, &total));
        printf("device %d alloc whole 0 one more %d free %zu total %zu\n", device, over, free_bytes, total);
    }
    CHECK(cuCtxSetCurrent(context[0]));
    CHECK(cuMemFree_v2(whole[0]));
    CHECK(cuMemGetInfo_v2(&free_bytes, &total));
    printf("device 0 after free: free %zu\n", free_bytes);
    CHECK(cuCtxSetCurrent(context[1]));
    CHECK(cuMemGetInfo_v2(&free_bytes, &total));
    printf("device 1 still: free %zu\n", free_bytes);
    CHECK(cuMemFree_v2(whole[1]));
    /* A vector add on device 1. */
    unsigned n = 1000;
    float a[1000], b[1000], c[1000];
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, b[i] = 2.0f * (float)i, c[i] = -1;
    CUmodule module;
    CUfunction add;
    CUdeviceptr da, db, dc;
    CHECK(cuModuleLoadData(&module, image));
    CHECK(cuModuleGetFunction(&add, module, "vector_add"));
    CHECK(cuMemAlloc_v2(&da, 4ull * n));
    CHECK(cuMemAlloc_v2(&db, 4ull * n));
    CHECK(cuMemAlloc_v2(&dc, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(da, a, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(db, b, 4ull * n));
    void *params[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH_v2(c, dc, 4ull * n));
    CHECK(cuCtxGetDevice(&device));
    printf("vector_add on device %d c[999]=%g\n", device, (double)c[999]);
    CHECK(cuCtxSetCurrent(context[0]));
    printf("peer copy %d\n", cuMemcpyPeer(da, context[0], dc, context[1], 4));
    return 0;
}
