/*
 * Internal interfaces between the parts of the interception library (one file per job):
 *   log.c       messages on stderr, level from GPUPOOL_SHIM_LOG
 *   grant.c     the node's grant: the read-only file the node agent writes (limits no env var can raise)
 *   config.c    limits and settings read once: the node's grant, lowered (never raised) by the environment
 *   ancestors.c the environments the process's ancestors started with (limits a child inherits)
 *   region.c    the per-container shared accounting region (memory.region)
 *   liveness.c  whether the process behind a region record still runs (its lock, its pid)
 *   memory.c    per-process table of live allocations, charge and release
 *   compute.c   token bucket and the controller that sets its rate from measured utilisation
 *   window.c    how far a compute-limited process may launch ahead of its card
 *   symbols.c   the hook table, the real driver entry points, dlsym and cuGetProcAddress
 *   variants.c  lookups of driver entry-point variants newer than any the library wraps: refused
 *   hooks_*.c   the wrapped driver and NVML entry points
 *   register.c  registration with the node agent
 *   virtual.c   one granted card presented as n CUDA ordinals (a virtual-card grant)
 */
#ifndef GPUPOOL_SHIM_H
#define GPUPOOL_SHIM_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "cuda_api.h"

#define SHIM_MAX_DEVICES 16
#define SHIM_UUID_LEN 96
#define SHIM_HIDDEN __attribute__((visibility("hidden")))

/* log.c */
enum { SHIM_LOG_DEBUG = 0, SHIM_LOG_INFO = 1, SHIM_LOG_WARN = 2, SHIM_LOG_ERROR = 3 };
SHIM_HIDDEN void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* config.c */
enum { SHIM_MODE_HARD = 0, SHIM_MODE_SOFT = 1 };
struct shim_config {
    int enabled;                                  /* 0: pass-through */
    int log_level;
    int mode;                                     /* SHIM_MODE_HARD or SHIM_MODE_SOFT */
    uint64_t memory_limit[SHIM_MAX_DEVICES];      /* bytes; 0: no limit on that device */
    int compute_percent[SHIM_MAX_DEVICES];        /* 1..99; 0: no limit on that device */
    int uuid_count;
    char uuids[SHIM_MAX_DEVICES][SHIM_UUID_LEN];  /* GPUPOOL_CARD_UUIDS, by CUDA ordinal */
    int granted;                                  /* the node's grant was found: the env can only lower */
    int virtual_devices;                          /* >1: card 0 presented as this many ordinals (virtual.c) */
    uint64_t virtual_share;                       /* bytes each of those ordinals may hold; 0: no limit */
    char dir[PATH_MAX];                           /* where memory.region lives (without a grant) */
    char region_path[PATH_MAX];                   /* the region file itself */
    char socket_path[108];                        /* sun_path size */
    char token[160];
    char pod[256];
    char container[256];
};
SHIM_HIDDEN const struct shim_config *shim_config(void);
/* A size in HAMi-core's notation: digits with an optional k/m/g suffix (1024-based), else bytes. */
SHIM_HIDDEN int shim_parse_size(const char *text, uint64_t *bytes);

/* ancestors.c: visit(pid, NUL-separated NAME=value block, its length) for the parent, its parent,
 * ... up to the pid namespace's init (those whose environment can be read); returns how many */
SHIM_HIDDEN int shim_each_ancestor_env(void (*visit)(int pid, const char *env, size_t length, void *ctx), void *ctx);
SHIM_HIDDEN const char *shim_env_block_get(const char *env, size_t length, const char *name);

/* elf_symbol.c: a symbol's default definition in one loaded object, from its dynamic table */
struct link_map;
SHIM_HIDDEN void *shim_elf_symbol(const struct link_map *map, const char *name);
SHIM_HIDDEN int shim_same_name(const char *a, const char *b); /* strcmp(a, b) == 0, usable before sanitizers start */

/* symbols.c: glibc's definition of name after this library (RTLD_NEXT from here) */
SHIM_HIDDEN void *shim_lookup_next(const char *name);

/* grant.c: the file's raw values; config.c reads the lists with the same rules as the env's */
enum { SHIM_GRANT_ABSENT = 0, SHIM_GRANT_PRESENT = 1, SHIM_GRANT_UNREADABLE = -1 };
struct shim_grant {
    char version[8];
    char memory_mib[SHIM_MAX_DEVICES * 16];       /* comma list, MiB per CUDA ordinal */
    char compute_percent[SHIM_MAX_DEVICES * 8];   /* comma list, percent; 0: no limit */
    char compute_mode[8];                         /* hard or soft */
    char card_uuids[SHIM_MAX_DEVICES * SHIM_UUID_LEN];
    char region[PATH_MAX];
    char socket_path[108];
    char token[160];
    char pod[256];
    char container[256];
    char remote_endpoint[300]; /* host:port of the GPU server of a remote share (docs/remote-gpu.md) */
    char remote_token[260];    /* its token; the GPU client library (src/remote/client.c) uses both */
    char virtual_devices[24];  /* the one card as this many CUDA ordinals; absent: one */
};
SHIM_HIDDEN int shim_read_grant(struct shim_grant *grant);
SHIM_HIDDEN const char *shim_grant_path(void);

/* region.c: dev is the program's CUDA ordinal; the region's records are per card (shim_card_of) */
SHIM_HIDDEN int shim_region_charge(int dev, uint64_t bytes);   /* 0 or -1 (over the limit) */
SHIM_HIDDEN void shim_region_release(int dev, uint64_t bytes);
SHIM_HIDDEN uint64_t shim_region_used(int dev);
SHIM_HIDDEN uint64_t shim_region_wait_ns(int dev);             /* the agent's bound on waiting for room; 0: none */
SHIM_HIDDEN int shim_wait_for_room(int dev, uint64_t *until_ns); /* 1: retry the refused allocation now */
SHIM_HIDDEN uint64_t shim_memory_limit(int dev);               /* effective, 0: none (a virtual ordinal: its share) */
SHIM_HIDDEN uint64_t shim_card_memory_limit(int card);         /* the card's, for the whole container */
SHIM_HIDDEN uint64_t shim_memory_left(int dev);                /* what dev may still take, by both limits */
SHIM_HIDDEN int shim_compute_limit(int dev, int *mode);        /* effective percent, 0: none */
SHIM_HIDDEN int shim_region_pids(int *pids, int max);          /* live processes, as NVML names them */
SHIM_HIDDEN void shim_region_set_host_pid(int pid);             /* this process's pid outside its pid namespace */
struct shim_bucket;
SHIM_HIDDEN struct shim_bucket *shim_region_bucket(int dev);

/* table.c: (kind, key) -> entry, open addressing; the caller holds its own lock */
struct shim_entry {
    uint64_t key;
    uint32_t kind; /* 0: empty */
    int32_t dev;
    uint64_t bytes;
    uint64_t owner; /* 0: none */
};
struct shim_table {
    struct shim_entry *slots;
    uint32_t capacity, occupied; /* occupied counts removed entries too */
};
SHIM_HIDDEN int shim_table_put(struct shim_table *t, const struct shim_entry *entry); /* -1: out of memory */
SHIM_HIDDEN struct shim_entry *shim_table_get(struct shim_table *t, uint32_t kind, uint64_t key);
SHIM_HIDDEN void shim_table_remove(struct shim_entry *entry);
SHIM_HIDDEN int shim_table_live(const struct shim_entry *entry);
SHIM_HIDDEN void shim_table_clear(struct shim_table *t);

/* memory.c */
enum { SHIM_KIND_POINTER = 1, SHIM_KIND_HANDLE = 2, SHIM_KIND_ARRAY = 3, SHIM_KIND_MIPMAP = 4, SHIM_KIND_GRAPH_NODE = 5,
       SHIM_KIND_CAPTURED = 6 /* an allocation made while its stream was captured: the graph's */,
       SHIM_KIND_GRAPH_COPY = 7 /* a copy's share of the memory nodes it copied: key (copy << 4) | card */,
       SHIM_KIND_EXEC = 8 /* an executable graph instantiated from a graph with memory nodes; owner: that graph */,
       SHIM_KIND_EXTERNAL = 9 /* memory another API allocated, imported with cuImportExternalMemory */,
       SHIM_KIND_POOL = 10 /* a memory pool and where it allocates: dev, or SHIM_POOL_HOST */ };
#define SHIM_POOL_HOST (-2)
SHIM_HIDDEN int shim_current_device(void);
/* Charge bytes on a card: CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (logged, naming what) past the limit. */
SHIM_HIDDEN CUresult shim_charge(int dev, uint64_t bytes, const char *what);
SHIM_HIDDEN int shim_memory_limited(int dev);
SHIM_HIDDEN int shim_any_memory_limited(void);
SHIM_HIDDEN void shim_track(int kind, uint64_t key, int dev, uint64_t bytes);
/* Tracked with an owner (a graph's memory nodes: the graph), so all of an owner's go at once. */
SHIM_HIDDEN void shim_track_owned(int kind, uint64_t key, int dev, uint64_t bytes, uint64_t owner);
SHIM_HIDDEN int shim_untrack(int kind, uint64_t key, int *dev, uint64_t *bytes);
/* Whether an entry is tracked, and its card; the entry stays. */
SHIM_HIDDEN int shim_lookup(int kind, uint64_t key, int *dev);
SHIM_HIDDEN int shim_untrack_owned(int kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *owner);
/* Untrack every entry of kind with this owner and give its bytes back to the region. */
SHIM_HIDDEN void shim_release_owned(int kind, uint64_t owner);
/* Hand every entry of kind owned by from over to to; returns how many moved. */
SHIM_HIDDEN int shim_reown(int kind, uint64_t from, uint64_t to);
/* Whether any entry of kind has this owner. */
SHIM_HIDDEN int shim_owns_any(int kind, uint64_t owner);
/* The key of an entry of kind with this owner, or 0. */
SHIM_HIDDEN uint64_t shim_find_owned(int kind, uint64_t owner);
/* Bytes per card of the entries of kind with this owner, added to sums. */
SHIM_HIDDEN void shim_sum_owned(int kind, uint64_t owner, uint64_t sums[SHIM_MAX_DEVICES]);
SHIM_HIDDEN void shim_forget_all(void);

/* vmm.c */
SHIM_HIDDEN void shim_vmm_forget_all(void);
SHIM_HIDDEN uint64_t shim_array_bytes(size_t w, size_t h, size_t d, CUarray_format format, unsigned channels);

/* hooks_graph.c: the limited card a pool allocates on, -1 (host, not limited), fallback (unknown pool) */
SHIM_HIDDEN int shim_pool_device(CUmemoryPool pool, int fallback);

/* hooks_graph_exec.c: the graph's memory goes back, or to the executable graph made from it */
SHIM_HIDDEN void shim_graph_memory_ends(uint64_t graph);
/* A child graph moved into its parent: the parent holds the child's memory nodes now. */
SHIM_HIDDEN void shim_graph_memory_moves(uint64_t child, uint64_t parent);

/* compute.c */
/* Takes a launch's tokens (may sleep); 1 when the card's compute is limited. */
SHIM_HIDDEN int shim_compute_launch(int dev, uint64_t cost);
SHIM_HIDDEN uint64_t shim_graph_cost(int dev);
SHIM_HIDDEN void shim_compute_after_fork(void);

/* window.c: a compute-limited card's launches never queue far ahead of it */
SHIM_HIDDEN void shim_window_launched(int dev, CUstream stream, int per_thread);
SHIM_HIDDEN void shim_window_after_fork(void);

/* symbols.c */
#define SHIM_HOOKS(X)                                                                                   \
    X(cuInit, "cuInit", 0, 0)                                                                           \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                                  \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                               \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                                             \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                                   \
    X(cuImportExternalMemory, "cuImportExternalMemory", 0, 0)                                           \
    X(cuDestroyExternalMemory, "cuDestroyExternalMemory", 0, 0)                                         \
    X(cuMemAllocManaged, "cuMemAllocManaged", 0, 0)                                                     \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                                               \
    X(cuMemCreate, "cuMemCreate", 0, 0)                                                                 \
    X(cuMemRelease, "cuMemRelease", 0, 0)                                                               \
    X(cuMemMap, "cuMemMap", 0, 0)                                                                       \
    X(cuMemUnmap, "cuMemUnmap", 0, 0)                                                                   \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 0, 0)                               \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 0, 0)                           \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 0, 0)                                 \
    X(cuMemAllocAsync, "cuMemAllocAsync", 0, 0)                                                         \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 0, 1)                                                    \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0, 0)                                         \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 0, 1)                                    \
    X(cuMemFreeAsync, "cuMemFreeAsync", 0, 0)                                                           \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 0, 1)                                                      \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                                       \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                                   \
    X(cuArrayDestroy, "cuArrayDestroy", 0, 0)                                                           \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0, 0)                                           \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0, 0)                                         \
    /* the v1 entry points after the others: a driver answer that is the address of both picks v2 */   \
    X(cuMemAlloc, "cuMemAlloc", 0, 0)                                                                   \
    X(cuMemAllocPitch, "cuMemAllocPitch", 0, 0)                                                         \
    X(cuMemFree, "cuMemFree", 0, 0)                                                                     \
    X(cuArrayCreate, "cuArrayCreate", 0, 0)                                                             \
    X(cuArray3DCreate, "cuArray3DCreate", 0, 0)                                                         \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 0, 0)                                             \
    X(cuMemPoolCreate, "cuMemPoolCreate", 0, 0)                                                         \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 0, 0)                                                       \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 0, 0)                                     \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 0, 0)                                                   \
    X(cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", 0, 0)                                           \
    X(cuMemGetMemPool, "cuMemGetMemPool", 0, 0)                                                         \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 0, 0)                                           \
    X(cuGraphAddNode, "cuGraphAddNode", 0, 0)                                                           \
    X(cuGraphAddNode_v2, "cuGraphAddNode", 12030, 0)                                                    \
    /* in the CUDA 13.4 driver API; the version it first came with is not known here (by address: any) */ \
    X(cuGraphAddNode_v3, "cuGraphAddNode", 13040, 0)                                                    \
    X(cuGraphDestroyNode, "cuGraphDestroyNode", 0, 0)                                                   \
    X(cuGraphDestroy, "cuGraphDestroy", 0, 0)                                                           \
    X(cuGraphClone, "cuGraphClone", 0, 0)                                                               \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 0, 0)                                 \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 0, 0)                               \
    X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 0, 1)                          \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 0, 0)                                                   \
    /* the 5-argument instantiation of CUDA 11; by address only: the same name means another signature now */ \
    X(cuGraphInstantiate, "", 0, 0)                                                                     \
    X(cuGraphInstantiate_v2, "", 0, 0)                                                                  \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                                         \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                                 \
    X(cuLaunchKernel, "cuLaunchKernel", 0, 0)                                                           \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 0, 1)                                                      \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 0, 0)                                                       \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 0, 1)                                                  \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0, 0)                                     \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 0, 1)                                \
    X(cuGraphLaunch, "cuGraphLaunch", 0, 0)                                                             \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 0, 1)                                                        \
    X(cuCtxGetDevice, "cuCtxGetDevice", 0, 0)                                                           \
    X(cuCtxGetDevice_v2, "cuCtxGetDevice", 13000, 0)                                                    \
    X(cuDeviceGetCount, "cuDeviceGetCount", 0, 0)                                                       \
    X(cuDeviceGet, "cuDeviceGet", 0, 0)                                                                 \
    X(cuDeviceGetName, "cuDeviceGetName", 0, 0)                                                         \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 0, 0)                                               \
    X(cuDeviceGetUuid, "cuDeviceGetUuid", 0, 0)                                                         \
    X(cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040, 0)                                                  \
    X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 0, 0)                                                 \
    X(cuDeviceComputeCapability, "cuDeviceComputeCapability", 0, 0)                                     \
    X(cuDeviceGetLuid, "cuDeviceGetLuid", 0, 0)                                                         \
    X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 0, 0)                                             \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0, 0)                                       \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                              \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)                                  \
    X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 0, 0)                                   \
    X(cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxSetFlags", 11000, 0)                            \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                           \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                          \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                                          \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                                         \
    X(cuMemSetAccess, "cuMemSetAccess", 0, 0)                                                           \
    X(cuMemGetAccess, "cuMemGetAccess", 0, 0)                                                           \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 0, 0)                             \
    X(cuMemPoolSetAccess, "cuMemPoolSetAccess", 0, 0)                                                   \
    X(cuMemPoolGetAccess, "cuMemPoolGetAccess", 0, 0)                                                   \
    X(cuMemAdvise, "cuMemAdvise", 0, 0)                                                                 \
    X(cuMemAdvise_v2, "cuMemAdvise", 12020, 0)                                                          \
    X(cuMemPrefetchAsync, "cuMemPrefetchAsync", 0, 0)                                                   \
    X(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync", 12020, 0)                                            \
    X(cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", 0, 1)                                              \
    X(cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync", 12020, 1)                                       \
    X(cuDeviceGetP2PAttribute, "cuDeviceGetP2PAttribute", 0, 0)                                         \
    X(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", 0, 0)                                         \
    X(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2", 0, 0)

/* Entry points the library calls but does not wrap. */
#define SHIM_HELPERS(X)                                                                                 \
    X(cuCtxSetCurrent)                                                                                  \
    X(cuCtxPopCurrent_v2)                                                                               \
    X(cuStreamGetCaptureInfo_v2)                                                                        \
    X(cuMemGetAllocationPropertiesFromHandle)                                                           \
    X(nvmlInit_v2)                                                                                      \
    X(nvmlDeviceGetHandleByIndex_v2)                                                                    \
    X(nvmlDeviceGetHandleByUUID)                                                                        \
    X(nvmlDeviceGetIndex)                                                                               \
    X(nvmlDeviceGetUUID)                                                                                \
    X(nvmlDeviceGetProcessUtilization)                                                                  \
    X(cuCtxGetCurrent)                                                                                  \
    X(cuEventCreate)                                                                                    \
    X(cuEventRecord)                                                                                    \
    X(cuEventQuery)                                                                                     \
    X(cuThreadExchangeStreamCaptureMode)

#define SHIM_HOOK_ID(name, base, version, ptds) SHIM_ID_##name,
#define SHIM_HELPER_ID(name) SHIM_ID_##name,
enum shim_symbol_id { SHIM_HOOKS(SHIM_HOOK_ID) SHIM_HELPERS(SHIM_HELPER_ID) SHIM_SYMBOL_COUNT };
#undef SHIM_HOOK_ID
#undef SHIM_HELPER_ID

SHIM_HIDDEN void *shim_real(enum shim_symbol_id id);
SHIM_HIDDEN const char *shim_symbol_name(enum shim_symbol_id id);
/* The variant number of the newest wrapped driver entry point whose name has this base (cuMemAlloc:
 * 2, for cuMemAlloc_v2), that entry point in *newest; 0 when the library wraps none of that base. */
SHIM_HIDDEN int shim_newest_wrapped(const char *base, size_t length, enum shim_symbol_id *newest);
/* What the driver (libcuda) exports under name, NULL when nothing. */
SHIM_HIDDEN void *shim_driver_symbol(const char *name);

/* variants.c. The newest CUDA version whose entry-point variants the hook table was checked
 * against: a driver answer at a newer version is compared with its answer at this one. */
#define SHIM_CUDA_CHECKED_VERSION 13000
typedef CUresult (*shim_proc_lookup_fn)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
/* The variant number a name spells (cuMemAlloc 1, cuMemAlloc_v3_ptsz 3) and its base's length. */
SHIM_HIDDEN int shim_variant_of(const char *name, size_t *base_length);
/* 1: dlsym of name is refused (a variant newer than the library wraps; logged once). */
SHIM_HIDDEN int shim_refuse_newer_named(const char *name);
/* 1: the driver's answer pfn to cuGetProcAddress(symbol, version, flags), which matched no resolved
 * entry point and by name would get picked's wrapper, is a newer variant: refused (logged once).
 * ask: the real lookup, to compare with the driver's answer at SHIM_CUDA_CHECKED_VERSION. */
SHIM_HIDDEN int shim_refuse_newer_returned(enum shim_symbol_id picked, const char *symbol, void *pfn, int version,
                                           cuuint64_t flags, shim_proc_lookup_fn ask);
/* The real entry point, typed like the wrapper of the same name. */
#define REAL(name) ((__typeof__(&name))shim_real(SHIM_ID_##name))

/* register.c */
SHIM_HIDDEN void shim_register_once(void);

/* virtual.c: the card behind a program's ordinal (0 for every virtual ordinal, else the ordinal
 * itself) and the number of virtual ordinals (0 without a virtual grant) */
SHIM_HIDDEN int shim_card_of(int dev);
SHIM_HIDDEN int shim_virtual_count(void);
/* Declared here, not in cuda_api.h: the stand-in and the remote client spell CUuuid their own way. */
struct shim_uuid;
CUresult cuDeviceGetUuid(struct shim_uuid *uuid, CUdevice dev) __attribute__((visibility("default")));
CUresult cuDeviceGetUuid_v2(struct shim_uuid *uuid, CUdevice dev) __attribute__((visibility("default")));

static inline uint64_t shim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
SHIM_HIDDEN void shim_sleep_ns(uint64_t ns);

#endif
