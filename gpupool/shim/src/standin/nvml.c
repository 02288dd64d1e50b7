/*
 * A stand-in libnvidia-ml.so.1: the stand-in driver's cards, their memory size, and utilisation
 * read from the shared card timeline (state.c), per card and per process, the way NVML samples it.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../cuda_api.h"
#include "state.h"

API nvmlReturn_t nvmlInit(void);
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
API const char *nvmlErrorString(nvmlReturn_t result);
API nvmlReturn_t nvmlShutdown(void);
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor);
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level);

#define MAX_PIDS 256

struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st devices[STANDIN_MAX_DEVICES] = {{0}, {1}, {2}, {3}};

static int index_of(nvmlDevice_t device) {
    for (int i = 0; i < standin_settings()->devices; i++)
        if (device == &devices[i]) return i;
    return -1;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_SUCCESS;
}
const char *nvmlErrorString(nvmlReturn_t result) { return result == NVML_SUCCESS ? "Success" : "stand-in error"; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = (unsigned)standin_settings()->devices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= (unsigned)standin_settings()->devices) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(uuid, length, "GPU-standin-%d", i);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    for (int i = 0; i < standin_settings()->devices; i++) {
        char name[NVML_DEVICE_UUID_BUFFER_SIZE];
        snprintf(name, sizeof name, "GPU-standin-%d", i);
        if (strcmp(name, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, length, "gpupool stand-in device %d", i);
    return NVML_SUCCESS;
}

/* Card i sits at PCI bus 0x3b + i (domain 0, device 0, function 0), as NVML writes the address. */
#define STANDIN_FIRST_BUS 0x3bu
#define STANDIN_NVIDIA_VENDOR 0x10deu
#define NVML_TOPOLOGY_HOSTBRIDGE 30

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    int i = index_of(device);
    if (i < 0 || pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = STANDIN_FIRST_BUS + (unsigned)i;
    pci->pciDeviceId = STANDIN_NVIDIA_VENDOR;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus & 0xffu);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus & 0xffu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    int i = index_of(device);
    if (i < 0 || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)i;
    return NVML_SUCCESS;
}

/* Every pair of stand-in cards shares a host bridge. */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    if (index_of(a) < 0 || index_of(b) < 0 || level == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *level = NVML_TOPOLOGY_HOSTBRIDGE;
    return NVML_SUCCESS;
}

/* Memory is tracked per process by the stand-in driver, so the card reports itself empty. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (index_of(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = memory->free = standin_settings()->memory_bytes;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (index_of(device) < 0 || memory->version != NVML_MEMORY_V2_VERSION) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = memory->free = standin_settings()->memory_bytes;
    memory->reserved = memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = standin_now_ns(), window = standin_settings()->window_ns;
    utilization->gpu = (unsigned)(standin_busy(i, 0, now - window, now) * 100 / window);
    utilization->memory = 0;
    return NVML_SUCCESS;
}

static unsigned long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

/* One sample per process over [lastSeenTimeStamp, now] (the last sample period when it is 0). */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    int i = index_of(device);
    if (i < 0 || processSamplesCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = standin_now_ns(), wall_us = realtime_us(), window = standin_settings()->window_ns;
    if (lastSeenTimeStamp != 0 && lastSeenTimeStamp < wall_us) window = (wall_us - lastSeenTimeStamp) * 1000ull;
    if (window == 0 || window > now) window = standin_settings()->window_ns;
    int pids[MAX_PIDS];
    int count = standin_pids(i, now - window, now, pids, MAX_PIDS);
    if (count == 0) return NVML_ERROR_NOT_FOUND;
    if (utilization == NULL || *processSamplesCount < (unsigned)count) {
        *processSamplesCount = (unsigned)count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < count; k++) {
        uint64_t busy = standin_busy(i, pids[k], now - window, now);
        utilization[k] = (nvmlProcessUtilizationSample_t){
            .pid = (unsigned)pids[k], .timeStamp = wall_us, .smUtil = (unsigned)((busy * 100 + window / 2) / window)};
    }
    *processSamplesCount = (unsigned)count;
    return NVML_SUCCESS;
}
