/* The shared card timeline of the stand-in driver (see state.h). */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_MAGIC 0x53545344u /* "DSTS" */

struct interval {
    uint64_t start_ns, end_ns;
    int32_t pid;
    uint32_t reserved;
};

struct device_timeline {
    uint64_t busy_until_ns;
    uint64_t count; /* intervals ever queued; the ring keeps the last STANDIN_RING */
    struct interval ring[STANDIN_RING];
};

struct card_holder {
    int32_t pid; /* 0: free */
    uint32_t reserved;
    uint64_t bytes[STANDIN_MAX_DEVICES];
};

struct shared_state {
    uint32_t magic, size;
    union {
        pthread_mutex_t lock;
        char lock_space[64];
    };
    struct device_timeline dev[STANDIN_MAX_DEVICES];
    struct card_holder holders[STANDIN_MAX_HOLDERS];
    uint64_t utilisation_queries; /* NVML per-process utilisation queries ever answered on this machine */
};

static struct standin_settings settings;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static struct shared_state *state;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

static uint64_t env_number(const char *name, uint64_t fallback) {
    const char *text = getenv(name);
    return text != NULL && *text != '\0' ? strtoull(text, NULL, 10) : fallback;
}

static void read_settings(void) {
    settings.devices = (int)env_number("GPUPOOL_STANDIN_DEVICES", 1);
    if (settings.devices < 1) settings.devices = 1;
    if (settings.devices > STANDIN_MAX_DEVICES) settings.devices = STANDIN_MAX_DEVICES;
    settings.memory_bytes = env_number("GPUPOOL_STANDIN_MEMORY_MIB", 16384) << 20;
    settings.kernel_ns = env_number("GPUPOOL_STANDIN_KERNEL_US", 1000) * 1000;
    settings.queue_ns = env_number("GPUPOOL_STANDIN_QUEUE_US", 2000) * 1000;
    settings.window_ns = env_number("GPUPOOL_STANDIN_SAMPLE_MS", 100) * 1000000;
    settings.pid_offset = (int)env_number("GPUPOOL_STANDIN_PID_OFFSET", 0);
    settings.shared_memory = env_number("GPUPOOL_STANDIN_SHARED_MEMORY", 0) != 0;
}

const struct standin_settings *standin_settings(void) {
    pthread_once(&settings_once, read_settings);
    return &settings;
}

int standin_driver_pid(int own_pid) { return own_pid + standin_settings()->pid_offset; }

uint64_t standin_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void init_state(struct shared_state *s) {
    memset(s, 0, sizeof *s);
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
    pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &attributes);
    pthread_mutexattr_destroy(&attributes);
    s->size = sizeof *s;
    __atomic_store_n(&s->magic, STATE_MAGIC, __ATOMIC_RELEASE);
}

static void open_state(void) {
    char fallback[128];
    const char *path = getenv("GPUPOOL_STANDIN_STATE");
    if (path == NULL || *path == '\0') {
        snprintf(fallback, sizeof fallback, "/tmp/gpupool-standin-%u.state", (unsigned)getuid());
        path = fallback;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        fprintf(stderr, "stand-in driver: cannot open %s: %s\n", path, strerror(errno));
        abort();
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (st.st_size != (off_t)sizeof *state && ftruncate(fd, sizeof *state) != 0)) abort();
    void *map = mmap(NULL, sizeof *state, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) abort();
    state = map;
    if (__atomic_load_n(&state->magic, __ATOMIC_ACQUIRE) != STATE_MAGIC || state->size != sizeof *state)
        init_state(state);
    flock(fd, LOCK_UN);
    close(fd);
}

static struct shared_state *locked(void) {
    pthread_once(&state_once, open_state);
    if (pthread_mutex_lock(&state->lock) == EOWNERDEAD) pthread_mutex_consistent(&state->lock);
    return state;
}

uint64_t standin_enqueue(int dev, uint64_t duration_ns, int pid) {
    for (;;) {
        struct shared_state *s = locked();
        struct device_timeline *t = &s->dev[dev];
        uint64_t now = standin_now_ns();
        uint64_t queued = t->busy_until_ns > now ? t->busy_until_ns - now : 0;
        if (queued > settings.queue_ns) { /* the card's queue is full: the launch blocks, as real ones do */
            pthread_mutex_unlock(&s->lock);
            uint64_t wait = queued - settings.queue_ns;
            struct timespec pause = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
            nanosleep(&pause, NULL);
            continue;
        }
        uint64_t start = now > t->busy_until_ns ? now : t->busy_until_ns;
        struct interval *slot = &t->ring[t->count % STANDIN_RING];
        *slot = (struct interval){.start_ns = start, .end_ns = start + duration_ns, .pid = pid};
        t->count++;
        t->busy_until_ns = start + duration_ns;
        pthread_mutex_unlock(&s->lock);
        return start + duration_ns;
    }
}

/* Walks the intervals overlapping [from, to), newest first (they are queued in time order). */
#define EACH_INTERVAL(t, from, to, body)                                                                \
    for (uint64_t k_ = 0; k_ < (t)->count && k_ < STANDIN_RING; k_++) {                                 \
        const struct interval *it = &(t)->ring[((t)->count - 1 - k_) % STANDIN_RING];                   \
        if (it->end_ns <= (from)) break;                                                                \
        if (it->start_ns >= (to)) continue;                                                             \
        body                                                                                            \
    }

uint64_t standin_busy(int dev, int pid, uint64_t from_ns, uint64_t to_ns) {
    struct shared_state *s = locked();
    uint64_t busy = 0;
    EACH_INTERVAL(&s->dev[dev], from_ns, to_ns, {
        if (pid != 0 && it->pid != pid) continue;
        uint64_t a = it->start_ns > from_ns ? it->start_ns : from_ns;
        uint64_t b = it->end_ns < to_ns ? it->end_ns : to_ns;
        busy += b - a;
    })
    pthread_mutex_unlock(&s->lock);
    return busy;
}

void standin_count_utilisation_query(void) {
    struct shared_state *s = locked();
    s->utilisation_queries++;
    pthread_mutex_unlock(&s->lock);
}

uint64_t standin_utilisation_queries(void) {
    struct shared_state *s = locked();
    uint64_t queries = s->utilisation_queries;
    pthread_mutex_unlock(&s->lock);
    return queries;
}

int standin_pids(int dev, uint64_t from_ns, uint64_t to_ns, int *pids, int max) {
    struct shared_state *s = locked();
    int count = 0;
    EACH_INTERVAL(&s->dev[dev], from_ns, to_ns, {
        int seen = 0;
        for (int i = 0; i < count && !seen; i++) seen = pids[i] == it->pid;
        if (!seen && count < max) pids[count++] = it->pid;
    })
    pthread_mutex_unlock(&s->lock);
    return count;
}

/* Under the state's lock: this process's record (taking a free one, or a dead process's, first), or
 * NULL when all are live; the bytes of dead processes go back to their cards on the way. */
static struct card_holder *own_holder(struct shared_state *s, uint64_t on_card[STANDIN_MAX_DEVICES]) {
    int pid = getpid();
    struct card_holder *mine = NULL, *free_one = NULL;
    for (int i = 0; i < STANDIN_MAX_HOLDERS; i++) {
        struct card_holder *h = &s->holders[i];
        if (h->pid != 0 && h->pid != pid && kill(h->pid, 0) != 0 && errno == ESRCH) memset(h, 0, sizeof *h);
        if (h->pid == pid) mine = h;
        else if (h->pid == 0 && free_one == NULL) free_one = h;
        for (int d = 0; d < STANDIN_MAX_DEVICES; d++) on_card[d] += h->bytes[d];
    }
    if (mine == NULL && free_one != NULL) {
        free_one->pid = pid;
        mine = free_one;
    }
    return mine;
}

int standin_card_take(int dev, uint64_t bytes) {
    if (!standin_settings()->shared_memory) return 1;
    struct shared_state *s = locked();
    uint64_t on_card[STANDIN_MAX_DEVICES] = {0};
    struct card_holder *mine = own_holder(s, on_card);
    int fits = mine != NULL && on_card[dev] <= settings.memory_bytes && bytes <= settings.memory_bytes - on_card[dev];
    if (fits) mine->bytes[dev] += bytes;
    pthread_mutex_unlock(&s->lock);
    return fits;
}

void standin_card_give(int dev, uint64_t bytes) {
    if (!standin_settings()->shared_memory) return;
    struct shared_state *s = locked();
    uint64_t on_card[STANDIN_MAX_DEVICES] = {0};
    struct card_holder *mine = own_holder(s, on_card);
    if (mine != NULL) mine->bytes[dev] -= bytes < mine->bytes[dev] ? bytes : mine->bytes[dev];
    pthread_mutex_unlock(&s->lock);
}
