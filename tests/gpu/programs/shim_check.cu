// A real CUDA program for the interception library's GPU tests (runtime API: the runtime reaches the
// driver through cuGetProcAddress, so this checks the lookup hooks against NVIDIA's own driver).
// Usage: shim_check memory | graph | pool | spin MILLISECONDS COUNT | spinsync MILLISECONDS COUNT EVERY
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static int memory() {
    size_t free = 0, total = 0;
    int info = (int)cudaMemGetInfo(&free, &total); // before the printf: its arguments have no order
    printf("info %d %zu %zu\n", info, free, total);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    printf("alloc3g %d\n", (int)cudaMalloc(&a, (size_t)3 << 30));
    printf("alloc2g %d\n", (int)cudaMalloc(&b, (size_t)2 << 30));
    cudaFree(a);
    printf("alloc2g_after_free %d\n", (int)cudaMalloc(&b, (size_t)2 << 30));
    printf("async3g %d\n", (int)cudaMallocAsync(&c, (size_t)3 << 30, 0));
    cudaDeviceSynchronize();
    return 0;
}

// Graph memory nodes count from their creation (4 GiB limit: 3 GiB fits, 2 GiB more does not) until
// their graph is destroyed.
static int graph() {
    cudaGraph_t g = nullptr;
    printf("create %d\n", (int)cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams params = {};
    params.poolProps.allocType = cudaMemAllocationTypePinned;
    params.poolProps.location.type = cudaMemLocationTypeDevice;
    params.poolProps.location.id = 0;
    params.bytesize = (size_t)3 << 30;
    cudaGraphNode_t first = nullptr, second = nullptr;
    printf("node3g %d\n", (int)cudaGraphAddMemAllocNode(&first, g, nullptr, 0, &params));
    params.bytesize = (size_t)2 << 30;
    printf("node2g %d\n", (int)cudaGraphAddMemAllocNode(&second, g, nullptr, 0, &params));
    void *p = nullptr;
    printf("alloc2g %d\n", (int)cudaMalloc(&p, (size_t)2 << 30));
    printf("destroy %d\n", (int)cudaGraphDestroy(g));
    printf("alloc2g_after_destroy %d\n", (int)cudaMalloc(&p, (size_t)2 << 30));
    return 0;
}

// A pool cannot be told to keep freed memory while a memory limit is in force.
static int pool() {
    cudaMemPool_t mem_pool = nullptr;
    cudaDeviceGetDefaultMemPool(&mem_pool, 0);
    unsigned long long keep = ~0ull, seen = 1;
    int set = (int)cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep);
    int get = (int)cudaMemPoolGetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &seen);
    printf("threshold %d %d %llu\n", set, get, seen);
    return 0;
}

static int spin_for(int milliseconds, int count) {
    int rate_khz = 0;
    cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)rate_khz * milliseconds;
    for (int i = 0; i < count; i++) spin<<<1, 32>>>(cycles);
    printf("spin %d\n", (int)cudaDeviceSynchronize());
    return 0;
}

// Like spin, with a synchronisation every `every` launches: a workload that never queues far ahead.
static int spin_synced(int milliseconds, int count, int every) {
    int rate_khz = 0;
    cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)rate_khz * milliseconds;
    for (int i = 0; i < count; i++) {
        spin<<<1, 32>>>(cycles);
        if ((i + 1) % every == 0) cudaDeviceSynchronize();
    }
    printf("spin %d\n", (int)cudaDeviceSynchronize());
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "memory") == 0) return memory();
    if (argc >= 2 && strcmp(argv[1], "graph") == 0) return graph();
    if (argc >= 2 && strcmp(argv[1], "pool") == 0) return pool();
    if (argc >= 4 && strcmp(argv[1], "spin") == 0) return spin_for(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 5 && strcmp(argv[1], "spinsync") == 0)
        return spin_synced(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: shim_check memory | graph | pool | spin MILLISECONDS COUNT | spinsync MS COUNT EVERY\n");
    return 2;
}
