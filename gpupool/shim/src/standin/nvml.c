/*
 * A stand-in libnvidia-ml.so.1: the stand-in driver's cards, their memory size, and utilisation
 * read from the shared card timeline (state.c), per card and per process, the way NVML samples it;
 * cards in MIG mode with MIG devices when GPUPOOL_STANDIN_MIG says so (at the end of this file).
 */
#include <stdio.h>
#include <stdlib.h>
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
    int mig; /* 0: the card itself; n: its MIG device in slot n - 1 */
};
static struct nvmlDevice_st devices[STANDIN_MAX_DEVICES] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};

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

static int mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length);
static int mig_name(nvmlDevice_t device, char *name, unsigned int length);

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i = index_of(device);
    if (i < 0 && mig_uuid(device, uuid, length)) return NVML_SUCCESS;
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
    if (i < 0 && mig_name(device, name, length)) return NVML_SUCCESS;
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
    standin_count_utilisation_query();
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

/*
 * MIG, read-only as gpupool uses it. GPUPOOL_STANDIN_MIG puts cards in MIG mode with MIG devices:
 * "<card>=<device>,<device>;<card>=error", a device being "<g>g.<MiB>" (a GPU instance of g slices
 * with a compute instance as large) or "<c>c.<g>g.<MiB>"; "error" makes the card's MIG query fail.
 * Cards not named are not in MIG mode. Each card has 7 slices, as an A100/H100/H200.
 */
#define STANDIN_MIG_SLOTS 7
#define STANDIN_MIG_ERROR (-1)

/* NVML's nvmlDeviceAttributes_t (nvml.h, since R450), the fields gpupool reads. */
typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

struct standin_mig {
    unsigned gpu_slices, compute_slices;
    unsigned long long memory_mib;
};

static struct standin_mig mig_specs[STANDIN_MAX_DEVICES][STANDIN_MIG_SLOTS];
static int mig_counts[STANDIN_MAX_DEVICES]; /* devices per card; STANDIN_MIG_ERROR: the query fails */
static int mig_mode[STANDIN_MAX_DEVICES];
static struct nvmlDevice_st mig_handles[STANDIN_MAX_DEVICES][STANDIN_MIG_SLOTS];
static int mig_parsed;

static void parse_mig_device(int card, const char *text) {
    unsigned first = 0, second = 0;
    unsigned long long mib = 0;
    struct standin_mig *spec = &mig_specs[card][mig_counts[card]];
    if (sscanf(text, "%uc.%ug.%llu", &first, &second, &mib) == 3) {
        *spec = (struct standin_mig){second, first, mib};
    } else if (sscanf(text, "%ug.%llu", &first, &mib) == 2) {
        *spec = (struct standin_mig){first, first, mib};
    } else {
        return;
    }
    mig_counts[card]++;
}

static void parse_mig(void) {
    if (mig_parsed) return;
    mig_parsed = 1;
    const char *text = getenv("GPUPOOL_STANDIN_MIG");
    char copy[1024];
    if (text == NULL || strlen(text) >= sizeof copy) return;
    strcpy(copy, text);
    char *card_save = NULL;
    for (char *entry = strtok_r(copy, ";", &card_save); entry; entry = strtok_r(NULL, ";", &card_save)) {
        char *equals = strchr(entry, '=');
        int card = atoi(entry);
        if (equals == NULL || card < 0 || card >= STANDIN_MAX_DEVICES) continue;
        mig_mode[card] = 1;
        if (strcmp(equals + 1, "error") == 0) {
            mig_counts[card] = STANDIN_MIG_ERROR;
            continue;
        }
        char *device_save = NULL;
        for (char *device = strtok_r(equals + 1, ",", &device_save); device && mig_counts[card] < STANDIN_MIG_SLOTS;
             device = strtok_r(NULL, ",", &device_save))
            parse_mig_device(card, device);
    }
}

/* The MIG device a handle names: its card and slot, or -1 for anything else. */
static int mig_of(nvmlDevice_t device, int *slot) {
    for (int card = 0; card < standin_settings()->devices && card < STANDIN_MAX_DEVICES; card++)
        for (int k = 0; k < STANDIN_MIG_SLOTS; k++)
            if (device == &mig_handles[card][k] && k < mig_counts[card]) {
                *slot = k;
                return card;
            }
    return -1;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending);
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count);
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig);
API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes);
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id);
API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id);

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    int i = index_of(device);
    if (i < 0 || current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    parse_mig();
    if (mig_counts[i] == STANDIN_MIG_ERROR) return NVML_ERROR_UNKNOWN;
    *current = *pending = (unsigned)mig_mode[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    int i = index_of(device);
    if (i < 0 || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    parse_mig();
    *count = mig_mode[i] ? STANDIN_MIG_SLOTS : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    int i = index_of(device);
    if (i < 0 || mig == NULL || index >= STANDIN_MIG_SLOTS) return NVML_ERROR_INVALID_ARGUMENT;
    parse_mig();
    if (mig_counts[i] == STANDIN_MIG_ERROR) return NVML_ERROR_UNKNOWN;
    if ((int)index >= mig_counts[i]) return NVML_ERROR_NOT_FOUND;
    mig_handles[i][index] = (struct nvmlDevice_st){i, (int)index + 1};
    *mig = &mig_handles[i][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    int slot = 0, card = mig_of(device, &slot);
    if (card < 0 || attributes == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const struct standin_mig *spec = &mig_specs[card][slot];
    memset(attributes, 0, sizeof *attributes);
    attributes->gpuInstanceSliceCount = spec->gpu_slices;
    attributes->computeInstanceSliceCount = spec->compute_slices;
    attributes->memorySizeMB = spec->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    int slot = 0, card = mig_of(device, &slot);
    if (card < 0 || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned)slot + 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    int slot = 0;
    if (mig_of(device, &slot) < 0 || id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *id = 0;
    return NVML_SUCCESS;
}

/* A MIG device's name, as the driver writes it: the card's, " MIG ", the profile. */
static int mig_name(nvmlDevice_t device, char *name, unsigned int length) {
    int slot = 0, card = mig_of(device, &slot);
    if (card < 0) return 0;
    const struct standin_mig *spec = &mig_specs[card][slot];
    unsigned long long gigabytes = (spec->memory_mib + 512) / 1024;
    if (spec->compute_slices != spec->gpu_slices)
        snprintf(name, length, "gpupool stand-in device %d MIG %uc.%ug.%llugb", card, spec->compute_slices,
                 spec->gpu_slices, gigabytes);
    else
        snprintf(name, length, "gpupool stand-in device %d MIG %ug.%llugb", card, spec->gpu_slices, gigabytes);
    return 1;
}

static int mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
    int slot = 0, card = mig_of(device, &slot);
    if (card < 0) return 0;
    snprintf(uuid, length, "MIG-standin-%d-%d", card, slot);
    return 1;
}
