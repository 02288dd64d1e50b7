/*
 * A program on the CUDA runtime API for tests/remote/test_remote_runtime_client.py: compiled by gcc
 * against the nvidia-cuda-runtime-cu12 wheel's cuda_runtime_api.h (NVIDIA's ABI) and linked to
 * gpupool's libcudart.so.12, run with the GPU client and a server on the stand-in driver. Each mode
 * prints one line.
 *
 *   runtime_probe properties  "properties <count> <device> <totalGlobalMem> <major>.<minor>
 *                             <multiProcessorCount> <maxThreadsPerBlock> refused=<status>,
 *                             <canMapHostMemory>,<managedMemory>,<the two by attribute> <name>"
 *   runtime_probe copies      copies of every kind (and cudaMemcpyDefault), async ones on a stream,
 *                             memsets, each checked: "copies <what>=<ok: 1/0> ..."
 *   runtime_probe kernel N    vector_add and scale launched through nvcc's registration ABI (a
 *                             fatbin wrapper whose data is the stand-in's module image), the second
 *                             as nvcc's <<<>>> stub does (push, pop, cudaLaunchKernel):
 *                             "kernel <status> c[N-1]=<value> ok=<1/0>"
 *   runtime_probe handle N    vector_add as newer nvcc host code launches it: its handle from
 *                             __cudaGetKernel, the pushed and popped configuration, __cudaLaunchKernel:
 *                             "handle <status> c[N-1]=<value> ok=<1/0> unknown=<__cudaGetKernel of an
 *                             unregistered function>"
 *   runtime_probe symbols     device variables registered as nvcc registers them (the stand-in's
 *                             image names a global "table" of 64 bytes), copied to and from by
 *                             their host shadows: "symbols size=<n> to=<status> from=<1/0>
 *                             address=<1/0> dtod=<1/0> bounds=<status> unknown=<status>
 *                             missing=<status>"
 *   runtime_probe functions   cudaFuncGetAttributes of vector_add and scale, the dynamic shared
 *                             memory limit set and read back, a cache preference, and blocks per
 *                             multiprocessor at 256 threads: "functions add=<threads>,<regs>,<ptx>,
 *                             <binary> scale=<regs> shared=<status>,<bytes> cache=<status>
 *                             occupancy=<add>,<scale> unknown=<status>"
 *   runtime_probe reset       a launch, cudaDeviceReset, then the share's free memory and a launch
 *                             again (the module loaded anew): "reset <status> freed=<1/0>
 *                             again=<1/0> priorities=<status>,<least>,<greatest>"
 *   runtime_probe unknown     a launch of a host function never registered: "unknown <status>"
 *   runtime_probe hostile     what a broken or hostile program hands in: a launch with more dynamic
 *                             shared memory than the driver's 32-bit parameter holds, a fatbin
 *                             wrapper whose data is NULL (registered, launched, unregistered), a
 *                             pop with nothing pushed: "hostile shared=<status> nulldata=<status>
 *                             pop=<status>"
 *   runtime_probe pytorch     what PyTorch asks before its first kernel besides the common calls
 *                             (docs/remote-gpu.md, "PyTorch"): stream capture status of a stream
 *                             and of the legacy stream by cudaStreamIsCapturing and the three
 *                             forms of cudaStreamGetCaptureInfo (status, id, graph, dependencies),
 *                             the thread's capture mode exchanged (and a bad one), a stream's
 *                             priority, and driver entry points: cuMemGetInfo's called (the
 *                             share's total), cuMemCreate's (not carried) called:
 *                             "pytorch capturing=<status>,<value>,<status>,<value> info=<status>,
 *                             <value>,<id>,<graph null>,<deps null>,<count> old=<status>,<value>,<id>
 *                             v3=<status>,<value>,<edges null> mode=<status>,<previous>,<status>,
 *                             <previous>,<bad status> priority=<status>,<value> entry=<status>,
 *                             <found>,<call status>,<total MiB> byversion=<status>,<found>,<call
 *                             status> refused=<status>,<found>,<call status>"
 *   runtime_probe pointers    cudaPointerGetAttributes (PyTorch's is_pinned) of a cudaMalloc
 *                             allocation's start and inside, cudaMallocHost and cudaHostAlloc
 *                             memory inside, a registered variable's device address, malloc and
 *                             stack memory, freed host and device memory; each
 *                             "<what>=<status>,<type>,<device>,<devicePointer: p/null/other>,
 *                             <hostPointer: p/null/other>", and nullattributes=<status>
 *   runtime_probe refused     cudaMallocManaged twice and cudaGetLastError:
 *                             "refused <status> <status> <last> <name>"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

/* nvcc's host code calls these (crt/host_runtime.h, not in the runtime's wheel). */
extern void **__cudaRegisterFatBinary(void *wrapper);
extern void __cudaRegisterFatBinaryEnd(void **handle);
extern void __cudaUnregisterFatBinary(void **handle);
extern void __cudaRegisterFunction(void **handle, const char *host, char *device_function, const char *device_name,
                                   int thread_limit, uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *warp);
extern void __cudaRegisterVar(void **handle, char *host, char *device_address, const char *device_name, int external,
                              size_t size, int constant, int global);
extern unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, cudaStream_t stream);
extern cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, void *stream);
/* ... and, from newer nvcc, a kernel's handle asked once and launches by it. */
extern cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *host);
extern cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared,
                                      cudaStream_t stream);

static int properties(void) {
    int count = -1, device = -1;
    struct cudaDeviceProp p;
    memset(&p, 0x5a, sizeof p);
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess) status = cudaSetDevice(0);
    if (status == cudaSuccess) status = cudaGetDevice(&device);
    if (status == cudaSuccess) status = cudaGetDeviceProperties(&p, 0);
    if (status != cudaSuccess) return printf("properties error %d\n", (int)status), 1;
    int mapped = -1, managed = -1;
    status = cudaDeviceGetAttribute(&mapped, cudaDevAttrCanMapHostMemory, 0);
    if (status == cudaSuccess) status = cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0);
    printf("properties %d %d %zu %d.%d %d %d refused=%d,%d,%d,%d,%d %s\n", count, device, p.totalGlobalMem, p.major,
           p.minor, p.multiProcessorCount, p.maxThreadsPerBlock, (int)status, p.canMapHostMemory, p.managedMemory,
           mapped, managed, p.name);
    return 0;
}

#define N 4096
static int copies(void) {
    static unsigned char host[N], back[N], pinned_check[N];
    unsigned char *a = NULL, *b = NULL, *pinned = NULL;
    cudaStream_t stream = NULL;
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 1);
    cudaError_t s = cudaMalloc((void **)&a, N);
    if (s == cudaSuccess) s = cudaMalloc((void **)&b, N);
    if (s == cudaSuccess) s = cudaMallocHost((void **)&pinned, N);
    if (s == cudaSuccess) s = cudaStreamCreate(&stream);
    if (s != cudaSuccess) return printf("copies error %d\n", (int)s), 1;
    printf("copies");
    /* host to device and back */
    memset(back, 0, N);
    int ok = cudaMemcpy(a, host, N, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(back, a, N, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(host, back, N) == 0;
    printf(" htod_dtoh=%d", ok);
    /* device to device */
    memset(back, 0, N);
    ok = cudaMemcpy(b, a, N, cudaMemcpyDeviceToDevice) == cudaSuccess &&
         cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(host, back, N) == 0;
    printf(" dtod=%d", ok);
    /* host to host */
    memset(back, 0, N);
    ok = cudaMemcpy(back, host, N, cudaMemcpyHostToHost) == cudaSuccess && memcmp(host, back, N) == 0;
    printf(" htoh=%d", ok);
    /* cudaMemcpyDefault: the direction from the pointers (an offset into an allocation too) */
    memset(back, 0, N);
    ok = cudaMemset(b, 0, N) == cudaSuccess && cudaMemcpy(b + 16, host + 16, N - 16, cudaMemcpyDefault) == cudaSuccess &&
         cudaMemcpy(a, b, N, cudaMemcpyDefault) == cudaSuccess && cudaMemcpy(back, a, N, cudaMemcpyDefault) == cudaSuccess &&
         memcmp(host + 16, back + 16, N - 16) == 0 && back[0] == 0 && back[15] == 0;
    printf(" default=%d", ok);
    /* async on a stream, through page-locked memory */
    memcpy(pinned, host, N);
    memset(pinned_check, 0, N);
    ok = cudaMemsetAsync(a, 0, N, stream) == cudaSuccess &&
         cudaMemcpyAsync(a, pinned, N, cudaMemcpyHostToDevice, stream) == cudaSuccess &&
         cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, stream) == cudaSuccess &&
         cudaMemcpyAsync(pinned_check, b, N, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess && memcmp(host, pinned_check, N) == 0;
    printf(" async=%d", ok);
    /* memset, all of it and a part */
    ok = cudaMemset(a, 0xab, N) == cudaSuccess && cudaMemset(a + 100, 0x01, 10) == cudaSuccess &&
         cudaMemcpy(back, a, N, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (int i = 0; ok && i < N; i++) ok = back[i] == (i >= 100 && i < 110 ? 0x01 : 0xab);
    printf(" memset=%d", ok);
    /* a bad direction */
    printf(" direction=%d", (int)cudaMemcpy(back, a, N, (enum cudaMemcpyKind)7));
    printf(" last=%d", (int)cudaGetLastError());
    printf(" cleared=%d", (int)cudaGetLastError());
    ok = cudaStreamDestroy(stream) == cudaSuccess && cudaFreeHost(pinned) == cudaSuccess && cudaFree(a) == cudaSuccess &&
         cudaFree(b) == cudaSuccess;
    printf(" freed=%d\n", ok);
    return 0;
}

/* The stand-in driver's module image (gpupool/shim/src/standin/kernels.c): its built-in kernels. */
static const char standin_image[] = "gpupool-standin-module\nvector_add\nscale\n";
static struct {
    unsigned magic, version;
    const void *data, *unused;
} wrapper = {0x466243b1u, 1, standin_image, NULL};

/* What nvcc's host stubs are: functions whose addresses name the kernels. */
static void vector_add_stub(void) {}
static void scale_stub(void) {}

static int kernel(unsigned n) {
    void **handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(handle, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFunction(handle, (const char *)scale_stub, (char *)"scale", "scale", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(handle);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    float *da = NULL, *db = NULL, *dc = NULL;
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, b[i] = 2.0f * (float)i, c[i] = -1.0f;
    cudaError_t s = cudaMalloc((void **)&da, n * sizeof *a);
    if (s == cudaSuccess) s = cudaMalloc((void **)&db, n * sizeof *b);
    if (s == cudaSuccess) s = cudaMalloc((void **)&dc, n * sizeof *c);
    if (s == cudaSuccess) s = cudaMemcpy(da, a, n * sizeof *a, cudaMemcpyHostToDevice);
    if (s == cudaSuccess) s = cudaMemcpy(db, b, n * sizeof *b, cudaMemcpyHostToDevice);
    dim3 grid = {(n + 255) / 256, 1, 1}, block = {256, 1, 1};
    void *add_args[] = {&da, &db, &dc, &n};
    if (s == cudaSuccess) s = cudaLaunchKernel((const void *)vector_add_stub, grid, block, add_args, 0, NULL);
    /* scale(c, 0.5, n) as nvcc's <<<1, 1>>> and its stub: push the configuration, pop it, launch */
    float factor = 0.5f;
    void *scale_args[] = {&dc, &factor, &n};
    dim3 one = {1, 1, 1}, g, bl;
    size_t shared = 0;
    cudaStream_t stream = NULL;
    if (s == cudaSuccess && __cudaPushCallConfiguration(one, one, 0, NULL) != 0) s = cudaErrorMissingConfiguration;
    if (s == cudaSuccess) s = __cudaPopCallConfiguration(&g, &bl, &shared, &stream);
    if (s == cudaSuccess) s = cudaLaunchKernel((const void *)scale_stub, g, bl, scale_args, shared, stream);
    if (s == cudaSuccess) s = cudaDeviceSynchronize();
    if (s == cudaSuccess) s = cudaMemcpy(c, dc, n * sizeof *c, cudaMemcpyDeviceToHost);
    int ok = s == cudaSuccess;
    for (unsigned i = 0; ok && i < n; i++) ok = c[i] == 1.5f * (float)i;
    printf("kernel %d c[%u]=%g ok=%d\n", (int)s, n - 1, (double)c[n - 1], ok);
    cudaFree(da), cudaFree(db), cudaFree(dc);
    __cudaUnregisterFatBinary(handle);
    free(a), free(b), free(c);
    return 0;
}

static void never_registered(void) {}

static const char image_with_globals[] = "gpupool-standin-module\nvector_add\nglobal table 64\n";
static struct {
    unsigned magic, version;
    const void *data, *unused;
} globals_wrapper = {0x466243b1u, 1, image_with_globals, NULL};
static char table_shadow[64], missing_shadow[8], unregistered_shadow[8]; /* what nvcc's host code keeps */

static int symbols(void) {
    void **fatbin = __cudaRegisterFatBinary(&globals_wrapper);
    __cudaRegisterVar(fatbin, table_shadow, table_shadow, "table", 0, sizeof table_shadow, 0, 0);
    __cudaRegisterVar(fatbin, missing_shadow, missing_shadow, "missing", 0, sizeof missing_shadow, 1, 0);
    __cudaRegisterFatBinaryEnd(fatbin);
    unsigned char src[64], back[64];
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)(3 * i + 1);
    size_t size = 0;
    cudaError_t s = cudaGetSymbolSize(&size, table_shadow);
    printf("symbols size=%zu", s == cudaSuccess ? size : 0);
    cudaError_t to = cudaMemcpyToSymbol(table_shadow, src, 64, 0, cudaMemcpyHostToDevice);
    printf(" to=%d", (int)to);
    memset(back, 0, sizeof back);
    int ok = cudaMemcpyFromSymbol(back, table_shadow, 32, 16, cudaMemcpyDeviceToHost) == cudaSuccess &&
             memcmp(back, src + 16, 32) == 0;
    printf(" from=%d", ok);
    void *address = NULL;
    memset(back, 0, sizeof back);
    ok = cudaGetSymbolAddress(&address, table_shadow) == cudaSuccess &&
         cudaMemcpy(back, address, 64, cudaMemcpyDefault) == cudaSuccess && memcmp(back, src, 64) == 0;
    printf(" address=%d", ok);
    unsigned char *device = NULL;
    cudaStream_t stream = NULL;
    ok = cudaMalloc((void **)&device, 64) == cudaSuccess && cudaMemset(device, 7, 64) == cudaSuccess &&
         cudaStreamCreate(&stream) == cudaSuccess &&
         cudaMemcpyToSymbolAsync(table_shadow, device, 64, 0, cudaMemcpyDefault, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess &&
         cudaMemcpyFromSymbol(back, table_shadow, 64, 0, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (int i = 0; ok && i < 64; i++) ok = back[i] == 7;
    printf(" dtod=%d", ok);
    printf(" bounds=%d", (int)cudaMemcpyToSymbol(table_shadow, src, 64, 8, cudaMemcpyHostToDevice));
    printf(" unknown=%d", (int)cudaMemcpyToSymbol(unregistered_shadow, src, 4, 0, cudaMemcpyHostToDevice));
    printf(" missing=%d\n", (int)cudaGetSymbolSize(&size, missing_shadow));
    cudaStreamDestroy(stream), cudaFree(device);
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

static int handle(unsigned n) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin);
    float *a = malloc(n * sizeof *a), *c = malloc(n * sizeof *c);
    float *da = NULL, *dc = NULL;
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, c[i] = -1.0f;
    cudaKernel_t kernel = NULL, none = NULL;
    cudaError_t s = __cudaGetKernel(&kernel, (const void *)vector_add_stub);
    cudaError_t unknown = __cudaGetKernel(&none, (const void *)never_registered);
    if (s == cudaSuccess) s = cudaMalloc((void **)&da, n * sizeof *a);
    if (s == cudaSuccess) s = cudaMalloc((void **)&dc, n * sizeof *c);
    if (s == cudaSuccess) s = cudaMemcpy(da, a, n * sizeof *a, cudaMemcpyHostToDevice);
    dim3 grid = {(n + 255) / 256, 1, 1}, block = {256, 1, 1}, g, bl;
    size_t shared = 0;
    cudaStream_t stream = NULL;
    void *args[] = {&da, &da, &dc, &n}; /* c = a + a */
    if (s == cudaSuccess && __cudaPushCallConfiguration(grid, block, 0, NULL) != 0) s = cudaErrorMissingConfiguration;
    if (s == cudaSuccess) s = __cudaPopCallConfiguration(&g, &bl, &shared, &stream);
    if (s == cudaSuccess) s = __cudaLaunchKernel(kernel, g, bl, args, shared, stream);
    if (s == cudaSuccess) s = cudaMemcpy(c, dc, n * sizeof *c, cudaMemcpyDeviceToHost);
    int ok = s == cudaSuccess;
    for (unsigned i = 0; ok && i < n; i++) ok = c[i] == 2.0f * (float)i;
    printf("handle %d c[%u]=%g ok=%d unknown=%d\n", (int)s, n - 1, (double)c[n - 1], ok, (int)unknown);
    cudaFree(da), cudaFree(dc);
    __cudaUnregisterFatBinary(fatbin);
    free(a), free(c);
    return 0;
}

static int functions(void) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFunction(fatbin, (const char *)scale_stub, (char *)"scale", "scale", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin);
    struct cudaFuncAttributes add, scale;
    memset(&add, 0x5a, sizeof add), memset(&scale, 0x5a, sizeof scale);
    cudaError_t s = cudaFuncGetAttributes(&add, (const void *)vector_add_stub);
    if (s == cudaSuccess) s = cudaFuncGetAttributes(&scale, (const void *)scale_stub);
    if (s != cudaSuccess) return printf("functions error %d\n", (int)s), 1;
    printf("functions add=%d,%d,%d,%d scale=%d", add.maxThreadsPerBlock, add.numRegs, add.ptxVersion, add.binaryVersion,
           scale.numRegs);
    s = cudaFuncSetAttribute((const void *)vector_add_stub, cudaFuncAttributeMaxDynamicSharedMemorySize, 40000);
    struct cudaFuncAttributes again;
    if (s == cudaSuccess) s = cudaFuncGetAttributes(&again, (const void *)vector_add_stub);
    printf(" shared=%d,%d", (int)s, again.maxDynamicSharedSizeBytes);
    printf(" cache=%d", (int)cudaFuncSetCacheConfig((const void *)scale_stub, cudaFuncCachePreferL1));
    int add_blocks = -1, scale_blocks = -1;
    s = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&add_blocks, (const void *)vector_add_stub, 256, 0);
    if (s == cudaSuccess) s = cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&scale_blocks, (const void *)scale_stub,
                                                                                    256, 0, cudaOccupancyDefault);
    printf(" occupancy=%d,%d", s == cudaSuccess ? add_blocks : -(int)s, scale_blocks);
    printf(" unknown=%d\n", (int)cudaFuncGetAttributes(&again, (const void *)never_registered));
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

/* c = a + b on the stand-in (n elements), read back and checked: 1, or 0 on any failure. */
static int add_once(unsigned n) {
    float *a = malloc(n * sizeof *a), *c = malloc(n * sizeof *c), *da = NULL, *dc = NULL;
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, c[i] = -1.0f;
    dim3 grid = {1, 1, 1}, block = {256, 1, 1};
    void *args[] = {&da, &da, &dc, &n};
    int ok = cudaMalloc((void **)&da, n * sizeof *a) == cudaSuccess && cudaMalloc((void **)&dc, n * sizeof *c) == cudaSuccess &&
             cudaMemcpy(da, a, n * sizeof *a, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaLaunchKernel((const void *)vector_add_stub, grid, block, args, 0, NULL) == cudaSuccess &&
             cudaMemcpy(c, dc, n * sizeof *c, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (unsigned i = 0; ok && i < n; i++) ok = c[i] == 2.0f * (float)i;
    free(a), free(c);
    return ok;
}

static int reset(void) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin);
    size_t free_before = 0, free_after = 0, total = 0;
    void *left = NULL;
    int ok = cudaMemGetInfo(&free_before, &total) == cudaSuccess && cudaMalloc(&left, 1 << 20) == cudaSuccess &&
             add_once(1000);
    cudaError_t s = cudaDeviceReset();
    ok = ok && cudaMemGetInfo(&free_after, &total) == cudaSuccess && free_after == free_before;
    int again = add_once(1000);
    int least = -1, greatest = -1;
    cudaError_t p = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    printf("reset %d freed=%d again=%d priorities=%d,%d,%d\n", (int)s, ok, again, (int)p, least, greatest);
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

static int unknown(void) {
    dim3 one = {1, 1, 1};
    cudaError_t s = cudaLaunchKernel((const void *)never_registered, one, one, NULL, 0, NULL);
    printf("unknown %d %s\n", (int)s, cudaGetErrorName(s));
    return 0;
}

static int hostile(void) {
    void **fatbin = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin, (const char *)vector_add_stub, (char *)"vector_add", "vector_add", -1, NULL, NULL,
                           NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin);
    unsigned n = 1;
    float *da = NULL;
    void *args[] = {&da, &da, &da, &n};
    dim3 one = {1, 1, 1};
    cudaError_t s = cudaMalloc((void **)&da, sizeof(float));
    /* 4 GiB of dynamic shared memory: cut to 32 bits it would be 0, and the launch would go ahead */
    if (s == cudaSuccess) s = cudaLaunchKernel((const void *)vector_add_stub, one, one, args, (size_t)1 << 32, NULL);
    printf("hostile shared=%d", (int)s);
    cudaFree(da);
    __cudaUnregisterFatBinary(fatbin);
    static struct {
        unsigned magic, version;
        const void *data, *unused;
    } empty = {0x466243b1u, 1, NULL, NULL};
    fatbin = __cudaRegisterFatBinary(&empty);
    __cudaRegisterFunction(fatbin, (const char *)scale_stub, (char *)"scale", "scale", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin);
    printf(" nulldata=%d", (int)cudaLaunchKernel((const void *)scale_stub, one, one, args, 0, NULL));
    __cudaUnregisterFatBinary(fatbin);
    dim3 g, b;
    size_t shared = 0;
    cudaStream_t stream = NULL;
    printf(" pop=%d\n", (int)__cudaPopCallConfiguration(&g, &b, &shared, &stream));
    return 0;
}

/* The CUDA 11 form of cudaStreamGetCaptureInfo (three arguments), which the 12 headers hide behind
 * the _v2 name: NVIDIA's library still exports it. */
extern cudaError_t capture_info_of_cuda_11(cudaStream_t stream, enum cudaStreamCaptureStatus *status,
                                           unsigned long long *id) __asm__("cudaStreamGetCaptureInfo");

typedef int (*mem_get_info_fn)(size_t *free_bytes, size_t *total);
typedef int (*mem_create_fn)(void *handle, size_t size, const void *properties, unsigned long long flags);

static int pytorch(void) {
    cudaStream_t stream = NULL;
    cudaError_t made = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, 0);
    if (made != cudaSuccess) return printf("pytorch stream %d\n", (int)made), 1;
    enum cudaStreamCaptureStatus on_stream = 7, on_legacy = 7;
    cudaError_t a = cudaStreamIsCapturing(stream, &on_stream), b = cudaStreamIsCapturing(cudaStreamLegacy, &on_legacy);
    printf("pytorch capturing=%d,%d,%d,%d", (int)a, (int)on_stream, (int)b, (int)on_legacy);
    enum cudaStreamCaptureStatus info = 7;
    unsigned long long id = 99;
    cudaGraph_t graph = (cudaGraph_t)&id;
    const cudaGraphNode_t *dependencies = (const cudaGraphNode_t *)&id;
    size_t count = 5;
    cudaError_t c = cudaStreamGetCaptureInfo(stream, &info, &id, &graph, &dependencies, &count);
    printf(" info=%d,%d,%llu,%d,%d,%zu", (int)c, (int)info, id, graph == NULL, dependencies == NULL, count);
    info = 7, id = 99;
    c = capture_info_of_cuda_11(stream, &info, &id);
    printf(" old=%d,%d,%llu", (int)c, (int)info, id);
    const cudaGraphEdgeData *edges = (const cudaGraphEdgeData *)&id;
    info = 7;
    c = cudaStreamGetCaptureInfo_v3(stream, &info, NULL, NULL, NULL, &edges, NULL);
    printf(" v3=%d,%d,%d", (int)c, (int)info, edges == NULL);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t d = cudaThreadExchangeStreamCaptureMode(&mode);
    enum cudaStreamCaptureMode first = mode;
    cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
    enum cudaStreamCaptureMode bad = (enum cudaStreamCaptureMode)7;
    printf(" mode=%d,%d,%d,%d,%d", (int)d, (int)first, (int)e, (int)mode, (int)cudaThreadExchangeStreamCaptureMode(&bad));
    int priority = 7;
    cudaError_t f = cudaStreamGetPriority(stream, &priority);
    printf(" priority=%d,%d", (int)f, priority);
    void *entry = NULL;
    enum cudaDriverEntryPointQueryResult found = (enum cudaDriverEntryPointQueryResult)7;
    cudaError_t g = cudaGetDriverEntryPoint("cuMemGetInfo", &entry, cudaEnableDefault, &found);
    size_t free_bytes = 0, total = 0;
    int called = entry != NULL ? ((mem_get_info_fn)entry)(&free_bytes, &total) : -1;
    printf(" entry=%d,%d,%d,%zu", (int)g, (int)found, called, total >> 20);
    entry = NULL, found = (enum cudaDriverEntryPointQueryResult)7;
    g = cudaGetDriverEntryPointByVersion("cuMemGetInfo", &entry, 12000, cudaEnableDefault, &found);
    called = entry != NULL ? ((mem_get_info_fn)entry)(&free_bytes, &total) : -1;
    printf(" byversion=%d,%d,%d", (int)g, (int)found, called);
    entry = NULL, found = (enum cudaDriverEntryPointQueryResult)7;
    g = cudaGetDriverEntryPoint("cuMemCreate", &entry, cudaEnableDefault, &found);
    called = entry != NULL ? ((mem_create_fn)entry)(NULL, 0, NULL, 0) : -1;
    printf(" refused=%d,%d,%d\n", (int)g, (int)found, called);
    cudaStreamDestroy(stream);
    return 0;
}

static void attributes_of(const char *what, const void *pointer) {
    struct cudaPointerAttributes a;
    memset(&a, 0x5a, sizeof a); /* every field must be written */
    cudaError_t status = cudaPointerGetAttributes(&a, pointer);
    const char *device = a.devicePointer == pointer ? "p" : a.devicePointer == NULL ? "null" : "other";
    const char *host = a.hostPointer == pointer ? "p" : a.hostPointer == NULL ? "null" : "other";
    printf(" %s=%d,%d,%d,%s,%s", what, (int)status, (int)a.type, a.device, device, host);
}

static int pointers(void) {
    char *device = NULL, *pinned = NULL, *allocated = NULL;
    if (cudaMalloc((void **)&device, 256) != cudaSuccess || cudaMallocHost((void **)&pinned, 128) != cudaSuccess ||
        cudaHostAlloc((void **)&allocated, 64, cudaHostAllocDefault) != cudaSuccess)
        return printf("pointers allocation failed\n"), 1;
    printf("pointers");
    attributes_of("device", device);
    attributes_of("inside", device + 255);
    attributes_of("pinned", pinned + 64);
    attributes_of("hostalloc", allocated);
    void **fatbin = __cudaRegisterFatBinary(&globals_wrapper);
    __cudaRegisterVar(fatbin, table_shadow, table_shadow, "table", 0, sizeof table_shadow, 0, 0);
    __cudaRegisterFatBinaryEnd(fatbin);
    void *variable = NULL;
    if (cudaGetSymbolAddress(&variable, table_shadow) != cudaSuccess) return printf(" variable failed\n"), 1;
    attributes_of("variable", (char *)variable + 8);
    char *heap = malloc(32), stack[16];
    attributes_of("heap", heap);
    attributes_of("stack", stack);
    cudaFreeHost(pinned), cudaFree(device);
    attributes_of("freedhost", pinned + 64);
    attributes_of("freed", device);
    printf(" nullattributes=%d\n", (int)cudaPointerGetAttributes(NULL, heap));
    free(heap), cudaFreeHost(allocated);
    __cudaUnregisterFatBinary(fatbin);
    return 0;
}

static int refused(void) {
    void *managed = NULL;
    cudaError_t first = cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal);
    cudaError_t second = cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal);
    cudaError_t last = cudaGetLastError();
    printf("refused %d %d %d %s\n", (int)first, (int)second, (int)last, cudaGetErrorName(first));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "properties") == 0) return properties();
    if (argc == 2 && strcmp(argv[1], "copies") == 0) return copies();
    if (argc == 3 && strcmp(argv[1], "kernel") == 0) return kernel((unsigned)strtoul(argv[2], NULL, 10));
    if (argc == 3 && strcmp(argv[1], "handle") == 0) return handle((unsigned)strtoul(argv[2], NULL, 10));
    if (argc == 2 && strcmp(argv[1], "unknown") == 0) return unknown();
    if (argc == 2 && strcmp(argv[1], "symbols") == 0) return symbols();
    if (argc == 2 && strcmp(argv[1], "functions") == 0) return functions();
    if (argc == 2 && strcmp(argv[1], "reset") == 0) return reset();
    if (argc == 2 && strcmp(argv[1], "refused") == 0) return refused();
    if (argc == 2 && strcmp(argv[1], "pytorch") == 0) return pytorch();
    if (argc == 2 && strcmp(argv[1], "pointers") == 0) return pointers();
    if (argc == 2 && strcmp(argv[1], "hostile") == 0) return hostile();
    fprintf(stderr, "usage: runtime_probe properties | copies | kernel N | handle N | symbols | functions | reset | unknown | refused | pytorch | pointers | hostile\n");
    return 2;
}
