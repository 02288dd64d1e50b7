/*
 * The per-container accounting region: open or create memory.region, one slot per process (pid
 * and start time, so a dead or reused pid is told apart), memory charged under a robust
 * process-shared mutex so that the limit holds for all of the container's processes at once and a
 * process killed while holding the lock does not wedge the others.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "region.h"

static struct shim_region *region;
static pthread_once_t region_once = PTHREAD_ONCE_INIT;
static int my_slot = -1;
static int need_claim = 1;
static int host_pid;     /* from the registration reply, which may come before or after the slot */
/* Without a slot (all taken by live processes) a process charges the region's overflow account,
 * and holds a shared lock on its byte; overflow_mine is its own part of that account. */
static int overflowed;
static int overflow_unlocked; /* ... without the lock: counted in the region's overflow_unlocked */
static uint64_t overflow_mine[SHIM_MAX_DEVICES];
static int region_ready; /* open_region has run: the registration thread may use the region */
static int left_region;  /* leave_region ran (under the lock): this process's pids are no longer listed */
/* A virtual-card grant (virtual.c): what this process holds on each of the card's ordinals, against
 * each ordinal's share. The card's record in the region holds the container's total. */
static uint64_t ordinal_used[SHIM_MAX_DEVICES];

/* The region's record a program's ordinal is charged to, -1 for none. */
static int card_of(int dev) {
    int card = shim_card_of(dev);
    return card >= 0 && card < SHIM_MAX_DEVICES ? card : -1;
}

/* Whether bytes more on a virtual ordinal stay within its share (this process's own account). */
static int within_share(int dev, uint64_t bytes) {
    if (dev < 0 || dev >= shim_virtual_count()) return 1;
    uint64_t share = shim_config()->virtual_share, held = __atomic_load_n(&ordinal_used[dev], __ATOMIC_RELAXED);
    return share == 0 || (held <= share && bytes <= share - held);
}

static void count_on_ordinal(int dev, uint64_t bytes, int add) {
    if (dev < 0 || dev >= shim_virtual_count()) return;
    if (add) __atomic_add_fetch(&ordinal_used[dev], bytes, __ATOMIC_RELAXED);
    else {
        uint64_t held = __atomic_load_n(&ordinal_used[dev], __ATOMIC_RELAXED);
        __atomic_sub_fetch(&ordinal_used[dev], bytes < held ? bytes : held, __ATOMIC_RELAXED);
    }
}

/* The byte of the file whose lock a slot's process holds: the slot's first. */
static off_t slot_lock(int i) {
    return (off_t)(offsetof(struct shim_region, slot) + (size_t)i * sizeof(struct shim_region_slot));
}

/* Gone when both witnesses say so (liveness.c): the lock on its slot is free and its pid is dead
 * or another process's. A private region has no file: only the pid speaks there. */
static int slot_alive(int i, const struct shim_region_slot *slot) {
    if (shim_live_held_by_other(slot_lock(i)) == 1) return 1;
    return shim_pid_alive(slot->pid, slot->start_time);
}

static void empty_slot(struct shim_region *r, struct shim_region_slot *slot) {
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        uint64_t held = slot->used[d];
        r->dev[d].used -= held < r->dev[d].used ? held : r->dev[d].used;
        slot->used[d] = 0;
    }
    __atomic_store_n(&slot->host_pid, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->pid, 0, __ATOMIC_RELEASE);
}

/* Whether a process other than this one is in the overflow account: 1, 0, or -1 (cannot tell). */
static int others_in_overflow(void) { return shim_live_held_by_other(SHIM_REGION_OVERFLOW_LOCK); }

/* Under the lock: the overflow account keeps no record per process, so the share of a dead one
 * is given back when no other process without a slot is left; until then it stays counted (more
 * than the card holds, never less). Returns 1 when something was given back. */
static int reclaim_overflow(struct shim_region *r) {
    int stale = 0;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) stale |= r->dev[d].overflow > overflow_mine[d];
    /* A slot-less process without the lock is invisible to the lock: while one may live, nothing. */
    if (!stale || r->overflow_unlocked != 0 || others_in_overflow() != 0) return 0;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        uint64_t gone = r->dev[d].overflow - overflow_mine[d];
        if (gone == 0) continue;
        shim_log(SHIM_LOG_INFO, "card %d: reclaiming %llu bytes of processes that had no slot (all gone)", d,
                 (unsigned long long)gone);
        r->dev[d].used -= gone < r->dev[d].used ? gone : r->dev[d].used;
        r->dev[d].overflow = overflow_mine[d];
    }
    return 1;
}

/* Under the lock: give back what dead processes held. Returns how many records were freed. */
static int reclaim_dead(struct shim_region *r) {
    int freed = 0;
    for (int i = 0; i < SHIM_REGION_SLOTS; i++) {
        struct shim_region_slot *slot = &r->slot[i];
        if (slot->pid == 0 || i == my_slot || slot_alive(i, slot)) continue;
        shim_log(SHIM_LOG_INFO, "reclaiming the memory of process %d (gone)", slot->pid);
        empty_slot(r, slot);
        freed++;
    }
    return freed + reclaim_overflow(r);
}

/* After a holder died inside the lock, the totals may miss its last step: rebuild them. */
static void repair(struct shim_region *r) {
    reclaim_dead(r);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        uint64_t sum = r->dev[d].overflow;
        for (int i = 0; i < SHIM_REGION_SLOTS; i++)
            if (r->slot[i].pid != 0) sum += r->slot[i].used[d];
        r->dev[d].used = sum;
    }
}

static int lock_region(struct shim_region *r) {
    int rc = pthread_mutex_lock(&r->lock);
    if (rc == EOWNERDEAD) {
        shim_log(SHIM_LOG_INFO, "a process died holding the region lock; repairing the totals");
        repair(r);
        pthread_mutex_consistent(&r->lock);
        return 0;
    }
    if (rc != 0) shim_log(SHIM_LOG_ERROR, "cannot lock the accounting region: %s", strerror(rc));
    return rc;
}

static void init_region(struct shim_region *r) {
    memset(r, 0, sizeof *r);
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
    pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->lock, &attributes);
    pthread_mutexattr_destroy(&attributes);
    r->version = SHIM_REGION_VERSION;
    r->size = sizeof *r;
    r->device_count = SHIM_MAX_DEVICES;
    r->slot_count = SHIM_REGION_SLOTS;
    __atomic_store_n(&r->magic, SHIM_REGION_MAGIC, __ATOMIC_RELEASE);
}

static struct shim_region *private_region(const char *why) {
    shim_log(SHIM_LOG_WARN, "%s; memory is accounted per process, not per container", why);
    void *map = mmap(NULL, sizeof(struct shim_region), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    init_region(map);
    return map;
}

/* Under a grant the file is the node agent's (a bind mount the container cannot unlink or replace):
 * it is never created here, so a region that is not where the grant says is no region at all. */
static struct shim_region *map_file(const char *path, int create) {
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (fd < 0) return NULL;
    struct shim_region *r = NULL;
    struct stat st;
    /* The file lock covers creation only: it serialises first openers, and is dropped when a
     * creator dies half-way, so the next opener initialises the file again. */
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) goto done;
    if (st.st_size == 0) {
        if (ftruncate(fd, sizeof *r) != 0) goto done;
        if (fchmod(fd, 0666) != 0) shim_log(SHIM_LOG_DEBUG, "fchmod %s: %s", path, strerror(errno));
    } else if (st.st_size != (off_t)sizeof *r) {
        shim_log(SHIM_LOG_ERROR, "%s has %lld bytes, this library expects %zu", path, (long long)st.st_size,
                 sizeof *r);
        goto done;
    }
    void *map = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) goto done;
    r = map;
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != SHIM_REGION_MAGIC) {
        /* The node agent may have written an owner's wait bound into the zero-filled file it created,
         * before any process of the container started (Allocate on a lent card: docs/lending.md); it
         * writes it under this file lock, so the bound is either here now or written to the region
         * after. Kept from a file whose header is still all zero only (not from a half-written one). */
        int fresh = r->magic == 0 && r->version == 0 && r->size == 0 && r->device_count == 0 && r->slot_count == 0;
        uint64_t wait[SHIM_MAX_DEVICES];
        for (int d = 0; d < SHIM_MAX_DEVICES; d++) wait[d] = fresh ? r->dev[d].wait_ns : 0;
        init_region(r);
        for (int d = 0; d < SHIM_MAX_DEVICES; d++) __atomic_store_n(&r->dev[d].wait_ns, wait[d], __ATOMIC_RELAXED);
    }
    if (r->version != SHIM_REGION_VERSION || r->size != sizeof *r) {
        shim_log(SHIM_LOG_ERROR, "%s is region version %u, this library writes %u", path, r->version,
                 SHIM_REGION_VERSION);
        munmap(map, sizeof *r);
        r = NULL;
    }
done:
    flock(fd, LOCK_UN);
    if (r != NULL) shim_live_init(fd, path); /* kept open, and the mapping keeps its locks: liveness.c */
    else close(fd);
    return r;
}

/* Under the lock: the limits a container's processes declared; the smallest one holds. */
static void declare_limits(struct shim_region *r, int alone) {
    const struct shim_config *c = shim_config();
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        struct shim_region_device *dev = &r->dev[d];
        uint64_t memory = c->memory_limit[d];
        uint32_t percent = (uint32_t)c->compute_percent[d];
        if (alone) { /* nobody left from before: neither their limits nor their learned rate apply */
            memset(&dev->bucket, 0, sizeof dev->bucket);
            dev->memory_limit = memory;
            dev->compute_percent = percent;
            dev->compute_mode = (uint32_t)c->mode;
            continue;
        }
        if (memory != 0 && (dev->memory_limit == 0 || memory < dev->memory_limit)) dev->memory_limit = memory;
        if (percent != 0 && (dev->compute_percent == 0 || percent < dev->compute_percent))
            dev->compute_percent = percent;
        if (percent != 0 && c->mode == SHIM_MODE_HARD) dev->compute_mode = SHIM_MODE_HARD;
    }
}

/* Under the lock: a free slot whose lock this process can take (a free slot still locked is a
 * live process's that someone wrongly emptied: left alone). -1 when every slot is taken. */
static int take_free_slot(struct shim_region *r, int pid) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < SHIM_REGION_SLOTS; i++) {
            /* First pass: a slot this pid left before an exec (that image's memory is gone). */
            if (r->slot[i].pid != (pass == 0 ? pid : 0)) continue;
            if (shim_live_hold(slot_lock(i), 0) == SHIM_LIVE_TAKEN) continue;
            if (pass == 0) empty_slot(r, &r->slot[i]);
            return i;
        }
    return -1;
}

static void fill_slot(struct shim_region *r, int i, int pid) {
    r->slot[i].start_time = shim_own_start_time();
    __atomic_store_n(&r->slot[i].host_pid, __atomic_load_n(&host_pid, __ATOMIC_SEQ_CST), __ATOMIC_RELAXED);
    __atomic_store_n(&r->slot[i].pid, pid, __ATOMIC_RELEASE);
    my_slot = i;
}

static void claim_slot(struct shim_region *r) {
    int pid = getpid();
    my_slot = -1;
    int i = take_free_slot(r, pid);
    if (i >= 0) {
        fill_slot(r, i, pid);
        return;
    }
    overflowed = 1;
    int lock = shim_live_hold(SHIM_REGION_OVERFLOW_LOCK, 1);
    if (lock != SHIM_LIVE_HELD) { /* killed, it keeps the account from ever being reclaimed: more, never less */
        overflow_unlocked = 1;
        r->overflow_unlocked++;
    }
    shim_log(SHIM_LOG_WARN, "all %d process slots of the region are taken by live processes; this process is "
             "accounted in the region's overflow account%s", SHIM_REGION_SLOTS,
             lock == SHIM_LIVE_HELD ? "" : " (without a lock: its memory is reclaimed only if it exits normally)");
}

static void leave_unlocked(struct shim_region *r) {
    if (!overflow_unlocked) return;
    overflow_unlocked = 0;
    if (r->overflow_unlocked > 0) r->overflow_unlocked--;
}

/* Under the lock: a process in the overflow account moves into a slot that became free, taking
 * its own part of the account with it, so that the dead ones' part can be given back sooner. */
static void leave_overflow_for_a_slot(struct shim_region *r) {
    int pid = getpid();
    int i = take_free_slot(r, pid);
    if (i < 0) return;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        r->dev[d].overflow -= overflow_mine[d] < r->dev[d].overflow ? overflow_mine[d] : r->dev[d].overflow;
        r->slot[i].used[d] = overflow_mine[d];
        overflow_mine[d] = 0;
    }
    fill_slot(r, i, pid);
    overflowed = 0;
    shim_live_drop(SHIM_REGION_OVERFLOW_LOCK);
    leave_unlocked(r);
}

static void join_region(struct shim_region *r) {
    if (lock_region(r) != 0) return;
    if (!__atomic_load_n(&need_claim, __ATOMIC_ACQUIRE)) { /* another thread joined meanwhile */
        pthread_mutex_unlock(&r->lock);
        return;
    }
    reclaim_dead(r);
    int alone = 1;
    for (int i = 0; i < SHIM_REGION_SLOTS; i++)
        if (r->slot[i].pid != 0 && r->slot[i].pid != getpid()) alone = 0;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++)
        if (r->dev[d].overflow != 0) alone = 0; /* left only while some process without a slot lives */
    if (others_in_overflow() == 1 || r->overflow_unlocked != 0) alone = 0;
    declare_limits(r, alone);
    claim_slot(r);
    __atomic_store_n(&need_claim, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->lock);
}

static void after_fork_child(void) {
    need_claim = 1;
    my_slot = -1;
    overflowed = 0; /* what the parent charged stays the parent's */
    overflow_unlocked = 0;
    memset(overflow_mine, 0, sizeof overflow_mine);
    memset(ordinal_used, 0, sizeof ordinal_used);
    shim_live_after_fork();
    left_region = 0;
    host_pid = 0; /* the parent's; the child is another process */
    shim_forget_all();
    shim_compute_after_fork();
}

static void open_region(void) {
    const struct shim_config *c = shim_config();
    const char *path = c->region_path;
    if (!c->granted && mkdir(c->dir, 0700) != 0 && errno != EEXIST)
        shim_log(SHIM_LOG_DEBUG, "mkdir %s: %s", c->dir, strerror(errno));
    region = path[0] != '\0' ? map_file(path, !c->granted) : NULL;
    if (region == NULL && c->granted) {
        /* A private region would give each process the whole grant: refuse instead. */
        shim_log(SHIM_LOG_ERROR, "cannot use the container's region %s (%s); every allocation is refused", path,
                 strerror(errno));
    } else if (region == NULL) {
        char why[PATH_MAX + 64];
        snprintf(why, sizeof why, "cannot use %s (%s)", path, strerror(errno));
        region = private_region(why);
    }
    if (region != NULL) pthread_atfork(NULL, NULL, after_fork_child);
    __atomic_store_n(&region_ready, 1, __ATOMIC_SEQ_CST);
}

static struct shim_region *get_region(void) {
    pthread_once(&region_once, open_region);
    if (region != NULL && __atomic_load_n(&need_claim, __ATOMIC_ACQUIRE)) join_region(region);
    return region;
}

/* The lower of two limits where 0 means "none". */
static uint64_t lower(uint64_t a, uint64_t b) {
    if (a == 0) return b;
    return b != 0 && b < a ? b : a;
}

/* The region's limit for a card, never above this process's own: the region is writable by every
 * process of the container, so a value written there must not lift what the node granted. */
static uint64_t effective_limit(const struct shim_region_device *d, int dev) {
    return lower(__atomic_load_n(&d->memory_limit, __ATOMIC_RELAXED), shim_config()->memory_limit[dev]);
}

int shim_region_charge(int ordinal, uint64_t bytes) {
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    if (dev < 0 || r == NULL || lock_region(r) != 0) return -1;
    /* No system call here: this process's liveness lock outlives its descriptor (liveness.c). */
    if (overflowed) { /* rare (more live processes than slots): a scan per charge is affordable */
        reclaim_dead(r);
        leave_overflow_for_a_slot(r);
    }
    struct shim_region_device *d = &r->dev[dev];
    uint64_t limit = effective_limit(d, dev);
    int fits = limit == 0 || (d->used <= limit && bytes <= limit - d->used);
    if (!fits && reclaim_dead(r) > 0) fits = d->used <= limit && bytes <= limit - d->used;
    fits = fits && within_share(ordinal, bytes); /* under the lock: this process's threads charge in turn */
    if (fits) {
        d->used += bytes;
        if (my_slot >= 0) {
            r->slot[my_slot].used[dev] += bytes;
        } else if (overflowed) {
            d->overflow += bytes;
            overflow_mine[dev] += bytes;
        }
        count_on_ordinal(ordinal, bytes, 1);
    }
    pthread_mutex_unlock(&r->lock);
    return fits ? 0 : -1;
}

void shim_region_release(int ordinal, uint64_t bytes) {
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    if (dev < 0) return;
    count_on_ordinal(ordinal, bytes, 0);
    if (r == NULL || lock_region(r) != 0) return;
    struct shim_region_device *d = &r->dev[dev];
    d->used -= bytes < d->used ? bytes : d->used;
    if (my_slot >= 0) {
        uint64_t *mine = &r->slot[my_slot].used[dev];
        *mine -= bytes < *mine ? bytes : *mine;
    } else if (overflowed) {
        uint64_t back = bytes < overflow_mine[dev] ? bytes : overflow_mine[dev];
        overflow_mine[dev] -= back;
        d->overflow -= back < d->overflow ? back : d->overflow;
    }
    pthread_mutex_unlock(&r->lock);
}

uint64_t shim_region_used(int ordinal) {
    static uint64_t last_reclaim_ns;
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    if (dev < 0 || r == NULL || lock_region(r) != 0) return 0;
    uint64_t now = shim_now_ns();
    if (now - __atomic_load_n(&last_reclaim_ns, __ATOMIC_RELAXED) > 1000000000ull) { /* reports stay fresh */
        __atomic_store_n(&last_reclaim_ns, now, __ATOMIC_RELAXED);
        reclaim_dead(r);
    }
    uint64_t used = r->dev[dev].used;
    pthread_mutex_unlock(&r->lock);
    return used;
}

uint64_t shim_card_memory_limit(int card) {
    if (card < 0 || card >= SHIM_MAX_DEVICES) return 0;
    struct shim_region *r = get_region();
    if (r == NULL) return shim_config()->memory_limit[card];
    return effective_limit(&r->dev[card], card);
}

uint64_t shim_memory_limit(int ordinal) {
    uint64_t card = shim_card_memory_limit(card_of(ordinal));
    if (ordinal < 0 || ordinal >= shim_virtual_count()) return card;
    return lower(card, shim_config()->virtual_share);
}

uint64_t shim_memory_left(int ordinal) {
    uint64_t limit = shim_card_memory_limit(card_of(ordinal)), used = shim_region_used(ordinal);
    uint64_t left = limit == 0 ? UINT64_MAX : used < limit ? limit - used : 0;
    if (ordinal >= 0 && ordinal < shim_virtual_count() && shim_config()->virtual_share != 0) {
        uint64_t share = shim_config()->virtual_share, held = __atomic_load_n(&ordinal_used[ordinal], __ATOMIC_RELAXED);
        uint64_t own = held < share ? share - held : 0;
        left = own < left ? own : left;
    }
    return left;
}

int shim_compute_limit(int ordinal, int *mode) {
    int dev = card_of(ordinal);
    if (dev < 0) {
        *mode = shim_config()->mode;
        return 0;
    }
    struct shim_region *r = get_region();
    if (r == NULL) {
        *mode = shim_config()->mode;
        return shim_config()->compute_percent[dev];
    }
    const struct shim_config *c = shim_config();
    *mode = (int)__atomic_load_n(&r->dev[dev].compute_mode, __ATOMIC_RELAXED);
    if (c->compute_percent[dev] != 0 && c->mode == SHIM_MODE_HARD) *mode = SHIM_MODE_HARD;
    return (int)lower(__atomic_load_n(&r->dev[dev].compute_percent, __ATOMIC_RELAXED), (uint64_t)c->compute_percent[dev]);
}

/* NVML names processes by their pid in the host's namespace; a process that learnt it from the
 * agent is listed by it, the others by their own pid (right only outside a pid namespace). */
int shim_region_pids(int *pids, int max) {
    struct shim_region *r = get_region();
    int count = 0;
    for (int i = 0; r != NULL && i < SHIM_REGION_SLOTS && count < max; i++) {
        int pid = __atomic_load_n(&r->slot[i].pid, __ATOMIC_ACQUIRE);
        int outside = __atomic_load_n(&r->slot[i].host_pid, __ATOMIC_RELAXED);
        if (pid != 0) pids[count++] = outside > 0 ? outside : pid;
    }
    return count;
}

/* Called from the registration thread. It never opens the region itself (a process without limits
 * has none); when the region is not open or the slot not claimed yet, claim_slot copies the pid.
 * Sequentially consistent on both sides, so one of them always sees the other's store. */
void shim_region_set_host_pid(int pid) {
    __atomic_store_n(&host_pid, pid, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&region_ready, __ATOMIC_SEQ_CST)) return;
    struct shim_region *r = region;
    if (r == NULL || lock_region(r) != 0) return;
    if (my_slot >= 0 && r->slot[my_slot].pid == getpid())
        __atomic_store_n(&r->slot[my_slot].host_pid, pid, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&r->lock);
}

uint64_t shim_region_wait_ns(int ordinal) {
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    return r == NULL || dev < 0 ? 0 : __atomic_load_n(&r->dev[dev].wait_ns, __ATOMIC_RELAXED);
}

/* Under the region's lock, which leave_region takes too: a measurement whose pids were read before
 * this process left could otherwise be stored after it left, and one read after it finds none of
 * its pids and counts the container's own work as a neighbour's. Either way it is dropped. */
int shim_region_report_utilisation(int ordinal, unsigned container, unsigned others, unsigned target) {
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    if (r == NULL || dev < 0 || lock_region(r) != 0) return 0;
    int stored = !left_region;
    if (stored) {
        struct shim_bucket *b = &r->dev[dev].bucket;
        __atomic_store_n(&b->util_container, container, __ATOMIC_RELAXED);
        __atomic_store_n(&b->util_others, others, __ATOMIC_RELAXED);
        __atomic_store_n(&b->target_percent, target, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&r->lock);
    return stored;
}

struct shim_bucket *shim_region_bucket(int ordinal) {
    int dev = card_of(ordinal);
    struct shim_region *r = get_region();
    return r == NULL || dev < 0 ? NULL : &r->dev[dev].bucket;
}

/* A process that exits normally gives its slot, or its part of the overflow account, back at
 * once; a killed one is reclaimed later by whoever looks. */
__attribute__((destructor)) static void leave_region(void) {
    if (region == NULL || need_claim || (my_slot < 0 && !overflowed)) return;
    if (lock_region(region) != 0) return;
    left_region = 1;
    if (my_slot >= 0 && region->slot[my_slot].pid == getpid()) {
        empty_slot(region, &region->slot[my_slot]);
        shim_live_drop(slot_lock(my_slot)); /* the slot is free for the next process at once */
    }
    for (int d = 0; overflowed && d < SHIM_MAX_DEVICES; d++) {
        struct shim_region_device *dev = &region->dev[d];
        uint64_t mine = overflow_mine[d];
        dev->overflow -= mine < dev->overflow ? mine : dev->overflow;
        dev->used -= mine < dev->used ? mine : dev->used;
        overflow_mine[d] = 0;
    }
    if (overflowed) leave_unlocked(region);
    pthread_mutex_unlock(&region->lock);
    my_slot = -1;
    overflowed = 0;
}
