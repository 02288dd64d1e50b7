/*
 * Looks driver entry points up the ways a program can, and says what it was handed, for the tests
 * of lookups of variants newer than the interception library wraps (test_newer_variants.py).
 * Usage: lookup STEP... ; each step prints one line "<step> <code> [values]".
 *   proc:NAME:VERSION    cuGetProcAddress_v2(NAME, VERSION): code, symbolStatus, origin, symbol
 *   proc1:NAME:VERSION   cuGetProcAddress (v1): code, origin, symbol
 *   dlsym:NAME   the same through the driver's handle: code (0, or 500 for NULL), origin, symbol
 *   alloc:SIZE   calls what the last lookup handed out as a cuMemAlloc_v3 (pointer, size, flags):
 *                its CUresult, or -1 when it handed out nothing
 *   gnode:SIZE   calls what the last lookup handed out as a cuGraphAddNode_v2/_v3 (edge data): a memory
 *                node of SIZE on card 0 in a new graph; its CUresult, or -1 when it handed out nothing
 *   used         the stand-in driver's bytes in use on card 0
 * origin: library (the interception library's), driver (the stand-in's), none (NULL), other;
 * symbol: the exported name at that address, "?" for an address inside a function (an internal one).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
uint64_t gpupoolStandinUsedBytes(int dev);

typedef CUresult (*alloc_v3_fn)(CUdeviceptr *dptr, size_t bytesize, unsigned long long flags);

static void *driver;            /* dlopen("libcuda.so.1") */
static const void *library_base, *driver_base;
static void *handed;            /* what the last lookup handed out */

static const void *base_of(const void *address) {
    Dl_info info;
    return address != NULL && dladdr(address, &info) ? info.dli_fbase : NULL;
}

static void print_origin(const void *address) {
    Dl_info info;
    const void *base = base_of(address);
    const char *origin = address == NULL ? "none" : base == library_base ? "library" : base == driver_base ? "driver"
                                                                                                           : "other";
    int named = address != NULL && dladdr(address, &info) && info.dli_sname != NULL && info.dli_saddr == address;
    printf(" %s %s", origin, named ? info.dli_sname : "?");
}

static unsigned long long size_of(const char *text) {
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (*end == 'g') value <<= 30;
    if (*end == 'm') value <<= 20;
    return value;
}

static void step(char *text) {
    printf("%s", text);
    char *argument = strchr(text, ':');
    if (argument != NULL) *argument++ = '\0';
    char *version = argument != NULL ? strrchr(argument, ':') : NULL;
    if (version != NULL) *version++ = '\0';
    if (strcmp(text, "proc") == 0) {
        CUdriverProcAddressQueryResult status = -1;
        handed = NULL;
        CUresult rc = cuGetProcAddress_v2(argument, &handed, atoi(version), 0, &status);
        printf(" %d %d", rc, status);
        print_origin(handed);
    } else if (strcmp(text, "proc1") == 0) {
        handed = NULL;
        printf(" %d", cuGetProcAddress(argument, &handed, atoi(version), 0));
        print_origin(handed);
    } else if (strcmp(text, "dlsym") == 0) {
        handed = dlsym(driver, argument);
        printf(" %d", handed != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND);
        print_origin(handed);
    } else if (strcmp(text, "alloc") == 0) {
        CUdeviceptr pointer = 0;
        printf(" %d", handed == NULL ? -1 : ((alloc_v3_fn)handed)(&pointer, size_of(argument), 0));
    } else if (strcmp(text, "gnode") == 0) {
        CUgraphNodeParams params = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC};
        params.alloc.poolProps = (CUmemPoolProps){.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE}};
        params.alloc.bytesize = size_of(argument);
        CUgraph graph = NULL;
        CUgraphNode node = NULL;
        CUresult rc = handed == NULL ? (CUresult)-1 : cuGraphCreate(&graph, 0);
        if (rc == CUDA_SUCCESS) rc = ((__typeof__(&cuGraphAddNode_v3))handed)(&node, graph, NULL, NULL, 0, &params);
        printf(" %d", (int)rc);
    } else if (strcmp(text, "used") == 0) {
        printf(" 0 %llu", (unsigned long long)gpupoolStandinUsedBytes(0));
    } else {
        printf(" unknown-step\n");
        exit(2);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    driver = dlopen("libcuda.so.1", RTLD_NOW);
    CUcontext ctx;
    if (driver == NULL || cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "lookup: no driver or no context\n");
        return 3;
    }
    library_base = base_of(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2")); /* the library's, when preloaded */
    driver_base = base_of(dlsym(driver, "gpupoolStandinUsedBytes"));     /* only the stand-in has it */
    for (int i = 1; i < argc; i++) step(argv[i]);
    return 0;
}
