/*
 * Compute shares (seed 004's vCUDA rule): a kernel launch takes tokens from a bucket shared by the
 * container's processes, and waits when there are none. A controller thread measures, every
 * period, how busy the container kept the card (NVML per-process utilisation) and how many tokens
 * it took, and sets the refill rate that would have kept it at its target: the share in hard mode;
 * in soft mode the whole card while nobody else uses it, the share as soon as someone does.
 * A launch's cost is its thread count; the controller learns what a token is worth, so the unit
 * only has to be proportional to work, not exact.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "region.h"

#define CONTROL_PERIOD_NS 50000000ull /* how often the rate is re-set */
#define CONTROL_WAKE_NS (CONTROL_PERIOD_NS / 4)
#define BURST_NS 25000000.0           /* tokens saved up while idle (or starved of CPU): this much time at the rate */
#define MAX_WAIT_NS 1000000000.0      /* one launch never waits longer than this */
#define SOFT_IDLE_PERCENT 5           /* others below this: the card counts as otherwise idle */
#define HEADROOM 2.0                  /* an unthrottled target keeps the rate this far above demand */
#define MIN_RATE 1e-9                 /* tokens per nanosecond */
#define MAX_COST (1ull << 40)
#define MAX_SAMPLES 256
#define COST_SMOOTHING 16

static int controller_started;

static double load_rate(struct shim_bucket *b) {
    uint64_t bits = __atomic_load_n(&b->rate_bits, __ATOMIC_ACQUIRE);
    double rate;
    memcpy(&rate, &bits, sizeof rate);
    return rate;
}

static void store_rate(struct shim_bucket *b, double rate) {
    uint64_t bits;
    memcpy(&bits, &rate, sizeof bits);
    __atomic_store_n(&b->rate_bits, bits, __ATOMIC_RELEASE);
}

/* One process adds what accrued since the last refill; the bucket never holds more than a burst. */
static void refill(struct shim_bucket *b, uint64_t now, double rate) {
    uint64_t last = __atomic_load_n(&b->refill_ns, __ATOMIC_ACQUIRE);
    if (now <= last || !__atomic_compare_exchange_n(&b->refill_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    /* Debts are repaid in full (a launch may cost more than a burst); only savings are capped. */
    double accrued = rate * (double)(now - last);
    int64_t cap = (int64_t)(rate * BURST_NS) + 1;
    double room = (double)cap - (double)__atomic_load_n(&b->tokens, __ATOMIC_ACQUIRE);
    int64_t add = (int64_t)(accrued < room ? accrued : room);
    if (add <= 0) return;
    int64_t tokens = __atomic_add_fetch(&b->tokens, add, __ATOMIC_ACQ_REL);
    while (tokens > cap && !__atomic_compare_exchange_n(&b->tokens, &tokens, cap, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

/* Per-pid mean over NVML's samples, summed for the container's processes and for the others. */
static void split_samples(const nvmlProcessUtilizationSample_t *samples, unsigned count, unsigned *mine,
                          unsigned *others) {
    int pids[SHIM_REGION_SLOTS];
    int pid_count = shim_region_pids(pids, SHIM_REGION_SLOTS);
    *mine = *others = 0;
    for (unsigned i = 0; i < count; i++) {
        int first = 1;
        for (unsigned j = 0; j < i && first; j++) first = samples[j].pid != samples[i].pid;
        if (!first) continue;
        unsigned sum = 0, n = 0;
        for (unsigned j = i; j < count; j++)
            if (samples[j].pid == samples[i].pid) sum += samples[j].smUtil, n++;
        int member = 0;
        for (int k = 0; k < pid_count && !member; k++) member = pids[k] == (int)samples[i].pid;
        *(member ? mine : others) += sum / n;
    }
}

static nvmlDevice_t handle_of(int dev) {
    static nvmlDevice_t handles[SHIM_MAX_DEVICES];
    const struct shim_config *c = shim_config();
    if (handles[dev] != NULL) return handles[dev];
    if (dev < c->uuid_count && REAL(nvmlDeviceGetHandleByUUID) != NULL)
        REAL(nvmlDeviceGetHandleByUUID)(c->uuids[dev], &handles[dev]);
    if (handles[dev] == NULL && REAL(nvmlDeviceGetHandleByIndex_v2) != NULL)
        REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)dev, &handles[dev]);
    return handles[dev];
}

static int measure(int dev, uint64_t since_ns_ago, unsigned *mine, unsigned *others) {
    nvmlDevice_t handle = handle_of(dev);
    if (handle == NULL || REAL(nvmlDeviceGetProcessUtilization) == NULL) return -1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long since_us = (unsigned long long)now.tv_sec * 1000000ull +
                                  (unsigned long long)now.tv_nsec / 1000ull - since_ns_ago / 1000ull;
    nvmlProcessUtilizationSample_t samples[MAX_SAMPLES];
    unsigned count = MAX_SAMPLES;
    nvmlReturn_t status = REAL(nvmlDeviceGetProcessUtilization)(handle, samples, &count, since_us);
    if (status == NVML_ERROR_NOT_FOUND) count = 0; /* no process ran a kernel in the window */
    else if (status != NVML_SUCCESS) return -1;
    split_samples(samples, count, mine, others);
    return 0;
}

static void control_step(int dev, int percent, int mode, uint64_t now) {
    struct shim_bucket *b = shim_region_bucket(dev);
    uint64_t last = __atomic_load_n(&b->control_ns, __ATOMIC_ACQUIRE);
    if (last != 0 && now - last < CONTROL_PERIOD_NS) return;
    if (!__atomic_compare_exchange_n(&b->control_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    uint64_t consumed = __atomic_load_n(&b->consumed, __ATOMIC_ACQUIRE);
    uint64_t before = __atomic_exchange_n(&b->control_consumed, consumed, __ATOMIC_ACQ_REL);
    unsigned mine, others;
    if (last == 0 || measure(dev, now - last, &mine, &others) != 0) return;
    unsigned target = mode == SHIM_MODE_SOFT && others < SOFT_IDLE_PERCENT ? 100u : (unsigned)percent;
    /* Dropped once the process has left the region at exit (the thread runs on until it is gone). */
    if (!shim_region_report_utilisation(dev, mine, others, target)) return;
    if (consumed == before || mine == 0) return; /* nothing ran: nothing to learn */
    double observed = (double)(consumed - before) / (double)(now - last);
    double next = observed * target / mine * (target >= 100 ? HEADROOM : 1.0);
    double old = load_rate(b);
    if (old > 0 && next > old * 0.5 && next < old * 2.0) next = (old + next) / 2.0; /* damp small corrections */
    store_rate(b, next > MIN_RATE ? next : MIN_RATE);
    shim_log(SHIM_LOG_DEBUG, "card %d: container %u%%, others %u%%, target %u%%, rate %.3g -> %.3g tokens/ns", dev,
             mine, others, target, old, next);
}

static void *controller(void *unused) {
    (void)unused;
    if (REAL(nvmlInit_v2) == NULL || REAL(nvmlInit_v2)() != NVML_SUCCESS) {
        shim_log(SHIM_LOG_WARN, "NVML is not available: compute shares are NOT enforced in this process");
        return NULL;
    }
    for (;;) {
        shim_sleep_ns(CONTROL_WAKE_NS);
        uint64_t now = shim_now_ns();
        for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++) {
            int mode, percent = shim_compute_limit(dev, &mode);
            if (percent > 0 && shim_region_bucket(dev) != NULL) control_step(dev, percent, mode, now);
        }
    }
    return NULL;
}

static void start_controller(void) {
    int expected = 0;
    if (!__atomic_compare_exchange_n(&controller_started, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous); /* the workload's signals are not ours to take */
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attributes, controller, NULL) != 0)
        shim_log(SHIM_LOG_ERROR, "cannot start the compute controller: compute shares are NOT enforced");
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
}

int shim_compute_launch(int dev, uint64_t cost) {
    int mode;
    if (dev < 0 || shim_compute_limit(dev, &mode) == 0) return 0;
    struct shim_bucket *b = shim_region_bucket(dev);
    if (b == NULL) return 0;
    start_controller();
    cost = cost == 0 ? 1 : cost > MAX_COST ? MAX_COST : cost;
    __atomic_fetch_add(&b->consumed, cost, __ATOMIC_RELAXED);
    uint64_t average = __atomic_load_n(&b->cost_average, __ATOMIC_RELAXED);
    __atomic_store_n(&b->cost_average, average + ((int64_t)cost - (int64_t)average) / COST_SMOOTHING,
                     __ATOMIC_RELAXED);
    double rate = load_rate(b);
    if (rate <= 0) return 1; /* not measured yet */
    refill(b, shim_now_ns(), rate);
    int64_t left = __atomic_sub_fetch(&b->tokens, (int64_t)cost, __ATOMIC_ACQ_REL);
    if (left >= 0) return 1;
    double wait = (double)-left / rate; /* our place in the queue of launches that owe tokens */
    shim_sleep_ns((uint64_t)(wait < MAX_WAIT_NS ? wait : MAX_WAIT_NS));
    return 1;
}

uint64_t shim_graph_cost(int dev) {
    struct shim_bucket *b = dev < 0 ? NULL : shim_region_bucket(dev);
    uint64_t average = b == NULL ? 0 : __atomic_load_n(&b->cost_average, __ATOMIC_RELAXED);
    return average ? average : 1;
}

void shim_compute_after_fork(void) {
    controller_started = 0;
    shim_window_after_fork();
}
