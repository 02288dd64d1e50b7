/*
 * Virtual cards: the node granted one card to be presented as n CUDA ordinals (the grant's
 * virtual_devices, docs/virtual-cards.md), so a program written for n GPUs (torch.cuda.device_count()
 * == n, one process or one context per device) runs on the part of one card it was booked.
 *
 * Ordinals 0..n-1 are the program's; each stands for the grant's one card (card 0). Every entry
 * point that names a device is translated before it reaches the driver, and every one that answers
 * with a device answers with the program's ordinal. Each ordinal has a context of its own, as
 * separate GPUs would: ordinal 0's primary context is the card's, the others' are contexts this file
 * creates on the card and keeps as their primary ones (retained, released and reset the same way),
 * so cuCtxGetDevice can tell which ordinal the calling thread works on. The memory an ordinal reports
 * (cuDeviceTotalMem, cuMemGetInfo) is its even part of the card's limit; region.c holds the card's
 * total for the whole container and each ordinal's part for this process.
 *
 * Without a virtual grant every wrapper passes straight through.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_CONTEXTS 256 /* the program's own contexts on virtual ordinals, beyond the primary ones */

struct primary {
    CUcontext ctx; /* NULL: not created (or reset) */
    unsigned retained;
    unsigned flags;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned generation = 1; /* changes whenever a context is made or dropped: thread caches go stale */
static __thread struct {
    CUcontext ctx;
    int ordinal;
    unsigned generation;
} cached;
static struct primary primaries[SHIM_MAX_DEVICES]; /* ordinal 0 is the driver's own */
static struct {
    CUcontext ctx;
    int dev;
} created[MAX_CONTEXTS];

int shim_virtual_count(void) {
    const struct shim_config *c = shim_config();
    return c->enabled && c->virtual_devices > 1 ? c->virtual_devices : 0;
}

int shim_card_of(int dev) {
    int n = shim_virtual_count();
    return n > 0 && dev >= 0 && dev < n ? 0 : dev;
}

static int is_virtual(CUdevice dev) { return dev >= 0 && dev < shim_virtual_count(); }

/* The ordinal a context stands for, or -1 when this file did not make it. Launches and allocations
 * ask on every call, so each thread remembers its last answer until a context changes. */
static int ordinal_of_context(CUcontext ctx) {
    if (ctx == cached.ctx && __atomic_load_n(&generation, __ATOMIC_ACQUIRE) == cached.generation) return cached.ordinal;
    int found = -1;
    pthread_mutex_lock(&lock);
    unsigned now = generation;
    for (int d = 1; d < SHIM_MAX_DEVICES && found < 0; d++)
        if (ctx != NULL && primaries[d].ctx == ctx) found = d;
    for (int i = 0; i < MAX_CONTEXTS && found < 0; i++)
        if (ctx != NULL && created[i].ctx == ctx) found = created[i].dev;
    pthread_mutex_unlock(&lock);
    cached.ctx = ctx;
    cached.ordinal = found;
    cached.generation = now;
    return found;
}

int shim_current_device(void) {
    CUdevice dev;
    if (shim_virtual_count() > 0 && REAL(cuCtxGetCurrent) != NULL) {
        CUcontext ctx = NULL;
        if (REAL(cuCtxGetCurrent)(&ctx) == CUDA_SUCCESS) {
            int ordinal = ordinal_of_context(ctx);
            if (ordinal >= 0) return ordinal;
        }
    }
    if (REAL(cuCtxGetDevice) == NULL || REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS) return -1;
    return dev >= 0 && dev < SHIM_MAX_DEVICES ? dev : -1;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    if (REAL(cuCtxGetDevice) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuCtxGetDevice)(device);
    if (status != CUDA_SUCCESS || device == NULL || shim_virtual_count() == 0) return status;
    int ordinal = shim_current_device();
    if (ordinal >= 0) *device = ordinal;
    return status;
}

/* CUDA 13's form names the context (NULL: the calling thread's): the ordinal that context stands for.
 * cuGetProcAddress hands a CUDA 13 program this one for "cuCtxGetDevice". */
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    if (REAL(cuCtxGetDevice_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuCtxGetDevice_v2)(device, ctx);
    if (status != CUDA_SUCCESS || device == NULL || shim_virtual_count() == 0) return status;
    if (ctx == NULL) {
        int ordinal = shim_current_device();
        if (ordinal >= 0) *device = ordinal;
        return status;
    }
    int ordinal = ordinal_of_context(ctx);
    if (ordinal >= 0) *device = ordinal;
    return status;
}

CUresult cuDeviceGetCount(int *count) {
    if (REAL(cuDeviceGetCount) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuDeviceGetCount)(count);
    int n = shim_virtual_count();
    if (status == CUDA_SUCCESS && count != NULL && n > 0 && *count >= 1) *count = n;
    return status;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (REAL(cuDeviceGet) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (shim_virtual_count() == 0) return REAL(cuDeviceGet)(device, ordinal);
    if (!is_virtual(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult status = REAL(cuDeviceGet)(device, 0);
    if (status == CUDA_SUCCESS && device != NULL) *device = ordinal;
    return status;
}

/* Entry points that only read a property of the device: the card's answer for every ordinal. */
#define ON_CARD(name, call_args, ...)                                                                   \
    CUresult name(__VA_ARGS__) {                                                                        \
        if (REAL(name) == NULL) return CUDA_ERROR_NOT_SUPPORTED;                                        \
        dev = shim_card_of(dev);                                                                        \
        return REAL(name) call_args;                                                                    \
    }
ON_CARD(cuDeviceGetName, (name, length, dev), char *name, int length, CUdevice dev)
ON_CARD(cuDeviceGetAttribute, (value, attribute, dev), int *value, int attribute, CUdevice dev)
ON_CARD(cuDeviceGetUuid, (uuid, dev), struct shim_uuid *uuid, CUdevice dev)
ON_CARD(cuDeviceGetUuid_v2, (uuid, dev), struct shim_uuid *uuid, CUdevice dev)
ON_CARD(cuDeviceGetPCIBusId, (bus, length, dev), char *bus, int length, CUdevice dev)
ON_CARD(cuDeviceComputeCapability, (major, minor, dev), int *major, int *minor, CUdevice dev)
ON_CARD(cuDeviceGetLuid, (luid, mask, dev), char *luid, unsigned int *mask, CUdevice dev)

/* Two ordinals of one card are not peers: their contexts are distinct, and peer access is between cards. */
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    if (REAL(cuDeviceCanAccessPeer) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (is_virtual(dev) && is_virtual(peer) && can != NULL) {
        *can = 0;
        return CUDA_SUCCESS;
    }
    return REAL(cuDeviceCanAccessPeer)(can, shim_card_of(dev), shim_card_of(peer));
}

/* A context on the card for a virtual ordinal above 0, leaving the caller's current context as it was. */
static CUresult make_context(CUcontext *ctx, unsigned flags) {
    if (REAL(cuCtxCreate_v2) == NULL || REAL(cuCtxGetCurrent) == NULL || REAL(cuCtxSetCurrent) == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUcontext before = NULL;
    REAL(cuCtxGetCurrent)(&before);
    CUresult status = REAL(cuCtxCreate_v2)(ctx, flags, 0);
    if (status != CUDA_SUCCESS) return status;
    CUcontext popped;
    if (REAL(cuCtxPopCurrent_v2) == NULL || REAL(cuCtxPopCurrent_v2)(&popped) != CUDA_SUCCESS) popped = NULL;
    CUcontext now = NULL;
    REAL(cuCtxGetCurrent)(&now);
    if (now != before) REAL(cuCtxSetCurrent)(before);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (REAL(cuDevicePrimaryCtxRetain) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (!is_virtual(dev) || dev == 0) return REAL(cuDevicePrimaryCtxRetain)(ctx, shim_card_of(dev));
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    struct primary *p = &primaries[dev];
    if (p->ctx == NULL) status = make_context(&p->ctx, p->flags);
    if (status == CUDA_SUCCESS) {
        if (p->retained++ == 0) __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
        *ctx = p->ctx;
    } else {
        p->ctx = NULL;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Drops ordinal dev's context (its last release, or a reset). Under the lock. */
static CUresult drop_primary(struct primary *p) {
    CUresult status = CUDA_SUCCESS;
    if (p->ctx != NULL && REAL(cuCtxDestroy_v2) != NULL) status = REAL(cuCtxDestroy_v2)(p->ctx);
    p->ctx = NULL;
    p->retained = 0;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    return status;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (REAL(cuDevicePrimaryCtxRelease_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (!is_virtual(dev) || dev == 0) return REAL(cuDevicePrimaryCtxRelease_v2)(shim_card_of(dev));
    CUresult status = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    struct primary *p = &primaries[dev];
    if (p->retained == 0) status = CUDA_ERROR_INVALID_CONTEXT;
    else if (--p->retained == 0) status = drop_primary(p);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    if (REAL(cuDevicePrimaryCtxReset_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (!is_virtual(dev) || dev == 0) return REAL(cuDevicePrimaryCtxReset_v2)(shim_card_of(dev));
    pthread_mutex_lock(&lock);
    CUresult status = drop_primary(&primaries[dev]);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (REAL(cuDevicePrimaryCtxGetState) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (!is_virtual(dev) || dev == 0) return REAL(cuDevicePrimaryCtxGetState)(shim_card_of(dev), flags, active);
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *flags = primaries[dev].flags;
    *active = primaries[dev].ctx != NULL;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    if (REAL(cuDevicePrimaryCtxSetFlags_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (!is_virtual(dev) || dev == 0) return REAL(cuDevicePrimaryCtxSetFlags_v2)(shim_card_of(dev), flags);
    pthread_mutex_lock(&lock);
    primaries[dev].flags = flags; /* as the driver: they apply when the context is next made */
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* A context the driver made on the card for a virtual ordinal above 0, remembered as that ordinal's. */
static CUresult kept_for_ordinal(CUresult status, const CUcontext *ctx, CUdevice dev) {
    if (status != CUDA_SUCCESS || !is_virtual(dev) || dev == 0) return status;
    int kept = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CONTEXTS && !kept; i++)
        if (created[i].ctx == NULL) {
            created[i].ctx = *ctx;
            created[i].dev = dev;
            kept = 1;
        }
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    if (!kept) /* still on the card and within its total; only its ordinal reads as 0 */
        shim_log(SHIM_LOG_WARN, "more than %d contexts on virtual ordinals: a new one on ordinal %d counts as ordinal 0",
                 MAX_CONTEXTS, dev);
    return status;
}

/* The three ways to make a context (CUDA 3.2, 11.4 with execution affinity, 12.5 with creation
 * parameters): cuGetProcAddress hands a CUDA 12.5+ program the last for "cuCtxCreate". */
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    if (REAL(cuCtxCreate_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return kept_for_ordinal(REAL(cuCtxCreate_v2)(ctx, flags, shim_card_of(dev)), ctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *ctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev) {
    if (REAL(cuCtxCreate_v3) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return kept_for_ordinal(REAL(cuCtxCreate_v3)(ctx, paramsArray, numParams, flags, shim_card_of(dev)), ctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *ctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) {
    if (REAL(cuCtxCreate_v4) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return kept_for_ordinal(REAL(cuCtxCreate_v4)(ctx, ctxCreateParams, flags, shim_card_of(dev)), ctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (REAL(cuCtxDestroy_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuCtxDestroy_v2)(ctx);
    if (status != CUDA_SUCCESS || ctx == NULL || shim_virtual_count() == 0) return status;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (created[i].ctx == ctx) created[i].ctx = NULL;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return status;
}

/* A location on the card behind the ordinal it names (a device location; any other kind as it is). */
static CUmemLocation location_on_card(CUmemLocation location) {
    if (location.type == CU_MEM_LOCATION_TYPE_DEVICE) location.id = shim_card_of(location.id);
    return location;
}

#define MAX_ACCESS_DESCS 64 /* more at once than any program names devices; beyond it, copied on the heap */

/* Access descriptors naming the cards behind their ordinals: descs itself without a virtual grant,
 * else a copy (in room, or on the heap: *heap, for the caller to free), NULL when out of memory. */
static const CUmemAccessDesc *access_on_card(const CUmemAccessDesc *descs, size_t count, CUmemAccessDesc *room,
                                            CUmemAccessDesc **heap) {
    *heap = NULL;
    if (descs == NULL || count == 0 || shim_virtual_count() == 0) return descs;
    CUmemAccessDesc *copy = room;
    if (count > MAX_ACCESS_DESCS && (copy = *heap = malloc(count * sizeof *copy)) == NULL) return NULL;
    for (size_t i = 0; i < count; i++) {
        copy[i] = descs[i];
        copy[i].location = location_on_card(descs[i].location);
    }
    return copy;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (REAL(cuMemSetAccess) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUmemAccessDesc room[MAX_ACCESS_DESCS], *heap;
    const CUmemAccessDesc *on_card = access_on_card(desc, count, room, &heap);
    if (on_card == NULL && desc != NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult status = REAL(cuMemSetAccess)(ptr, size, on_card, count);
    free(heap);
    return status;
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
    if (REAL(cuMemPoolSetAccess) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUmemAccessDesc room[MAX_ACCESS_DESCS], *heap;
    const CUmemAccessDesc *on_card = access_on_card(map, count, room, &heap);
    if (on_card == NULL && map != NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult status = REAL(cuMemPoolSetAccess)(pool, on_card, count);
    free(heap);
    return status;
}

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
    if (REAL(cuMemGetAccess) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (location == NULL || shim_virtual_count() == 0) return REAL(cuMemGetAccess)(flags, location, ptr);
    CUmemLocation on_card = location_on_card(*location);
    return REAL(cuMemGetAccess)(flags, &on_card, ptr);
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location) {
    if (REAL(cuMemPoolGetAccess) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (location == NULL || shim_virtual_count() == 0) return REAL(cuMemPoolGetAccess)(flags, memPool, location);
    CUmemLocation on_card = location_on_card(*location);
    return REAL(cuMemPoolGetAccess)(flags, memPool, &on_card);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    if (REAL(cuMemGetAllocationGranularity) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (prop == NULL || shim_virtual_count() == 0) return REAL(cuMemGetAllocationGranularity)(granularity, prop, option);
    CUmemAllocationProp on_card = *prop;
    on_card.location = location_on_card(prop->location);
    return REAL(cuMemGetAllocationGranularity)(granularity, &on_card, option);
}

/* The hints name a device (CU_DEVICE_CPU, -1, stays as it is) or a location. */
CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device) {
    if (REAL(cuMemAdvise) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemAdvise)(devPtr, count, advice, shim_card_of(device));
}

CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location) {
    if (REAL(cuMemAdvise_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemAdvise_v2)(devPtr, count, advice, location_on_card(location));
}

CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    if (REAL(cuMemPrefetchAsync) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemPrefetchAsync)(devPtr, count, shim_card_of(dstDevice), hStream);
}

CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                               CUstream hStream) {
    if (REAL(cuMemPrefetchAsync_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemPrefetchAsync_v2)(devPtr, count, location_on_card(location), flags, hStream);
}

/* The per-thread default stream forms (nvcc --default-stream per-thread, or asked for by flag). */
CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    if (REAL(cuMemPrefetchAsync_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemPrefetchAsync_ptsz)(devPtr, count, shim_card_of(dstDevice), hStream);
}

CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                    CUstream hStream) {
    if (REAL(cuMemPrefetchAsync_v2_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    return REAL(cuMemPrefetchAsync_v2_ptsz)(devPtr, count, location_on_card(location), flags, hStream);
}

/* Two ordinals of one card are not peers (as cuDeviceCanAccessPeer): every peer attribute is 0. One
 * ordinal with itself is the card with itself, which the driver answers. */
CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice) {
    if (REAL(cuDeviceGetP2PAttribute) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    if (is_virtual(srcDevice) && is_virtual(dstDevice) && srcDevice != dstDevice && value != NULL) {
        *value = 0;
        return CUDA_SUCCESS;
    }
    return REAL(cuDeviceGetP2PAttribute)(value, attrib, shim_card_of(srcDevice), shim_card_of(dstDevice));
}
