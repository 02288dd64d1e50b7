/*
 * A stand-in libcuda.so.1 for the interception library's tests: devices of a fixed size, tracked
 * allocations (a free of an unknown pointer fails, as with the real driver), entry points reachable
 * by symbol and through cuGetProcAddress_v2 (from its own table, like the real driver, so the
 * lookup never passes through dlsym), and launches that occupy the card's shared timeline for the
 * configured kernel time. No memory is really allocated: pointers are numbers.
 *
 * Memory pools keep what cuMemFreeAsync gives back (still counted as used) and release the part
 * above their release threshold at the next synchronisation, as the real driver does; a
 * stream-ordered allocation on a captured stream is a memory node of the capture's graph (graph.c),
 * and its free in the capture gives nothing back; IPC handles carry the exporter's pointer, and
 * opening one allocates nothing. VMM allocations: vmm.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../cuda_api.h"
#include "driver.h"
#include "state.h"

#define POINTER_BASE 0x700000000000ull
#define LEGACY_POINTER_BASE 0x10000000ull
#define ALIGNMENT 512ull
#define MAX_ALLOCATIONS 65536
#define MAX_POOLS 64 /* the first STANDIN_MAX_DEVICES are the cards' default pools */
#define NO_POOL (-1)

API CUresult cuDriverGetVersion(int *version);
API CUresult cuDeviceGet(CUdevice *device, int ordinal);
API CUresult cuDeviceGetCount(int *count);
API CUresult cuDeviceGetName(char *name, int length, CUdevice dev);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
API CUresult cuCtxDestroy_v2(CUcontext ctx);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxGetCurrent(CUcontext *ctx);
API CUresult cuCtxSynchronize(void);
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
API CUresult cuStreamSynchronize(CUstream stream);
API uint64_t gpupoolStandinBusyNs(int dev, int pid, uint64_t from_ns, uint64_t to_ns);
API uint64_t gpupoolStandinUsedBytes(int dev);
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);

struct allocation {
    uint64_t key; /* 0: free entry */
    int dev;
    int pool;       /* NO_POOL, or the pool a stream-ordered allocation came from */
    uint64_t graph; /* the graph of a memory node, 0: none */
    uint64_t bytes;
};

struct pool {
    int live;
    int dev;
    uint64_t threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
    uint64_t retained;  /* freed into the pool, still used on the card */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct allocation allocations[MAX_ALLOCATIONS];
static uint64_t used[STANDIN_MAX_DEVICES];
static struct pool pools[MAX_POOLS];
static uint64_t next_address = POINTER_BASE;
static uint64_t next_low_address = LEGACY_POINTER_BASE; /* for the 32-bit pointers of the v1 entry points */
static uint64_t last_end_ns;
static int initialised;
static __thread int current = -1; /* device of the calling thread's context, -1: none */
static __thread uintptr_t current_context; /* that context, 0: none */
static uintptr_t next_context = 1;          /* serials of created contexts; a primary one's is 0 */

static CUresult checked_device(CUdevice dev) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < standin_settings()->devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* Memory leaves the card: this process's count, and the machine's where cards are shared. */
static void give_back(int dev, uint64_t bytes) {
    used[dev] -= bytes;
    standin_card_give(dev, bytes);
}

#define TOMBSTONE 1ull /* keys are multiples of ALIGNMENT, so 1 is never one */

static uint32_t home_of(uint64_t key) { return (uint32_t)((key / ALIGNMENT) * 2654435761u) % MAX_ALLOCATIONS; }

/* An allocation on a card, from a pool (whose freed memory is used first) or for a graph node. */
static CUresult allocate_in(uint64_t *cursor, int dev, uint64_t bytes, int pool, uint64_t graph,
                            unsigned long long *key) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    uint64_t reused = pool == NO_POOL ? 0 : pools[pool].retained < bytes ? pools[pool].retained : bytes;
    if (bytes - reused <= standin_settings()->memory_bytes - used[dev] && standin_card_take(dev, bytes - reused)) {
        uint64_t address = *cursor;
        uint32_t i = home_of(address);
        for (uint32_t probe = 0; probe < MAX_ALLOCATIONS; probe++, i = (i + 1) % MAX_ALLOCATIONS) {
            if (allocations[i].key != 0 && allocations[i].key != TOMBSTONE) continue;
            *key = address;
            *cursor += (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
            allocations[i] = (struct allocation){.key = address, .dev = dev, .pool = pool, .graph = graph,
                                                 .bytes = bytes};
            used[dev] += bytes - reused;
            if (pool != NO_POOL) pools[pool].retained -= reused;
            status = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult allocate(int dev, uint64_t bytes, unsigned long long *key) {
    return allocate_in(&next_address, dev, bytes, NO_POOL, 0, key);
}

CUresult standin_allocate(int dev, uint64_t bytes, unsigned long long *key) { return allocate(dev, bytes, key); }
int standin_current_device(void) { return current; }
CUresult standin_checked_device(int dev) { return checked_device(dev); }

static CUresult release(uint64_t key) {
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    if (key == 0 || key == TOMBSTONE) return status;
    pthread_mutex_lock(&lock);
    uint32_t i = home_of(key);
    for (uint32_t probe = 0; probe < MAX_ALLOCATIONS && allocations[i].key != 0; probe++, i = (i + 1) % MAX_ALLOCATIONS) {
        if (allocations[i].key != key) continue;
        if (allocations[i].pool == NO_POOL) give_back(allocations[i].dev, allocations[i].bytes);
        else pools[allocations[i].pool].retained += allocations[i].bytes; /* kept until a synchronisation */
        allocations[i].key = TOMBSTONE;
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    if (status == CUDA_SUCCESS) standin_backing_drop(key);
    return status;
}

int standin_allocation_at(uint64_t address, uint64_t *base, uint64_t *bytes) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (uint32_t i = 0; i < MAX_ALLOCATIONS && !found; i++) {
        if (allocations[i].key == 0 || allocations[i].key == TOMBSTONE) continue;
        if (address < allocations[i].key || address >= allocations[i].key + allocations[i].bytes) continue;
        *base = allocations[i].key, *bytes = allocations[i].bytes, found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

CUresult standin_release(uint64_t key) { return release(key); }

CUresult standin_allocate_for_graph(int dev, uint64_t bytes, uint64_t graph, unsigned long long *key) {
    return allocate_in(&next_address, dev, bytes, NO_POOL, graph, key);
}

void standin_hand_over(uint64_t owner, uint64_t to, uint64_t bytes[STANDIN_MAX_DEVICES]) {
    pthread_mutex_lock(&lock);
    for (uint32_t i = 0; i < MAX_ALLOCATIONS; i++) {
        if (allocations[i].key == 0 || allocations[i].key == TOMBSTONE || allocations[i].graph != owner) continue;
        if (bytes != NULL) bytes[allocations[i].dev] += allocations[i].bytes;
        if (to != 0) {
            allocations[i].graph = to;
            continue;
        }
        give_back(allocations[i].dev, allocations[i].bytes);
        allocations[i].key = TOMBSTONE;
    }
    pthread_mutex_unlock(&lock);
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    standin_vmm_open_control();
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    *version = 12080;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult status = checked_device(ordinal);
    if (status == CUDA_SUCCESS) *device = ordinal;
    return status;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = standin_settings()->devices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice dev) {
    CUresult status = checked_device(dev);
    if (status == CUDA_SUCCESS) snprintf(name, (size_t)length, "gpupool stand-in device %d", dev);
    return status;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult status = checked_device(dev);
    if (status == CUDA_SUCCESS) *bytes = standin_settings()->memory_bytes;
    return status;
}

/* A context is a serial (0 for a device's primary context) and its device's ordinal plus one:
 * (serial << 4) | (ordinal + 1), so several contexts on one device are told apart as the real
 * driver's are. There is no context stack: a created context is the thread's current one. */
#define CONTEXT_DEVICE(ctx) ((int)((uintptr_t)(ctx) & 0xfu) - 1)

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    CUresult status = checked_device(dev);
    if (status == CUDA_SUCCESS) *ctx = (CUcontext)(uintptr_t)(dev + 1);
    return status;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return checked_device(dev); }

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    CUresult status = checked_device(dev);
    if (status != CUDA_SUCCESS) return status;
    uintptr_t serial = __atomic_fetch_add(&next_context, 1, __ATOMIC_RELAXED);
    *ctx = (CUcontext)((serial << 4) | (uintptr_t)(dev + 1));
    current = dev;
    current_context = (uintptr_t)*ctx;
    return status;
}

/* The later forms make the same context; their parameters (execution affinity, creation parameters)
 * are accepted and not modelled. */
CUresult cuCtxCreate_v3(CUcontext *ctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev) {
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL)) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(ctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *ctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) {
    (void)ctxCreateParams;
    return cuCtxCreate_v2(ctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if ((uintptr_t)ctx == current_context) current = -1, current_context = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    int dev = CONTEXT_DEVICE(ctx);
    if (ctx != NULL && checked_device(dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx == NULL ? -1 : dev;
    current_context = (uintptr_t)ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    if (current_context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx != NULL) *ctx = (CUcontext)current_context;
    current = -1;
    current_context = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current < 0 ? NULL : (CUcontext)current_context;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *device = current;
    return CUDA_SUCCESS;
}

/* CUDA 13: the device of a named context (the device is in its handle), NULL: the current one. */
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    if (ctx == NULL) return cuCtxGetDevice(device);
    int dev = CONTEXT_DEVICE(ctx);
    if (checked_device(dev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    *device = dev;
    return CUDA_SUCCESS;
}

/* What every pool keeps above its release threshold goes back to the card. */
static void trim_pools(void) {
    pthread_mutex_lock(&lock);
    for (int p = 0; p < MAX_POOLS; p++) {
        if (!pools[p].live || pools[p].retained <= pools[p].threshold) continue;
        give_back(pools[p].dev, pools[p].retained - pools[p].threshold);
        pools[p].retained = pools[p].threshold;
    }
    pthread_mutex_unlock(&lock);
}

CUresult cuCtxSynchronize(void) {
    trim_pools();
    uint64_t end = __atomic_load_n(&last_end_ns, __ATOMIC_ACQUIRE), now = standin_now_ns();
    if (end > now) {
        struct timespec pause = {(time_t)((end - now) / 1000000000ull), (long)((end - now) % 1000000000ull)};
        nanosleep(&pause, NULL);
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
    (void)stream;
    return cuCtxSynchronize();
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    *free = standin_settings()->memory_bytes - used[current];
    pthread_mutex_unlock(&lock);
    *total = standin_settings()->memory_bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return allocate(current, bytesize, dptr); }

CUresult cuMemAlloc_v3(CUdeviceptr *dptr, size_t bytesize, unsigned long long flags) {
    (void)flags;
    return allocate(current, bytesize, dptr);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)flags;
    return allocate(current, bytesize, dptr);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    (void)ElementSizeBytes;
    *pPitch = (WidthInBytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    return allocate(current, (uint64_t)*pPitch * Height, dptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr); }

/* The index of a pool handle (NULL: the current card's default pool), or NO_POOL. */
static int pool_index(CUmemoryPool pool) {
    if (pool == NULL) {
        if (current < 0) return NO_POOL;
        pthread_mutex_lock(&lock);
        pools[current].live = 1;
        pools[current].dev = current;
        pthread_mutex_unlock(&lock);
        return current;
    }
    intptr_t p = (intptr_t)pool - 1;
    return p >= 0 && p < MAX_POOLS && pools[p].live ? (int)p : NO_POOL;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    CUresult status = checked_device(dev);
    if (status != CUDA_SUCCESS) return status;
    pthread_mutex_lock(&lock);
    pools[dev].live = 1;
    pools[dev].dev = dev;
    pthread_mutex_unlock(&lock);
    *pool = (CUmemoryPool)(uintptr_t)(dev + 1);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (props == NULL || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = checked_device(props->location.id);
    if (status != CUDA_SUCCESS) return status;
    status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int p = STANDIN_MAX_DEVICES; p < MAX_POOLS; p++) {
        if (pools[p].live) continue;
        pools[p] = (struct pool){.live = 1, .dev = props->location.id};
        *pool = (CUmemoryPool)(uintptr_t)(p + 1);
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    int p = pool == NULL ? NO_POOL : pool_index(pool);
    if (p < STANDIN_MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE; /* unknown, or a default pool */
    pthread_mutex_lock(&lock);
    give_back(pools[p].dev, pools[p].retained);
    pools[p].live = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    int p = pool == NULL ? NO_POOL : pool_index(pool);
    if (p == NO_POOL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) pools[p].threshold = *(const cuuint64_t *)value;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    int p = pool == NULL ? NO_POOL : pool_index(pool);
    if (p == NO_POOL || value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return CUDA_ERROR_NOT_SUPPORTED;
    *(cuuint64_t *)value = pools[p].threshold;
    return CUDA_SUCCESS;
}

/* On a captured stream the allocation is a memory node of the capture's graph. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUgraph graph) {
    if (graph != NULL) return allocate_in(&next_address, current, bytesize, NO_POOL, (uintptr_t)graph, dptr);
    return allocate_in(&next_address, current, bytesize, pool_index(NULL), 0, dptr);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool) {
    int p = pool_index(pool);
    if (p == NO_POOL) return CUDA_ERROR_INVALID_VALUE;
    return allocate_in(&next_address, pools[p].dev, bytesize, p, 0, dptr);
}

/* A free recorded into a captured graph frees nothing now: the graph holds the memory. */
static CUresult free_async(CUdeviceptr dptr, CUgraph graph) {
    if (graph != NULL) return dptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    return release(dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, standin_capture_graph(hStream, 0));
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, standin_capture_graph(hStream, 1));
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    return (void)hStream, alloc_from_pool(dptr, bytesize, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    return (void)hStream, alloc_from_pool(dptr, bytesize, pool);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, standin_capture_graph(hStream, 0)); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, standin_capture_graph(hStream, 1)); }

/* The v1 entry points (CUDA < 3.2): 32-bit pointers, sizes and array extents. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    unsigned long long key;
    CUresult status = allocate_in(&next_low_address, current, bytesize, NO_POOL, 0, &key);
    if (status == CUDA_SUCCESS) *dptr = (CUdeviceptr_v1)key;
    return status;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                         unsigned int ElementSizeBytes) {
    (void)ElementSizeBytes;
    *pPitch = (unsigned int)((WidthInBytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT);
    return cuMemAlloc(dptr, *pPitch * Height);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) { return release(dptr); }

/* Memory another API allocated (Vulkan, OpenGL...): importing it allocates nothing here. */
#define MAX_EXTERNAL 64
static uint64_t externals[MAX_EXTERNAL], next_external = 0x9000;

CUresult cuImportExternalMemory(CUexternalMemory *extMem_out, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc) {
    if (extMem_out == NULL || desc == NULL || desc->type != CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD ||
        desc->handle.fd < 0 || desc->size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EXTERNAL; i++) {
        if (externals[i] != 0) continue;
        externals[i] = next_external++;
        *extMem_out = (CUexternalMemory)(uintptr_t)externals[i];
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    if (status == CUDA_SUCCESS) close(desc->handle.fd); /* the driver owns the descriptor now */
    return status;
}

CUresult cuDestroyExternalMemory(CUexternalMemory extMem) {
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EXTERNAL && extMem != NULL; i++)
        if (externals[i] == (uintptr_t)extMem) externals[i] = 0, status = CUDA_SUCCESS;
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult create_array(CUarray *handle, uint64_t bytes) {
    unsigned long long key;
    CUresult status = allocate(current, bytes, &key);
    if (status == CUDA_SUCCESS) *handle = (CUarray)(uintptr_t)key;
    return status;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    return create_array(pHandle, (uint64_t)d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 4);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return create_array(pHandle, (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                                     d->NumChannels * 4);
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    return create_array(pHandle, (uint64_t)d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 4);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    return create_array(pHandle, (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                                     d->NumChannels * 4);
}

CUresult cuArrayDestroy(CUarray hArray) { return release((uint64_t)(uintptr_t)hArray); }

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    return create_array((CUarray *)pHandle, (uint64_t)d->Width * (d->Height ? d->Height : 1) *
                                                (d->Depth ? d->Depth : 1) * d->NumChannels * 4 * 2 + levels);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return release((uint64_t)(uintptr_t)h); }

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    if (pHandle == NULL || dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &dptr, sizeof dptr);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    (void)Flags;
    if (pdptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    memcpy(pdptr, handle.reserved, sizeof *pdptr);
    return *pdptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) { return dptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }

static CUresult run_kernel(void) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t end = standin_enqueue(current, standin_settings()->kernel_ns, standin_driver_pid((int)getpid()));
    uint64_t last = __atomic_load_n(&last_end_ns, __ATOMIC_ACQUIRE);
    while (end > last && !__atomic_compare_exchange_n(&last_end_ns, &last, end, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(LAUNCH_PARAMS, void **kernelParams, void **extra) {
    CUresult status = current < 0 ? CUDA_ERROR_INVALID_CONTEXT : standin_run_builtin(f, kernelParams, extra);
    return status != CUDA_SUCCESS ? status : run_kernel();
}
CUresult cuLaunchCooperativeKernel(LAUNCH_PARAMS, void **kernelParams) { return run_kernel(); }
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    return config == NULL ? CUDA_ERROR_INVALID_VALUE : run_kernel();
}
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return hGraphExec == NULL ? CUDA_ERROR_INVALID_VALUE : run_kernel();
}

uint64_t standin_last_end_ns(void) { return __atomic_load_n(&last_end_ns, __ATOMIC_ACQUIRE); }

uint64_t gpupoolStandinBusyNs(int dev, int pid, uint64_t from_ns, uint64_t to_ns) {
    return standin_busy(dev, pid == 0 ? 0 : standin_driver_pid(pid), from_ns, to_ns); /* pid: the caller's own */
}

uint64_t gpupoolStandinUsedBytes(int dev) {
    standin_vmm_settle();
    pthread_mutex_lock(&lock);
    uint64_t bytes = dev >= 0 && dev < STANDIN_MAX_DEVICES ? used[dev] : 0;
    pthread_mutex_unlock(&lock);
    return bytes;
}

#define ENTRY(name) {#name, (void *)&name},
static const struct {
    const char *name;
    void *function;
} entry_points[] = {
    ENTRY(cuInit) ENTRY(cuDriverGetVersion) ENTRY(cuDeviceGet) ENTRY(cuDeviceGetCount) ENTRY(cuDeviceGetName)
    ENTRY(cuDeviceTotalMem_v2) ENTRY(cuDevicePrimaryCtxRetain) ENTRY(cuDevicePrimaryCtxRelease_v2)
    ENTRY(cuCtxCreate_v2) ENTRY(cuCtxCreate_v3) ENTRY(cuCtxCreate_v4) ENTRY(cuCtxDestroy_v2) ENTRY(cuCtxSetCurrent) ENTRY(cuCtxGetCurrent) ENTRY(cuCtxGetDevice) ENTRY(cuCtxGetDevice_v2)
    ENTRY(cuCtxPopCurrent_v2)
    ENTRY(cuCtxSynchronize) ENTRY(cuStreamSynchronize) ENTRY(cuMemGetInfo_v2) ENTRY(cuMemAlloc_v2)
    ENTRY(cuMemAllocManaged) ENTRY(cuMemAllocPitch_v2) ENTRY(cuMemFree_v2) ENTRY(cuMemCreate) ENTRY(cuMemRelease)
    ENTRY(cuMemAllocAsync) ENTRY(cuMemAllocFromPoolAsync) ENTRY(cuMemFreeAsync) ENTRY(cuArrayCreate_v2)
    ENTRY(cuArray3DCreate_v2) ENTRY(cuArrayDestroy) ENTRY(cuMipmappedArrayCreate) ENTRY(cuMipmappedArrayDestroy)
    ENTRY(cuLaunchKernel) ENTRY(cuLaunchCooperativeKernel) ENTRY(cuLaunchKernelEx) ENTRY(cuGraphLaunch)
    ENTRY(cuGetProcAddress) ENTRY(cuGetProcAddress_v2) ENTRY(cuDeviceGetDefaultMemPool) ENTRY(cuMemPoolCreate)
    ENTRY(cuMemPoolDestroy) ENTRY(cuMemPoolSetAttribute) ENTRY(cuMemPoolGetAttribute) ENTRY(cuGraphCreate)
    ENTRY(cuGraphAddMemAllocNode) ENTRY(cuGraphAddNode) ENTRY(cuGraphAddNode_v2) ENTRY(cuGraphAddNode_v3) ENTRY(cuGraphDestroyNode)
    ENTRY(cuGraphDestroy) ENTRY(cuStreamBeginCapture_v2) ENTRY(cuStreamEndCapture) ENTRY(cuStreamGetCaptureInfo_v2)
    ENTRY(cuIpcGetMemHandle) ENTRY(cuIpcOpenMemHandle_v2) ENTRY(cuIpcCloseMemHandle)
    ENTRY(cuMemAddressReserve) ENTRY(cuMemAddressFree) ENTRY(cuMemMap) ENTRY(cuMemUnmap)
    ENTRY(cuMemExportToShareableHandle) ENTRY(cuMemImportFromShareableHandle) ENTRY(cuMemRetainAllocationHandle)
    ENTRY(cuMemGetAllocationPropertiesFromHandle) ENTRY(cuGraphClone) ENTRY(cuGraphInstantiateWithFlags)
    ENTRY(cuGraphInstantiateWithParams) ENTRY(cuGraphInstantiateWithParams_ptsz) ENTRY(cuGraphExecDestroy)
    ENTRY(cuStreamBeginCapture_v2_ptsz) ENTRY(cuStreamEndCapture_ptsz) ENTRY(cuStreamGetCaptureInfo_v2_ptsz)
    ENTRY(cuMemAllocAsync_ptsz) ENTRY(cuMemAllocFromPoolAsync_ptsz) ENTRY(cuMemFreeAsync_ptsz)
    ENTRY(cuMemAlloc) ENTRY(cuMemAllocPitch) ENTRY(cuMemFree) ENTRY(cuArrayCreate) ENTRY(cuArray3DCreate)
    ENTRY(cuImportExternalMemory) ENTRY(cuDestroyExternalMemory) ENTRY(cuGraphInstantiate) ENTRY(cuGraphInstantiate_v2)
    ENTRY(cuLibraryLoadData) ENTRY(cuLibraryLoadFromFile) ENTRY(cuLibraryUnload) ENTRY(cuLibraryGetKernel)
    ENTRY(cuLibraryGetModule) ENTRY(cuLibraryGetGlobal) ENTRY(cuKernelGetFunction) ENTRY(cuKernelGetParamInfo)
    ENTRY(cuMemSetAccess) ENTRY(cuMemGetAccess) ENTRY(cuMemGetAllocationGranularity) ENTRY(cuMemPoolSetAccess)
    ENTRY(cuMemPoolGetAccess) ENTRY(cuMemAdvise) ENTRY(cuMemAdvise_v2) ENTRY(cuMemPrefetchAsync)
    ENTRY(cuMemPrefetchAsync_v2) ENTRY(cuMemPrefetchAsync_ptsz) ENTRY(cuMemPrefetchAsync_v2_ptsz)
    ENTRY(cuDeviceGetP2PAttribute) ENTRY(cuMemAlloc_v3) ENTRY(cuModuleGetGlobal_v2) ENTRY(cuFuncGetAttribute)
    ENTRY(cuFuncSetAttribute) ENTRY(cuFuncSetCacheConfig) ENTRY(cuKernelGetAttribute) ENTRY(cuKernelSetAttribute)
    ENTRY(cuKernelSetCacheConfig) ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor)
    ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) ENTRY(cuOccupancyMaxPotentialBlockSize)
    ENTRY(cuOccupancyMaxPotentialBlockSizeWithFlags)
};

static void *entry_named(const char *name) {
    for (size_t i = 0; i < sizeof entry_points / sizeof *entry_points; i++)
        if (strcmp(entry_points[i].name, name) == 0) return entry_points[i].function;
    return NULL;
}

/* GPUPOOL_STANDIN_PROC_INTERNAL=1: cuGetProcAddress answers with internal addresses, not the exported
 * ones, for the cuMemAlloc variants (a real driver may), so the library must recognise them by name. */
static CUresult internal_mem_alloc_v2(CUdeviceptr *dptr, size_t bytesize) { return cuMemAlloc_v2(dptr, bytesize); }
static CUresult internal_mem_alloc_v3(CUdeviceptr *dptr, size_t bytesize, unsigned long long flags) {
    return cuMemAlloc_v3(dptr, bytesize, flags);
}

static void *internal_address(void *exported) {
    const char *setting = getenv("GPUPOOL_STANDIN_PROC_INTERNAL");
    if (setting == NULL || strcmp(setting, "1") != 0) return exported;
    if (exported == (void *)&cuMemAlloc_v2) return (void *)&internal_mem_alloc_v2;
    if (exported == (void *)&cuMemAlloc_v3) return (void *)&internal_mem_alloc_v3;
    return exported;
}

/* As the real driver: a base name means its newest variant the caller's CUDA version knows, its
 * per-thread-default-stream (_ptsz) variant when the caller asks for those and there is one. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    char name[128];
    void *found = NULL;
    int versioned = cudaVersion >= 3020 && (strcmp(symbol, "cuGetProcAddress") != 0 || cudaVersion >= 12000);
    /* the location-taking hints of CUDA 12.2: an older program's base name is the device-taking one */
    if ((strcmp(symbol, "cuMemAdvise") == 0 || strcmp(symbol, "cuMemPrefetchAsync") == 0) && cudaVersion < 12020)
        versioned = 0;
    if (strcmp(symbol, "cuCtxGetDevice") == 0 && cudaVersion < 13000) /* the context-taking form of CUDA 13 */
        versioned = 0;
    /* contexts: _v3 (execution affinity) from CUDA 11.4, _v4 (creation parameters) from 12.5 */
    if (strcmp(symbol, "cuCtxCreate") == 0 && cudaVersion >= 11040)
        found = entry_named(cudaVersion >= 12050 ? "cuCtxCreate_v4" : "cuCtxCreate_v3");
    if (strcmp(symbol, "cuMemAlloc") == 0 && cudaVersion >= STANDIN_FUTURE_VERSION) found = entry_named("cuMemAlloc_v3");
    if (strcmp(symbol, "cuGraphAddNode") == 0 && cudaVersion >= 13040) found = entry_named("cuGraphAddNode_v3");
    for (int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0; per_thread >= 0 && !found;
         per_thread--) {
        const char *suffix = per_thread ? "_ptsz" : "";
        snprintf(name, sizeof name, "%s_v2%s", symbol, suffix);
        if (versioned) found = entry_named(name);
        snprintf(name, sizeof name, "%s%s", symbol, suffix);
        if (found == NULL) found = entry_named(name);
    }
    if (symbolStatus != NULL)
        *symbolStatus = found ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = internal_address(found);
    return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
