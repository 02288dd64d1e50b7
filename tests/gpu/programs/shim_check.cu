// A real CUDA program for the interception library's GPU tests (runtime API: the runtime reaches the
// driver through cuGetProcAddress, so this checks the lookup hooks against NVIDIA's own driver).
// Usage: shim_check memory | spin MILLISECONDS COUNT
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
    printf("info %d %zu %zu\n", (int)cudaMemGetInfo(&free, &total), free, total);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    printf("alloc3g %d\n", (int)cudaMalloc(&a, (size_t)3 << 30));
    printf("alloc2g %d\n", (int)cudaMalloc(&b, (size_t)2 << 30));
    cudaFree(a);
    printf("alloc2g_after_free %d\n", (int)cudaMalloc(&b, (size_t)2 << 30));
    printf("async3g %d\n", (int)cudaMallocAsync(&c, (size_t)3 << 30, 0));
    cudaDeviceSynchronize();
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

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "memory") == 0) return memory();
    if (argc >= 4 && strcmp(argv[1], "spin") == 0) return spin_for(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: shim_check memory | spin MILLISECONDS COUNT\n");
    return 2;
}
