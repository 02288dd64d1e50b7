/*
 * The stand-in driver's virtual memory management, with the real driver's lifetime rule: a
 * cuMemCreate allocation is freed when no handle (created, imported, retained), no mapping and no
 * open exported file refers to it. Like the real driver's, whose exported files are all opens of
 * /dev/nvidiactl (one inode, also that of the process's own control descriptor), every exported
 * file here is an open of one carrier file, kept open from cuInit as the control descriptor too;
 * what tells exports apart is the open file's position, shared by its dups and by the copies
 * passed to other processes, and the carrier holds each export's card and size at that offset.
 * Importing one this process exported is one more handle to the same allocation, importing
 * another process's allocates nothing here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cuda_api.h"
#include "driver.h"

#define MAX_VMM 8192
#define MAX_HANDLES 8192
#define MAX_MAPPINGS 8192
#define HANDLE_BASE 0x10000ull
#define VA_BASE 0x7e0000000000ull
#define GRANULE (2ull << 20)

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags);
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);

struct vmm {
    int live;
    int foreign;   /* imported from another process: its memory is on that process's card */
    int exported;
    int dev;
    uint64_t key;  /* the card memory (standin_allocate) */
    uint64_t bytes;
    int refs;
    int64_t offset; /* of its export in the carrier */
};
struct file_header {
    int dev;
    uint64_t bytes;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct vmm vmms[MAX_VMM];
static struct { uint64_t value; int vmm; int count; } handles[MAX_HANDLES];
static struct { uint64_t va, size, handle; int vmm; } mappings[MAX_MAPPINGS];
static uint64_t next_handle = HANDLE_BASE, next_va = VA_BASE;

#define FIRST_EXPORT 4096 /* offsets below are never an export's: the control descriptor sits at 0 */
#define EXPORT_STRIDE 64

/* The carrier every exported file opens: next to the shared state file, else in /tmp. */
static int open_carrier(void) {
    const char *state = getenv("GPUPOOL_STANDIN_STATE");
    char path[4096];
    snprintf(path, sizeof path, "%s.carrier", state != NULL ? state : "/tmp/gpupool-standin");
    return open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
}

/* The position of an open descriptor, from /proc (lseek would need it and move nothing, but
 * reading fdinfo works for any descriptor of this process). */
static int64_t position_of(const char *fd_name) {
    char path[300], text[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%.255s", fd_name);
    FILE *info = fopen(path, "re");
    long long pos = -1;
    while (info != NULL && fgets(text, sizeof text, info) != NULL)
        if (sscanf(text, "pos: %lld", &pos) == 1) break;
    if (info != NULL) fclose(info);
    return pos;
}

/* Whether a descriptor of this process is the allocation's exported file (or a dup of it). */
static int file_open(const struct vmm *v) {
    struct stat carrier;
    int fd = open_carrier();
    if (fd < 0 || fstat(fd, &carrier) != 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    close(fd);
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) return 0;
    struct dirent *item;
    struct stat st;
    int found = 0;
    while (!found && (item = readdir(dir)) != NULL)
        found = item->d_name[0] != '.' && fstatat(dirfd(dir), item->d_name, &st, 0) == 0 &&
                st.st_ino == carrier.st_ino && st.st_dev == carrier.st_dev && position_of(item->d_name) == v->offset;
    closedir(dir);
    return found;
}

static void settle(struct vmm *v) {
    if (!v->live || v->refs > 0 || (v->exported && file_open(v))) return;
    if (!v->foreign) standin_release(v->key);
    v->live = 0;
}

void standin_vmm_settle(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_VMM; i++) settle(&vmms[i]);
    pthread_mutex_unlock(&lock);
}

static int new_handle(int vmm) {
    for (int i = 0; i < MAX_HANDLES; i++) {
        if (handles[i].count != 0) continue;
        handles[i].value = next_handle;
        next_handle += 16;
        handles[i].vmm = vmm;
        handles[i].count = 1;
        vmms[vmm].refs++;
        return i;
    }
    return -1;
}

static int handle_index(uint64_t value) {
    for (int i = 0; i < MAX_HANDLES; i++)
        if (handles[i].count != 0 && handles[i].value == value) return i;
    return -1;
}

static int free_vmm(void) {
    for (int i = 0; i < MAX_VMM; i++)
        if (!vmms[i].live) return i;
    return -1;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    (void)flags;
    if (prop == NULL || handle == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (standin_checked_device(prop->location.id) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    unsigned long long key;
    CUresult status = standin_allocate(prop->location.id, size, &key);
    if (status != CUDA_SUCCESS) return status;
    pthread_mutex_lock(&lock);
    int v = free_vmm(), h = -1;
    if (v >= 0) {
        vmms[v] = (struct vmm){.live = 1, .dev = prop->location.id, .key = key, .bytes = size};
        h = new_handle(v);
        if (h < 0) vmms[v].live = 0;
    }
    if (h >= 0) *handle = handles[h].value;
    pthread_mutex_unlock(&lock);
    if (h < 0) standin_release(key);
    return h < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    pthread_mutex_lock(&lock);
    int h = handle_index(handle);
    if (h >= 0) {
        struct vmm *v = &vmms[handles[h].vmm];
        handles[h].count--;
        v->refs--;
        settle(v);
    }
    pthread_mutex_unlock(&lock);
    return h < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment, (void)addr, (void)flags;
    if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    *ptr = __atomic_fetch_add(&next_va, (size + GRANULE - 1) / GRANULE * GRANULE, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { return ptr == 0 || size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    (void)flags;
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int h = handle_index(handle);
    if (h >= 0 && offset == 0 && size <= vmms[handles[h].vmm].bytes && size > 0) {
        for (int m = 0; m < MAX_MAPPINGS; m++) {
            if (mappings[m].size != 0) continue;
            mappings[m].va = ptr;
            mappings[m].size = size;
            mappings[m].handle = handle;
            mappings[m].vmm = handles[h].vmm;
            vmms[handles[h].vmm].refs++;
            status = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int m = 0; m < MAX_MAPPINGS; m++) {
        if (mappings[m].size == 0 || mappings[m].va < ptr || mappings[m].va - ptr >= size) continue;
        struct vmm *v = &vmms[mappings[m].vmm];
        mappings[m].size = 0;
        v->refs--;
        settle(v);
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A new export's offset in the carrier: the carrier's first 8 bytes count the exports made. */
static int64_t next_export(int fd) {
    int64_t count = 0;
    if (flock(fd, LOCK_EX) != 0) return -1;
    if (pread(fd, &count, sizeof count, 0) != (ssize_t)sizeof count) count = 0;
    count++;
    int written = pwrite(fd, &count, sizeof count, 0) == (ssize_t)sizeof count;
    flock(fd, LOCK_UN);
    return written ? FIRST_EXPORT + count * EXPORT_STRIDE : -1;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
    (void)flags;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    if (shareableHandle == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int h = handle_index(handle);
    struct vmm *v = h >= 0 ? &vmms[handles[h].vmm] : NULL;
    int fd = v != NULL ? open_carrier() : -1;
    int64_t offset = fd >= 0 ? next_export(fd) : -1;
    struct file_header header = {.dev = v != NULL ? v->dev : 0, .bytes = v != NULL ? v->bytes : 0};
    if (offset > 0 && pwrite(fd, &header, sizeof header, offset) == (ssize_t)sizeof header &&
        lseek(fd, offset, SEEK_SET) == offset) {
        v->exported = 1; /* one file per allocation is enough for the tests: the last export's */
        v->offset = offset;
        *(int *)shareableHandle = fd;
        status = CUDA_SUCCESS;
    } else if (fd >= 0) {
        close(fd);
        status = CUDA_ERROR_UNKNOWN;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType) {
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    struct file_header header;
    int64_t offset = handle != NULL ? lseek(fd, 0, SEEK_CUR) : -1;
    if (offset < FIRST_EXPORT || pread(fd, &header, sizeof header, offset) != (ssize_t)sizeof header)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int v = -1, h = -1;
    for (int i = 0; i < MAX_VMM && v < 0; i++)
        if (vmms[i].live && vmms[i].exported && vmms[i].offset == offset) v = i;
    if (v < 0 && (v = free_vmm()) >= 0)
        vmms[v] = (struct vmm){.live = 1, .foreign = 1, .dev = header.dev, .bytes = header.bytes};
    if (v >= 0) h = new_handle(v);
    if (h >= 0) {
        *handle = handles[h].value;
        status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* The control descriptor every process of the real driver keeps open on /dev/nvidiactl, which
 * every exported file is an open of too. */
void standin_vmm_open_control(void) {
    static int control = -1;
    if (__atomic_load_n(&control, __ATOMIC_ACQUIRE) < 0) __atomic_store_n(&control, open_carrier(), __ATOMIC_RELEASE);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    uint64_t at = (uint64_t)(uintptr_t)addr;
    pthread_mutex_lock(&lock);
    for (int m = 0; m < MAX_MAPPINGS && status != CUDA_SUCCESS; m++) {
        if (mappings[m].size == 0 || at < mappings[m].va || at - mappings[m].va >= mappings[m].size) continue;
        int h = handle_index(mappings[m].handle);
        if (h < 0) h = new_handle(mappings[m].vmm); /* the mapping's handle was released: a fresh one */
        else handles[h].count++, vmms[handles[h].vmm].refs++;
        if (h >= 0) *handle = handles[h].value, status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
    if (prop == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int h = handle_index(handle);
    if (h >= 0) {
        memset(prop, 0, sizeof *prop);
        prop->type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = vmms[handles[h].vmm].dev;
    }
    pthread_mutex_unlock(&lock);
    return h < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Entry points that name a device without allocating: each refuses a device this driver does not
 * have, as the real one does, and records the last device it was given (gpupoolStandinLastDevice),
 * so a test sees which device reached the driver. CU_DEVICE_CPU is a place for the hints. */
API int gpupoolStandinLastDevice(void);
static int last_device = -2; /* -2: none yet */

int gpupoolStandinLastDevice(void) { return __atomic_load_n(&last_device, __ATOMIC_RELAXED); }

static CUresult named_device(int dev, int cpu_allowed) {
    CUresult status = cpu_allowed && dev == CU_DEVICE_CPU ? CUDA_SUCCESS : standin_checked_device(dev);
    if (status == CUDA_SUCCESS) __atomic_store_n(&last_device, dev, __ATOMIC_RELAXED);
    return status;
}

static CUresult named_location(const CUmemLocation *location, int cpu_allowed) {
    if (location == NULL) return CUDA_ERROR_INVALID_VALUE;
    return location->type == CU_MEM_LOCATION_TYPE_DEVICE ? named_device(location->id, cpu_allowed) : CUDA_SUCCESS;
}

static CUresult named_access(const CUmemAccessDesc *descs, size_t count) {
    if (descs == NULL || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        CUresult status = named_location(&descs[i].location, 0);
        if (status != CUDA_SUCCESS) return status;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    return ptr == 0 || size == 0 ? CUDA_ERROR_INVALID_VALUE : named_access(desc, count);
}

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
    if (flags == NULL || ptr == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = named_location(location, 0);
    if (status == CUDA_SUCCESS) *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return status;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    (void)option;
    if (granularity == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = named_location(&prop->location, 0);
    if (status == CUDA_SUCCESS) *granularity = GRANULE;
    return status;
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
    return pool == NULL ? CUDA_ERROR_INVALID_VALUE : named_access(map, count);
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location) {
    if (flags == NULL || memPool == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = named_location(location, 0);
    if (status == CUDA_SUCCESS) *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return status;
}

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device) {
    (void)advice;
    return devPtr == 0 || count == 0 ? CUDA_ERROR_INVALID_VALUE : named_device(device, 1);
}

CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location) {
    (void)advice;
    return devPtr == 0 || count == 0 ? CUDA_ERROR_INVALID_VALUE : named_location(&location, 1);
}

CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    (void)hStream;
    return devPtr == 0 || count == 0 ? CUDA_ERROR_INVALID_VALUE : named_device(dstDevice, 1);
}

CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                               CUstream hStream) {
    (void)hStream;
    return devPtr == 0 || count == 0 || flags != 0 ? CUDA_ERROR_INVALID_VALUE : named_location(&location, 1);
}

CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    return cuMemPrefetchAsync(devPtr, count, dstDevice, hStream);
}

CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                    CUstream hStream) {
    return cuMemPrefetchAsync_v2(devPtr, count, location, flags, hStream);
}

/* The stand-in's cards are never peers; one card with itself is not a peer question (as the driver). */
CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice) {
    (void)attrib;
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = named_device(srcDevice, 0);
    if (status == CUDA_SUCCESS) status = named_device(dstDevice, 0);
    if (status == CUDA_SUCCESS && srcDevice == dstDevice) status = CUDA_ERROR_INVALID_DEVICE;
    if (status == CUDA_SUCCESS) *value = 0;
    return status;
}
