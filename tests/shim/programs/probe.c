/*
 * Drives the driver API step by step for the interception library's tests. The entry points come
 * from one of three places, so each path into the library is tested on its own:
 *   symbol       the program is linked against libcuda.so.1 and calls it by name;
 *   dlsym        dlopen("libcuda.so.1") + dlsym(name);
 *   procaddress  only cuGetProcAddress_v2 is looked up; everything else comes through it;
 * and three ways around a library that replaces dlsym (each uses the dlsym it got for every name):
 *   libcdlsym    dlsym fetched from libc's own handle;
 *   vdlsym       dlsym fetched with dlvsym from libc's handle;
 *   mopen        the driver loaded with dlmopen(LM_ID_NEWLM), names looked up with the dlsym of
 *                that namespace's own libc.
 * Usage: probe MODE STEP... ; each step prints one line "<step> <CUresult> [values]".
 * Steps: alloc:SIZE  managed:SIZE  async:SIZE  pool:SIZE  pitch:WxH  create:SIZE  array:WxH
 *        array3d:WxHxD  mipmap:WxHxL  free:I  freeasync:I  release:I  destroy:I  unmip:I
 *        info  total  grab:SIZE:N  wait:PATH  sleep:MS  hold  launch:N  ppid  nsload:PATH
 *        closefds   (closes every descriptor past stderr, the library's too, as a daemon does, and
 *        opens /dev/null a few times so that their numbers name another file)
 *        fork:STEP+STEP...   (a child forked without exec runs those steps, printing its lines, then
 *        pauses for good; the parent prints its line after them, with the child's pid)
 *        defpool  mkpool[:DEV]  setkeep:I:BYTES  getkeep:I  poolalloc:I:SIZE  sync  used
 *        graph  gmem:I:SIZE  gnode:I:SIZE  gdelnode:I  gdel:I  ipcopen:I  ipcclose:I
 *        capture  casync:SIZE  cfree:I  claunch:N  endcapture   (on a stream of its own, captured into a graph)
 *        events   (the stand-in's count of events recorded, and of those recorded on a captured stream)
 *        map:I:SIZE  unmap:I:SIZE  export:I  import:I  importfd:FD  close:I  retain:I   (VMM handles)
 *        vmmgrab:N:SIZE  vmmdrop   (N allocations of SIZE, each mapped and its handle released; unmap them)
 *        inst:I  instp:I  execdel:I  clone:I   (executable graphs and copies of graph I)
 *        gmove:P:C   (graph C moved into graph P as a child graph node)
 *        alloc1:SIZE  pitch1:WxH  free1:I  array1:WxH  array3d1:WxHxD   (the v1 entry points, CUDA < 3.2)
 *        extimport:SIZE  extdel:I  instl:I   (external memory; CUDA 11's 5-argument instantiation)
 *        count  use:D  ctxdev  totalof:D  name:D  newctx:D  ctxdel  unuse:D   (devices and contexts:
 *        use retains device D's primary context and makes it current, unuse releases it, newctx
 *        creates a context on D (current), ctxdel destroys the last one; totalof: cuDeviceTotalMem)
 *        newctx3:D  newctx4:D   (the same through cuCtxCreate_v3 (CUDA 11.4) and _v4 (12.5))
 *        ctxdev2  ctxdev2:last   (CUDA 13's cuCtxGetDevice_v2 of the current, or the last created, context)
 *        setaccess:D  getaccess:D  poolsetaccess:D  poolgetaccess:D  granularity:D  advise:D  advise2:D
 *        prefetch:D  prefetch2:D  prefetchptsz:D  prefetch2ptsz:D  p2p:SxD  seen   (entry points that
 *        name device D; seen: the device the stand-in driver was last handed)
 *        child:STEP+STEP...   (runs this program's symbol mode with those steps as a child whose
 *        environment is cleared of the container's settings; prints its exit status, then its lines)
 *        the capture steps prefixed p (pcapture, pcasync:SIZE, pcfree:I, pendcapture) use the _ptsz
 *        entry points on the NULL stream, prefixed t the plain ones on CU_STREAM_PER_THREAD
 *        (I: index of an earlier allocation, pool, graph or node; used: the stand-in's bytes in use)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
uint64_t gpupoolStandinUsedBytes(int dev);
int gpupoolStandinLastDevice(void);
void gpupoolStandinEventCounts(unsigned long long *recorded, unsigned long long *recorded_in_capture);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);

#define CUDA_VERSION_ASKED 12080
#define CUDA_VERSION_V1 3010
#define MAX_HANDLES 4096
#define CAPTURED_STREAM ((CUstream)(uintptr_t)0x5000) /* the stand-in takes any non-NULL stream */

static struct {
    __typeof__(&cuInit) init;
    __typeof__(&cuDevicePrimaryCtxRetain) retain;
    __typeof__(&cuCtxSetCurrent) set_current;
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemAllocManaged) managed;
    __typeof__(&cuMemAllocAsync) async;
    __typeof__(&cuMemAllocFromPoolAsync) pool;
    __typeof__(&cuMemAllocPitch_v2) pitch;
    __typeof__(&cuMemFree_v2) free;
    __typeof__(&cuMemFreeAsync) free_async;
    __typeof__(&cuMemCreate) create;
    __typeof__(&cuMemRelease) release;
    __typeof__(&cuArrayCreate_v2) array;
    __typeof__(&cuArray3DCreate_v2) array3d;
    __typeof__(&cuArrayDestroy) destroy;
    __typeof__(&cuMipmappedArrayCreate) mipmap;
    __typeof__(&cuMipmappedArrayDestroy) unmip;
    __typeof__(&cuMemGetInfo_v2) info;
    __typeof__(&cuDeviceTotalMem_v2) total;
    __typeof__(&cuLaunchKernel) launch;
    __typeof__(&cuCtxSynchronize) sync;
    __typeof__(&cuDeviceGetDefaultMemPool) default_pool;
    __typeof__(&cuMemPoolCreate) pool_create;
    __typeof__(&cuMemPoolSetAttribute) pool_set;
    __typeof__(&cuMemPoolGetAttribute) pool_get;
    __typeof__(&cuGraphCreate) graph_create;
    __typeof__(&cuGraphAddMemAllocNode) graph_memory;
    __typeof__(&cuGraphAddNode_v2) graph_node;
    __typeof__(&cuGraphDestroyNode) graph_destroy_node;
    __typeof__(&cuGraphDestroy) graph_destroy;
    __typeof__(&cuIpcGetMemHandle) ipc_get;
    __typeof__(&cuIpcOpenMemHandle_v2) ipc_open;
    __typeof__(&cuIpcCloseMemHandle) ipc_close;
    __typeof__(&cuStreamBeginCapture_v2) begin_capture;
    __typeof__(&cuStreamEndCapture) end_capture;
    __typeof__(&cuMemAddressReserve) reserve;
    __typeof__(&cuMemMap) map;
    __typeof__(&cuMemUnmap) unmap;
    __typeof__(&cuMemExportToShareableHandle) export_handle;
    __typeof__(&cuMemImportFromShareableHandle) import_handle;
    __typeof__(&cuMemRetainAllocationHandle) retain_handle;
    __typeof__(&cuGraphInstantiateWithFlags) instantiate;
    __typeof__(&cuGraphInstantiateWithParams) instantiate_params;
    __typeof__(&cuGraphExecDestroy) exec_destroy;
    __typeof__(&cuGraphClone) clone;
    __typeof__(&cuMemAllocAsync_ptsz) async_ptsz;
    __typeof__(&cuMemFreeAsync_ptsz) free_async_ptsz;
    __typeof__(&cuStreamBeginCapture_v2_ptsz) begin_capture_ptsz;
    __typeof__(&cuStreamEndCapture_ptsz) end_capture_ptsz;
    __typeof__(&cuMemAlloc) alloc1;
    __typeof__(&cuMemAllocPitch) pitch1;
    __typeof__(&cuMemFree) free1;
    __typeof__(&cuArrayCreate) array1;
    __typeof__(&cuArray3DCreate) array3d1;
    __typeof__(&cuImportExternalMemory) ext_import;
    __typeof__(&cuDestroyExternalMemory) ext_destroy;
    __typeof__(&cuGraphInstantiate_v2) instantiate_legacy;
    __typeof__(&cuDeviceGetCount) count;
    __typeof__(&cuDeviceGet) get;
    __typeof__(&cuDeviceGetName) name;
    __typeof__(&cuCtxGetDevice) ctx_device;
    __typeof__(&cuCtxCreate_v2) ctx_create;
    __typeof__(&cuCtxDestroy_v2) ctx_destroy;
    __typeof__(&cuDevicePrimaryCtxRelease_v2) primary_release;
    __typeof__(&cuMemSetAccess) set_access;
    __typeof__(&cuMemGetAllocationGranularity) granularity;
    __typeof__(&cuMemAdvise_v2) advise2;
    __typeof__(&cuDeviceGetP2PAttribute) p2p;
    __typeof__(&cuCtxCreate_v3) ctx_create3;
    __typeof__(&cuCtxGetDevice_v2) ctx_device2;
    __typeof__(&cuCtxCreate_v4) ctx_create4;
    __typeof__(&cuMemGetAccess) get_access;
    __typeof__(&cuMemPoolSetAccess) pool_set_access;
    __typeof__(&cuMemPoolGetAccess) pool_get_access;
    __typeof__(&cuMemAdvise) advise1;
    __typeof__(&cuMemPrefetchAsync) prefetch1;
    __typeof__(&cuMemPrefetchAsync_v2) prefetch2;
    __typeof__(&cuMemPrefetchAsync_ptsz) prefetch1_ptsz;
    __typeof__(&cuMemPrefetchAsync_v2_ptsz) prefetch2_ptsz;
} api;

static unsigned long long handles[MAX_HANDLES];
static CUdeviceptr grabbed[MAX_HANDLES];
static unsigned long long grabbed_size;
static int grabbed_count;
static int handle_count;

typedef void *(*lookup_fn)(void *, const char *);
static lookup_fn lookup = dlsym;

static void *resolve_dlsym(void *library, const char *name) {
    void *found = lookup(library, name);
    if (found == NULL) fprintf(stderr, "probe: %s not found\n", name);
    return found;
}

static void *resolve_proc(void *getter, const char *name, cuuint64_t flags, int version) {
    void *found = NULL;
    CUdriverProcAddressQueryResult status;
    CUresult rc = ((__typeof__(&cuGetProcAddress_v2))getter)(name, &found, version, flags, &status);
    if (rc != CUDA_SUCCESS) fprintf(stderr, "probe: cuGetProcAddress_v2(%s) = %d\n", name, rc);
    return found;
}

#define FILL(field, symbol, base)                                                                      \
    api.field = mode == 's' ? &symbol                                                                   \
                : mode != 'p' ? (__typeof__(&symbol))resolve_dlsym(library, #symbol)                    \
                              : (__typeof__(&symbol))resolve_proc(getter, base, 0, CUDA_VERSION_ASKED)
/* A v1 entry point: through cuGetProcAddress, the base name asked for by a CUDA 3.1 program. */
#define FILL_V1(field, symbol)                                                                          \
    api.field = mode == 's' ? &symbol                                                                   \
                : mode != 'p' ? (__typeof__(&symbol))resolve_dlsym(library, #symbol)                    \
                              : (__typeof__(&symbol))resolve_proc(getter, #symbol, 0, CUDA_VERSION_V1)
/* A _ptsz entry point: through cuGetProcAddress, the base name asked for per-thread streams. */
#define FILL_PTSZ(field, symbol, base)                                                                 \
    api.field = mode == 's' ? &symbol                                                                   \
                : mode != 'p' ? (__typeof__(&symbol))resolve_dlsym(library, #symbol)                    \
                              : (__typeof__(&symbol))resolve_proc(getter, base,                         \
                                                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, \
                                                                  CUDA_VERSION_ASKED)

/* Through cuGetProcAddress, the base name asked for by a program of a given CUDA version, with flags. */
#define FILL_AT(field, symbol, base, flags, version)                                                   \
    api.field = mode == 's' ? &symbol                                                                   \
                : mode != 'p' ? (__typeof__(&symbol))resolve_dlsym(library, #symbol)                    \
                              : (__typeof__(&symbol))resolve_proc(getter, base, flags, version)

static void fill(char mode) {
    void *library = NULL, *getter = NULL;
    if (mode != 's') {
        library = mode == 'm' ? dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW) : dlopen("libcuda.so.1", RTLD_NOW);
        if (library == NULL) {
            fprintf(stderr, "probe: %s\n", dlerror());
            exit(3);
        }
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (mode == 'l') lookup = (lookup_fn)dlsym(libc, "dlsym");
        if (mode == 'v') lookup = (lookup_fn)dlvsym(libc, "dlsym", "GLIBC_2.34");
        if (mode == 'v' && lookup == NULL) lookup = (lookup_fn)dlvsym(libc, "dlsym", "GLIBC_2.2.5");
        if (mode == 'm') {
            Lmid_t space = LM_ID_BASE;
            dlinfo(library, RTLD_DI_LMID, &space);
            void *own_libc = dlmopen(space, "libc.so.6", RTLD_NOW);
            lookup = own_libc != NULL ? (lookup_fn)dlsym(own_libc, "dlsym") : NULL;
        }
        if (lookup == NULL) {
            fprintf(stderr, "probe: no dlsym for mode %c\n", mode);
            exit(3);
        }
        getter = dlsym(library, "cuGetProcAddress_v2");
    }
    FILL(init, cuInit, "cuInit");
    FILL(retain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    FILL(set_current, cuCtxSetCurrent, "cuCtxSetCurrent");
    FILL(alloc, cuMemAlloc_v2, "cuMemAlloc");
    FILL(managed, cuMemAllocManaged, "cuMemAllocManaged");
    FILL(async, cuMemAllocAsync, "cuMemAllocAsync");
    FILL(pool, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    FILL(pitch, cuMemAllocPitch_v2, "cuMemAllocPitch");
    FILL(free, cuMemFree_v2, "cuMemFree");
    FILL(free_async, cuMemFreeAsync, "cuMemFreeAsync");
    FILL(create, cuMemCreate, "cuMemCreate");
    FILL(release, cuMemRelease, "cuMemRelease");
    FILL(array, cuArrayCreate_v2, "cuArrayCreate");
    FILL(array3d, cuArray3DCreate_v2, "cuArray3DCreate");
    FILL(destroy, cuArrayDestroy, "cuArrayDestroy");
    FILL(mipmap, cuMipmappedArrayCreate, "cuMipmappedArrayCreate");
    FILL(unmip, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy");
    FILL(info, cuMemGetInfo_v2, "cuMemGetInfo");
    FILL(total, cuDeviceTotalMem_v2, "cuDeviceTotalMem");
    FILL(launch, cuLaunchKernel, "cuLaunchKernel");
    FILL(sync, cuCtxSynchronize, "cuCtxSynchronize");
    FILL(default_pool, cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
    FILL(pool_create, cuMemPoolCreate, "cuMemPoolCreate");
    FILL(pool_set, cuMemPoolSetAttribute, "cuMemPoolSetAttribute");
    FILL(pool_get, cuMemPoolGetAttribute, "cuMemPoolGetAttribute");
    FILL(graph_create, cuGraphCreate, "cuGraphCreate");
    FILL(graph_memory, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode");
    FILL(graph_node, cuGraphAddNode_v2, "cuGraphAddNode");
    FILL(graph_destroy_node, cuGraphDestroyNode, "cuGraphDestroyNode");
    FILL(graph_destroy, cuGraphDestroy, "cuGraphDestroy");
    FILL(ipc_get, cuIpcGetMemHandle, "cuIpcGetMemHandle");
    FILL(ipc_open, cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle");
    FILL(ipc_close, cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    FILL(begin_capture, cuStreamBeginCapture_v2, "cuStreamBeginCapture");
    FILL(end_capture, cuStreamEndCapture, "cuStreamEndCapture");
    FILL(reserve, cuMemAddressReserve, "cuMemAddressReserve");
    FILL(map, cuMemMap, "cuMemMap");
    FILL(unmap, cuMemUnmap, "cuMemUnmap");
    FILL(export_handle, cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
    FILL(import_handle, cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    FILL(retain_handle, cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    FILL(instantiate, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    FILL(instantiate_params, cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams");
    FILL(exec_destroy, cuGraphExecDestroy, "cuGraphExecDestroy");
    FILL(clone, cuGraphClone, "cuGraphClone");
    FILL_PTSZ(async_ptsz, cuMemAllocAsync_ptsz, "cuMemAllocAsync");
    FILL_PTSZ(free_async_ptsz, cuMemFreeAsync_ptsz, "cuMemFreeAsync");
    FILL_PTSZ(begin_capture_ptsz, cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture");
    FILL_PTSZ(end_capture_ptsz, cuStreamEndCapture_ptsz, "cuStreamEndCapture");
    FILL_V1(alloc1, cuMemAlloc);
    FILL_V1(pitch1, cuMemAllocPitch);
    FILL_V1(free1, cuMemFree);
    FILL_V1(array1, cuArrayCreate);
    FILL_V1(array3d1, cuArray3DCreate);
    FILL(ext_import, cuImportExternalMemory, "cuImportExternalMemory");
    FILL(ext_destroy, cuDestroyExternalMemory, "cuDestroyExternalMemory");
    FILL(instantiate_legacy, cuGraphInstantiate_v2, "cuGraphInstantiate_v2");
    FILL(count, cuDeviceGetCount, "cuDeviceGetCount");
    FILL(get, cuDeviceGet, "cuDeviceGet");
    FILL(name, cuDeviceGetName, "cuDeviceGetName");
    FILL(ctx_device, cuCtxGetDevice, "cuCtxGetDevice");
    FILL_AT(ctx_create, cuCtxCreate_v2, "cuCtxCreate", 0, 11000); /* before _v3 took the name */
    FILL(ctx_destroy, cuCtxDestroy_v2, "cuCtxDestroy");
    FILL(primary_release, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease");
    FILL(set_access, cuMemSetAccess, "cuMemSetAccess");
    FILL(granularity, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    FILL(advise2, cuMemAdvise_v2, "cuMemAdvise");
    FILL(p2p, cuDeviceGetP2PAttribute, "cuDeviceGetP2PAttribute");
    FILL_AT(ctx_create3, cuCtxCreate_v3, "cuCtxCreate", 0, 12000);
    FILL_AT(ctx_device2, cuCtxGetDevice_v2, "cuCtxGetDevice", 0, 13000);
    FILL(ctx_create4, cuCtxCreate_v4, "cuCtxCreate");
    FILL(get_access, cuMemGetAccess, "cuMemGetAccess");
    FILL(pool_set_access, cuMemPoolSetAccess, "cuMemPoolSetAccess");
    FILL(pool_get_access, cuMemPoolGetAccess, "cuMemPoolGetAccess");
    FILL_AT(advise1, cuMemAdvise, "cuMemAdvise", 0, 12000); /* before the location-taking form */
    FILL_AT(prefetch1, cuMemPrefetchAsync, "cuMemPrefetchAsync", 0, 12000);
    FILL(prefetch2, cuMemPrefetchAsync_v2, "cuMemPrefetchAsync");
    FILL_AT(prefetch1_ptsz, cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            12000);
    FILL_PTSZ(prefetch2_ptsz, cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync");
}

/* Devices and contexts as a program for several GPUs sees them. */
#define MANAGED_RANGE 0x7e0000000000ull           /* an address range the stand-in takes as managed memory */
#define SOME_POOL ((CUmemoryPool)(uintptr_t)0x10) /* a pool handle the stand-in takes as it is */

static int step_devices(const char *verb, const char *argument) {
    static CUcontext last_created;
    const CUmemLocation device = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = atoi(argument)};
    CUdevice dev = -1;
    CUcontext ctx = NULL;
    CUresult rc;
    if (strcmp(verb, "count") == 0) {
        int count = 0;
        rc = api.count(&count);
        printf(" %d %d", rc, count);
    } else if (strcmp(verb, "use") == 0) {
        rc = api.get(&dev, atoi(argument));
        if (rc == CUDA_SUCCESS) rc = api.retain(&ctx, dev);
        if (rc == CUDA_SUCCESS) rc = api.set_current(ctx);
        printf(" %d %d %#lx", rc, (int)dev, (unsigned long)(uintptr_t)ctx);
    } else if (strcmp(verb, "unuse") == 0) {
        printf(" %d", api.primary_release(atoi(argument)));
    } else if (strcmp(verb, "ctxdev") == 0) {
        rc = api.ctx_device(&dev);
        printf(" %d %d", rc, (int)dev);
    } else if (strcmp(verb, "totalof") == 0) {
        size_t total = 0;
        rc = api.total(&total, atoi(argument));
        printf(" %d %zu", rc, total);
    } else if (strcmp(verb, "name") == 0) {
        char name[128] = "";
        rc = api.name(name, sizeof name, atoi(argument));
        for (char *c = name; *c != '\0'; c++) *c = *c == ' ' ? '_' : *c;
        printf(" %d %s", rc, name);
    } else if (strcmp(verb, "newctx") == 0) {
        rc = api.ctx_create(&last_created, 0, atoi(argument));
        printf(" %d %#lx", rc, (unsigned long)(uintptr_t)last_created);
    } else if (strcmp(verb, "ctxdel") == 0) {
        printf(" %d", api.ctx_destroy(last_created));
    } else if (strcmp(verb, "setaccess") == 0) { /* then "seen": the device the driver got */
        CUmemAccessDesc desc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = atoi(argument)}, .flags = 3};
        printf(" %d", api.set_access(0x7e0000000000ull, 2u << 20, &desc, 1));
    } else if (strcmp(verb, "granularity") == 0) {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = atoi(argument)}};
        size_t granularity = 0;
        rc = api.granularity(&granularity, &prop, 0);
        printf(" %d %zu", rc, granularity);
    } else if (strcmp(verb, "advise2") == 0) {
        CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = atoi(argument)};
        printf(" %d", api.advise2(0x7e0000000000ull, 2u << 20, 1, location));
    } else if (strcmp(verb, "ctxdev2") == 0) { /* CUDA 13's form: ctxdev2 (the current context), ctxdev2:last */
        rc = api.ctx_device2(&dev, strcmp(argument, "last") == 0 ? last_created : NULL);
        printf(" %d %d", rc, (int)dev);
    } else if (strcmp(verb, "newctx3") == 0) {
        rc = api.ctx_create3(&last_created, NULL, 0, 0, atoi(argument));
        printf(" %d %#lx", rc, (unsigned long)(uintptr_t)last_created);
    } else if (strcmp(verb, "newctx4") == 0) {
        rc = api.ctx_create4(&last_created, NULL, 0, atoi(argument));
        printf(" %d %#lx", rc, (unsigned long)(uintptr_t)last_created);
    } else if (strcmp(verb, "getaccess") == 0) {
        unsigned long long flags = 0;
        printf(" %d", api.get_access(&flags, &device, MANAGED_RANGE));
    } else if (strcmp(verb, "poolsetaccess") == 0) {
        CUmemAccessDesc desc = {.location = device, .flags = 3};
        printf(" %d", api.pool_set_access(SOME_POOL, &desc, 1));
    } else if (strcmp(verb, "poolgetaccess") == 0) {
        CUmemAccess_flags flags = 0;
        CUmemLocation asked = device; /* the driver's prototype takes it non-const */
        printf(" %d", api.pool_get_access(&flags, SOME_POOL, &asked));
    } else if (strcmp(verb, "advise") == 0) {
        printf(" %d", api.advise1(MANAGED_RANGE, 2u << 20, 1, atoi(argument)));
    } else if (strcmp(verb, "prefetch") == 0) {
        printf(" %d", api.prefetch1(MANAGED_RANGE, 2u << 20, atoi(argument), NULL));
    } else if (strcmp(verb, "prefetch2") == 0) {
        printf(" %d", api.prefetch2(MANAGED_RANGE, 2u << 20, device, 0, NULL));
    } else if (strcmp(verb, "prefetchptsz") == 0) {
        printf(" %d", api.prefetch1_ptsz(MANAGED_RANGE, 2u << 20, atoi(argument), NULL));
    } else if (strcmp(verb, "prefetch2ptsz") == 0) {
        printf(" %d", api.prefetch2_ptsz(MANAGED_RANGE, 2u << 20, device, 0, NULL));
    } else if (strcmp(verb, "p2p") == 0) { /* p2p:SxD */
        int value = -1;
        rc = api.p2p(&value, 2, atoi(argument), atoi(strchr(argument, 'x') ? strchr(argument, 'x') + 1 : "0"));
        printf(" %d %d", rc, value);
    } else if (strcmp(verb, "seen") == 0) {
        printf(" 0 %d", gpupoolStandinLastDevice());
    } else {
        return 0;
    }
    return 1;
}

static unsigned long long size_of(const char *text) {
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    switch (*end) {
    case 'k': return value << 10;
    case 'm': return value << 20;
    case 'g': return value << 30;
    default: return value;
    }
}

static void keep(CUresult rc, unsigned long long handle) {
    if (rc == CUDA_SUCCESS && handle_count < MAX_HANDLES) handles[handle_count++] = handle;
    printf(" %d", rc == CUDA_SUCCESS ? handle_count - 1 : -1);
}

/* "I:SIZE": an earlier handle and a size. */
static unsigned long long indexed(const char *argument, unsigned long long *size) {
    const char *colon = strchr(argument, ':');
    *size = colon ? size_of(colon + 1) : 0;
    return handles[atoi(argument) % MAX_HANDLES];
}

/* The VMM steps; 0 when the verb is none of them. */
static int step_vmm(const char *verb, const char *argument) {
    unsigned long long handle = 0, size = 0, target = indexed(argument, &size);
    CUresult rc;
    if (strcmp(verb, "map") == 0) { /* reserve addresses for SIZE bytes and map handle I there */
        CUdeviceptr va = 0;
        rc = api.reserve(&va, size, 0, 0, 0);
        if (rc == CUDA_SUCCESS) rc = api.map(va, size, 0, target, 0);
        printf(" %d", rc);
        keep(rc, va);
    } else if (strcmp(verb, "unmap") == 0) {
        printf(" %d", api.unmap(target, size));
    } else if (strcmp(verb, "vmmgrab") == 0) { /* many at once: the library's tables have to grow */
        CUmemAllocationProp prop = {.type = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        int wanted = atoi(argument) < MAX_HANDLES ? atoi(argument) : MAX_HANDLES;
        rc = CUDA_SUCCESS;
        grabbed_size = size;
        for (grabbed_count = 0; grabbed_count < wanted && rc == CUDA_SUCCESS; grabbed_count++) {
            CUdeviceptr va = 0;
            rc = api.create(&handle, size, &prop, 0);
            if (rc == CUDA_SUCCESS) rc = api.reserve(&va, size, 0, 0, 0);
            if (rc == CUDA_SUCCESS) rc = api.map(va, size, 0, handle, 0);
            if (rc == CUDA_SUCCESS) rc = api.release(handle);
            grabbed[grabbed_count] = va;
        }
        printf(" %d %d", rc, grabbed_count - (rc != CUDA_SUCCESS));
    } else if (strcmp(verb, "vmmdrop") == 0) {
        rc = CUDA_SUCCESS;
        for (int i = 0; i < grabbed_count && rc == CUDA_SUCCESS; i++)
            if (grabbed[i] != 0) rc = api.unmap(grabbed[i], grabbed_size);
        printf(" %d", rc);
    } else if (strcmp(verb, "export") == 0) {
        int fd = -1;
        rc = api.export_handle(&fd, target, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf(" %d", rc);
        keep(rc, (unsigned long long)fd);
        printf(" %d", fd);
    } else if (strcmp(verb, "import") == 0 || strcmp(verb, "importfd") == 0) {
        int fd = verb[6] == 'f' ? atoi(argument) : (int)target;
        rc = api.import_handle(&handle, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb, "close") == 0) {
        printf(" %d", close((int)target) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
    } else if (strcmp(verb, "retain") == 0) { /* an address inside the mapping at index I */
        rc = api.retain_handle(&handle, (void *)(uintptr_t)(target + 4096));
        printf(" %d", rc);
        keep(rc, handle);
    } else {
        return 0;
    }
    return 1;
}

/* Executable graphs and copies; 0 when the verb is none of them. */
static int step_graph(const char *verb, const char *argument) {
    unsigned long long size = 0, target = indexed(argument, &size);
    CUresult rc;
    if (strcmp(verb, "inst") == 0 || strcmp(verb, "instp") == 0) {
        CUgraphExec exec = NULL;
        CUDA_GRAPH_INSTANTIATE_PARAMS params = {0};
        rc = verb[4] == 'p' ? api.instantiate_params(&exec, (CUgraph)(uintptr_t)target, &params)
                            : api.instantiate(&exec, (CUgraph)(uintptr_t)target, 0);
        printf(" %d", rc);
        keep(rc, (uintptr_t)exec);
    } else if (strcmp(verb, "execdel") == 0) {
        printf(" %d", api.exec_destroy((CUgraphExec)(uintptr_t)target));
    } else if (strcmp(verb, "gmove") == 0) {
        CUgraphNodeParams params = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
        params.graph.graph = (CUgraph)(uintptr_t)handles[size % MAX_HANDLES];
        params.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
        CUgraphNode node = NULL;
        rc = api.graph_node(&node, (CUgraph)(uintptr_t)target, NULL, NULL, 0, &params);
        printf(" %d", rc);
        keep(rc, (uintptr_t)node);
    } else if (strcmp(verb, "clone") == 0) {
        CUgraph copy = NULL;
        rc = api.clone(&copy, (CUgraph)(uintptr_t)target);
        printf(" %d", rc);
        keep(rc, (uintptr_t)copy);
    } else {
        return 0;
    }
    return 1;
}

/* The v1 entry points, external memory and CUDA 11's instantiation; 0 when the verb is none of them. */
static int step_legacy(const char *verb, const char *argument) {
    unsigned long long size = 0, target = indexed(argument, &size);
    unsigned a = 0, b = 0, c = 0;
    sscanf(argument, "%ux%ux%u", &a, &b, &c);
    CUresult rc;
    if (strcmp(verb, "alloc1") == 0 || strcmp(verb, "pitch1") == 0) {
        CUdeviceptr_v1 pointer = 0;
        unsigned pitch = 0;
        rc = verb[0] == 'a' ? api.alloc1(&pointer, (unsigned)size_of(argument)) : api.pitch1(&pointer, &pitch, a, b, 4);
        printf(" %d", rc);
        keep(rc, pointer);
    } else if (strcmp(verb, "free1") == 0) {
        printf(" %d", api.free1((CUdeviceptr_v1)target));
    } else if (strcmp(verb, "array1") == 0 || strcmp(verb, "array3d1") == 0) {
        CUDA_ARRAY_DESCRIPTOR_v1 flat = {.Width = a, .Height = b, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUDA_ARRAY3D_DESCRIPTOR_v1 deep = {.Width = a, .Height = b, .Depth = c, .Format = CU_AD_FORMAT_FLOAT,
                                           .NumChannels = 1};
        CUarray array = NULL;
        rc = verb[5] == '1' ? api.array1(&array, &flat) : api.array3d1(&array, &deep);
        printf(" %d", rc);
        keep(rc, (uintptr_t)array);
    } else if (strcmp(verb, "extimport") == 0) { /* the stand-in takes any descriptor and owns it after */
        CUDA_EXTERNAL_MEMORY_HANDLE_DESC desc = {.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
                                                 .size = size_of(argument)};
        desc.handle.fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        CUexternalMemory memory = NULL;
        rc = api.ext_import(&memory, &desc);
        if (rc != CUDA_SUCCESS) close(desc.handle.fd);
        printf(" %d", rc);
        keep(rc, (uintptr_t)memory);
    } else if (strcmp(verb, "extdel") == 0) {
        printf(" %d", api.ext_destroy((CUexternalMemory)(uintptr_t)target));
    } else if (strcmp(verb, "instl") == 0) {
        CUgraphExec exec = NULL;
        rc = api.instantiate_legacy(&exec, (CUgraph)(uintptr_t)target, NULL, NULL, 0);
        printf(" %d", rc);
        keep(rc, (uintptr_t)exec);
    } else {
        return 0;
    }
    return 1;
}

/* Capture on a thread's default stream: p = the _ptsz entry points with NULL, t = the plain ones
 * with CU_STREAM_PER_THREAD; 0 when the verb is none of them. */
static int step_per_thread(const char *verb, const char *argument) {
    if (verb[0] != 'p' && verb[0] != 't') return 0;
    int ptsz = verb[0] == 'p';
    CUstream stream = ptsz ? NULL : CU_STREAM_PER_THREAD;
    unsigned long long handle = 0, size = 0, target = indexed(argument, &size);
    CUresult rc;
    if (strcmp(verb + 1, "capture") == 0) {
        printf(" %d", ptsz ? api.begin_capture_ptsz(stream, 0) : api.begin_capture(stream, 0));
    } else if (strcmp(verb + 1, "endcapture") == 0) {
        CUgraph graph = NULL;
        rc = ptsz ? api.end_capture_ptsz(stream, &graph) : api.end_capture(stream, &graph);
        printf(" %d", rc);
        keep(rc, (uintptr_t)graph);
    } else if (strcmp(verb + 1, "casync") == 0) {
        rc = ptsz ? api.async_ptsz(&handle, size_of(argument), stream) : api.async(&handle, size_of(argument), stream);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb + 1, "cfree") == 0) {
        printf(" %d", ptsz ? api.free_async_ptsz(target, stream) : api.free_async(target, stream));
    } else {
        return 0;
    }
    return 1;
}

/* The memory-pool, graph and IPC steps; 0 when the verb is none of them. */
static int step_more(const char *verb, const char *argument) {
    unsigned long long handle = 0, size = 0, target = indexed(argument, &size);
    CUresult rc;
    if (strcmp(verb, "defpool") == 0) {
        CUmemoryPool pool = NULL;
        rc = api.default_pool(&pool, 0);
        printf(" %d", rc);
        keep(rc, (uintptr_t)pool);
    } else if (strcmp(verb, "mkpool") == 0) {
        CUmemPoolProps props = {.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = atoi(argument)}};
        CUmemoryPool pool = NULL;
        rc = api.pool_create(&pool, &props);
        printf(" %d", rc);
        keep(rc, (uintptr_t)pool);
    } else if (strcmp(verb, "setkeep") == 0) {
        cuuint64_t value = size;
        printf(" %d", api.pool_set((CUmemoryPool)(uintptr_t)target, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value));
    } else if (strcmp(verb, "getkeep") == 0) {
        cuuint64_t value = 0;
        rc = api.pool_get((CUmemoryPool)(uintptr_t)target, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value);
        printf(" %d %llu", rc, (unsigned long long)value);
    } else if (strcmp(verb, "poolalloc") == 0) {
        rc = api.pool(&handle, size, (CUmemoryPool)(uintptr_t)target, NULL);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb, "sync") == 0) {
        printf(" %d", api.sync());
    } else if (strcmp(verb, "used") == 0) {
        printf(" 0 %llu", (unsigned long long)gpupoolStandinUsedBytes(0));
    } else if (strcmp(verb, "graph") == 0) {
        CUgraph graph = NULL;
        rc = api.graph_create(&graph, 0);
        printf(" %d", rc);
        keep(rc, (uintptr_t)graph);
    } else if (strcmp(verb, "gmem") == 0 || strcmp(verb, "gnode") == 0) {
        CUgraphNodeParams params = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC};
        params.alloc.poolProps = (CUmemPoolProps){.allocType = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE}};
        params.alloc.bytesize = size;
        CUgraphNode node = NULL;
        CUgraph graph = (CUgraph)(uintptr_t)target;
        rc = verb[1] == 'm' ? api.graph_memory(&node, graph, NULL, 0, &params.alloc)
                            : api.graph_node(&node, graph, NULL, NULL, 0, &params);
        printf(" %d", rc);
        keep(rc, (uintptr_t)node);
    } else if (strcmp(verb, "gdelnode") == 0) {
        printf(" %d", api.graph_destroy_node((CUgraphNode)(uintptr_t)target));
    } else if (strcmp(verb, "gdel") == 0) {
        printf(" %d", api.graph_destroy((CUgraph)(uintptr_t)target));
    } else if (strcmp(verb, "ipcopen") == 0) {
        CUipcMemHandle ipc;
        rc = api.ipc_get(&ipc, target);
        if (rc == CUDA_SUCCESS) rc = api.ipc_open(&handle, ipc, 1);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb, "ipcclose") == 0) {
        printf(" %d", api.ipc_close(target));
    } else if (strcmp(verb, "capture") == 0) {
        printf(" %d", api.begin_capture(CAPTURED_STREAM, 0));
    } else if (strcmp(verb, "endcapture") == 0) {
        CUgraph graph = NULL;
        rc = api.end_capture(CAPTURED_STREAM, &graph);
        printf(" %d", rc);
        keep(rc, (uintptr_t)graph);
    } else if (strcmp(verb, "casync") == 0) {
        rc = api.async(&handle, size_of(argument), CAPTURED_STREAM);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb, "cfree") == 0) {
        printf(" %d", api.free_async(target, CAPTURED_STREAM));
    } else if (strcmp(verb, "claunch") == 0) {
        int n = atoi(argument);
        rc = CUDA_SUCCESS;
        for (int i = 0; i < n && rc == CUDA_SUCCESS; i++)
            rc = api.launch(NULL, 1, 1, 1, 32, 1, 1, 0, CAPTURED_STREAM, NULL, NULL);
        printf(" %d", rc);
    } else if (strcmp(verb, "events") == 0) {
        unsigned long long recorded = 0, in_capture = 0;
        gpupoolStandinEventCounts(&recorded, &in_capture);
        printf(" 0 %llu %llu", recorded, in_capture);
    } else {
        return 0;
    }
    return 1;
}

extern char **environ;

/* A child whose environment keeps only what stands for the machine (the preload file, the driver,
 * the stand-in's state, the sanitizers), as a process started with `env -i` in a HAMi-style pod,
 * whose /etc/ld.so.preload loads the library anyway. */
static int step_child(const char *argument) {
    static const char *machine[] = {"LD_PRELOAD=", "LD_LIBRARY_PATH=", "GPUPOOL_STANDIN_", "ASAN_OPTIONS=",
                                    "UBSAN_OPTIONS=", "PATH="};
    char *env[64], *args[64], steps[4096];
    int n = 0, a = 0;
    for (char **e = environ; *e != NULL && n < 63; e++)
        for (size_t m = 0; m < sizeof machine / sizeof *machine; m++)
            if (strncmp(*e, machine[m], strlen(machine[m])) == 0) env[n++] = *e;
    env[n] = NULL;
    snprintf(steps, sizeof steps, "%s", argument);
    args[a++] = "/proc/self/exe";
    args[a++] = "symbol";
    for (char *part = strtok(steps, "+"); part != NULL && a < 63; part = strtok(NULL, "+")) args[a++] = part;
    args[a] = NULL;
    int out[2];
    if (pipe(out) != 0) return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    pid_t pid;
    int failed = posix_spawn(&pid, "/proc/self/exe", &actions, NULL, args, env);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    static char lines[65536];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof lines - 1 && (r = read(out[0], lines + got, sizeof lines - 1 - got)) > 0) got += (size_t)r;
    close(out[0]);
    int status = 0;
    if (failed == 0) waitpid(pid, &status, 0);
    lines[got] = '\0';
    printf(" %d\n%s", failed != 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), lines);
    return 0;
}

static void step(const char *text);

/* A child forked without exec runs the steps and stays (the library's state is the parent's copy);
 * it stops itself when done, so the parent's line comes after the child's. */
static int step_fork(const char *argument) {
    char steps[4096];
    snprintf(steps, sizeof steps, "%s", argument);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        __fpurge(stdout); /* the parent's unfinished line */
        char *saved = NULL;
        for (char *part = strtok_r(steps, "+", &saved); part != NULL; part = strtok_r(NULL, "+", &saved)) step(part);
        raise(SIGSTOP);
        for (;;) pause();
    }
    int status = 0;
    if (waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status)) return -1;
    kill(pid, SIGCONT);
    return pid;
}

static void step(const char *text) {
    char verb[32] = "";
    const char *argument = strchr(text, ':');
    snprintf(verb, sizeof verb, "%.*s", argument ? (int)(argument - text) : (int)strlen(text), text);
    argument = argument ? argument + 1 : "";
    unsigned long long a = 0, b = 0, c = 0;
    sscanf(argument, "%llux%llux%llu", &a, &b, &c);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    unsigned long long handle = 0;
    printf("%s", text);
    if (strcmp(verb, "alloc") == 0) rc = api.alloc(&handle, size_of(argument)), printf(" %d", rc), keep(rc, handle);
    else if (strcmp(verb, "managed") == 0) rc = api.managed(&handle, size_of(argument), 1), printf(" %d", rc), keep(rc, handle);
    else if (strcmp(verb, "async") == 0) rc = api.async(&handle, size_of(argument), NULL), printf(" %d", rc), keep(rc, handle);
    else if (strcmp(verb, "pool") == 0) rc = api.pool(&handle, size_of(argument), NULL, NULL), printf(" %d", rc), keep(rc, handle);
    else if (strcmp(verb, "pitch") == 0) {
        size_t pitch = 0;
        rc = api.pitch(&handle, &pitch, a, b, 4);
        printf(" %d", rc);
        keep(rc, handle);
        printf(" %zu", pitch);
    } else if (strcmp(verb, "create") == 0) {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        rc = api.create(&handle, size_of(argument), &prop, 0);
        printf(" %d", rc);
        keep(rc, handle);
    } else if (strcmp(verb, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = a, .Height = b, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray h = NULL;
        rc = api.array(&h, &d);
        printf(" %d", rc);
        keep(rc, (uintptr_t)h);
    } else if (strcmp(verb, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = a, .Height = b, .Depth = c, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray h = NULL;
        rc = api.array3d(&h, &d);
        printf(" %d", rc);
        keep(rc, (uintptr_t)h);
    } else if (strcmp(verb, "mipmap") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = a, .Height = b, .Depth = 0, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUmipmappedArray h = NULL;
        rc = api.mipmap(&h, &d, (unsigned)c);
        printf(" %d", rc);
        keep(rc, (uintptr_t)h);
    } else if (strcmp(verb, "free") == 0) printf(" %d", api.free(handles[atoi(argument)]));
    else if (strcmp(verb, "freeasync") == 0) printf(" %d", api.free_async(handles[atoi(argument)], NULL));
    else if (strcmp(verb, "release") == 0) printf(" %d", api.release(handles[atoi(argument)]));
    else if (strcmp(verb, "destroy") == 0) printf(" %d", api.destroy((CUarray)(uintptr_t)handles[atoi(argument)]));
    else if (strcmp(verb, "unmip") == 0) printf(" %d", api.unmip((CUmipmappedArray)(uintptr_t)handles[atoi(argument)]));
    else if (strcmp(verb, "info") == 0) {
        size_t free = 0, total = 0;
        rc = api.info(&free, &total);
        printf(" %d %zu %zu", rc, free, total);
    } else if (strcmp(verb, "total") == 0) {
        size_t total = 0;
        rc = api.total(&total, 0);
        printf(" %d %zu", rc, total);
    } else if (strcmp(verb, "grab") == 0) { /* grab:SIZE:N allocate up to N blocks, report how many */
        const char *count = strchr(argument, ':');
        int wanted = count ? atoi(count + 1) : MAX_HANDLES, got = 0;
        unsigned long long size = size_of(argument);
        for (int i = 0; i < wanted; i++) {
            if (api.alloc(&handle, size) != CUDA_SUCCESS) continue;
            handles[handle_count++ % MAX_HANDLES] = handle;
            got++;
        }
        printf(" 0 %d", got);
    } else if (strcmp(verb, "wait") == 0) { /* wait:PATH until the file exists (a start line for racers) */
        struct stat st;
        while (stat(argument, &st) != 0) usleep(1000);
        printf(" 0");
    } else if (strcmp(verb, "launch") == 0) {
        int n = atoi(argument);
        rc = CUDA_SUCCESS;
        for (int i = 0; i < n && rc == CUDA_SUCCESS; i++) rc = api.launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        printf(" %d", rc);
    } else if (strcmp(verb, "ppid") == 0) {
        printf(" 0 %d", (int)getppid());
    } else if (strcmp(verb, "nsload") == 0) { /* dlmopen(LM_ID_NEWLM, PATH): 0 loaded, 1 refused */
        void *other = dlmopen(LM_ID_NEWLM, argument, RTLD_NOW);
        printf(" %d", other == NULL);
    } else if (strcmp(verb, "child") == 0) {
        step_child(argument);
        fflush(stdout);
        return; /* its lines end with their own newlines */
    } else if (strcmp(verb, "sleep") == 0) {
        usleep((useconds_t)atoi(argument) * 1000);
        printf(" 0");
    } else if (strcmp(verb, "fork") == 0) {
        int pid = step_fork(argument);
        printf(" %d %d", pid > 0 ? 0 : 1, pid);
    } else if (strcmp(verb, "closefds") == 0) {
        for (int fd = 3; fd < 1024; fd++) close(fd);
        int reused = 0;
        for (int i = 0; i < 8; i++) reused += open("/dev/null", O_RDONLY) >= 0;
        printf(" %d", reused == 8 ? 0 : 1);
    } else if (strcmp(verb, "hold") == 0) {
        printf(" 0\n");
        fflush(stdout);
        for (;;) pause();
    } else if (!step_more(verb, argument) && !step_vmm(verb, argument) && !step_graph(verb, argument) &&
               !step_per_thread(verb, argument) && !step_legacy(verb, argument) && !step_devices(verb, argument)) {
        printf(" unknown-step\n");
        exit(2);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2 || strchr("sdplvm", argv[1][0]) == NULL) {
        fprintf(stderr, "usage: probe symbol|dlsym|procaddress|libcdlsym|vdlsym|mopen STEP...\n");
        return 2;
    }
    fill(argv[1][0]);
    CUcontext ctx;
    if (api.init(0) != CUDA_SUCCESS || api.retain(&ctx, 0) != CUDA_SUCCESS || api.set_current(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "probe: no context\n");
        return 3;
    }
    for (int i = 2; i < argc; i++) step(argv[i]);
    return 0;
}
