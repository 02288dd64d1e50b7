/*
 * Device-memory allocation and release. Every allocation is charged to the container's budget
 * BEFORE the driver is asked (so concurrent processes cannot all pass the check and overshoot
 * together) and given back when the driver refuses or when the memory is freed.
 */
#include "shim.h"

#define PITCH_ALIGNMENT 512u /* rows of a pitched allocation start at this alignment */

/* Charge bytes on a card; CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY when the budget is spent. */
static CUresult charge(int dev, uint64_t bytes) {
    if (shim_region_charge(dev, bytes) == 0) return CUDA_SUCCESS;
    shim_log(SHIM_LOG_INFO, "refusing %llu bytes on card %d: the container's limit is %llu bytes",
             (unsigned long long)bytes, dev, (unsigned long long)shim_memory_limit(dev));
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The card a context-bound allocation lands on, or -1 when it is not limited. */
static int limited_device(void) {
    if (!shim_config()->enabled) return -1;
    int dev = shim_current_device();
    return shim_memory_limited(dev) ? dev : -1;
}

/* An allocation within the limit that the driver refused for want of room is tried again while the
 * card drains (shim_wait_for_room: only while the agent says the card is lent). */
#define RETRY_WHILE_FULL(dev, status, call)                                                             \
    for (uint64_t until_ = 0; (status) == CUDA_ERROR_OUT_OF_MEMORY && shim_wait_for_room((dev), &until_);) \
    (status) = (call)

/* Charge, allocate, track: the common shape of pointer allocations. */
#define GUARDED_ALLOC(dev, bytes, kind, key_expr, call)                                                  \
    do {                                                                                                \
        if ((dev) < 0) return (call);                                                                   \
        CUresult status_ = charge((dev), (bytes));                                                      \
        if (status_ != CUDA_SUCCESS) return status_;                                                    \
        status_ = (call);                                                                               \
        RETRY_WHILE_FULL((dev), status_, (call));                                                       \
        if (status_ != CUDA_SUCCESS) shim_region_release((dev), (bytes));                               \
        else shim_track((kind), (uint64_t)(key_expr), (dev), (bytes));                                  \
        return status_;                                                                                 \
    } while (0)

/* Forget, free, give back (or keep the charge when the driver refused to free). */
#define GUARDED_FREE(kind, key, call)                                                                   \
    do {                                                                                                \
        int dev_;                                                                                       \
        uint64_t bytes_;                                                                                \
        int tracked_ = shim_untrack((kind), (uint64_t)(key), &dev_, &bytes_);                           \
        CUresult status_ = (call);                                                                      \
        if (tracked_ && status_ == CUDA_SUCCESS) shim_region_release(dev_, bytes_);                     \
        else if (tracked_) shim_track((kind), (uint64_t)(key), dev_, bytes_);                           \
        return status_;                                                                                 \
    } while (0)

#define REQUIRE(name)                                                                                   \
    if (REAL(name) == NULL) return CUDA_ERROR_NOT_SUPPORTED

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REQUIRE(cuMemAlloc_v2);
    int dev = limited_device();
    GUARDED_ALLOC(dev, bytesize, SHIM_KIND_POINTER, *dptr, REAL(cuMemAlloc_v2)(dptr, bytesize));
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REQUIRE(cuMemAllocManaged);
    int dev = limited_device();
    GUARDED_ALLOC(dev, bytesize, SHIM_KIND_POINTER, *dptr, REAL(cuMemAllocManaged)(dptr, bytesize, flags));
}

/* Pitched allocations: the driver chooses the pitch, so an estimate is charged first and then
 * corrected to what the driver took (or the allocation undone when that no longer fits). */
static CUresult charge_pitch(int dev, uint64_t width, uint64_t height, uint64_t *estimate) {
    uint64_t row = (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (__builtin_mul_overflow(row, height, estimate)) return CUDA_ERROR_OUT_OF_MEMORY;
    return charge(dev, *estimate);
}

static CUresult settle_pitch(int dev, uint64_t estimate, CUresult status, uint64_t key, uint64_t actual, int legacy) {
    if (status != CUDA_SUCCESS) {
        shim_region_release(dev, estimate);
        return status;
    }
    if (actual > estimate && charge(dev, actual - estimate) != CUDA_SUCCESS) {
        shim_region_release(dev, estimate);
        if (legacy) REAL(cuMemFree)((CUdeviceptr_v1)key);
        else REAL(cuMemFree_v2)(key);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < estimate) shim_region_release(dev, estimate - actual);
    shim_track(SHIM_KIND_POINTER, key, dev, actual);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    REQUIRE(cuMemAllocPitch_v2);
    int dev = limited_device();
    if (dev < 0) return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t estimate;
    CUresult status = charge_pitch(dev, WidthInBytes, Height, &estimate);
    if (status != CUDA_SUCCESS) return status;
    status = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    RETRY_WHILE_FULL(dev, status, REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    return settle_pitch(dev, estimate, status, status == CUDA_SUCCESS ? *dptr : 0,
                        status == CUDA_SUCCESS ? (uint64_t)*pPitch * Height : 0, 0);
}

/* The v1 entry points (CUDA < 3.2: 32-bit pointers and sizes), still exported by the driver. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    REQUIRE(cuMemAlloc);
    int dev = limited_device();
    GUARDED_ALLOC(dev, bytesize, SHIM_KIND_POINTER, *dptr, REAL(cuMemAlloc)(dptr, bytesize));
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                         unsigned int ElementSizeBytes) {
    REQUIRE(cuMemAllocPitch);
    int dev = limited_device();
    if (dev < 0) return REAL(cuMemAllocPitch)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t estimate;
    CUresult status = charge_pitch(dev, WidthInBytes, Height, &estimate);
    if (status != CUDA_SUCCESS) return status;
    status = REAL(cuMemAllocPitch)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    RETRY_WHILE_FULL(dev, status, REAL(cuMemAllocPitch)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    return settle_pitch(dev, estimate, status, status == CUDA_SUCCESS ? *dptr : 0,
                        status == CUDA_SUCCESS ? (uint64_t)*pPitch * Height : 0, 1);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    REQUIRE(cuMemFree);
    GUARDED_FREE(SHIM_KIND_POINTER, dptr, REAL(cuMemFree)(dptr));
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REQUIRE(cuMemFree_v2);
    GUARDED_FREE(SHIM_KIND_POINTER, dptr, REAL(cuMemFree_v2)(dptr));
}

/* The graph a stream is being captured into, or NULL. NULL means the legacy stream, which is
 * never captured, except to the _ptsz entry points, where it is the calling thread's per-thread
 * default stream, which can be (so can CU_STREAM_PER_THREAD, passed to any of them). */
static CUgraph capture_graph(CUstream stream, int per_thread) {
    if (stream == NULL && per_thread) stream = CU_STREAM_PER_THREAD;
    if (stream == NULL || stream == CU_STREAM_LEGACY || REAL(cuStreamGetCaptureInfo_v2) == NULL) return NULL;
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph graph = NULL;
    if (REAL(cuStreamGetCaptureInfo_v2)(stream, &status, NULL, &graph, NULL, NULL) != CUDA_SUCCESS) return NULL;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph : NULL;
}

/* Stream-ordered allocations count when they are requested (hooks_graph.c: a pool keeps nothing
 * freed under a limit). One made while its stream is captured is a memory node of the capture's
 * graph: charged like one, until the graph is destroyed; its free inside the capture gives back
 * nothing, since the graph holds the memory at every launch. */
#define ASYNC_ALLOC(name, per_thread, pool, ...)                                                         \
    REQUIRE(name);                                                                                      \
    int dev = shim_config()->enabled ? shim_pool_device(pool, limited_device()) : -1;                   \
    CUgraph graph = dev < 0 ? NULL : capture_graph(hStream, per_thread);                                \
    if (graph == NULL) GUARDED_ALLOC(dev, bytesize, SHIM_KIND_POINTER, *dptr, REAL(name)(__VA_ARGS__)); \
    CUresult status = charge(dev, bytesize);                                                            \
    if (status != CUDA_SUCCESS) return status;                                                          \
    status = REAL(name)(__VA_ARGS__);                                                                   \
    if (status != CUDA_SUCCESS) shim_region_release(dev, bytesize);                                     \
    else shim_track_owned(SHIM_KIND_CAPTURED, *dptr, dev, bytesize, (uintptr_t)graph);                  \
    return status

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync, 0, NULL, dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync_ptsz, 1, NULL, dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync, 0, pool, dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, 1, pool, dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    REQUIRE(cuMemFreeAsync);
    GUARDED_FREE(SHIM_KIND_POINTER, dptr, REAL(cuMemFreeAsync)(dptr, hStream));
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    REQUIRE(cuMemFreeAsync_ptsz);
    GUARDED_FREE(SHIM_KIND_POINTER, dptr, REAL(cuMemFreeAsync_ptsz)(dptr, hStream));
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    REQUIRE(cuArrayCreate_v2);
    int dev = desc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0 : shim_array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_ARRAY, (uintptr_t)*pHandle, REAL(cuArrayCreate_v2)(pHandle, desc));
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    REQUIRE(cuArray3DCreate_v2);
    int dev = desc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0
                             : shim_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                                desc->NumChannels);
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_ARRAY, (uintptr_t)*pHandle, REAL(cuArray3DCreate_v2)(pHandle, desc));
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    REQUIRE(cuArrayCreate);
    int dev = desc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0 : shim_array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_ARRAY, (uintptr_t)*pHandle, REAL(cuArrayCreate)(pHandle, desc));
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    REQUIRE(cuArray3DCreate);
    int dev = desc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0
                             : shim_array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                                desc->NumChannels);
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_ARRAY, (uintptr_t)*pHandle, REAL(cuArray3DCreate)(pHandle, desc));
}

CUresult cuArrayDestroy(CUarray hArray) {
    REQUIRE(cuArrayDestroy);
    GUARDED_FREE(SHIM_KIND_ARRAY, (uintptr_t)hArray, REAL(cuArrayDestroy)(hArray));
}

/* Every level halves each extent, down to 1. */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    uint64_t total = 0;
    for (unsigned int level = 0; level < levels && level < 64; level++) {
        uint64_t part = shim_array_bytes(desc->Width >> level ? desc->Width >> level : 1,
                                         desc->Height >> level ? desc->Height >> level : 1,
                                         desc->Depth >> level ? desc->Depth >> level : 1, desc->Format,
                                         desc->NumChannels);
        if (__builtin_add_overflow(total, part, &total)) return UINT64_MAX;
    }
    return total;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int numMipmapLevels) {
    REQUIRE(cuMipmappedArrayCreate);
    int dev = desc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0 : mipmap_bytes(desc, numMipmapLevels);
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_MIPMAP, (uintptr_t)*pHandle,
                  REAL(cuMipmappedArrayCreate)(pHandle, desc, numMipmapLevels));
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    REQUIRE(cuMipmappedArrayDestroy);
    GUARDED_FREE(SHIM_KIND_MIPMAP, (uintptr_t)hMipmappedArray, REAL(cuMipmappedArrayDestroy)(hMipmappedArray));
}

/* Memory another API (Vulkan, OpenGL, NvSciBuf) allocated is invisible here until CUDA imports it;
 * the import names its size, and the importer pays for what it can reach, on its current card. */
CUresult cuImportExternalMemory(CUexternalMemory *extMem_out, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc) {
    REQUIRE(cuImportExternalMemory);
    int dev = memHandleDesc != NULL ? limited_device() : -1;
    uint64_t bytes = dev < 0 ? 0 : memHandleDesc->size;
    GUARDED_ALLOC(dev, bytes, SHIM_KIND_EXTERNAL, (uintptr_t)*extMem_out,
                  REAL(cuImportExternalMemory)(extMem_out, memHandleDesc));
}

CUresult cuDestroyExternalMemory(CUexternalMemory extMem) {
    REQUIRE(cuDestroyExternalMemory);
    GUARDED_FREE(SHIM_KIND_EXTERNAL, (uintptr_t)extMem, REAL(cuDestroyExternalMemory)(extMem));
}
