/*
 * The few CUDA driver and NVML types the interception library and the stand-in driver use,
 * declared here so that building needs only a C compiler (no CUDA toolkit). Layouts follow the
 * driver ABI of CUDA 11.x-13.x on 64-bit Linux; names match cuda.h / nvml.h so that reading the
 * code against NVIDIA's documentation is direct.
 */
#ifndef GPUPOOL_CUDA_TYPES_H
#define GPUPOOL_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
/* cuCtxCreate_v3's execution-affinity array (CUDA 11.4) and cuCtxCreate_v4's creation parameters
 * (CUDA 12.5): handed to the driver as they are, never read by the library. */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUevent_st *CUevent;

enum { CU_EVENT_DEFAULT = 0, CU_EVENT_DISABLE_TIMING = 2 };
/* cuThreadExchangeStreamCaptureMode: relaxed never refuses a call because of a capture elsewhere. */
enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1, CU_STREAM_CAPTURE_MODE_RELAXED = 2 };

/* cuGetProcAddress flags and results. */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef int CUdriverProcAddressQueryResult;
enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
};

/* Array formats: only the element sizes matter here (see shim_array_bytes). */
typedef int CUarray_format;
enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
};

typedef struct {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

/* The v1 entry points' (CUDA < 3.2) 32-bit pointers and descriptors. */
typedef unsigned int CUdeviceptr_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 };
typedef struct {
    int type;
    int id;
} CUmemLocation;

typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* Sharing VMM allocations between processes (cuMemExportToShareableHandle). */
typedef int CUmemAllocationHandleType;
enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1, CU_MEM_HANDLE_TYPE_FABRIC = 0x8 };
typedef struct {
    unsigned char data[64];
} CUmemFabricHandle;

/* Memory another API allocated, imported into CUDA. */
typedef struct CUextMemory_st *CUexternalMemory;
enum { CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD = 1 };
typedef struct {
    int type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;

/* Memory pools: only the release threshold matters here (how much freed memory a pool keeps). */
typedef int CUmemPool_attribute;
enum { CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4 };
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Graph memory nodes (cuGraphAddMemAllocNode, and cuGraphAddNode with type MEM_ALLOC). */
typedef struct {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;
/* Who may reach memory (cuMemSetAccess, cuMemPoolSetAccess) and the hints and queries that name a
 * device: their enums are plain ints here (only the device they name matters to the library). */
typedef int CUmemAccess_flags;
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };
typedef int CUmemAllocationGranularity_flags;
typedef int CUmem_advise;
typedef int CUdevice_P2PAttribute;
enum { CU_DEVICE_CPU = -1 };
typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;
enum { CU_GRAPH_NODE_TYPE_GRAPH = 4, CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10 };
/* A child graph node: the child is cloned into the parent, or (required for one with memory
 * nodes) moved, after which the parent owns it. */
enum { CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE = 0, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE = 1 };
typedef struct {
    CUgraph graph;
    int ownership;
} CUDA_CHILD_GRAPH_NODE_PARAMS;
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_CHILD_GRAPH_NODE_PARAMS graph;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
    };
    long long reserved2;
} CUgraphNodeParams;
typedef struct {
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
} CUgraphEdgeData;

/* Stream capture: a stream being captured records work into a graph instead of running it. */
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 };
/* Stream handles with a meaning of their own: the legacy NULL stream (never captured) and the
 * calling thread's per-thread default stream, which the _ptsz entry points mean by NULL. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* Inter-process memory handles. */
typedef struct {
    char reserved[64];
} CUipcMemHandle;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* NVML */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_UNKNOWN = 999,
};
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CLOCK_REALTIME, microseconds */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;
#define NVML_DEVICE_UUID_BUFFER_SIZE 80
typedef struct {
    char busIdLegacy[16]; /* "0000:3b:00.0" style, 4-digit domain */
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32]; /* "00000000:3B:00.0": 8-digit domain, upper case */
} nvmlPciInfo_t;

_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
_Static_assert(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size) == 24, "CUDA_EXTERNAL_MEMORY_HANDLE_DESC layout");
_Static_assert(sizeof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC) == 104, "CUDA_EXTERNAL_MEMORY_HANDLE_DESC layout");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams layout");

#endif
