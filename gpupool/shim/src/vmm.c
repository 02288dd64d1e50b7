/*
 * Virtual memory management (cuMemCreate and the calls that share, map and release its
 * allocations). The driver frees such an allocation only when nothing refers to it any more: no
 * handle (the one cuMemCreate returned, each import and each cuMemRetainAllocationHandle), no
 * mapping (cuMemMap), and no open file exported with cuMemExportToShareableHandle. So the library
 * keeps the same references and gives the charge back when the last one goes; releasing the first
 * handle while the memory is still mapped, imported or exported gives nothing back.
 *
 * Imports: a file or fabric handle this process exported names an allocation it already charged,
 * and the import is one more reference to it. A file is known by its descriptor number, checked
 * against the file it named at the export: the driver's exported files are all opens of
 * /dev/nvidiactl, one inode for every export and for the driver's own control descriptors, so the
 * inode alone says nothing. A dup of the file is not recognised: its import is charged as
 * another process's would be (more, never less). Anything else (another process's export, of this
 * container or another) is charged to the importer when it maps the memory, by the bytes it maps
 * (the size of an imported allocation is not known before): the importer holds memory the exporter
 * may release at any time, so the importer pays for what it can reach. Within one container that
 * counts memory shared between two processes twice, which is more, never less, than the card holds.
 *
 * Every hook holds vmm_lock across its driver call, so a handle or address the driver reuses is
 * never confused with the one just released (these calls are rare: not on an allocation's hot path).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

/* Entries of the table (struct shim_entry fields):
 *   ALLOCATION key id (the library's own number); dev; bytes charged; owner = references
 *   FOREIGN    key id: imported from another process, charged by what is mapped
 *   EXPORTED   key id: exported at least once (its FILE and FABRIC entries go with it)
 *   HANDLE     key handle value; bytes = times held; owner = id
 *   MAPPING    key address; bytes = size; owner = id
 *   FILE       key descriptor number of an exported file; bytes = its file's identity; owner = id
 *   FABRIC     key digest of an exported fabric handle; owner = id */
enum { ALLOCATION = 1, FOREIGN, EXPORTED, HANDLE, MAPPING, FILE_EXPORT, FABRIC_EXPORT };

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_table vmm;
static uint64_t next_id;
static int held_by_files; /* a hint: allocations without references that an open exported file kept alive */

#define REQUIRE(name)                                                                                   \
    if (REAL(name) == NULL) return CUDA_ERROR_NOT_SUPPORTED

static void put(uint32_t kind, uint64_t key, int dev, uint64_t bytes, uint64_t owner) {
    struct shim_entry entry = {.key = key, .kind = kind, .dev = dev, .bytes = bytes, .owner = owner};
    if (shim_table_put(&vmm, &entry) != 0)
        shim_log(SHIM_LOG_ERROR, "out of host memory tracking a VMM allocation; its bytes stay charged");
}

static struct shim_entry *get(uint32_t kind, uint64_t key) { return shim_table_get(&vmm, kind, key); }

static void drop(uint32_t kind, uint64_t key) {
    struct shim_entry *entry = get(kind, key);
    if (entry != NULL) shim_table_remove(entry);
}

/* What a descriptor's file is (device, inode, special device): the same for every /dev/nvidiactl
 * open, different once the number is closed and reused for something else. */
static int file_identity(int fd, uint64_t *identity) {
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return -1;
    *identity = ((uint64_t)st.st_dev * 0x9e3779b97f4a7c15ull) ^ (uint64_t)st.st_ino ^ ((uint64_t)st.st_rdev << 32);
    return 0;
}

static uint64_t fabric_digest(const void *handle) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof(CUmemFabricHandle); i++) h = (h ^ ((const unsigned char *)handle)[i]) * 0x100000001b3ull;
    return h | 1; /* never 0 */
}

/* Whether a descriptor this process got from exporting allocation id is still open (its number
 * still names a file like the one exported; a closed number's record is dropped). */
static int exported_file_open(uint64_t id) {
    int open_file = 0;
    for (uint32_t i = 0; i < vmm.capacity; i++) {
        struct shim_entry *file = &vmm.slots[i];
        if (file->kind != FILE_EXPORT || file->owner != id) continue;
        uint64_t identity;
        if (file_identity((int)file->key, &identity) == 0 && identity == file->bytes) open_file = 1;
        else shim_table_remove(file);
    }
    return open_file;
}

/* An allocation without references: charged while an exported file keeps it alive, else given back. */
static void settle(struct shim_entry *allocation) {
    uint64_t id = allocation->key;
    int exported = get(EXPORTED, id) != NULL;
    if (exported && exported_file_open(id)) {
        held_by_files++;
        return;
    }
    shim_region_release(allocation->dev, allocation->bytes);
    shim_table_remove(allocation);
    drop(FOREIGN, id);
    if (!exported) return;
    drop(EXPORTED, id);
    for (uint32_t i = 0; i < vmm.capacity; i++) {
        struct shim_entry *entry = &vmm.slots[i];
        if ((entry->kind == FILE_EXPORT || entry->kind == FABRIC_EXPORT) && entry->owner == id) shim_table_remove(entry);
    }
}

static void drop_reference(uint64_t id) {
    struct shim_entry *allocation = get(ALLOCATION, id);
    if (allocation == NULL) return;
    if (allocation->owner > 0) allocation->owner--;
    if (allocation->owner == 0) settle(allocation);
}

static void add_reference(uint64_t id) {
    struct shim_entry *allocation = get(ALLOCATION, id);
    if (allocation != NULL) allocation->owner++;
}

/* Allocations kept only by exported files: give back those whose files are all closed now. */
static void recheck_files(void) {
    if (held_by_files <= 0) return;
    held_by_files = 0;
    for (uint32_t i = 0; i < vmm.capacity; i++) {
        struct shim_entry *entry = &vmm.slots[i];
        if (entry->kind == ALLOCATION && entry->owner == 0) settle(entry);
    }
}

static void hold_handle(CUmemGenericAllocationHandle handle, uint64_t id) {
    struct shim_entry *held = get(HANDLE, handle);
    if (held != NULL && held->owner == id) held->bytes++;
    else put(HANDLE, handle, 0, 1, id);
    add_reference(id);
}

/* The limited card an allocation property names, or -1. */
static int limited_location(const CUmemAllocationProp *prop) {
    if (!shim_config()->enabled || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return -1;
    return shim_memory_limited(prop->location.id) ? prop->location.id : -1;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    REQUIRE(cuMemCreate);
    int dev = limited_location(prop);
    CUmemAllocationProp on_card;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) { /* a virtual ordinal's card */
        on_card = *prop;
        on_card.location.id = shim_card_of(prop->location.id);
        prop = &on_card;
    }
    if (dev < 0) return REAL(cuMemCreate)(handle, size, prop, flags);
    pthread_mutex_lock(&vmm_lock);
    recheck_files();
    CUresult status = shim_charge(dev, size, "a VMM allocation");
    if (status == CUDA_SUCCESS) {
        status = REAL(cuMemCreate)(handle, size, prop, flags);
        if (status != CUDA_SUCCESS) {
            shim_region_release(dev, size);
        } else {
            uint64_t id = ++next_id;
            put(ALLOCATION, id, dev, size, 0);
            hold_handle(*handle, id);
        }
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REQUIRE(cuMemRelease);
    pthread_mutex_lock(&vmm_lock);
    CUresult status = REAL(cuMemRelease)(handle);
    struct shim_entry *held = get(HANDLE, handle);
    if (status == CUDA_SUCCESS && held != NULL) {
        uint64_t id = held->owner;
        if (--held->bytes == 0) shim_table_remove(held);
        drop_reference(id);
    }
    recheck_files();
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    REQUIRE(cuMemMap);
    pthread_mutex_lock(&vmm_lock);
    struct shim_entry *held = get(HANDLE, handle);
    struct shim_entry *allocation = held != NULL ? get(ALLOCATION, held->owner) : NULL;
    uint64_t extra = 0, reach;
    int charged = 0;
    CUresult status = CUDA_SUCCESS;
    if (allocation != NULL && get(FOREIGN, allocation->key) != NULL) { /* pay for what becomes reachable */
        if (__builtin_add_overflow((uint64_t)offset, (uint64_t)size, &reach)) reach = UINT64_MAX;
        extra = reach > allocation->bytes ? reach - allocation->bytes : 0;
        if (extra > 0) status = shim_charge(allocation->dev, extra, "imported memory");
        charged = extra > 0 && status == CUDA_SUCCESS;
    }
    if (status == CUDA_SUCCESS) status = REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (allocation != NULL && status == CUDA_SUCCESS) {
        uint64_t id = allocation->key;
        allocation->bytes += extra;
        put(MAPPING, ptr, 0, size, id); /* may move the table's entries: allocation is stale after it */
        add_reference(id);
    } else if (charged) {
        shim_region_release(allocation->dev, extra);
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REQUIRE(cuMemUnmap);
    pthread_mutex_lock(&vmm_lock);
    CUresult status = REAL(cuMemUnmap)(ptr, size);
    /* The range may cover several mappings laid end to end. */
    for (CUdeviceptr at = ptr; status == CUDA_SUCCESS && at - ptr < size;) {
        struct shim_entry *mapping = get(MAPPING, at);
        if (mapping == NULL || mapping->bytes == 0) break;
        uint64_t id = mapping->owner, length = mapping->bytes;
        shim_table_remove(mapping);
        drop_reference(id);
        at += length;
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
    REQUIRE(cuMemExportToShareableHandle);
    pthread_mutex_lock(&vmm_lock);
    CUresult status = REAL(cuMemExportToShareableHandle)(shareableHandle, handle, handleType, flags);
    struct shim_entry *held = get(HANDLE, handle);
    if (status == CUDA_SUCCESS && held != NULL && shareableHandle != NULL) {
        uint64_t id = held->owner, identity;
        int fd = *(int *)shareableHandle;
        if (handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && file_identity(fd, &identity) == 0) {
            drop(FILE_EXPORT, (uint64_t)fd); /* the number was closed and reused: the new export wins */
            put(FILE_EXPORT, (uint64_t)fd, 0, identity, id);
        } else if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
            uint64_t digest = fabric_digest(shareableHandle);
            if (get(FABRIC_EXPORT, digest) == NULL) put(FABRIC_EXPORT, digest, 0, 0, id);
        }
        if (get(EXPORTED, id) == NULL) put(EXPORTED, id, 0, 0, 0);
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

/* The allocation this process exported as osHandle, or 0. */
static uint64_t own_export(void *osHandle, CUmemAllocationHandleType type) {
    struct shim_entry *found = NULL;
    uint64_t identity;
    int fd = (int)(intptr_t)osHandle;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && file_identity(fd, &identity) == 0) {
        found = get(FILE_EXPORT, (uint64_t)fd);
        if (found != NULL && found->bytes != identity) found = NULL;
    } else if (type == CU_MEM_HANDLE_TYPE_FABRIC && osHandle != NULL) {
        found = get(FABRIC_EXPORT, fabric_digest(osHandle));
    }
    return found != NULL && get(ALLOCATION, found->owner) != NULL ? found->owner : 0;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType) {
    REQUIRE(cuMemImportFromShareableHandle);
    pthread_mutex_lock(&vmm_lock);
    CUresult status = REAL(cuMemImportFromShareableHandle)(handle, osHandle, shHandleType);
    if (status == CUDA_SUCCESS && shim_config()->enabled) {
        uint64_t id = own_export(osHandle, shHandleType);
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        int dev = -1;
        if (id == 0 && REAL(cuMemGetAllocationPropertiesFromHandle) != NULL &&
            REAL(cuMemGetAllocationPropertiesFromHandle)(&prop, *handle) == CUDA_SUCCESS)
            dev = limited_location(&prop);
        if (id == 0 && dev >= 0) { /* another process's memory: charged as it is mapped */
            id = ++next_id;
            put(ALLOCATION, id, dev, 0, 0);
            put(FOREIGN, id, 0, 0, 0);
        }
        if (id != 0) hold_handle(*handle, id);
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    REQUIRE(cuMemRetainAllocationHandle);
    pthread_mutex_lock(&vmm_lock);
    CUresult status = REAL(cuMemRetainAllocationHandle)(handle, addr);
    uint64_t at = (uint64_t)(uintptr_t)addr;
    for (uint32_t i = 0; status == CUDA_SUCCESS && i < vmm.capacity; i++) { /* rare: a scan will do */
        struct shim_entry *mapping = &vmm.slots[i];
        if (mapping->kind != MAPPING || at < mapping->key || at - mapping->key >= mapping->bytes) continue;
        hold_handle(*handle, mapping->owner);
        break;
    }
    pthread_mutex_unlock(&vmm_lock);
    return status;
}

/* In a forked child: the parent's allocations are not the child's. */
void shim_vmm_forget_all(void) {
    pthread_mutex_init(&vmm_lock, NULL);
    shim_table_clear(&vmm);
    held_by_files = 0;
}
