/*
 * Prototypes of the driver entry points the library wraps or calls, and that the stand-in driver
 * implements. The interception library defines the wrapped ones under the same names (that is how
 * symbol interposition works), so one list of prototypes serves both sides.
 */
#ifndef GPUPOOL_CUDA_API_H
#define GPUPOOL_CUDA_API_H

#include "cuda_types.h"

#define API __attribute__((visibility("default")))

API CUresult cuInit(unsigned int flags);
API CUresult cuCtxGetDevice(CUdevice *device);
API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
API CUresult cuDeviceGetCount(int *count);
API CUresult cuDeviceGet(CUdevice *device, int ordinal);
API CUresult cuDeviceGetName(char *name, int length, CUdevice dev);
API CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);
API CUresult cuDeviceGetPCIBusId(char *bus, int length, CUdevice dev);
API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev);
API CUresult cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice dev);
API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
API CUresult cuCtxCreate_v3(CUcontext *ctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                            CUdevice dev);
API CUresult cuCtxCreate_v4(CUcontext *ctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);
API CUresult cuCtxDestroy_v2(CUcontext ctx);
API CUresult cuCtxSetCurrent(CUcontext ctx);
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus);

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                             unsigned int ElementSizeBytes);
API CUresult cuMemFree(CUdeviceptr_v1 dptr);
API CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray);
API CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray);
API CUresult cuImportExternalMemory(CUexternalMemory *extMem_out, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc);
API CUresult cuDestroyExternalMemory(CUexternalMemory extMem);
API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                unsigned int ElementSizeBytes);
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
API CUresult cuMemFree_v2(CUdeviceptr dptr);
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
API CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                          CUmemAllocationHandleType handleType, unsigned long long flags);
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                            CUmemAllocationHandleType shHandleType);
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream hStream);
API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
API CUresult cuArrayDestroy(CUarray hArray);
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pDesc,
                                    unsigned int numMipmapLevels);
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, int type);
API CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, int type);
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
/* Entry points that name a device and reach the driver translated on a virtual grant (virtual.c). */
API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
API CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr);
API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags option);
API CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count);
API CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location);
API CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);
API CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location);
API CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);
API CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                   CUstream hStream);
API CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);
API CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                        CUstream hStream);
API CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                     CUdevice dstDevice);
API CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                    size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
API CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, CUgraphNodeParams *nodeParams);
API CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               const CUgraphEdgeData *dependencyData, size_t numDependencies,
                               CUgraphNodeParams *nodeParams);
/* The same arguments as _v2 (CUDA 13.x: a kernel node's context and function must match). */
API CUresult cuGraphAddNode_v3(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               const CUgraphEdgeData *dependencyData, size_t numDependencies,
                               CUgraphNodeParams *nodeParams);
API CUresult cuGraphDestroyNode(CUgraphNode hNode);
API CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out,
                                       CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                       size_t *numDependencies_out);
API CUresult cuGraphDestroy(CUgraph hGraph);
API CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph);
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
API CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                          CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
API CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                                size_t bufferSize);
API CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                   char *logBuffer, size_t bufferSize);

API CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
API CUresult cuCtxGetCurrent(CUcontext *pctx);
API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
API CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
API CUresult cuEventQuery(CUevent hEvent);
API CUresult cuThreadExchangeStreamCaptureMode(int *mode);
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

#define LAUNCH_PARAMS                                                                                   \
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,                 \
        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                         \
        unsigned int sharedMemBytes, CUstream hStream
API CUresult cuLaunchKernel(LAUNCH_PARAMS, void **kernelParams, void **extra);
API CUresult cuLaunchKernel_ptsz(LAUNCH_PARAMS, void **kernelParams, void **extra);
API CUresult cuLaunchCooperativeKernel(LAUNCH_PARAMS, void **kernelParams);
API CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_PARAMS, void **kernelParams);
API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                   void **extra);
API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);

API nvmlReturn_t nvmlInit_v2(void);
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp);

#endif
