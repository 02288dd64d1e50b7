/*
 * What a process is told about memory: the container's limit as the total, and what the
 * container has left as free, so frameworks that size their caches from these numbers (PyTorch,
 * TensorFlow, JAX) stay inside the share instead of running into refusals. A virtual ordinal
 * (virtual.c) reports its share as its total; NVML, which names the card, reports the card's.
 */
#include <string.h>

#include "shim.h"

/* The free memory of a limited ordinal: what is left of its limits, never more than the card has. */
static uint64_t left_of(int dev, uint64_t card_free) {
    uint64_t left = shim_memory_left(dev);
    return left < card_free ? left : card_free;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (REAL(cuMemGetInfo_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuMemGetInfo_v2)(free, total);
    if (status != CUDA_SUCCESS || !shim_config()->enabled) return status;
    int dev = shim_current_device();
    if (!shim_memory_limited(dev)) return status;
    uint64_t limit = shim_memory_limit(dev);
    if (total != NULL && *total > limit) *total = limit;
    if (free != NULL) *free = left_of(dev, *free);
    shim_log(SHIM_LOG_DEBUG, "cuMemGetInfo on card %d: free %llu, total %llu (limit %llu)", dev,
             free == NULL ? 0ull : (unsigned long long)*free, total == NULL ? 0ull : (unsigned long long)*total,
             (unsigned long long)limit);
    return status;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (REAL(cuDeviceTotalMem_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = REAL(cuDeviceTotalMem_v2)(bytes, shim_card_of(dev));
    if (status == CUDA_SUCCESS && bytes != NULL && shim_memory_limited(dev) && *bytes > shim_memory_limit(dev))
        *bytes = shim_memory_limit(dev);
    return status;
}

/* NVML names cards by handle: the container's card UUIDs give the CUDA ordinal, else NVML's index. */
static int ordinal_of(nvmlDevice_t device) {
    const struct shim_config *c = shim_config();
    if (c->uuid_count > 0 && REAL(nvmlDeviceGetUUID) != NULL) {
        char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
        if (REAL(nvmlDeviceGetUUID)(device, uuid, sizeof uuid) == NVML_SUCCESS)
            for (int i = 0; i < c->uuid_count; i++)
                if (strcmp(uuid, c->uuids[i]) == 0) return i;
    }
    unsigned int index;
    if (REAL(nvmlDeviceGetIndex) == NULL || REAL(nvmlDeviceGetIndex)(device, &index) != NVML_SUCCESS) return -1;
    return index < SHIM_MAX_DEVICES ? (int)index : -1;
}

/* Rewrites total/free/used of a limited card; leaves an unlimited one as NVML said. */
static void limit_report(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                         unsigned long long *used) {
    if (!shim_config()->enabled) return;
    int dev = ordinal_of(device); /* a card: with a virtual grant, card 0 and all of its ordinals */
    uint64_t limit = dev >= 0 && dev < SHIM_MAX_DEVICES ? shim_card_memory_limit(dev) : 0;
    if (limit == 0) return;
    uint64_t held = shim_region_used(dev);
    uint64_t left = held < limit ? limit - held : 0;
    *total = limit < *total ? limit : *total;
    *free = left < *free ? left : *free;
    *used = held;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (REAL(nvmlDeviceGetMemoryInfo) == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t status = REAL(nvmlDeviceGetMemoryInfo)(device, memory);
    if (status == NVML_SUCCESS && memory != NULL) limit_report(device, &memory->total, &memory->free, &memory->used);
    return status;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (REAL(nvmlDeviceGetMemoryInfo_v2) == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t status = REAL(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (status == NVML_SUCCESS && memory != NULL) limit_report(device, &memory->total, &memory->free, &memory->used);
    return status;
}
