/*
 * Layout of memory.region, the accounting file every process of one container maps (MAP_SHARED).
 * Version 1, little-endian, 64-bit. Readers check magic, version and size before using it; the
 * node agent may read it (docs/isolation.md gives the offsets). The memory fields change only
 * under the robust process-shared mutex; the compute bucket is lock-free.
 */
#ifndef GPUPOOL_REGION_H
#define GPUPOOL_REGION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shim.h"

#define SHIM_REGION_MAGIC 0x52535047u /* "GPSR" */
#define SHIM_REGION_VERSION 1u
/* The format's 256; a test build may compile a smaller table (the size field tells readers). */
#ifndef SHIM_REGION_SLOTS
#define SHIM_REGION_SLOTS 256
#endif
/* Byte of the file whose shared lock every process without a slot holds (liveness.c). */
#define SHIM_REGION_OVERFLOW_LOCK 24

/* Compute state of one card, shared by the container's processes (see compute.c). */
struct shim_bucket {
    int64_t tokens;               /* may go negative: launches waiting for their turn */
    uint64_t rate_bits;           /* double, tokens per nanosecond; 0: not throttled yet */
    uint64_t refill_ns;           /* CLOCK_MONOTONIC of the last refill */
    uint64_t consumed;            /* tokens taken since the region was created */
    uint64_t control_ns;          /* CLOCK_MONOTONIC of the last controller step */
    uint64_t control_consumed;    /* consumed at that step */
    uint64_t cost_average;        /* running mean cost of one kernel launch, for graph launches */
    uint32_t util_container;      /* last measured utilisation of the container, percent */
    uint32_t util_others;         /* ... of every other process on the card */
    uint32_t target_percent;      /* what the controller aimed at in its last step */
    uint32_t reserved32;
    uint64_t reserved[3];
};

struct shim_region_device {
    uint64_t used;                /* bytes charged by live processes */
    uint64_t memory_limit;        /* smallest limit a live process declared; 0: none */
    uint32_t compute_percent;     /* smallest share a live process declared; 0: none */
    uint32_t compute_mode;        /* SHIM_MODE_HARD when any live process declared hard */
    uint64_t overflow;            /* part of used charged by processes without a slot */
    uint64_t wait_ns;             /* written by the node agent while the card is lent: how long an allocation
                                     within the limit that the driver refuses for want of room is retried
                                     (the borrowers are reclaimed and give it back); 0: never retried */
    uint64_t reserved[3];
    struct shim_bucket bucket;
};

struct shim_region_slot {
    int32_t pid;                  /* 0: free */
    int32_t host_pid;             /* the pid NVML knows it by (from the agent's reply); 0: unknown */
    uint64_t start_time;          /* /proc/<pid>/stat field 22, tells a reused pid apart */
    uint64_t used[SHIM_MAX_DEVICES];
};

struct shim_region {
    uint32_t magic;               /* written last, when the rest is initialised */
    uint32_t version;
    uint32_t size;                /* sizeof(struct shim_region) */
    uint32_t device_count;        /* SHIM_MAX_DEVICES */
    uint32_t slot_count;          /* SHIM_REGION_SLOTS */
    uint32_t overflow_unlocked;   /* slot-less processes that could not take the overflow lock */
    uint64_t reserved[5];
    union {
        pthread_mutex_t lock;     /* robust, process-shared */
        char lock_space[64];
    };
    struct shim_region_device dev[SHIM_MAX_DEVICES];
    struct shim_region_slot slot[SHIM_REGION_SLOTS];
};

_Static_assert(offsetof(struct shim_region, reserved) == SHIM_REGION_OVERFLOW_LOCK, "the overflow lock's byte");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "the lock fits its space");
_Static_assert(sizeof(struct shim_bucket) == 96, "bucket layout is part of the format");
_Static_assert(sizeof(struct shim_region_device) == 160, "device layout is part of the format");
_Static_assert(sizeof(struct shim_region_slot) == 144, "slot layout is part of the format");

/* liveness.c: whether the process behind a record still runs (a lock it holds, its pid) */
enum { SHIM_LIVE_HELD = 0, SHIM_LIVE_TAKEN = 1, SHIM_LIVE_UNUSABLE = 2 };
SHIM_HIDDEN int shim_read_proc_stat(int pid, char *state, int *ppid, uint64_t *start_time);
SHIM_HIDDEN uint64_t shim_own_start_time(void);
SHIM_HIDDEN int shim_pid_alive(int pid, uint64_t start_time);
SHIM_HIDDEN void shim_live_init(int fd, const char *path);   /* takes the region's descriptor */
SHIM_HIDDEN int shim_live_hold(off_t offset, int shared);    /* SHIM_LIVE_* */
SHIM_HIDDEN void shim_live_drop(off_t offset);
SHIM_HIDDEN int shim_live_held_by_other(off_t offset);      /* 1, 0, or -1: cannot tell */
SHIM_HIDDEN void shim_live_after_fork(void);
/* Store the controller's measurement of a card; 0 (nothing stored) once this process has left the
 * region at exit, when its pids are no longer listed and the measurement would be wrong. */
SHIM_HIDDEN int shim_region_report_utilisation(int ordinal, unsigned container, unsigned others, unsigned target);

#endif
