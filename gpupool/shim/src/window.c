/*
 * The in-flight window of a compute-limited card. A launch returns as soon as the kernel is queued,
 * and a card's queue holds a thousand launches or more, so a program that launches ahead and
 * synchronises once at the end would queue all its work before the controller's first measurement
 * and run unthrottled, however the bucket paced what followed. Every WINDOW_EVERY launches the
 * library records an event behind the launch; while WINDOW_MARKS such marks are pending, the next
 * mark first waits for the oldest. The process thus never runs more than about
 * WINDOW_EVERY x WINDOW_MARKS launches ahead of its card, and the bucket's pace is the card's. In
 * soft mode, while the card is otherwise idle (target 100 %), there is no window.
 *
 * The wait polls (cuEventQuery, short sleeps) for at most WINDOW_MAX_WAIT_NS instead of blocking in
 * cuEventSynchronize: a stream whose work waits for the launching thread (a host function taking a
 * lock that thread holds) must not deadlock because of the library. Event calls run in relaxed
 * stream-capture mode, so that they never invalidate another thread's capture, and no mark is
 * recorded on a stream that is being captured (it would become a node of the graph).
 */
#include <pthread.h>

#include "region.h"

#define WINDOW_EVERY 8u                   /* launches between two marks */
#define WINDOW_MARKS 4u                   /* marks pending at most */
#define WINDOW_MAX_WAIT_NS 1000000000ull  /* a mark never holds a launch longer than this */
#define WINDOW_FIRST_POLL_NS 20000ull
#define WINDOW_LAST_POLL_NS 500000ull
#define WINDOW_MAX_CONTEXTS 4             /* context changes on one card before the window gives up */

struct window {
    pthread_mutex_t lock;
    unsigned launches;
    unsigned oldest, pending;
    unsigned contexts; /* how many contexts the marks were created in */
    int disabled;
    CUcontext context; /* the marks' context */
    CUevent marks[WINDOW_MARKS];
};

static struct window windows[SHIM_MAX_DEVICES] = {[0 ... SHIM_MAX_DEVICES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static int usable(void) {
    return REAL(cuEventCreate) != NULL && REAL(cuEventRecord) != NULL && REAL(cuEventQuery) != NULL &&
           REAL(cuCtxGetCurrent) != NULL;
}

/* The stream a launch went to, as a handle other calls accept. */
static CUstream launched_on(CUstream stream, int per_thread) {
    return stream == NULL && per_thread ? CU_STREAM_PER_THREAD : stream;
}

static int capturing(CUstream stream) {
    if (stream == NULL || stream == CU_STREAM_LEGACY || REAL(cuStreamGetCaptureInfo_v2) == NULL) return 0;
    int status = 0;
    if (REAL(cuStreamGetCaptureInfo_v2)(stream, &status, NULL, NULL, NULL, NULL) != CUDA_SUCCESS) return 1;
    return status != 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
}

/* Waits, bounded, until the oldest mark's work is done (an event the driver refuses counts as done). */
static void wait_oldest(struct window *w) {
    CUevent mark = w->marks[w->oldest];
    uint64_t poll = WINDOW_FIRST_POLL_NS, deadline = shim_now_ns() + WINDOW_MAX_WAIT_NS;
    while (REAL(cuEventQuery)(mark) == CUDA_ERROR_NOT_READY && shim_now_ns() < deadline) {
        shim_sleep_ns(poll);
        poll = poll * 2 < WINDOW_LAST_POLL_NS ? poll * 2 : WINDOW_LAST_POLL_NS;
    }
    w->oldest = (w->oldest + 1) % WINDOW_MARKS;
    w->pending--;
}

/* Marks are events of the current context; a card used from another context gets new ones. */
static int ready_for(struct window *w) {
    CUcontext current = NULL;
    if (REAL(cuCtxGetCurrent)(&current) != CUDA_SUCCESS || current == NULL) return 0;
    if (current == w->context) return 1;
    if (++w->contexts > WINDOW_MAX_CONTEXTS) {
        w->disabled = 1;
        shim_log(SHIM_LOG_WARN, "a card used from more than %d contexts: its launches are paced but may queue far "
                 "ahead of it", WINDOW_MAX_CONTEXTS);
        return 0;
    }
    for (unsigned i = 0; i < WINDOW_MARKS; i++)
        if (REAL(cuEventCreate)(&w->marks[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            w->disabled = 1;
            shim_log(SHIM_LOG_WARN, "cannot create events: launches are paced but may queue far ahead of the card");
            return 0;
        }
    w->context = current;
    w->oldest = w->pending = 0;
    return 1;
}

static void mark(struct window *w, CUstream stream) {
    if (w->disabled || !ready_for(w) || capturing(stream)) return;
    if (w->pending == WINDOW_MARKS) wait_oldest(w);
    unsigned slot = (w->oldest + w->pending) % WINDOW_MARKS;
    if (REAL(cuEventRecord)(w->marks[slot], stream) == CUDA_SUCCESS) w->pending++;
}

/* Soft mode on a card nobody else uses: the container may have all of it, nothing to hold back. */
static int unbounded(int dev) {
    struct shim_bucket *b = shim_region_bucket(dev);
    return b != NULL && __atomic_load_n(&b->target_percent, __ATOMIC_RELAXED) >= 100;
}

void shim_window_launched(int dev, CUstream stream, int per_thread) {
    if (dev < 0 || dev >= SHIM_MAX_DEVICES || unbounded(dev)) return;
    struct window *w = &windows[dev];
    if (__atomic_add_fetch(&w->launches, 1, __ATOMIC_RELAXED) % WINDOW_EVERY != 0 || !usable()) return;
    pthread_mutex_lock(&w->lock);
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    int exchanged = REAL(cuThreadExchangeStreamCaptureMode) != NULL &&
                    REAL(cuThreadExchangeStreamCaptureMode)(&mode) == CUDA_SUCCESS;
    mark(w, launched_on(stream, per_thread));
    if (exchanged) REAL(cuThreadExchangeStreamCaptureMode)(&mode);
    pthread_mutex_unlock(&w->lock);
}

void shim_window_after_fork(void) {
    /* The parent's events belong to its contexts, which the child does not have. */
    for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++) {
        struct window *w = &windows[dev];
        pthread_mutex_init(&w->lock, NULL);
        w->launches = w->oldest = w->pending = w->contexts = 0;
        w->disabled = 0;
        w->context = NULL;
    }
}
