/*
 * The process's live allocations (pointer, handle, array or graph memory node -> card and bytes),
 * so that a free, which names only the pointer, returns the right amount to the container's budget.
 * An entry may name an owner (a graph for its memory nodes), whose destruction releases them all.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_table table;

void shim_track(int kind, uint64_t key, int dev, uint64_t bytes) { shim_track_owned(kind, key, dev, bytes, 0); }

void shim_track_owned(int kind, uint64_t key, int dev, uint64_t bytes, uint64_t owner) {
    struct shim_entry entry = {.key = key, .kind = (uint32_t)kind, .dev = dev, .bytes = bytes, .owner = owner};
    pthread_mutex_lock(&table_lock);
    int failed = shim_table_put(&table, &entry);
    pthread_mutex_unlock(&table_lock);
    if (failed) shim_log(SHIM_LOG_ERROR, "out of host memory tracking an allocation; its bytes stay charged");
}

int shim_untrack(int kind, uint64_t key, int *dev, uint64_t *bytes) {
    uint64_t owner;
    return shim_untrack_owned(kind, key, dev, bytes, &owner);
}

int shim_lookup(int kind, uint64_t key, int *dev) {
    pthread_mutex_lock(&table_lock);
    struct shim_entry *entry = shim_table_get(&table, (uint32_t)kind, key);
    if (entry != NULL) *dev = entry->dev;
    pthread_mutex_unlock(&table_lock);
    return entry != NULL;
}

int shim_untrack_owned(int kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *owner) {
    pthread_mutex_lock(&table_lock);
    struct shim_entry *entry = shim_table_get(&table, (uint32_t)kind, key);
    if (entry != NULL) {
        *dev = entry->dev;
        *bytes = entry->bytes;
        *owner = entry->owner;
        shim_table_remove(entry);
    }
    pthread_mutex_unlock(&table_lock);
    return entry != NULL;
}

/* A whole-table scan: only graph destruction (rare) calls it. The region is updated after the
 * table's lock is dropped, so the two locks are never held together. */
void shim_release_owned(int kind, uint64_t owner) {
    uint64_t freed[SHIM_MAX_DEVICES] = {0};
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < table.capacity; i++) {
        struct shim_entry *entry = &table.slots[i];
        if (entry->kind != (uint32_t)kind || entry->owner != owner) continue;
        if (entry->dev >= 0 && entry->dev < SHIM_MAX_DEVICES) freed[entry->dev] += entry->bytes;
        shim_table_remove(entry);
    }
    pthread_mutex_unlock(&table_lock);
    for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++)
        if (freed[dev] != 0) shim_region_release(dev, freed[dev]);
}

int shim_reown(int kind, uint64_t from, uint64_t to) {
    int moved = 0;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < table.capacity; i++) {
        struct shim_entry *entry = &table.slots[i];
        if (entry->kind == (uint32_t)kind && entry->owner == from) {
            entry->owner = to;
            moved++;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return moved;
}

int shim_owns_any(int kind, uint64_t owner) {
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < table.capacity && !found; i++)
        found = table.slots[i].kind == (uint32_t)kind && table.slots[i].owner == owner;
    pthread_mutex_unlock(&table_lock);
    return found;
}

uint64_t shim_find_owned(int kind, uint64_t owner) {
    uint64_t key = 0;
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < table.capacity && key == 0; i++)
        if (table.slots[i].kind == (uint32_t)kind && table.slots[i].owner == owner) key = table.slots[i].key;
    pthread_mutex_unlock(&table_lock);
    return key;
}

void shim_sum_owned(int kind, uint64_t owner, uint64_t sums[SHIM_MAX_DEVICES]) {
    pthread_mutex_lock(&table_lock);
    for (uint32_t i = 0; i < table.capacity; i++) {
        const struct shim_entry *entry = &table.slots[i];
        if (entry->kind == (uint32_t)kind && entry->owner == owner && entry->dev >= 0 && entry->dev < SHIM_MAX_DEVICES)
            sums[entry->dev] += entry->bytes;
    }
    pthread_mutex_unlock(&table_lock);
}

/* In a forked child: the parent's allocations are not the child's, and the lock may be held by a
 * thread that does not exist here. */
void shim_forget_all(void) {
    pthread_mutex_init(&table_lock, NULL);
    shim_table_clear(&table);
    shim_vmm_forget_all();
}

CUresult shim_charge(int dev, uint64_t bytes, const char *what) {
    if (shim_region_charge(dev, bytes) == 0) return CUDA_SUCCESS;
    shim_log(SHIM_LOG_INFO, "refusing %s of %llu bytes on card %d: the container's limit is %llu bytes", what,
             (unsigned long long)bytes, dev, (unsigned long long)shim_memory_limit(dev));
    return CUDA_ERROR_OUT_OF_MEMORY;
}

#define ROOM_POLL_NS 5000000ull /* how often a refused allocation is tried again while the card drains */

/* The driver refused an allocation that fits the container's limit for want of room on the card. While
 * the node agent says the card is lent (its wait bound in the region), the room is a borrower's, which
 * the agent reclaims: wait a little and let the caller try again, up to the bound (counted from the
 * first refusal, *until_ns 0 before it). An owner returning to its lent card then waits for its
 * borrowers to drain instead of running out of memory. */
int shim_wait_for_room(int dev, uint64_t *until_ns) {
    uint64_t now = shim_now_ns();
    if (*until_ns == 0) {
        uint64_t bound = shim_region_wait_ns(dev);
        if (bound == 0) return 0;
        *until_ns = now + bound;
        shim_log(SHIM_LOG_INFO, "card %d is full and lent: waiting up to %llu ms for its borrowers to give memory back",
                 dev, (unsigned long long)(bound / 1000000ull));
    }
    if (now >= *until_ns) {
        shim_log(SHIM_LOG_WARN, "card %d: still no room after waiting for its borrowers; the allocation fails", dev);
        return 0;
    }
    uint64_t pause_ns = *until_ns - now < ROOM_POLL_NS ? *until_ns - now : ROOM_POLL_NS;
    struct timespec pause = {0, (long)pause_ns};
    nanosleep(&pause, NULL);
    return 1;
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
