/*
 * Function and kernel attributes, occupancy and module globals for the remote GPU's tests
 * (tests/remote/test_remote_attributes.py): linked against whichever libcuda.so.1 is on
 * LD_LIBRARY_PATH (the GPU client, or the stand-in driver directly), it asks what a CUDA 12
 * runtime asks before its launches and prints one line of answers, so that the two can be compared.
 *
 *   attributes_probe attributes   "attributes" then, per call, its CUresult and what it answered
 *   attributes_probe occupancy    "occupancy" then the same for the occupancy calls
 *   attributes_probe globals      "globals" then a module's global: its size, written and read back,
 *                                 a library's module's global against the library's own
 *   attributes_probe accounting   (through a server only) "accounting <free before> <free after>
 *                                 <cuMemFree of a global> <global after unload> <cuLibraryGetManaged>"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUlibrary, *CUkernel;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
CUresult cuLibraryLoadData(CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuLibraryGetModule(CUmodule *, CUlibrary);
CUresult cuLibraryGetGlobal(CUdeviceptr *, size_t *, CUlibrary, const char *);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuFuncSetAttribute(CUfunction, int, int);
CUresult cuFuncSetCacheConfig(CUfunction, int);
CUresult cuKernelGetAttribute(int *, int, CUkernel, CUdevice);
CUresult cuKernelSetAttribute(int, int, CUkernel, CUdevice);
CUresult cuKernelSetCacheConfig(CUkernel, int, CUdevice);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *, CUfunction, int, size_t, unsigned);
CUresult cuOccupancyMaxPotentialBlockSize(int *, int *, CUfunction, size_t (*)(int), size_t, int);
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *, int *, CUfunction, size_t (*)(int), size_t, int, unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

#define MAX_THREADS_PER_BLOCK 0
#define NUM_REGS 4
#define MAX_DYNAMIC_SHARED 8
#define CARVEOUT 9

static const char module_image[] = "gpupool-standin-module\nvector_add\nscale\nglobal counter 256\n";
static const char library_image[] = "gpupool-standin-module\nvector_add\nscale\nglobal table 4096\n";

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        CUresult status_ = (call);                                                                       \
        if (status_ != 0) {                                                                              \
            printf("error %d at %s\n", status_, #call);                                                  \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

/* One answer: the call's CUresult and, when it succeeded, the value it gave (read after the call). */
#define say(call, value)                                                                                 \
    do {                                                                                                 \
        CUresult said_ = (call);                                                                         \
        if (said_ == 0) printf(" 0:%ld", (long)(value));                                                 \
        else printf(" %d", said_);                                                                       \
    } while (0)

static size_t shared_per_thread(int block_size) { return 48u * (size_t)block_size; }

static int attributes(CUmodule module, CUlibrary library) {
    CUfunction add, scale;
    CUkernel kernel;
    CHECK(cuModuleGetFunction(&add, module, "vector_add"));
    CHECK(cuModuleGetFunction(&scale, module, "scale"));
    CHECK(cuLibraryGetKernel(&kernel, library, "scale"));
    int value = -7;
    printf("attributes");
    say(cuFuncGetAttribute(&value, MAX_THREADS_PER_BLOCK, add), value);
    say(cuFuncGetAttribute(&value, NUM_REGS, add), value);
    say(cuFuncGetAttribute(&value, NUM_REGS, scale), value);
    say(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, scale), value);
    say(cuFuncSetAttribute(scale, MAX_DYNAMIC_SHARED, 65536), 0);
    say(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, scale), value);
    say(cuFuncSetAttribute(scale, MAX_DYNAMIC_SHARED, 70000), 0); /* past the card: the driver's 1 */
    say(cuFuncSetAttribute(add, CARVEOUT, 50), 0);
    say(cuFuncGetAttribute(&value, CARVEOUT, add), value);
    say(cuFuncSetCacheConfig(add, 1), 0);
    say(cuFuncSetCacheConfig(add, 7), 0);
    say(cuFuncGetAttribute(&value, NUM_REGS, (CUfunction)kernel), value); /* a kernel cast, as CUDA 12 runtimes do */
    say(cuKernelGetAttribute(&value, NUM_REGS, kernel, 0), value);
    say(cuKernelSetAttribute(CARVEOUT, 25, kernel, 0), 0);
    say(cuKernelGetAttribute(&value, CARVEOUT, kernel, 0), value);
    say(cuKernelSetCacheConfig(kernel, 2, 0), 0);
    say(cuFuncGetAttribute(&value, NUM_REGS, (CUfunction)(unsigned long)0x7f00dead0000), value); /* made up: 400 */
    printf("\n");
    return 0;
}

static int occupancy(CUmodule module) {
    CUfunction add, scale;
    CHECK(cuModuleGetFunction(&add, module, "vector_add"));
    CHECK(cuModuleGetFunction(&scale, module, "scale"));
    int blocks = -7, grid = -7, size = -7;
    printf("occupancy");
    say(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 256, 0), blocks);
    say(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, scale, 256, 0), blocks);
    say(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 128, 20000), blocks);
    say(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 256, 60000), blocks); /* past its limit: 0 */
    say(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, add, 256, 0, 1), blocks);
    say(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, add, 256, 0, 2), blocks); /* bad flags */
    say(cuOccupancyMaxPotentialBlockSize(&grid, &size, add, NULL, 0, 0), grid * 10000L + size);
    say(cuOccupancyMaxPotentialBlockSize(&grid, &size, add, shared_per_thread, 0, 0), grid * 10000L + size);
    say(cuOccupancyMaxPotentialBlockSize(&grid, &size, add, shared_per_thread, 0, 500), grid * 10000L + size);
    say(cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &size, scale, NULL, 16384, 0, 1), grid * 10000L + size);
    /* found by name, as a runtime finds its entry points */
    CUresult (*by_name)(int *, int *, CUfunction, size_t (*)(int), size_t, int) = NULL;
    CHECK(cuGetProcAddress_v2("cuOccupancyMaxPotentialBlockSize", (void **)&by_name, 12000, 0, NULL));
    say(by_name(&grid, &size, add, shared_per_thread, 0, 256), grid * 10000L + size);
    printf("\n");
    return 0;
}

static int globals(CUmodule module, CUlibrary library) {
    CUdeviceptr counter = 0, table = 0, through_module = 0;
    size_t bytes = 0, table_bytes = 0, module_bytes = 0;
    unsigned char out[256], back[256];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (unsigned char)(i * 13 + 1);
    CHECK(cuModuleGetGlobal_v2(&counter, &bytes, module, "counter"));
    CHECK(cuMemcpyHtoD_v2(counter, out, sizeof out));
    CHECK(cuMemcpyDtoH_v2(back, counter, sizeof back));
    CUmodule of_library;
    CHECK(cuLibraryGetModule(&of_library, library));
    CHECK(cuLibraryGetGlobal(&table, &table_bytes, library, "table"));
    CHECK(cuModuleGetGlobal_v2(&through_module, &module_bytes, of_library, "table"));
    CUresult missing = cuModuleGetGlobal_v2(&counter, NULL, module, "nothing");
    CUresult only_pointer = cuModuleGetGlobal_v2(&through_module, NULL, of_library, "table");
    printf("globals %zu %s library %zu %s missing %d %d\n", bytes, memcmp(out, back, sizeof out) == 0 ? "same" : "wrong",
           module_bytes, through_module == table && module_bytes == table_bytes ? "same" : "other", missing, only_pointer);
    return 0;
}

/* A module's global is the module's memory, not an allocation of the client's: it leaves the
 * share's free memory as it was, cuMemFree refuses it, and it goes with its module. */
static int accounting(void) {
    size_t free_before = 0, free_after = 0, total = 0, bytes = 0;
    CUmodule module;
    CUdeviceptr counter = 0, managed = 0;
    CHECK(cuMemGetInfo_v2(&free_before, &total));
    CHECK(cuModuleLoadData(&module, "gpupool-standin-module\nscale\nglobal big 104857600\n"));
    CHECK(cuModuleGetGlobal_v2(&counter, &bytes, module, "big"));
    CHECK(cuMemGetInfo_v2(&free_after, &total));
    CUresult freed = cuMemFree_v2(counter);
    CHECK(cuModuleUnload(module));
    CUresult after_unload = cuModuleGetGlobal_v2(&counter, &bytes, module, "big");
    CUresult (*get_managed)(CUdeviceptr *, size_t *, CUlibrary, const char *) = NULL;
    CHECK(cuGetProcAddress_v2("cuLibraryGetManaged", (void **)&get_managed, 12000, 0, NULL));
    CUresult managed_status = get_managed(&managed, &bytes, NULL, "x");
    printf("accounting %zu %zu %d %d %d\n", free_before, free_after, freed, after_unload, managed_status);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUdevice device;
    CUcontext context;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuCtxCreate_v2(&context, 0, device));
    if (strcmp(argv[1], "accounting") == 0) return accounting();
    CUmodule module;
    CUlibrary library;
    CHECK(cuModuleLoadData(&module, module_image));
    CHECK(cuLibraryLoadData(&library, library_image, NULL, NULL, 0, NULL, NULL, 0));
    if (strcmp(argv[1], "attributes") == 0) return attributes(module, library);
    if (strcmp(argv[1], "occupancy") == 0) return occupancy(module);
    if (strcmp(argv[1], "globals") == 0) return globals(module, library);
    return 2;
}
