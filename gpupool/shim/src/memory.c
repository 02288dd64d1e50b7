/*
 * The process's live allocations (pointer, handle, array or graph memory node -> card and bytes),
 * so that a free, which names only the pointer, returns the right amount to the container's budget.
 * An entry may name an owner (a graph for its memory nodes), whose destruction releases them all.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define TOMBSTONE 0xffffu
#define INITIAL_CAPACITY 1024u

struct entry {
    uint64_t key;
    uint32_t kind; /* 0: empty; TOMBSTONE: removed */
    int32_t dev;
    uint64_t bytes;
    uint64_t owner; /* 0: none */
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table;
static uint32_t capacity, occupied; /* occupied counts tombstones too */

static uint32_t slot_of(uint64_t key, uint32_t kind) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (capacity - 1);
}

static int grow(void) {
    uint32_t old_capacity = capacity;
    struct entry *old = table;
    uint32_t live = 0;
    for (uint32_t i = 0; i < old_capacity; i++) live += old[i].kind != 0 && old[i].kind != TOMBSTONE;
    /* Mostly tombstones (allocation churn): rebuild at the same size instead of doubling. */
    uint32_t new_capacity = old_capacity == 0 ? INITIAL_CAPACITY : live * 4 < old_capacity ? old_capacity
                                                                                         : old_capacity * 2;
    struct entry *fresh = calloc(new_capacity, sizeof *fresh);
    if (fresh == NULL) return -1;
    table = fresh;
    capacity = new_capacity;
    occupied = 0;
    for (uint32_t i = 0; i < old_capacity; i++) {
        if (old[i].kind == 0 || old[i].kind == TOMBSTONE) continue;
        uint32_t s = slot_of(old[i].key, old[i].kind);
        while (table[s].kind != 0) s = (s + 1) & (capacity - 1);
        table[s] = old[i];
        occupied++;
    }
    free(old);
    return 0;
}

void shim_track(int kind, uint64_t key, int dev, uint64_t bytes) { shim_track_owned(kind, key, dev, bytes, 0); }

void shim_track_owned(int kind, uint64_t key, int dev, uint64_t bytes, uint64_t owner) {
    pthread_mutex_lock(&table_lock);
    if ((occupied + 1) * 2 > capacity && grow() != 0) {
        pthread_mutex_unlock(&table_lock);
        shim_log(SHIM_LOG_ERROR, "out of host memory tracking an allocation; its bytes stay charged");
        return;
    }
    uint32_t s = slot_of(key, (uint32_t)kind);
    while (table[s].kind != 0 && table[s].kind != TOMBSTONE) s = (s + 1) & (capacity - 1);
    if (table[s].kind == 0) occupied++;
    table[s] = (struct entry){.key = key, .kind = (uint32_t)kind, .dev = dev, .bytes = bytes, .owner = owner};
    pthread_mutex_unlock(&table_lock);
}

int shim_untrack(int kind, uint64_t key, int *dev, uint64_t *bytes) {
    uint64_t owner;
    return shim_untrack_owned(kind, key, dev, bytes, &owner);
}

int shim_untrack_owned(int kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *owner) {
    int found = 0;
    pthread_mutex_lock(&table_lock);
    if (capacity != 0) {
        uint32_t s = slot_of(key, (uint32_t)kind);
        while (table[s].kind != 0) {
            if (table[s].kind == (uint32_t)kind && table[s].key == key) {
                *dev = table[s].dev;
                *bytes = table[s].bytes;
                *owner = table[s].owner;
                table[s].kind = TOMBSTONE;
                found = 1;
                break;
            }
            s = (s + 1) & (capacity - 1);
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

/* A whole-table scan: only graph destruction (rare) calls it. The region is updated after the
 * table's lock is dropped, so the two locks are never held together. */
void shim_release_owned(int kind, uint64_t owner) {
    uint64_t freed[SHIM_MAX_DEVICES] = {0};
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < capacity; i++) {
        if (table[i].kind != (uint32_t)kind || table[i].owner != owner) continue;
        if (table[i].dev >= 0 && table[i].dev < SHIM_MAX_DEVICES) freed[table[i].dev] += table[i].bytes;
        table[i].kind = TOMBSTONE;
    }
    pthread_mutex_unlock(&table_lock);
    for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++)
        if (freed[dev] != 0) shim_region_release(dev, freed[dev]);
}

/* In a forked child: the parent's allocations are not the child's, and the lock may be held by a
 * thread that does not exist here. */
void shim_forget_all(void) {
    pthread_mutex_init(&table_lock, NULL);
    free(table);
    table = NULL;
    capacity = occupied = 0;
}

int shim_current_device(void) {
    CUdevice dev;
    if (REAL(cuCtxGetDevice) == NULL || REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS) return -1;
    return dev >= 0 && dev < SHIM_MAX_DEVICES ? dev : -1;
}

int shim_memory_limited(int dev) {
    return dev >= 0 && dev < SHIM_MAX_DEVICES && shim_config()->enabled && shim_memory_limit(dev) != 0;
}

int shim_any_memory_limited(void) {
    for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++)
        if (shim_memory_limited(dev)) return 1;
    return 0;
}

static uint64_t element_bytes(CUarray_format format) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats; packed and compressed ones take no more than this */
    }
}

/* The bytes an array needs, from its descriptor (the driver's padding is not counted). */
uint64_t shim_array_bytes(size_t w, size_t h, size_t d, CUarray_format format, unsigned channels) {
    uint64_t bytes = element_bytes(format) * (channels ? channels : 1);
    if (__builtin_mul_overflow(bytes, (uint64_t)(w ? w : 1), &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)(h ? h : 1), &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)(d ? d : 1), &bytes))
        return UINT64_MAX;
    return bytes;
}
