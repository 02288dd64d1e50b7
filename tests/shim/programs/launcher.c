/*
 * Launches kernels on the stand-in driver as fast as it lets it, and reports which share of the
 * card this process kept busy, read from the stand-in's timeline (the busy time NVML would see),
 * not guessed from the wall clock.
 * Usage: launcher API SECONDS FROM-TO [FROM-TO ...] [--neighbour-at S]
 *   API: kernel | kernelex | cooperative | graph
 *   FROM-TO: a measuring window in seconds since the start, e.g. 1.0-3.0; one line per window:
 *            "window FROM TO PERCENT"
 *   --neighbour-at S: at S seconds, start a copy of this program outside the container (the
 *            library and the limits removed from its environment) that launches until we end.
 * Last lines: "launches N" and "events N" (events the library recorded behind launches).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
uint64_t gpupoolStandinBusyNs(int dev, int pid, uint64_t from_ns, uint64_t to_ns);
void gpupoolStandinEventCounts(unsigned long long *recorded, unsigned long long *recorded_in_capture);

extern char **environ;
#define MAX_WINDOWS 8

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUresult launch_once(const char *api) {
    if (strcmp(api, "kernelex") == 0) {
        CUlaunchConfig config = {.gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
        return cuLaunchKernelEx(&config, NULL, NULL, NULL);
    }
    if (strcmp(api, "cooperative") == 0) return cuLaunchCooperativeKernel(NULL, 4, 1, 1, 128, 1, 1, 0, NULL, NULL);
    if (strcmp(api, "graph") == 0) return cuGraphLaunch((CUgraphExec)(uintptr_t)1, NULL);
    return cuLaunchKernel(NULL, 4, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
}

/* The neighbour: same driver, no library, no limits. */
static pid_t start_neighbour(const char *self) {
    static char *clean[512];
    int n = 0;
    for (char **e = environ; *e != NULL && n < 510; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) != 0 && strncmp(*e, "GPUPOOL_MEMORY", 14) != 0 &&
            strncmp(*e, "GPUPOOL_COMPUTE", 15) != 0 && strncmp(*e, "GPUPOOL_SHIM", 12) != 0 &&
            strncmp(*e, "CUDA_DEVICE_", 12) != 0)
            clean[n++] = *e;
    clean[n] = NULL;
    char *args[] = {(char *)self, "kernel", "3600", NULL};
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, args, clean) != 0) return -1;
    return pid;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: launcher API SECONDS [FROM-TO ...] [--neighbour-at S]\n");
        return 2;
    }
    const char *api = argv[1];
    double seconds = atof(argv[2]), windows[MAX_WINDOWS][2], neighbour_at = -1;
    int window_count = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--neighbour-at") == 0 && i + 1 < argc) neighbour_at = atof(argv[++i]);
        else if (window_count < MAX_WINDOWS && sscanf(argv[i], "%lf-%lf", &windows[window_count][0], &windows[window_count][1]) == 2)
            window_count++;
    }
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 3;
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
    pid_t neighbour = -1;
    printf("started\n");
    fflush(stdout);
    long launches = 0;
    while (now_ns() < end) {
        if (neighbour_at >= 0 && neighbour < 0 && now_ns() >= start + (uint64_t)(neighbour_at * 1e9))
            neighbour = start_neighbour(argv[0]);
        if (launch_once(api) != CUDA_SUCCESS) return 4;
        launches++;
    }
    cuCtxSynchronize();
    if (neighbour > 0) {
        kill(neighbour, SIGKILL);
        waitpid(neighbour, NULL, 0);
    }
    for (int w = 0; w < window_count; w++) {
        uint64_t from = start + (uint64_t)(windows[w][0] * 1e9), to = start + (uint64_t)(windows[w][1] * 1e9);
        uint64_t busy = gpupoolStandinBusyNs(0, getpid(), from, to);
        printf("window %.2f %.2f %.1f\n", windows[w][0], windows[w][1], 100.0 * (double)busy / (double)(to - from));
    }
    printf("launches %ld\n", launches);
    unsigned long long events = 0, in_capture = 0;
    gpupoolStandinEventCounts(&events, &in_capture);
    printf("events %llu\n", events);
    return 0;
}
