/*
 * An open-addressing hash table of (kind, key) -> entry, without a lock of its own: memory.c (the
 * pointer table) and vmm.c (VMM allocations, handles and mappings) each hold one under their lock.
 */
#include <stdlib.h>

#include "shim.h"

#define TOMBSTONE 0xffffu
#define INITIAL_CAPACITY 1024u

static uint32_t slot_of(const struct shim_table *t, uint64_t key, uint32_t kind) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (t->capacity - 1);
}

static int grow(struct shim_table *t) {
    uint32_t old_capacity = t->capacity;
    struct shim_entry *old = t->slots;
    uint32_t live = 0;
    for (uint32_t i = 0; i < old_capacity; i++) live += old[i].kind != 0 && old[i].kind != TOMBSTONE;
    /* Mostly tombstones (allocation churn): rebuild at the same size instead of doubling. */
    uint32_t new_capacity = old_capacity == 0 ? INITIAL_CAPACITY : live * 4 < old_capacity ? old_capacity
                                                                                         : old_capacity * 2;
    struct shim_entry *fresh = calloc(new_capacity, sizeof *fresh);
    if (fresh == NULL) return -1;
    t->slots = fresh;
    t->capacity = new_capacity;
    t->occupied = 0;
    for (uint32_t i = 0; i < old_capacity; i++) {
        if (old[i].kind == 0 || old[i].kind == TOMBSTONE) continue;
        uint32_t s = slot_of(t, old[i].key, old[i].kind);
        while (t->slots[s].kind != 0) s = (s + 1) & (t->capacity - 1);
        t->slots[s] = old[i];
        t->occupied++;
    }
    free(old);
    return 0;
}

int shim_table_put(struct shim_table *t, const struct shim_entry *entry) {
    if ((t->occupied + 1) * 2 > t->capacity && grow(t) != 0) return -1;
    uint32_t s = slot_of(t, entry->key, entry->kind);
    while (t->slots[s].kind != 0 && t->slots[s].kind != TOMBSTONE) s = (s + 1) & (t->capacity - 1);
    if (t->slots[s].kind == 0) t->occupied++;
    t->slots[s] = *entry;
    return 0;
}

struct shim_entry *shim_table_get(struct shim_table *t, uint32_t kind, uint64_t key) {
    if (t->capacity == 0) return NULL;
    for (uint32_t s = slot_of(t, key, kind); t->slots[s].kind != 0; s = (s + 1) & (t->capacity - 1))
        if (t->slots[s].kind == kind && t->slots[s].key == key) return &t->slots[s];
    return NULL;
}

void shim_table_remove(struct shim_entry *entry) { entry->kind = TOMBSTONE; }

int shim_table_live(const struct shim_entry *entry) { return entry->kind != 0 && entry->kind != TOMBSTONE; }

void shim_table_clear(struct shim_table *t) {
    free(t->slots);
    *t = (struct shim_table){0};
}
