/*
 * Kernel and graph launches: each passes the compute bucket of its card before reaching the driver,
 * and a launch on a limited card counts towards its in-flight window (window.c) once queued.
 */
#include "shim.h"

static uint64_t thread_count(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
    uint64_t grid = (uint64_t)gx * gy * gz, block = (uint64_t)bx * by * bz, total;
    return __builtin_mul_overflow(grid, block, &total) ? UINT64_MAX : total;
}

/* The launch's card when its compute is limited (after the bucket let it pass), else -1. */
static int throttle(uint64_t cost, int graph) {
    if (!shim_config()->enabled) return -1;
    int dev = shim_card_of(shim_current_device()); /* a card's ordinals share its compute share */
    if (dev < 0) return -1;
    return shim_compute_launch(dev, graph ? shim_graph_cost(dev) : cost) ? dev : -1;
}

static CUresult launched(CUresult status, int dev, CUstream stream, int per_thread) {
    if (status == CUDA_SUCCESS && dev >= 0) shim_window_launched(dev, stream, per_thread);
    return status;
}

#define LAUNCH_ARGS f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream
#define LAUNCH_COST thread_count(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ)

CUresult cuLaunchKernel(LAUNCH_PARAMS, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernel) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(LAUNCH_COST, 0);
    return launched(REAL(cuLaunchKernel)(LAUNCH_ARGS, kernelParams, extra), dev, hStream, 0);
}

CUresult cuLaunchKernel_ptsz(LAUNCH_PARAMS, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernel_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(LAUNCH_COST, 0);
    return launched(REAL(cuLaunchKernel_ptsz)(LAUNCH_ARGS, kernelParams, extra), dev, hStream, 1);
}

CUresult cuLaunchCooperativeKernel(LAUNCH_PARAMS, void **kernelParams) {
    if (REAL(cuLaunchCooperativeKernel) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(LAUNCH_COST, 0);
    return launched(REAL(cuLaunchCooperativeKernel)(LAUNCH_ARGS, kernelParams), dev, hStream, 0);
}

CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_PARAMS, void **kernelParams) {
    if (REAL(cuLaunchCooperativeKernel_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(LAUNCH_COST, 0);
    return launched(REAL(cuLaunchCooperativeKernel_ptsz)(LAUNCH_ARGS, kernelParams), dev, hStream, 1);
}

static uint64_t config_cost(const CUlaunchConfig *c) {
    return c == NULL ? 1 : thread_count(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ);
}

static CUstream config_stream(const CUlaunchConfig *c) { return c == NULL ? NULL : c->hStream; }

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernelEx) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(config_cost(config), 0);
    return launched(REAL(cuLaunchKernelEx)(config, f, kernelParams, extra), dev, config_stream(config), 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernelEx_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(config_cost(config), 0);
    return launched(REAL(cuLaunchKernelEx_ptsz)(config, f, kernelParams, extra), dev, config_stream(config), 1);
}

/* A graph's work is not visible from its executable handle: it costs an average kernel. */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    if (REAL(cuGraphLaunch) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(0, 1);
    return launched(REAL(cuGraphLaunch)(hGraphExec, hStream), dev, hStream, 0);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    if (REAL(cuGraphLaunch_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = throttle(0, 1);
    return launched(REAL(cuGraphLaunch_ptsz)(hGraphExec, hStream), dev, hStream, 1);
}
