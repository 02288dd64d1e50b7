/*
 * The stand-in driver's virtual memory management, with the real driver's lifetime rule: a
 * cuMemCreate allocation is freed when no handle (created, imported, retained), no mapping and no
 * open exported file refers to it. Exported handles are POSIX file descriptors (a memfd holding the
 * card and size, so another process can import it); importing one this process exported is one
 * more handle to the same allocation, importing another process's allocates nothing here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <string.h>
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
    uint64_t file_dev, file_ino;
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

static int file_open(const struct vmm *v) {
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) return 0;
    struct dirent *item;
    struct stat st;
    int found = 0;
    while (!found && (item = readdir(dir)) != NULL)
        found = item->d_name[0] != '.' && fstatat(dirfd(dir), item->d_name, &st, 0) == 0 &&
                (uint64_t)st.st_ino == v->file_ino && (uint64_t)st.st_dev == v->file_dev;
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

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
    (void)flags;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    if (shareableHandle == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int h = handle_index(handle);
    struct vmm *v = h >= 0 ? &vmms[handles[h].vmm] : NULL;
    int fd = v != NULL ? memfd_create("gpupool-standin-vmm", MFD_CLOEXEC) : -1;
    struct file_header header = {.dev = v != NULL ? v->dev : 0, .bytes = v != NULL ? v->bytes : 0};
    struct stat st;
    if (fd >= 0 && pwrite(fd, &header, sizeof header, 0) == (ssize_t)sizeof header && fstat(fd, &st) == 0) {
        v->exported = 1; /* one file per allocation is enough for the tests: the last export's */
        v->file_dev = (uint64_t)st.st_dev;
        v->file_ino = (uint64_t)st.st_ino;
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
    struct stat st;
    struct file_header header;
    if (handle == NULL || fstat(fd, &st) != 0 || pread(fd, &header, sizeof header, 0) != (ssize_t)sizeof header)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int v = -1, h = -1;
    for (int i = 0; i < MAX_VMM && v < 0; i++)
        if (vmms[i].live && vmms[i].exported && vmms[i].file_ino == (uint64_t)st.st_ino &&
            vmms[i].file_dev == (uint64_t)st.st_dev)
            v = i;
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
