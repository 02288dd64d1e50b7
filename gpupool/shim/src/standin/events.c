/*
 * The stand-in driver's events. A process's launches run in order on its card's timeline, so an
 * event recorded now is complete when the last kernel queued so far ends. Recording on a stream
 * that is being captured is counted (the real driver would put the event into the graph), so the
 * interception library's tests can check it never does. The capture mode is kept per thread.
 */
#include <stdlib.h>
#include <time.h>

#include "driver.h"

API CUresult cuEventSynchronize(CUevent hEvent);
API CUresult cuEventDestroy_v2(CUevent hEvent);
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
API void gpupoolStandinEventCounts(unsigned long long *recorded, unsigned long long *recorded_in_capture);

struct standin_event {
    uint64_t done_ns;
};

static unsigned long long recorded, recorded_in_capture;
static __thread int capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    (void)Flags;
    if (phEvent == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (standin_current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct standin_event *event = calloc(1, sizeof *event);
    if (event == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *phEvent = (CUevent)event;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    if (hEvent == NULL) return CUDA_ERROR_INVALID_HANDLE;
    __atomic_add_fetch(&recorded, 1, __ATOMIC_RELAXED);
    if (standin_capture_graph(hStream, 0) != NULL) __atomic_add_fetch(&recorded_in_capture, 1, __ATOMIC_RELAXED);
    ((struct standin_event *)hEvent)->done_ns = standin_last_end_ns();
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent) {
    if (hEvent == NULL) return CUDA_ERROR_INVALID_HANDLE;
    return standin_now_ns() >= ((struct standin_event *)hEvent)->done_ns ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    if (hEvent == NULL) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t done = ((struct standin_event *)hEvent)->done_ns, now = standin_now_ns();
    if (done > now) {
        struct timespec pause = {(time_t)((done - now) / 1000000000ull), (long)((done - now) % 1000000000ull)};
        nanosleep(&pause, NULL);
    }
    return CUDA_SUCCESS;
}

/* The time between two recorded events: when the work queued before each ended on the timeline. */
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (start == NULL || end == NULL) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t from = ((struct standin_event *)start)->done_ns, to = ((struct standin_event *)end)->done_ns;
    *ms = (float)((double)(int64_t)(to - from) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
    if (hEvent == NULL) return CUDA_ERROR_INVALID_HANDLE;
    free(hEvent);
    return CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
    int previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return CUDA_SUCCESS;
}

void gpupoolStandinEventCounts(unsigned long long *all, unsigned long long *in_capture) {
    *all = __atomic_load_n(&recorded, __ATOMIC_RELAXED);
    *in_capture = __atomic_load_n(&recorded_in_capture, __ATOMIC_RELAXED);
}
