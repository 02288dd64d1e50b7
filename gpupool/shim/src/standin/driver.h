/* What the stand-in libcuda.so.1's parts share: cuda.c owns the cards' memory, vmm.c builds VMM
 * allocations on it, graph.c graphs and stream capture, events.c events. */
#ifndef GPUPOOL_STANDIN_DRIVER_H
#define GPUPOOL_STANDIN_DRIVER_H

#include "../cuda_api.h"
#include "state.h"

/* When the last kernel this process queued ends (cuda.c's timeline; events.c records it). */
uint64_t standin_last_end_ns(void);
/* The calling thread's current card, -1 without a context. */
int standin_current_device(void);
CUresult standin_checked_device(int dev);
/* Take bytes of a card's memory (a key names them), and give them back. */
CUresult standin_allocate(int dev, uint64_t bytes, unsigned long long *key);
CUresult standin_release(uint64_t key);
/* Memory for a graph's memory node (owner: the graph), and every allocation of owner handed to
 * another (to 0: freed); bytes (or NULL) gets what each card held. */
CUresult standin_allocate_for_graph(int dev, uint64_t bytes, uint64_t graph, unsigned long long *key);
void standin_hand_over(uint64_t owner, uint64_t to, uint64_t bytes[STANDIN_MAX_DEVICES]);
/* The graph a stream is being captured into, or NULL (graph.c); per_thread: a _ptsz caller. */
CUgraph standin_capture_graph(CUstream stream, int per_thread);
/* Entry points graph.c defines that cuda.c's lookup table names. */
API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
API CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode);
API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out,
                                            CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                            size_t *numDependencies_out);

/* A variant no gpupool release wraps, served by cuGetProcAddress for "cuMemAlloc" from
 * STANDIN_FUTURE_VERSION on: what a driver newer than the interception library looks like to it. */
#define STANDIN_FUTURE_VERSION 99000
API CUresult cuMemAlloc_v3(CUdeviceptr *dptr, size_t bytesize, unsigned long long flags);

/* The CUDA 12 library API (kernels.c), for cuda.c's lookup table. */
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUmod_st *CUmodule;
API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                               unsigned int jit_count, void *library_options, void **library_values,
                               unsigned int library_count);
API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, void *jit_options, void **jit_values,
                                   unsigned int jit_count, void *library_options, void **library_values,
                                   unsigned int library_count);
API CUresult cuLibraryUnload(CUlibrary library);
API CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
API CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library);
API CUresult cuLibraryGetGlobal(CUdeviceptr *pointer, size_t *bytes, CUlibrary library, const char *name);
API CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel);
API CUresult cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t *offset, size_t *size);
/* Module globals, attributes and occupancy (kernels.c), for the same table. */
API CUresult cuModuleGetGlobal_v2(CUdeviceptr *pointer, size_t *bytes, CUmodule module, const char *name);
API CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function);
API CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value);
API CUresult cuFuncSetCacheConfig(CUfunction function, int config);
API CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice dev);
API CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice dev);
API CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, CUdevice dev);
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction function, int block_size,
                                                         size_t dynamic_shared);
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction function, int block_size,
                                                                  size_t dynamic_shared, unsigned int flags);
API CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction function,
                                              size_t (*shared_of)(int), size_t dynamic_shared, int limit);
API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size, CUfunction function,
                                                       size_t (*shared_of)(int), size_t dynamic_shared, int limit,
                                                       unsigned int flags);

/* The allocation holding address (its base and size): 1, or 0 when none does (cuda.c). */
int standin_allocation_at(uint64_t address, uint64_t *base, uint64_t *bytes);
/* kernels.c: the host memory behind an allocation given back, and a launch of a built-in kernel run. */
void standin_backing_drop(uint64_t base);
CUresult standin_run_builtin(CUfunction function, void **params, void **extra);

/* Let VMM allocations go that only an exported file kept, once that file is closed. */
void standin_vmm_settle(void);
/* At cuInit: the control descriptor, an open of the file every export opens (vmm.c). */
void standin_vmm_open_control(void);

#endif
