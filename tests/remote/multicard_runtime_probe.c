/*
 * gpupool's CUDA runtime over a remote share of two cards (tests/remote/test_remote_multicard.py):
 * cudaGetDeviceCount, cudaSetDevice per device, an allocation of the whole share on each device and
 * cudaMemGetInfo per current device. Argument: the booked MiB per card. One line per check.
 * Argument "kernels": a fatbin registered as nvcc's host code registers it (the stand-in's image:
 * vector_add and a 64-byte global "table") used on device 0, then on device 1, then on device 0
 * again, and a reset of device 1 (docs/remote-gpu.md: loaded per device).
 * Argument "pointers": cudaPointerGetAttributes, with device 0 current, of device 1's cudaMalloc
 * memory, of cudaMallocHost memory made while device 1 was current and of a registered variable's
 * address on device 1: "pointers <what> <status> <type> <device> ..." (NVIDIA's rule: device memory
 * is of its device, host memory of the device current at its allocation).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaMemGetInfo(size_t *, size_t *);
cudaError_t cudaMemcpy(void *, const void *, size_t, int);
cudaError_t cudaMemcpyToSymbol(const void *, const void *, size_t, size_t, int);
cudaError_t cudaMemcpyFromSymbol(void *, const void *, size_t, size_t, int);
cudaError_t cudaGetSymbolAddress(void **, const void *);
cudaError_t cudaFuncGetAttributes(void *, const void *);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaFreeHost(void *);
struct pointer_attributes { /* struct cudaPointerAttributes of CUDA 12 */
    int type, device;
    void *device_pointer, *host_pointer;
};
cudaError_t cudaPointerGetAttributes(struct pointer_attributes *, const void *);
typedef struct {
    unsigned x, y, z;
} dim3;
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
void **__cudaRegisterFatBinary(void *);
void __cudaRegisterFatBinaryEnd(void **);
void __cudaUnregisterFatBinary(void **);
void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *);
void __cudaRegisterVar(void **, char *, char *, const char *, int, size_t, int, int);
#define H2D 1
#define D2H 2
#define N 1000u

static const char image[] = "gpupool-standin-module\nvector_add\nglobal table 64\n";
static struct {
    unsigned magic, version;
    const void *data, *unused;
} wrapper = {0x466243b1u, 1, image, NULL};
static void vector_add_stub(void) {}
static char table_shadow[64];
static float a[N], b[N], c[N];
static float *da[2], *db[2], *dc[2];

/* vector_add on the current device's buffers of device d: status of the first failing call, ok 1
 * when c = a + b came back. */
static cudaError_t add_on(int d, int *ok) {
    unsigned n = N;
    void *args[] = {&da[d], &db[d], &dc[d], &n};
    dim3 grid = {4, 1, 1}, block = {256, 1, 1};
    memset(c, 0, sizeof c);
    cudaError_t s = cudaMemcpy(dc[d], c, sizeof c, H2D);
    if (s == 0) s = cudaLaunchKernel((const void *)vector_add_stub, grid, block, args, 0, NULL);
    if (s == 0) s = cudaMemcpy(c, dc[d], sizeof c, D2H);
    *ok = s == 0;
    for (unsigned i = 0; *ok && i < N; i++) *ok = c[i] == a[i] + b[i];
    return s;
}

/* The table on the current device: filled with value, read back whole; 1 when it came back. */
static int table_holds(unsigned char value, int fill) {
    unsigned char src[64], back[64];
    memset(src, value, sizeof src), memset(back, 0, sizeof back);
    if (fill && cudaMemcpyToSymbol(table_shadow, src, sizeof src, 0, H2D) != 0) return 0;
    return cudaMemcpyFromSymbol(back, table_shadow, sizeof back, 0, D2H) == 0 && memcmp(back, src, sizeof src) == 0;
}

static int kernels(void) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterVar(fatbin, table_shadow, table_shadow, "table", 0, sizeof table_shadow, 0, 0);
    __cudaRegisterFatBinaryEnd(fatbin);
    for (unsigned i = 0; i < N; i++) a[i] = (float)i, b[i] = 2.0f * (float)i;
    void *address[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        int ok = 0;
        cudaError_t s = cudaSetDevice(d);
        if (s == 0) s = cudaMalloc((void **)&da[d], sizeof a);
        if (s == 0) s = cudaMalloc((void **)&db[d], sizeof b);
        if (s == 0) s = cudaMalloc((void **)&dc[d], sizeof c);
        if (s == 0) s = cudaMemcpy(da[d], a, sizeof a, H2D);
        if (s == 0) s = cudaMemcpy(db[d], b, sizeof b, H2D);
        if (s == 0) s = add_on(d, &ok);
        int symbol = table_holds((unsigned char)(10 + d), 1);
        char attributes[144] = {0};
        cudaError_t attributed = cudaFuncGetAttributes(attributes, (const void *)vector_add_stub);
        int registers = 0;
        memcpy(&registers, attributes + 28, sizeof registers); /* numRegs, after three size_t and an int */
        cudaGetSymbolAddress(&address[d], table_shadow);
        printf("device %d: add %d ok %d table %d attributes %d regs %d\n", d, s, ok, symbol, attributed, registers);
    }
    printf("tables distinct %d\n", address[0] != NULL && address[1] != NULL && address[0] != address[1]);
    int ok = 0;
    cudaSetDevice(0);
    cudaError_t s = add_on(0, &ok);
    printf("device 0 again: add %d ok %d table kept %d\n", s, ok, table_holds(10, 0));
    cudaSetDevice(1);
    cudaError_t reset = cudaDeviceReset();
    cudaSetDevice(0);
    s = add_on(0, &ok);
    printf("reset device 1: %d; device 0 after: add %d ok %d table kept %d\n", reset, s, ok, table_holds(10, 0));
    cudaSetDevice(1);
    cudaError_t made = cudaMalloc((void **)&da[1], sizeof a);
    if (made == 0) made = cudaMalloc((void **)&db[1], sizeof b);
    if (made == 0) made = cudaMalloc((void **)&dc[1], sizeof c);
    if (made == 0) made = cudaMemcpy(da[1], a, sizeof a, H2D);
    if (made == 0) made = cudaMemcpy(db[1], b, sizeof b, H2D);
    s = made == 0 ? add_on(1, &ok) : made;
    printf("device 1 after: add %d ok %d table %d\n", s, ok, table_holds(12, 1));
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

static void attributes_of(const char *what, const void *pointer) {
    struct pointer_attributes a = {7, 7, NULL, NULL};
    cudaError_t s = cudaPointerGetAttributes(&a, pointer);
    printf(" %s %d %d %d", what, s, a.type, a.device);
}

static int pointers(void) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterVar(fatbin, table_shadow, table_shadow, "table", 0, sizeof table_shadow, 0, 0);
    __cudaRegisterFatBinaryEnd(fatbin);
    void *device = NULL, *host = NULL, *variable = NULL;
    cudaError_t s = cudaSetDevice(1);
    if (s == 0) s = cudaMalloc(&device, 4096);
    if (s == 0) s = cudaMallocHost(&host, 4096);
    if (s == 0) s = cudaGetSymbolAddress(&variable, table_shadow);
    if (s == 0) s = cudaSetDevice(0);
    if (s != 0) return printf("pointers setup %d\n", s), 1;
    printf("pointers");
    attributes_of("device1", (char *)device + 100);
    attributes_of("host1", (char *)host + 100);
    attributes_of("variable1", variable);
    printf("\n");
    cudaFreeHost(host), cudaFree(device);
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "kernels") == 0) return kernels();
    if (argc > 1 && strcmp(argv[1], "pointers") == 0) return pointers();
    size_t booked = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20, free_bytes = 0, total = 0;
    int count = 0, device = -1;
    void *whole[2] = {NULL, NULL};
    cudaError_t counted = cudaGetDeviceCount(&count);
    printf("count %d %d\n", counted, count);
    printf("set 2: %d\n", cudaSetDevice(2));
    for (int i = 0; i < 2; i++) {
        cudaError_t set = cudaSetDevice(i), got = cudaGetDevice(&device), made = cudaMalloc(&whole[i], booked);
        cudaError_t info = cudaMemGetInfo(&free_bytes, &total);
        printf("device %d: set %d get %d malloc %d info %d free %zu total %zu\n", device, set, got, made, info,
               free_bytes, total);
    }
    cudaSetDevice(0);
    void *more = NULL;
    printf("one more on device 0: %d\n", cudaMalloc(&more, 1 << 20));
    return 0;
}
