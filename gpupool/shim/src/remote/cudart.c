/*
 * gpupool's CUDA runtime (docs/remote-gpu.md, "NVIDIA's CUDA runtime (libcudart)"): a
 * libcudart.so.12 that implements a subset of the CUDA runtime API on the CUDA driver API, so that
 * a program on the runtime can use a remote GPU through the GPU client (client.c, the
 * libcuda.so.1 it loads). NVIDIA's own libcudart cannot start on the client: it needs the driver's
 * private export tables, which cannot be forwarded. This one calls only the driver's public API
 * (never cuGetExportTable), which the client carries to the server.
 *
 * Carried: devices (one context per device, the device's primary context, made current in each
 * thread at its first call), properties (the fields a driver attribute answers; others zero),
 * versions, device memory, host memory, copies of every kind (cudaMemcpyDefault decided by this
 * library's own record of cudaMalloc's allocations), memsets, memory info, streams, events,
 * synchronisation, errors, and the registration ABI nvcc's host code calls (a fatbin is loaded with
 * cuModuleLoadData at its first use on each device, in that device's context, as a driver's module
 * belongs to one context; a kernel found by the device name it was registered with;
 * its parameter layout is the driver client's, which the server's driver answers) and of device
 * variables (the symbol calls copy to and from the module's global), kernels' attributes and
 * occupancy (the client forwards the driver's), a device reset of what it made, stream capture
 * status (never capturing: capture is refused), stream priority (0), driver entry points (the
 * client's cuGetProcAddress) and pointer attributes (from this library's records of device and
 * page-locked memory), which PyTorch asks. Every other
 * function of NVIDIA's libcudart.so.12 is exported (cudart_refused.h) and returns
 * cudaErrorNotSupported, saying so once per function on stderr.
 *
 * Error codes: the runtime's cudaError_t values of every driver code this library passes on are the
 * driver's numbers (CUDA 12 gives both the same values for them), so a driver code is returned as is.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))
#define RUNTIME_VERSION 12090 /* the runtime API (cuda_runtime_api.h 12.9) this library's ABI follows */
#define MAX_DEVICES 16
#define CUDA_SUCCESS_ 0
#define MAX_CONFIGURATIONS 16 /* nested <<<...>>> configurations pushed and not yet popped, per thread */

/* ---------------------------------------------------------------------- the driver API it calls */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
    char bytes[16];
} CUuuid;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int length, CUdevice device);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device);
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuCtxGetCurrent(CUcontext *context);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr pointer);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total);
CUresult cuMemAllocHost_v2(void **pointer, size_t bytes);
CUresult cuMemHostAlloc(void **pointer, size_t bytes, unsigned int flags);
CUresult cuMemFreeHost(void *pointer);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamQuery(CUstream stream);
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventQuery(CUevent event);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *pointer, size_t *bytes, CUmodule module, const char *name);
CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function);
CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value);
CUresult cuFuncSetCacheConfig(CUfunction function, int config);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction function, int block_size,
                                                              size_t dynamic_shared, unsigned int flags);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra);

/* ------------------------------------------------------------------------ the runtime's types */
typedef int cudaError_t;
typedef CUstream cudaStream_t;
typedef CUevent cudaEvent_t;
typedef struct {
    unsigned int x, y, z;
} dim3;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorMissingConfiguration = 52,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotSupported = 801,
};

enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
#define STREAM_LEGACY ((cudaStream_t)0x1)
#define STREAM_PER_THREAD ((cudaStream_t)0x2)

/* struct cudaDeviceProp of CUDA 12 (cudaGetDeviceProperties_v2): the layout of driver_types.h. */
struct cudaDeviceProp {
    char name[256];
    CUuuid uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem, sharedMemPerBlock;
    int regsPerBlock, warpSize;
    size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], clockRate;
    size_t totalConstMem;
    int major, minor;
    size_t textureAlignment, texturePitchAlignment;
    int deviceOverlap, multiProcessorCount, kernelExecTimeoutEnabled, integrated, canMapHostMemory, computeMode;
    int maxTexture1D, maxTexture1DMipmap, maxTexture1DLinear, maxTexture2D[2], maxTexture2DMipmap[2];
    int maxTexture2DLinear[3], maxTexture2DGather[2], maxTexture3D[3], maxTexture3DAlt[3], maxTextureCubemap;
    int maxTexture1DLayered[2], maxTexture2DLayered[3], maxTextureCubemapLayered[2], maxSurface1D, maxSurface2D[2];
    int maxSurface3D[3], maxSurface1DLayered[2], maxSurface2DLayered[3], maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels, ECCEnabled, pciBusID, pciDeviceID, pciDomainID, tccDriver, asyncEngineCount;
    int unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize, persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor, streamPrioritiesSupported, globalL1CacheSupported, localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor, managedMemory, isMultiGpuBoard, multiGpuBoardGroupID, hostNativeAtomicSupported;
    int singleToDoublePrecisionPerfRatio, pageableMemoryAccess, concurrentManagedAccess, computePreemptionSupported;
    int canUseHostPointerForRegisteredMem, cooperativeLaunch, cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost, maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported, sparseCudaArraySupported, hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported, memoryPoolsSupported, gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported, ipcEventSupported, clusterLaunch, unifiedFunctionPointers;
    int reserved[63];
};
_Static_assert(sizeof(struct cudaDeviceProp) == 1032, "struct cudaDeviceProp of CUDA 12 is 1032 bytes");

/* ------------------------------------------------------------------------------ errors */
static __thread cudaError_t last_error;

/* Every entry point returns through here: a failure is kept for cudaGetLastError. */
static cudaError_t done(cudaError_t status) {
    if (status != cudaSuccess) last_error = status;
    return status;
}

API cudaError_t cudaGetLastError(void) {
    cudaError_t status = last_error;
    last_error = cudaSuccess;
    return status;
}
API cudaError_t cudaPeekAtLastError(void) { return last_error; }

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {0, "cudaSuccess", "no error"},
    {1, "cudaErrorInvalidValue", "invalid argument"},
    {2, "cudaErrorMemoryAllocation", "out of memory"},
    {3, "cudaErrorInitializationError", "initialization error"},
    {4, "cudaErrorCudartUnloading", "driver shutting down"},
    {13, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {21, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {46, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {52, "cudaErrorMissingConfiguration", "__global__ function call is not configured"},
    {98, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {100, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {101, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {200, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {201, "cudaErrorDeviceUninitialized", "invalid device context"},
    {209, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
    {218, "cudaErrorInvalidPtx", "a PTX JIT compilation failed"},
    {301, "cudaErrorFileNotFound", "file not found"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {500, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {700, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {701, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {719, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {800, "cudaErrorNotPermitted", "operation not permitted"},
    {801, "cudaErrorNotSupported", "operation not supported"},
    {909, "cudaErrorTimeout", "timeout expired"},
    {999, "cudaErrorUnknown", "unknown error"},
};

API const char *cudaGetErrorName(cudaError_t error) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error) return errors[i].name;
    return "cudaErrorUnknown";
}
API const char *cudaGetErrorString(cudaError_t error) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error) return errors[i].text;
    return "unrecognized error code";
}

/* ------------------------------------------------------------------------- devices, contexts */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t started = PTHREAD_ONCE_INIT;
static CUresult start_status;
static int device_count;
static CUcontext primary[MAX_DEVICES]; /* retained at a device's first use */
static __thread int chosen;            /* cudaSetDevice's, per thread as the runtime's */
static __thread CUcontext bound;       /* the context made current in this thread */

static void start(void) {
    start_status = cuInit(0);
    if (start_status == 0) start_status = cuDeviceGetCount(&device_count);
    if (device_count > MAX_DEVICES) device_count = MAX_DEVICES;
}

/* cuInit once: 0 or why the driver cannot be used. */
static CUresult driver(void) {
    pthread_once(&started, start);
    return start_status;
}

/* The chosen device's primary context, current in this thread (what a call on a device needs). */
static CUresult ready(void) {
    CUresult status = driver();
    if (status != 0) return status;
    if (chosen >= device_count) return cudaErrorInvalidDevice;
    pthread_mutex_lock(&lock);
    if (primary[chosen] == NULL) {
        CUdevice device;
        if ((status = cuDeviceGet(&device, chosen)) == 0) status = cuDevicePrimaryCtxRetain(&primary[chosen], device);
    }
    CUcontext context = primary[chosen];
    pthread_mutex_unlock(&lock);
    if (status == 0 && bound != context && (status = cuCtxSetCurrent(context)) == 0) bound = context;
    return status;
}

#define READY()                                         \
    do {                                                \
        CUresult ready_status = ready();                \
        if (ready_status != 0) return done(ready_status); \
    } while (0)

API cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL) return done(cudaErrorInvalidValue);
    CUresult status = driver();
    *count = status == 0 ? device_count : 0;
    return done(status != 0 ? status : device_count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

API cudaError_t cudaSetDevice(int device) {
    CUresult status = driver();
    if (status != 0) return done(status);
    if (device < 0 || device >= device_count) return done(cudaErrorInvalidDevice);
    chosen = device;
    return done(ready());
}

API cudaError_t cudaGetDevice(int *device) {
    if (device == NULL) return done(cudaErrorInvalidValue);
    *device = chosen;
    return cudaSuccess;
}

API cudaError_t cudaDriverGetVersion(int *version) {
    if (version == NULL) return done(cudaErrorInvalidValue);
    CUresult status = cuDriverGetVersion(version);
    if (status != 0) *version = 0;
    return done(status);
}

API cudaError_t cudaRuntimeGetVersion(int *version) {
    if (version == NULL) return done(cudaErrorInvalidValue);
    *version = RUNTIME_VERSION;
    return cudaSuccess;
}

API cudaError_t cudaDeviceSynchronize(void) {
    READY();
    return done(cuCtxSynchronize());
}
API cudaError_t cudaThreadSynchronize(void) { return cudaDeviceSynchronize(); }

/* Attributes of features this runtime refuses (mapped and registered host memory, managed memory,
 * memory pools, IPC, cooperative and cluster launches): 0 whatever the card can, so that a program
 * that asks before it uses one takes its other path. */
static const int refused_features[] = {19, 83, 88, 89, 91, 95, 96, 99, 100, 101, 113, 115, 120, 125};

static CUresult attribute_of(int *value, int attribute, int device) {
    for (size_t i = 0; i < sizeof refused_features / sizeof *refused_features; i++)
        if (refused_features[i] == attribute) return *value = 0, CUDA_SUCCESS_;
    return cuDeviceGetAttribute(value, attribute, device);
}

API cudaError_t cudaDeviceGetAttribute(int *value, int attribute, int device) {
    if (value == NULL) return done(cudaErrorInvalidValue);
    CUresult status = driver();
    if (status != 0) return done(status);
    if (device < 0 || device >= device_count) return done(cudaErrorInvalidDevice);
    return done(attribute_of(value, attribute, device)); /* cudaDeviceAttr numbers are the driver's */
}

/* Which driver attribute answers which int field of struct cudaDeviceProp (size: 4 or 8 bytes). */
#define FIELD(member, attribute) {offsetof(struct cudaDeviceProp, member), sizeof(((struct cudaDeviceProp *)0)->member), attribute}
static const struct {
    size_t offset, size;
    int attribute;
} property_attributes[] = {
    FIELD(sharedMemPerBlock, 8), FIELD(regsPerBlock, 12), FIELD(warpSize, 10), FIELD(memPitch, 11),
    FIELD(maxThreadsPerBlock, 1), FIELD(maxThreadsDim[0], 2), FIELD(maxThreadsDim[1], 3), FIELD(maxThreadsDim[2], 4),
    FIELD(maxGridSize[0], 5), FIELD(maxGridSize[1], 6), FIELD(maxGridSize[2], 7), FIELD(clockRate, 13),
    FIELD(totalConstMem, 9), FIELD(major, 75), FIELD(minor, 76), FIELD(textureAlignment, 14),
    FIELD(texturePitchAlignment, 51), FIELD(deviceOverlap, 15), FIELD(multiProcessorCount, 16),
    FIELD(kernelExecTimeoutEnabled, 17), FIELD(integrated, 18), FIELD(canMapHostMemory, 19), FIELD(computeMode, 20),
    FIELD(maxTexture1D, 21), FIELD(maxTexture2D[0], 22), FIELD(maxTexture2D[1], 23), FIELD(maxTexture3D[0], 24),
    FIELD(maxTexture3D[1], 25), FIELD(maxTexture3D[2], 26), FIELD(surfaceAlignment, 30),
    FIELD(concurrentKernels, 31), FIELD(ECCEnabled, 32), FIELD(pciBusID, 33), FIELD(pciDeviceID, 34),
    FIELD(pciDomainID, 50), FIELD(tccDriver, 35), FIELD(asyncEngineCount, 40), FIELD(unifiedAddressing, 41),
    FIELD(memoryClockRate, 36), FIELD(memoryBusWidth, 37), FIELD(l2CacheSize, 38),
    FIELD(persistingL2CacheMaxSize, 108), FIELD(maxThreadsPerMultiProcessor, 39),
    FIELD(streamPrioritiesSupported, 78), FIELD(globalL1CacheSupported, 79), FIELD(localL1CacheSupported, 80),
    FIELD(sharedMemPerMultiprocessor, 81), FIELD(regsPerMultiprocessor, 82), FIELD(managedMemory, 83),
    FIELD(isMultiGpuBoard, 84), FIELD(multiGpuBoardGroupID, 85), FIELD(hostNativeAtomicSupported, 86),
    FIELD(singleToDoublePrecisionPerfRatio, 87), FIELD(pageableMemoryAccess, 88),
    FIELD(concurrentManagedAccess, 89), FIELD(computePreemptionSupported, 90),
    FIELD(canUseHostPointerForRegisteredMem, 91), FIELD(cooperativeLaunch, 95),
    FIELD(cooperativeMultiDeviceLaunch, 96), FIELD(sharedMemPerBlockOptin, 97),
    FIELD(pageableMemoryAccessUsesHostPageTables, 100), FIELD(directManagedMemAccessFromHost, 101),
    FIELD(maxBlocksPerMultiProcessor, 106), FIELD(accessPolicyMaxWindowSize, 109),
    FIELD(reservedSharedMemPerBlock, 111), FIELD(hostRegisterSupported, 99), FIELD(sparseCudaArraySupported, 112),
    FIELD(hostRegisterReadOnlySupported, 113), FIELD(timelineSemaphoreInteropSupported, 114),
    FIELD(memoryPoolsSupported, 115), FIELD(gpuDirectRDMASupported, 116),
    FIELD(gpuDirectRDMAFlushWritesOptions, 117), FIELD(gpuDirectRDMAWritesOrdering, 118),
    FIELD(memoryPoolSupportedHandleTypes, 119), FIELD(deferredMappingCudaArraySupported, 121),
    FIELD(ipcEventSupported, 125), FIELD(clusterLaunch, 120), FIELD(unifiedFunctionPointers, 129),
};

/* The properties are asked of the driver once per device (an attribute each: a round trip to the
 * server through the client), then copied from what was kept. */
static struct cudaDeviceProp *properties_of[MAX_DEVICES];

static CUresult read_properties(struct cudaDeviceProp *out, int device) {
    memset(out, 0, sizeof *out);
    CUresult status = cuDeviceGetName(out->name, sizeof out->name, device);
    if (status == 0) status = cuDeviceGetUuid(&out->uuid, device);
    if (status == 0) status = cuDeviceTotalMem_v2(&out->totalGlobalMem, device);
    for (size_t i = 0; status == 0 && i < sizeof property_attributes / sizeof *property_attributes; i++) {
        int value = 0;
        status = attribute_of(&value, property_attributes[i].attribute, device);
        if (status == 801 /* the driver does not know it: left zero */) status = 0, value = 0;
        char *field = (char *)out + property_attributes[i].offset;
        if (property_attributes[i].size == 8) {
            size_t wide = (size_t)(unsigned)value;
            memcpy(field, &wide, 8);
        } else {
            memcpy(field, &value, 4);
        }
    }
    return status;
}

API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *properties, int device) {
    if (properties == NULL) return done(cudaErrorInvalidValue);
    CUresult status = driver();
    if (status != 0) return done(status);
    if (device < 0 || device >= device_count) return done(cudaErrorInvalidDevice);
    pthread_mutex_lock(&lock);
    struct cudaDeviceProp *kept = properties_of[device];
    pthread_mutex_unlock(&lock);
    if (kept == NULL) {
        if ((kept = malloc(sizeof *kept)) == NULL) return done(cudaErrorMemoryAllocation);
        if ((status = read_properties(kept, device)) != 0) return free(kept), done(status);
        pthread_mutex_lock(&lock);
        if (properties_of[device] == NULL) properties_of[device] = kept;
        else free(kept), kept = properties_of[device];
        pthread_mutex_unlock(&lock);
    }
    memcpy(properties, kept, sizeof *properties);
    return cudaSuccess;
}
API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *properties, int device) {
    return cudaGetDeviceProperties_v2(properties, device);
}

/* ------------------------------------------------------------------------------------ memory */
/* cudaMalloc's allocations, so that cudaMemcpyDefault and cudaPointerGetAttributes can tell a
 * device pointer from a host one (over the network no driver can: the pointers are the server's). */
struct allocation {
    CUdeviceptr base;
    size_t bytes;
    int of_module; /* a module's global (a device variable's), not cudaMalloc's */
    int device;    /* the device it is on (cudaDeviceReset frees the current device's) */
};
static struct allocation *allocations;
static size_t allocation_count, allocation_room;

/* The recorded allocation pointer lies inside, NULL for none (with lock held). */
static const struct allocation *allocation_at(const void *pointer) {
    CUdeviceptr address = (CUdeviceptr)(uintptr_t)pointer;
    for (size_t i = 0; i < allocation_count; i++)
        if (address >= allocations[i].base && address - allocations[i].base < allocations[i].bytes)
            return &allocations[i];
    return NULL;
}

static int on_device(const void *pointer) {
    pthread_mutex_lock(&lock);
    int found = allocation_at(pointer) != NULL;
    pthread_mutex_unlock(&lock);
    return found;
}

/* Keep an allocation in the record (with lock held); 0, or -1 when no memory was left for it. */
static int remember(CUdeviceptr base, size_t bytes, int of_module, int device) {
    if (allocation_count == allocation_room) {
        size_t room = allocation_room ? 2 * allocation_room : 64;
        struct allocation *grown = realloc(allocations, room * sizeof *grown);
        if (grown == NULL) return -1;
        allocations = grown, allocation_room = room;
    }
    allocations[allocation_count++] = (struct allocation){base, bytes, of_module, device};
    return 0;
}

/* Drop the allocation at base from the record (with lock held). */
static void forget(CUdeviceptr base) {
    for (size_t i = 0; base != 0 && i < allocation_count; i++)
        if (allocations[i].base == base) {
            allocations[i] = allocations[--allocation_count];
            return;
        }
}

API cudaError_t cudaMalloc(void **pointer, size_t bytes) {
    if (pointer == NULL) return done(cudaErrorInvalidValue);
    READY();
    *pointer = NULL;
    if (bytes == 0) return cudaSuccess;
    CUdeviceptr got = 0;
    CUresult status = cuMemAlloc_v2(&got, bytes);
    if (status != 0) return done(status);
    pthread_mutex_lock(&lock);
    int kept = remember(got, bytes, 0, chosen);
    pthread_mutex_unlock(&lock);
    if (kept != 0) return cuMemFree_v2(got), done(cudaErrorMemoryAllocation);
    *pointer = (void *)(uintptr_t)got;
    return cudaSuccess;
}

/* cudaFree(0) only makes the device's context (what programs call it for). */
API cudaError_t cudaFree(void *pointer) {
    READY();
    if (pointer == NULL) return cudaSuccess;
    CUdeviceptr address = (CUdeviceptr)(uintptr_t)pointer;
    CUresult status = cuMemFree_v2(address);
    if (status != 0) return done(status);
    pthread_mutex_lock(&lock);
    forget(address);
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* Page-locked host memory (cudaMallocHost, cudaHostAlloc), so that cudaPointerGetAttributes can
 * tell it from a program's own memory: its start, size and the device current when it was made. */
struct host_allocation {
    const char *base;
    size_t bytes;
    int device;
};
static struct host_allocation *host_allocations;
static size_t host_allocation_count, host_allocation_room;

/* Keep page-locked memory the driver gave in the record; 0, or -1 when no memory was left for it. */
static int remember_host(void *base, size_t bytes) {
    int kept = 0;
    pthread_mutex_lock(&lock);
    if (host_allocation_count == host_allocation_room) {
        size_t room = host_allocation_room ? 2 * host_allocation_room : 16;
        struct host_allocation *grown = realloc(host_allocations, room * sizeof *grown);
        if (grown == NULL) kept = -1;
        else host_allocations = grown, host_allocation_room = room;
    }
    if (kept == 0) host_allocations[host_allocation_count++] = (struct host_allocation){base, bytes, chosen};
    pthread_mutex_unlock(&lock);
    return kept;
}

static cudaError_t host_allocated(void **pointer, size_t bytes, CUresult status) {
    if (status != 0 || *pointer == NULL) return done(status);
    if (remember_host(*pointer, bytes) != 0) return cuMemFreeHost(*pointer), *pointer = NULL, done(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

API cudaError_t cudaMallocHost(void **pointer, size_t bytes) {
    if (pointer == NULL) return done(cudaErrorInvalidValue);
    READY();
    return host_allocated(pointer, bytes, cuMemAllocHost_v2(pointer, bytes));
}
API cudaError_t cudaHostAlloc(void **pointer, size_t bytes, unsigned int flags) {
    if (pointer == NULL) return done(cudaErrorInvalidValue);
    READY();
    /* cudaHostAlloc* flags are the driver's */
    return host_allocated(pointer, bytes, cuMemHostAlloc(pointer, bytes, flags));
}
API cudaError_t cudaFreeHost(void *pointer) {
    READY();
    CUresult status = cuMemFreeHost(pointer);
    if (status != 0 || pointer == NULL) return done(status);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < host_allocation_count; i++)
        if (host_allocations[i].base == pointer) {
            host_allocations[i] = host_allocations[--host_allocation_count];
            break;
        }
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* struct cudaPointerAttributes of CUDA 12 (driver_types.h of the 12.x runtime wheel the tests build
 * against: type, device, devicePointer, hostPointer, nothing after). */
struct cudaPointerAttributes {
    int type; /* enum cudaMemoryType */
    int device;
    void *devicePointer;
    void *hostPointer;
};
_Static_assert(sizeof(struct cudaPointerAttributes) == 24, "struct cudaPointerAttributes of CUDA 12 is 24 bytes");
enum { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2 };
#define INVALID_DEVICE_ID (-2) /* driver_types.h's cudaInvalidDeviceId */

/* Answered from this runtime's own records, asking the server nothing. What NVIDIA documents
 * (cuda_runtime_api.h 12.x, the note on cudaPointerGetAttributes): since CUDA 11 a host pointer
 * CUDA does not know is answered with success and type cudaMemoryTypeUnregistered, not an error;
 * for host memory, device is the device that was current when it was allocated; devicePointer and
 * hostPointer are NULL when no such access exists (driver_types.h also warns that for unregistered
 * memory hostPointer may be an invalid pointer: it is the pointer passed, unchecked). So:
 *  - inside a cudaMalloc allocation or a registered variable on a device: device memory of that
 *    device, devicePointer the pointer, hostPointer NULL;
 *  - inside cudaMallocHost/cudaHostAlloc memory: host memory of the device current at its
 *    allocation, hostPointer the pointer, devicePointer NULL (NVIDIA's gives the device alias;
 *    here page-locked memory is the client's, which the remote GPU cannot read: mapped host memory
 *    is refused);
 *  - anything else: unregistered, device cudaInvalidDeviceId, devicePointer NULL, hostPointer the
 *    pointer, cudaSuccess. */
API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *pointer) {
    if (attributes == NULL) return done(cudaErrorInvalidValue);
    struct cudaPointerAttributes found = {cudaMemoryTypeUnregistered, INVALID_DEVICE_ID, NULL, (void *)pointer};
    pthread_mutex_lock(&lock);
    const struct allocation *allocation = allocation_at(pointer);
    if (allocation != NULL)
        found = (struct cudaPointerAttributes){cudaMemoryTypeDevice, allocation->device, (void *)pointer, NULL};
    for (size_t i = 0; found.type == cudaMemoryTypeUnregistered && i < host_allocation_count; i++)
        if ((uintptr_t)pointer >= (uintptr_t)host_allocations[i].base &&
            (uintptr_t)pointer - (uintptr_t)host_allocations[i].base < host_allocations[i].bytes)
            found = (struct cudaPointerAttributes){cudaMemoryTypeHost, host_allocations[i].device, NULL, (void *)pointer};
    pthread_mutex_unlock(&lock);
    *attributes = found;
    return cudaSuccess;
}

API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    if (free_bytes == NULL || total == NULL) return done(cudaErrorInvalidValue);
    READY();
    return done(cuMemGetInfo_v2(free_bytes, total));
}

/* The runtime's default streams (legacy, per-thread) are the driver's NULL stream here. */
static CUstream native(cudaStream_t stream) {
    return stream == STREAM_LEGACY || stream == STREAM_PER_THREAD ? NULL : stream;
}

static cudaError_t copy(void *dst, const void *src, size_t bytes, int kind, cudaStream_t stream, int async) {
    if (bytes == 0) return cudaSuccess;
    if (dst == NULL || src == NULL) return done(cudaErrorInvalidValue);
    if (kind == cudaMemcpyDefault)
        kind = on_device(src) ? (on_device(dst) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                              : (on_device(dst) ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    CUdeviceptr to = (CUdeviceptr)(uintptr_t)dst, from = (CUdeviceptr)(uintptr_t)src;
    CUstream s = native(stream);
    switch (kind) {
    case cudaMemcpyHostToHost: memmove(dst, src, bytes); return cudaSuccess;
    case cudaMemcpyHostToDevice: READY(); return done(async ? cuMemcpyHtoDAsync_v2(to, src, bytes, s) : cuMemcpyHtoD_v2(to, src, bytes));
    case cudaMemcpyDeviceToHost: READY(); return done(async ? cuMemcpyDtoHAsync_v2(dst, from, bytes, s) : cuMemcpyDtoH_v2(dst, from, bytes));
    case cudaMemcpyDeviceToDevice: READY(); return done(async ? cuMemcpyDtoDAsync_v2(to, from, bytes, s) : cuMemcpyDtoD_v2(to, from, bytes));
    default: return done(cudaErrorInvalidMemcpyDirection);
    }
}

API cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, int kind) {
    return copy(dst, src, bytes, kind, NULL, 0);
}
API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, cudaStream_t stream) {
    return copy(dst, src, bytes, kind, stream, 1);
}

API cudaError_t cudaMemset(void *pointer, int value, size_t bytes) {
    READY();
    return done(cuMemsetD8_v2((CUdeviceptr)(uintptr_t)pointer, (unsigned char)value, bytes));
}
API cudaError_t cudaMemsetAsync(void *pointer, int value, size_t bytes, cudaStream_t stream) {
    READY();
    return done(cuMemsetD8Async((CUdeviceptr)(uintptr_t)pointer, (unsigned char)value, bytes, native(stream)));
}

/* --------------------------------------------------------------------------- streams, events */
/* cudaStream* and cudaEvent* flags have the driver's values. */
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (stream == NULL) return done(cudaErrorInvalidValue);
    READY();
    return done(cuStreamCreate(stream, flags));
}
API cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }
API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
    if (stream == NULL) return done(cudaErrorInvalidValue);
    READY();
    return done(cuStreamCreateWithPriority(stream, flags, priority));
}
API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    READY();
    return done(cuStreamDestroy_v2(stream));
}
API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    READY();
    return done(cuStreamSynchronize(native(stream)));
}
API cudaError_t cudaStreamQuery(cudaStream_t stream) {
    READY();
    return done(cuStreamQuery(native(stream)));
}
API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    READY();
    return done(cuStreamWaitEvent(native(stream), event, flags));
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (event == NULL) return done(cudaErrorInvalidValue);
    READY();
    return done(cuEventCreate(event, flags));
}
API cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    READY();
    return done(cuEventRecord(event, native(stream)));
}
API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    READY();
    return done(cuEventSynchronize(event));
}
API cudaError_t cudaEventQuery(cudaEvent_t event) {
    READY();
    return done(cuEventQuery(event));
}
API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start_event, cudaEvent_t end_event) {
    if (ms == NULL) return done(cudaErrorInvalidValue);
    READY();
    return done(cuEventElapsedTime(ms, start_event, end_event));
}
API cudaError_t cudaEventDestroy(cudaEvent_t event) {
    READY();
    return done(cuEventDestroy_v2(event));
}

/* ------------------------------------------------------------------ nvcc's registration ABI */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
struct fatbin_wrapper { /* what nvcc's host code hands __cudaRegisterFatBinary */
    uint32_t magic, version;
    const void *data;
    const void *unused;
};

/* A registered fatbin: its image, loaded on each device at its first use there (a module belongs
 * to the context it was loaded in: device 1's launch needs device 1's module). */
struct image {
    const void *data;
    CUmodule module[MAX_DEVICES];
    CUresult load_status[MAX_DEVICES]; /* per device; -1: not tried */
};

/* A registered kernel: the host function nvcc's stub passes to cudaLaunchKernel, its device name. */
struct kernel {
    const void *host;
    struct image *image;
    char *name;
    CUfunction function[MAX_DEVICES]; /* per device, from its module */
    struct kernel *next;
};
static struct kernel *kernels;

/* A registered device variable (__device__, __constant__): its host shadow's address, which the
 * symbol calls take, and its device name; its device address is the loaded module's global. */
struct variable {
    const void *host;
    struct image *image;
    char *name;
    size_t bytes;
    CUdeviceptr address[MAX_DEVICES]; /* per device, its module's global; 0: not asked yet */
    struct variable *next;
};
static struct variable *variables;

/* Unload a registered fatbin's module on a device, if loaded there; its next use there loads it
 * again. Unloaded with that device's context current (a module is its context's), then the
 * thread's own context again (both local to the client: no round trip). Called with lock held. */
static CUresult unload(struct image *image, int device) {
    CUresult status = 0;
    if (image->load_status[device] == 0) {
        CUcontext was = NULL;
        int switched = cuCtxGetCurrent(&was) == 0 && primary[device] != NULL && was != primary[device] &&
                       cuCtxSetCurrent(primary[device]) == 0;
        status = cuModuleUnload(image->module[device]);
        if (switched) cuCtxSetCurrent(was);
    }
    image->load_status[device] = -1, image->module[device] = NULL;
    return status;
}

API void **__cudaRegisterFatBinary(void *wrapper) {
    struct image *image = calloc(1, sizeof *image);
    if (image == NULL) return NULL;
    const struct fatbin_wrapper *w = wrapper;
    image->data = w != NULL && w->magic == FATBIN_WRAPPER_MAGIC ? w->data : wrapper;
    for (int d = 0; d < MAX_DEVICES; d++) image->load_status[d] = -1;
    return (void **)image;
}

API void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }

API void __cudaUnregisterFatBinary(void **handle) {
    struct image *image = (struct image *)handle;
    if (image == NULL) return;
    pthread_mutex_lock(&lock);
    for (struct kernel **k = &kernels; *k != NULL;) {
        if ((*k)->image != image) {
            k = &(*k)->next;
            continue;
        }
        struct kernel *gone = *k;
        *k = gone->next;
        free(gone->name), free(gone);
    }
    for (struct variable **v = &variables; *v != NULL;) {
        if ((*v)->image != image) {
            v = &(*v)->next;
            continue;
        }
        struct variable *gone = *v;
        *v = gone->next;
        for (int d = 0; d < MAX_DEVICES; d++) forget(gone->address[d]);
        free(gone->name), free(gone);
    }
    for (int d = 0; d < MAX_DEVICES; d++) unload(image, d); /* the server also drops them when the connection ends */
    pthread_mutex_unlock(&lock);
    free(image);
}

API void __cudaRegisterFunction(void **handle, const char *host, char *device_function, const char *device_name,
                                int thread_limit, void *thread_id, void *block_id, void *block_dim, void *grid_dim,
                                int *warp_size) {
    (void)device_function, (void)thread_limit, (void)thread_id, (void)block_id, (void)block_dim, (void)grid_dim;
    (void)warp_size;
    struct kernel *kernel = calloc(1, sizeof *kernel);
    if (handle == NULL || host == NULL || device_name == NULL || kernel == NULL) return free(kernel);
    if ((kernel->name = strdup(device_name)) == NULL) return free(kernel);
    kernel->host = host, kernel->image = (struct image *)handle;
    pthread_mutex_lock(&lock);
    kernel->next = kernels, kernels = kernel;
    pthread_mutex_unlock(&lock);
}

API void __cudaRegisterVar(void **handle, char *host, char *device_address, const char *device_name, int external,
                           size_t bytes, int constant, int global) {
    (void)device_address, (void)external, (void)constant, (void)global;
    struct variable *variable = calloc(1, sizeof *variable);
    if (handle == NULL || host == NULL || device_name == NULL || variable == NULL) return free(variable);
    if ((variable->name = strdup(device_name)) == NULL) return free(variable);
    variable->host = host, variable->image = (struct image *)handle, variable->bytes = bytes;
    pthread_mutex_lock(&lock);
    variable->next = variables, variables = variable;
    pthread_mutex_unlock(&lock);
}

/* <<<grid, block, shared, stream>>>: nvcc's code pushes the configuration, its stub pops it. */
struct configuration {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};
static __thread struct configuration configurations[MAX_CONFIGURATIONS];
static __thread int configured;

API unsigned int __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, cudaStream_t stream) {
    if (configured == MAX_CONFIGURATIONS) return 1;
    configurations[configured++] = (struct configuration){grid, block, shared, stream};
    return 0;
}

API cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, void *stream) {
    if (configured == 0) return done(cudaErrorMissingConfiguration);
    struct configuration *c = &configurations[--configured];
    if (grid != NULL) *grid = c->grid;
    if (block != NULL) *block = c->block;
    if (shared != NULL) *shared = c->shared;
    if (stream != NULL) *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* A registered fatbin's module on the chosen device (whose context ready() made current): loaded at
 * the first use of any of its kernels or variables there (the load's error is kept per device, and
 * every use of them on that device returns it). Called with lock held. */
static CUresult loaded(struct image *image) {
    if (image->load_status[chosen] == -1)
        image->load_status[chosen] = cuModuleLoadData(&image->module[chosen], image->data);
    return image->load_status[chosen];
}

/* The driver's function of a registered kernel on the chosen device, from that device's module. */
static CUresult function_of(const void *host, CUfunction *function) {
    struct kernel *kernel = kernels;
    while (kernel != NULL && kernel->host != host) kernel = kernel->next;
    if (kernel == NULL) return cudaErrorInvalidDeviceFunction;
    if (kernel->function[chosen] != NULL) return *function = kernel->function[chosen], 0;
    CUresult status = loaded(kernel->image);
    if (status != 0) return status;
    status = cuModuleGetFunction(&kernel->function[chosen], kernel->image->module[chosen], kernel->name);
    if (status == 0) *function = kernel->function[chosen];
    return status;
}

/* The driver's function of a registered kernel, its module loaded (cudaFuncGetAttributes & co.). */
static CUresult function_for(const void *host, CUfunction *function) {
    CUresult status = ready();
    if (status != 0) return status;
    pthread_mutex_lock(&lock);
    status = function_of(host, function);
    pthread_mutex_unlock(&lock);
    return status;
}

API cudaError_t cudaLaunchKernel(const void *host, dim3 grid, dim3 block, void **args, size_t shared,
                                 cudaStream_t stream) {
    if (shared > UINT_MAX) return done(cudaErrorInvalidValue); /* the driver's parameter is 32 bits */
    CUfunction function = NULL;
    CUresult status = function_for(host, &function);
    if (status != 0) return done(status);
    return done(cuLaunchKernel(function, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned int)shared,
                               native(stream), args, NULL));
}

/* The device address and size of a registered variable on the chosen device, named by its host
 * shadow's address: its fatbin loaded there, that module's global asked once, and kept in the record of allocations so that
 * cudaMemcpyDefault knows it for the device's. */
static CUresult symbol_of(const void *host, CUdeviceptr *address, size_t *bytes) {
    CUresult status = ready();
    if (status != 0) return status;
    pthread_mutex_lock(&lock);
    struct variable *variable = variables;
    while (variable != NULL && variable->host != host) variable = variable->next;
    CUdeviceptr *on_chosen = variable != NULL ? &variable->address[chosen] : NULL;
    if (variable == NULL) status = cudaErrorInvalidSymbol;
    else if (*on_chosen == 0 && (status = loaded(variable->image)) == 0) {
        size_t size = 0;
        status = cuModuleGetGlobal_v2(on_chosen, &size, variable->image->module[chosen], variable->name);
        if (status == 0 && size > 0) variable->bytes = size;
        if (status == 0 && remember(*on_chosen, variable->bytes, 1, chosen) != 0) status = cudaErrorMemoryAllocation;
        if (status != 0) *on_chosen = 0;
    }
    if (status == 0) *address = *on_chosen, *bytes = variable->bytes;
    pthread_mutex_unlock(&lock);
    return status == 500 /* CUDA_ERROR_NOT_FOUND: the image has no such global */ ? cudaErrorInvalidSymbol : status;
}

API cudaError_t cudaGetSymbolAddress(void **pointer, const void *symbol) {
    if (pointer == NULL) return done(cudaErrorInvalidValue);
    CUdeviceptr address = 0;
    size_t bytes = 0;
    CUresult status = symbol_of(symbol, &address, &bytes);
    if (status == 0) *pointer = (void *)(uintptr_t)address;
    return done(status);
}

API cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol) {
    if (size == NULL) return done(cudaErrorInvalidValue);
    CUdeviceptr address = 0;
    return done(symbol_of(symbol, &address, size));
}

/* A copy to or from a variable: host to device or device to device (kind), within the variable. */
static cudaError_t symbol_copy(const void *symbol, void *memory, size_t count, size_t offset, int kind, int to_symbol,
                               cudaStream_t stream, int async) {
    CUdeviceptr address = 0;
    size_t bytes = 0;
    CUresult status = symbol_of(symbol, &address, &bytes);
    if (status != 0) return done(status);
    if (offset > bytes || count > bytes - offset) return done(cudaErrorInvalidValue);
    void *device = (void *)(uintptr_t)(address + offset);
    if (kind == cudaMemcpyDefault) kind = on_device(memory) ? cudaMemcpyDeviceToDevice : -1;
    if (kind == -1) kind = to_symbol ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    int from_host = kind == cudaMemcpyHostToDevice, to_host = kind == cudaMemcpyDeviceToHost;
    if (!(kind == cudaMemcpyDeviceToDevice || (to_symbol ? from_host : to_host)))
        return done(cudaErrorInvalidMemcpyDirection);
    return to_symbol ? copy(device, memory, count, kind, stream, async) : copy(memory, device, count, kind, stream, async);
}

API cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset, int kind) {
    return symbol_copy(symbol, (void *)(uintptr_t)src, count, offset, kind, 1, NULL, 0);
}
API cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset, int kind) {
    return symbol_copy(symbol, dst, count, offset, kind, 0, NULL, 0);
}
API cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count, size_t offset, int kind,
                                        cudaStream_t stream) {
    return symbol_copy(symbol, (void *)(uintptr_t)src, count, offset, kind, 1, stream, 1);
}
API cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset, int kind,
                                          cudaStream_t stream) {
    return symbol_copy(symbol, dst, count, offset, kind, 0, stream, 1);
}

/* struct cudaFuncAttributes of CUDA 12 (driver_types.h's layout). */
struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, cacheModeCA, maxDynamicSharedSizeBytes;
    int preferredShmemCarveout, clusterDimMustBeSet, requiredClusterWidth, requiredClusterHeight;
    int requiredClusterDepth, clusterSchedulingPolicyPreference, nonPortableClusterSizeAllowed;
    int reserved[16];
};
_Static_assert(sizeof(struct cudaFuncAttributes) == 144, "struct cudaFuncAttributes of CUDA 12 is 144 bytes");

#define FUNCTION_FIELD(member, attribute) \
    {offsetof(struct cudaFuncAttributes, member), sizeof(((struct cudaFuncAttributes *)0)->member), attribute}
static const struct {
    size_t offset, size;
    int attribute; /* CUfunction_attribute: the runtime's cudaFuncAttribute numbers are the same */
} function_attributes[] = {
    FUNCTION_FIELD(maxThreadsPerBlock, 0), FUNCTION_FIELD(sharedSizeBytes, 1), FUNCTION_FIELD(constSizeBytes, 2),
    FUNCTION_FIELD(localSizeBytes, 3), FUNCTION_FIELD(numRegs, 4), FUNCTION_FIELD(ptxVersion, 5),
    FUNCTION_FIELD(binaryVersion, 6), FUNCTION_FIELD(cacheModeCA, 7), FUNCTION_FIELD(maxDynamicSharedSizeBytes, 8),
    FUNCTION_FIELD(preferredShmemCarveout, 9), FUNCTION_FIELD(clusterDimMustBeSet, 10),
    FUNCTION_FIELD(requiredClusterWidth, 11), FUNCTION_FIELD(requiredClusterHeight, 12),
    FUNCTION_FIELD(requiredClusterDepth, 13), FUNCTION_FIELD(nonPortableClusterSizeAllowed, 14),
    FUNCTION_FIELD(clusterSchedulingPolicyPreference, 15),
};
#define FIRST_CLUSTER_ATTRIBUTE 10 /* CUDA 11.8's: an older driver refuses them, left zero */

API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attributes, const void *host) {
    if (attributes == NULL) return done(cudaErrorInvalidValue);
    CUfunction function = NULL;
    CUresult status = function_for(host, &function);
    if (status != 0) return done(status);
    memset(attributes, 0, sizeof *attributes);
    for (size_t i = 0; status == 0 && i < sizeof function_attributes / sizeof *function_attributes; i++) {
        int value = 0;
        status = cuFuncGetAttribute(&value, function_attributes[i].attribute, function);
        if (status != 0 && function_attributes[i].attribute >= FIRST_CLUSTER_ATTRIBUTE) status = 0, value = 0;
        char *field = (char *)attributes + function_attributes[i].offset;
        if (function_attributes[i].size == 8) {
            size_t wide = (size_t)(unsigned)value;
            memcpy(field, &wide, 8);
        } else {
            memcpy(field, &value, 4);
        }
    }
    return done(status);
}

API cudaError_t cudaFuncSetAttribute(const void *host, int attribute, int value) {
    CUfunction function = NULL;
    CUresult status = function_for(host, &function);
    return done(status != 0 ? status : cuFuncSetAttribute(function, attribute, value));
}

API cudaError_t cudaFuncSetCacheConfig(const void *host, int config) { /* cudaFuncCache values are the driver's */
    CUfunction function = NULL;
    CUresult status = function_for(host, &function);
    return done(status != 0 ? status : cuFuncSetCacheConfig(function, config));
}

API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, const void *host, int block_size,
                                                                      size_t dynamic_shared, unsigned int flags) {
    if (blocks == NULL) return done(cudaErrorInvalidValue);
    CUfunction function = NULL;
    CUresult status = function_for(host, &function);
    if (status == 0) status = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, function, block_size,
                                                                                 dynamic_shared, flags);
    return done(status);
}
API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *host, int block_size,
                                                              size_t dynamic_shared) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, host, block_size, dynamic_shared, 0);
}

/* What this runtime made on the current device, undone, as NVIDIA's reset is of the current device
 * only: cudaMalloc's memory there freed, the registered fatbins' modules there unloaded (loaded
 * again at their next use there); other devices' memory and modules stay. Streams and events made
 * before are not tracked: they stay until the program's connection ends. */
API cudaError_t cudaDeviceReset(void) {
    READY();
    CUresult status = cuCtxSynchronize(), step;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < allocation_count;) {
        if (allocations[i].of_module || allocations[i].device != chosen) {
            i++;
            continue;
        }
        if ((step = cuMemFree_v2(allocations[i].base)) != 0 && status == 0) status = step;
        allocations[i] = allocations[--allocation_count];
    }
    for (struct variable *v = variables; v != NULL; v = v->next) {
        forget(v->address[chosen]);
        v->address[chosen] = 0;
        if ((step = unload(v->image, chosen)) != 0 && status == 0) status = step;
    }
    for (struct kernel *k = kernels; k != NULL; k = k->next) {
        k->function[chosen] = NULL;
        if ((step = unload(k->image, chosen)) != 0 && status == 0) status = step;
    }
    pthread_mutex_unlock(&lock);
    return done(status);
}

/* Stream priorities are not carried (the client creates every stream at the default priority):
 * the range is [0, 0], what a device without priorities answers. */
API cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    READY();
    if (least != NULL) *least = 0;
    if (greatest != NULL) *greatest = 0;
    return cudaSuccess;
}

/* A stream's priority: 0, the only one (cudaDeviceGetStreamPriorityRange's [0, 0]). */
API cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
    if (priority == NULL) return done(cudaErrorInvalidValue);
    READY();
    *priority = 0;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------- stream capture */
/* Capture (cudaStreamBeginCapture and the graph calls) is refused, so no stream is ever capturing:
 * asked, every stream answers cudaStreamCaptureStatusNone (0). PyTorch asks at its CUDA start
 * (at::cuda::assertNotCapturing, making its default random generator) and stops there without an
 * answer. The out values beside the status are zeroed. */
#define CAPTURE_STATUS_NONE 0
static cudaError_t not_capturing(int *status) {
    if (status == NULL) return done(cudaErrorInvalidValue);
    READY();
    *status = CAPTURE_STATUS_NONE;
    return cudaSuccess;
}
API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *status) { return not_capturing(status); }
/* The CUDA 11 form (the 12 headers name the six-argument _v2 cudaStreamGetCaptureInfo). */
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, int *status, unsigned long long *id) {
    if (id != NULL) *id = 0;
    return not_capturing(status);
}
API cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream, int *status, unsigned long long *id, void **graph,
                                            const void **dependencies, size_t *dependency_count) {
    if (id != NULL) *id = 0;
    if (graph != NULL) *graph = NULL;
    if (dependencies != NULL) *dependencies = NULL;
    if (dependency_count != NULL) *dependency_count = 0;
    return not_capturing(status);
}
API cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream, int *status, unsigned long long *id, void **graph,
                                            const void **dependencies, const void **edges, size_t *dependency_count) {
    if (edges != NULL) *edges = NULL;
    return cudaStreamGetCaptureInfo_v2(stream, status, id, graph, dependencies, dependency_count);
}

/* The calling thread's capture mode: kept and exchanged as NVIDIA's runtime does (it only matters
 * while some stream captures, which none does here). */
static __thread int capture_mode; /* cudaStreamCaptureModeGlobal (0), Relaxed (2), ThreadLocal (1) */
API cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode) {
    if (mode == NULL || *mode < 0 || *mode > 2) return done(cudaErrorInvalidValue);
    int previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return cudaSuccess;
}

/* ----------------------------------------------------------------------- driver entry points */
/* The driver's entry points are the GPU client's (cuGetProcAddress_v2): a forwarded call's, or one
 * that returns CUDA_ERROR_NOT_SUPPORTED for a call the client does not carry. The runtime's flags
 * and query results have the driver's values. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *symbol_status);
API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned int version,
                                                 unsigned long long flags, int *query_status) {
    if (symbol == NULL || function == NULL) return done(cudaErrorInvalidValue);
    CUresult status = driver();
    if (status != 0) return done(status);
    int found = 0;
    status = cuGetProcAddress_v2(symbol, function, (int)version, flags, &found);
    if (query_status != NULL) *query_status = found;
    return done(status);
}
API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **function, unsigned long long flags,
                                        int *query_status) {
    return cudaGetDriverEntryPointByVersion(symbol, function, RUNTIME_VERSION, flags, query_status);
}

/* A kernel's handle (cudaKernel_t) is its host stub's address here: nvcc's newer host code asks
 * for it once per kernel (__cudaGetKernel) and launches with it (__cudaLaunchKernel), which is
 * cudaLaunchKernel's launch. */
API cudaError_t cudaGetKernel(void **kernel, const void *host) {
    if (kernel == NULL) return done(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    struct kernel *k = kernels;
    while (k != NULL && k->host != host) k = k->next;
    pthread_mutex_unlock(&lock);
    if (k == NULL) return done(cudaErrorInvalidDeviceFunction);
    *kernel = (void *)(uintptr_t)host;
    return cudaSuccess;
}
API cudaError_t __cudaGetKernel(void **kernel, const void *host) { return cudaGetKernel(kernel, host); }
API cudaError_t __cudaLaunchKernel(const void *kernel, dim3 grid, dim3 block, void **args, size_t shared,
                                   cudaStream_t stream) {
    return cudaLaunchKernel(kernel, grid, block, args, shared, stream);
}

/* ------------------------------------------------------------------------------ the rest */
/* Every other function of NVIDIA's libcudart.so.12: cudaErrorNotSupported, named once on stderr so
 * that a program that stops on it says why. */
static cudaError_t refuse(const char *name, int *told) {
    if (!__atomic_exchange_n(told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "gpupool CUDA runtime: %s is not carried to the GPU: cudaErrorNotSupported\n", name);
    return done(cudaErrorNotSupported);
}
#define REFUSED(name)                    \
    API cudaError_t name(void) {         \
        static int told;                 \
        return refuse(#name, &told);     \
    }
#include "cudart_refused.h"
