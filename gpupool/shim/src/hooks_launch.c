/* Kernel and graph launches: each passes the compute bucket of its card before reaching the driver. */
#include "shim.h"

static uint64_t thread_count(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
    uint64_t grid = (uint64_t)gx * gy * gz, block = (uint64_t)bx * by * bz, total;
    return __builtin_mul_overflow(grid, block, &total) ? UINT64_MAX : total;
}

static void throttle(uint64_t cost, int graph) {
    if (!shim_config()->enabled) return;
    int dev = shim_current_device();
    if (dev >= 0) shim_compute_launch(dev, graph ? shim_graph_cost(dev) : cost);
}

#define LAUNCH_ARGS f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream
#define LAUNCH_COST thread_count(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ)

CUresult cuLaunchKernel(LAUNCH_PARAMS, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernel) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(LAUNCH_COST, 0);
    return REAL(cuLaunchKernel)(LAUNCH_ARGS, kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(LAUNCH_PARAMS, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernel_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(LAUNCH_COST, 0);
    return REAL(cuLaunchKernel_ptsz)(LAUNCH_ARGS, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(LAUNCH_PARAMS, void **kernelParams) {
    if (REAL(cuLaunchCooperativeKernel) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(LAUNCH_COST, 0);
    return REAL(cuLaunchCooperativeKernel)(LAUNCH_ARGS, kernelParams);
}

CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_PARAMS, void **kernelParams) {
    if (REAL(cuLaunchCooperativeKernel_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(LAUNCH_COST, 0);
    return REAL(cuLaunchCooperativeKernel_ptsz)(LAUNCH_ARGS, kernelParams);
}

static uint64_t config_cost(const CUlaunchConfig *c) {
    return c == NULL ? 1 : thread_count(c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernelEx) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(config_cost(config), 0);
    return REAL(cuLaunchKernelEx)(config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    if (REAL(cuLaunchKernelEx_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(config_cost(config), 0);
    return REAL(cuLaunchKernelEx_ptsz)(config, f, kernelParams, extra);
}

/* A graph's work is not visible from its executable handle: it costs an average kernel. */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    if (REAL(cuGraphLaunch) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(0, 1);
    return REAL(cuGraphLaunch)(hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    if (REAL(cuGraphLaunch_ptsz) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    throttle(0, 1);
    return REAL(cuGraphLaunch_ptsz)(hGraphExec, hStream);
}
