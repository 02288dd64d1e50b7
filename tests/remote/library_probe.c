/*
 * A CUDA 12 library API program for the remote GPU's tests (tests/remote/test_remote_library.py):
 * linked against whichever libcuda.so.1 is on LD_LIBRARY_PATH (the GPU client, or the stand-in
 * driver directly). It loads the stand-in's built-in kernels as a library, the way nvcc 12's
 * runtime loads a program's kernels, and prints one line saying what happened.
 *
 *   library_probe library N        load a library (cuLibraryLoadData found through cuGetProcAddress),
 *                                  a vector add launched through its CUkernel cast to CUfunction, a
 *                                  scale through cuKernelGetFunction's function, its global written
 *                                  and read back, its module's function, then unloaded:
 *                                  "ok library N c[N-1]=<value> global <bytes> after-unload <CUresult>"
 *   library_probe file PATH N      the same vector add from a library loaded by cuLibraryLoadFromFile
 *   library_probe refusals         a bad image, a made-up library and kernel, an unknown kernel and
 *                                  global, a library's module unloaded alone, a second unload:
 *                                  "refusals <CUresult> ..." in that order
 *   library_probe hold MIB         load a library holding a global of MIB MiB, say "held", sleep
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUlibrary, *CUkernel;
typedef CUresult (*library_load_data)(CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned);

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuLibraryLoadFromFile(CUlibrary *, const char *, void *, void **, unsigned, void *, void **, unsigned);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuLibraryGetModule(CUmodule *, CUlibrary);
CUresult cuLibraryGetGlobal(CUdeviceptr *, size_t *, CUlibrary, const char *);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);

static const char image[] = "gpupool-standin-module\nvector_add\nscale\nglobal table 4096\n";

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        CUresult status_ = (call);                                                                       \
        if (status_ != 0) {                                                                              \
            printf("error %d at %s\n", status_, #call);                                                  \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

static int setup(void) {
    CUdevice device;
    CUcontext context;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuCtxCreate_v2(&context, 0, device));
    return 0;
}

/* c = a + b through the library's vector_add kernel, then c *= 0.5 through scale's function. */
static int compute(CUlibrary library, unsigned n, float *last) {
    CUkernel add, scale;
    CUfunction scale_function;
    CHECK(cuLibraryGetKernel(&add, library, "vector_add"));
    CHECK(cuLibraryGetKernel(&scale, library, "scale"));
    CHECK(cuKernelGetFunction(&scale_function, scale));
    float *a = malloc(4ull * n), *b = malloc(4ull * n), *c = malloc(4ull * n);
    for (unsigned i = 0; i < n; i++) a[i] = (float)i, b[i] = 2.0f * (float)i, c[i] = -1;
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc_v2(&da, 4ull * n));
    CHECK(cuMemAlloc_v2(&db, 4ull * n));
    CHECK(cuMemAlloc_v2(&dc, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(da, a, 4ull * n));
    CHECK(cuMemcpyHtoD_v2(db, b, 4ull * n));
    void *add_params[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel((CUfunction)add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, add_params, NULL));
    float factor = 0.5f;
    void *scale_params[] = {&dc, &factor, &n};
    CHECK(cuLaunchKernel(scale_function, 1, 1, 1, 1, 1, 1, 0, NULL, scale_params, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH_v2(c, dc, 4ull * n));
    for (unsigned i = 0; i < n; i++) {
        if (c[i] != 1.5f * (float)i) {
            printf("wrong c[%u] = %g, expected %g\n", i, c[i], 1.5f * (float)i);
            return 1;
        }
    }
    *last = c[n - 1];
    CHECK(cuMemFree_v2(da));
    CHECK(cuMemFree_v2(db));
    CHECK(cuMemFree_v2(dc));
    free(a), free(b), free(c);
    return 0;
}

static int library(unsigned n) {
    library_load_data load = NULL;
    CUlibrary library;
    CHECK(cuGetProcAddress_v2("cuLibraryLoadData", (void **)&load, 12000, 0, NULL));
    CHECK(load(&library, image, NULL, NULL, 0, NULL, NULL, 0));
    float last = 0;
    if (compute(library, n, &last) != 0) return 1;
    /* the library's global: written, read back */
    CUdeviceptr table;
    size_t bytes = 0;
    unsigned char out[4096], back[4096];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (unsigned char)(i * 7);
    CHECK(cuLibraryGetGlobal(&table, &bytes, library, "table"));
    CHECK(cuMemcpyHtoD_v2(table, out, sizeof out));
    CHECK(cuMemcpyDtoH_v2(back, table, sizeof back));
    if (memcmp(out, back, sizeof out) != 0) {
        printf("wrong global\n");
        return 1;
    }
    /* the library's module names the same kernels */
    CUmodule module;
    CUfunction through_module;
    CHECK(cuLibraryGetModule(&module, library));
    CHECK(cuModuleGetFunction(&through_module, module, "vector_add"));
    CUkernel add;
    CHECK(cuLibraryGetKernel(&add, library, "vector_add"));
    CHECK(cuLibraryUnload(library));
    /* the kernel went with its library: a launch of it is refused (its error comes with the next call) */
    CUdeviceptr nothing = 0;
    unsigned zero = 0;
    void *params[] = {&nothing, &nothing, &nothing, &zero};
    CUresult after = cuLaunchKernel((CUfunction)add, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (after == 0) after = cuCtxSynchronize();
    printf("ok library %u c[%u]=%g global %zu after-unload %d\n", n, n - 1, last, bytes, after);
    return 0;
}

static int from_file(const char *path, unsigned n) {
    CUlibrary library;
    CHECK(cuLibraryLoadFromFile(&library, path, NULL, NULL, 0, NULL, NULL, 0));
    float last = 0;
    if (compute(library, n, &last) != 0) return 1;
    CHECK(cuLibraryUnload(library));
    printf("ok file %u c[%u]=%g\n", n, n - 1, last);
    return 0;
}

static int refusals(void) {
    library_load_data load = NULL;
    CUlibrary library, bad = NULL, made_up = (CUlibrary)(unsigned long)0x7f00dead0000;
    CUkernel kernel, made_up_kernel = (CUkernel)(unsigned long)0x7f00beef0000;
    CUfunction function;
    CUmodule module;
    CUdeviceptr global;
    CHECK(cuGetProcAddress_v2("cuLibraryLoadData", (void **)&load, 12000, 0, NULL));
    CUresult bad_image = load(&bad, "not an image\n", NULL, NULL, 0, NULL, NULL, 0);
    CHECK(load(&library, image, NULL, NULL, 0, NULL, NULL, 0));
    CUresult unknown_library = cuLibraryGetKernel(&kernel, made_up, "vector_add");
    CUresult unknown_kernel = cuKernelGetFunction(&function, made_up_kernel);
    CUresult no_such_kernel = cuLibraryGetKernel(&kernel, library, "matmul");
    CUresult no_such_global = cuLibraryGetGlobal(&global, NULL, library, "nothing");
    CHECK(cuLibraryGetModule(&module, library));
    CUresult module_alone = cuModuleUnload(module);
    CHECK(cuLibraryUnload(library));
    CUresult twice = cuLibraryUnload(library);
    printf("refusals %d %d %d %d %d %d %d\n", bad_image, unknown_library, unknown_kernel, no_such_kernel,
           no_such_global, module_alone, twice);
    return 0;
}

static int hold(long mib) {
    library_load_data load = NULL;
    CUlibrary library;
    char held[128];
    snprintf(held, sizeof held, "gpupool-standin-module\nvector_add\nglobal weights %llu\n",
             (unsigned long long)mib << 20);
    CHECK(cuGetProcAddress_v2("cuLibraryLoadData", (void **)&load, 12000, 0, NULL));
    CHECK(load(&library, held, NULL, NULL, 0, NULL, NULL, 0));
    printf("held %ld\n", mib);
    fflush(stdout);
    for (;;) pause();
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (setup() != 0) return 1;
    if (strcmp(argv[1], "library") == 0 && argc > 2) return library((unsigned)atol(argv[2]));
    if (strcmp(argv[1], "file") == 0 && argc > 3) return from_file(argv[2], (unsigned)atol(argv[3]));
    if (strcmp(argv[1], "refusals") == 0) return refusals();
    if (strcmp(argv[1], "hold") == 0 && argc > 2) return hold(atol(argv[2]));
    return 2;
}
