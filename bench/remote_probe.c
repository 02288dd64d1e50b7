/*
 * A CUDA driver API program for the remote GPU's tests and benchmark (tests/remote, bench/remote.py):
 * linked against whichever libcuda.so.1 is on LD_LIBRARY_PATH (the GPU client, or the stand-in
 * driver directly). Its kernels are the stand-in driver's built-ins, loaded from the stand-in's
 * module image, or, with REMOTE_PROBE_PTX naming bench/remote_probe_kernels.ptx, the same kernels as
 * PTX for a real GPU (tests/gpu). Every mode prints one line saying what happened.
 *
 *   remote_probe vector_add N    a vector add and a scale whose results are read back and checked
 *                                (PROBE_PINNED=1: its host buffers from cuMemAllocHost)
 *   remote_probe vector_add_per_line N   say "connected", then the vector add on its one connection
 *                                for each line read from stdin, until stdin ends
 *   remote_probe hold MIB        allocate MIB MiB, say "held", sleep until killed
 *   remote_probe alloc MIB       try to allocate MIB MiB: "alloc <CUresult> free <bytes> total <bytes>"
 *   remote_probe copy_loop MIB   copy MIB MiB to the device and back until a call fails:
 *                                "error <CUresult> after <ms> ms" (time since the failing call began)
 *   remote_probe wait_loop       synchronise every 10 ms until a call fails: "error <CUresult>"
 *   remote_probe launch_for MS   launch the scale kernel for MS milliseconds (a synchronisation every
 *                                20 launches): "launched <count>"
 *   remote_probe lookup          entry points through cuGetProcAddress_v2: "lookup <alloc status> <unknown status>"
 *   remote_probe bench CALLS MIB LAUNCHES   one JSON line of figures
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuDriverGetVersion(int *);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

static const char image[] = "gpupool-standin-module\nvector_add\nscale\n";

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        CUresult status_ = (call);                                                                       \
        if (status_ != 0) {                                                                              \
            printf("error %d at %s\n", status_, #call);                                                  \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static CUfunction add, scale;

static int setup(void) {
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuCtxCreate_v2(&context, 0, device));
    const char *ptx_path = getenv("REMOTE_PROBE_PTX");
    if (ptx_path != NULL && *ptx_path != '\0') { /* a real GPU: the kernels as PTX text */
        FILE *file = fopen(ptx_path, "rb");
        if (file == NULL) {
            printf("error cannot open %s\n", ptx_path);
            return 1;
        }
        static char ptx[1 << 16];
        size_t length = fread(ptx, 1, sizeof ptx - 1, file);
        fclose(file);
        ptx[length] = '\0';
        CHECK(cuModuleLoadData(&module, ptx));
    } else {
        CHECK(cuModuleLoadData(&module, image));
    }
    CHECK(cuModuleGetFunction(&add, module, "vector_add"));
    CHECK(cuModuleGetFunction(&scale, module, "scale"));
    return 0;
}

static float *host_buffer(size_t bytes) {
    void *pointer = NULL;
    if (getenv("PROBE_PINNED") == NULL) return malloc(bytes);
    return cuMemAllocHost_v2(&pointer, bytes) == 0 ? pointer : NULL;
}

static int vector_add(unsigned n) {
    float *a = host_buffer(4ull * n), *b = host_buffer(4ull * n), *c = host_buffer(4ull * n);
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, b[i] = 2.0f * (float)i, c[i] = -1;
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc_v2(&da, 4ull * n));
    CHECK(cuMemAlloc_v2(&db, 4ull * n));
    CHECK(cuMemAlloc_v2(&dc, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(da, a, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(db, b, 4ull * n));
    void *params[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    /* scale by 0.5 with the parameters packed by the caller (the extra buffer) */
    struct {
        CUdeviceptr x;
        float factor;
        unsigned n;
    } packed = {dc, 0.5f, n};
    size_t size = sizeof packed;
    void *extra[] = {(void *)1, &packed, (void *)2, &size, NULL};
    CHECK(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH_v2(c, dc, 4ull * n));
    for (unsigned i = 0; i < n; i++) {
        if (c[i] != 1.5f * (float)i) {
            printf("wrong c[%u] = %g, expected %g\n", i, c[i], 1.5f * (float)i);
            return 1;
        }
    }
    CHECK(cuMemFree_v2(da));
    CHECK(cuMemFree_v2(db));
    CHECK(cuMemFree_v2(dc));
    printf("ok vector_add %u c[%u]=%g\n", n, n - 1, c[n - 1]);
    if (getenv("PROBE_PINNED") != NULL) {
        CHECK(cuMemFreeHost(a));
        CHECK(cuMemFreeHost(b));
        CHECK(cuMemFreeHost(c));
    }
    return 0;
}

static int bench(int calls, size_t mib, int launches) {
    double *rtt = malloc(sizeof *rtt * (size_t)calls);
    int version;
    for (int i = 0; i < 100; i++) CHECK(cuDriverGetVersion(&version)); /* warm */
    for (int i = 0; i < calls; i++) {
        double start = now_us();
        CHECK(cuDriverGetVersion(&version));
        rtt[i] = now_us() - start;
    }
    qsort(rtt, (size_t)calls, sizeof *rtt, compare);
    size_t bytes = mib << 20;
    unsigned char *host = malloc(bytes);
    memset(host, 7, bytes);
    CUdeviceptr device;
    CHECK(cuMemAlloc_v2(&device, bytes));
    int rounds = 5;
    CHECK(cuMemcpyHtoD_v2(device, host, bytes));
    CHECK(cuCtxSynchronize());
    double start = now_us();
    for (int i = 0; i < rounds; i++) CHECK(cuMemcpyHtoD_v2(device, host, bytes));
    CHECK(cuCtxSynchronize());
    double h2d = rounds * bytes * 8.0 / (now_us() - start) / 1e3; /* Gb/s */
    start = now_us();
    for (int i = 0; i < rounds; i++) CHECK(cuMemcpyDtoH_v2(host, device, bytes));
    double d2h = rounds * bytes * 8.0 / (now_us() - start) / 1e3;
    unsigned n = 1;
    float factor = 1.0f;
    void *params[] = {&device, &factor, &n};
    start = now_us();
    for (int i = 0; i < launches; i++) CHECK(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    double per_s = launches / ((now_us() - start) / 1e6);
    printf("{\"rtt_p50_us\": %.1f, \"rtt_p99_us\": %.1f, \"h2d_gbit_s\": %.2f, \"d2h_gbit_s\": %.2f, "
           "\"copy_mib\": %zu, \"launches_per_s\": %.0f}\n",
           rtt[calls / 2], rtt[calls * 99 / 100], h2d, d2h, mib, per_s);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 2;
    const char *mode = argv[1];
    long value = argc > 2 ? atol(argv[2]) : 0;
    if (setup() != 0) return 1;
    if (strcmp(mode, "vector_add") == 0) return vector_add((unsigned)value);
    if (strcmp(mode, "vector_add_per_line") == 0) { /* one connection, a vector add per line read */
        char line[64];
        printf("connected\n");
        while (fgets(line, sizeof line, stdin) != NULL)
            if (vector_add((unsigned)value) != 0) return 1;
        return 0;
    }
    if (strcmp(mode, "hold") == 0) {
        CUdeviceptr pointer;
        CHECK(cuMemAlloc_v2(&pointer, (size_t)value << 20));
        printf("held %ld\n", value);
        for (;;) pause();
    }
    if (strcmp(mode, "alloc") == 0) {
        CUdeviceptr pointer;
        size_t free_bytes = 0, total = 0;
        CUresult status = cuMemAlloc_v2(&pointer, (size_t)value << 20);
        cuMemGetInfo_v2(&free_bytes, &total);
        printf("alloc %d free %zu total %zu\n", status, free_bytes, total);
        return 0;
    }
    if (strcmp(mode, "copy_loop") == 0) {
        size_t bytes = (size_t)value << 20;
        unsigned char *host = calloc(1, bytes);
        CUdeviceptr device;
        CHECK(cuMemAlloc_v2(&device, bytes));
        printf("copying\n");
        for (;;) {
            double start = now_us();
            CUresult status = cuMemcpyHtoD_v2(device, host, bytes);
            if (status == 0) status = cuMemcpyDtoH_v2(host, device, bytes);
            if (status != 0) {
                printf("error %d after %.0f ms\n", status, (now_us() - start) / 1e3);
                return 0;
            }
        }
    }
    if (strcmp(mode, "wait_loop") == 0) {
        printf("waiting\n");
        for (;;) {
            CUresult status = cuCtxSynchronize();
            if (status != 0) {
                printf("error %d\n", status);
                return 0;
            }
            usleep(10000);
        }
    }
    if (strcmp(mode, "launch_for") == 0) {
        CUdeviceptr device;
        CHECK(cuMemAlloc_v2(&device, 4096));
        unsigned n = 1;
        float factor = 1.0f;
        void *params[] = {&device, &factor, &n};
        long count = 0;
        for (double end = now_us() + value * 1e3; now_us() < end; count++) {
            CHECK(cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
            if (count % 20 == 19) CHECK(cuCtxSynchronize());
        }
        CHECK(cuCtxSynchronize());
        printf("launched %ld\n", count);
        return 0;
    }
    if (strcmp(mode, "lookup") == 0) {
        CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
        CUresult (*unknown)(void) = NULL;
        int found = -1;
        CHECK(cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &found));
        CHECK(cuGetProcAddress_v2("cuGraphAddKernelNode", (void **)&unknown, 12000, 0, &found));
        CUdeviceptr pointer;
        printf("lookup %d %d\n", alloc(&pointer, 4096), unknown());
        return 0;
    }
    if (strcmp(mode, "bench") == 0) return bench((int)value, argc > 3 ? (size_t)atol(argv[3]) : 64,
                                                 argc > 4 ? atoi(argv[4]) : 10000);
    return 2;
}
