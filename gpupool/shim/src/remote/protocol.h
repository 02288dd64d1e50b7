/*
 * The remote GPU wire protocol (docs/remote-gpu.md, "Protocol"): framed messages over one TCP
 * connection per client process. Every frame starts with this 16-byte header, little-endian (the
 * byte order of every platform gpupool builds for; checked at compile time), then `length` bytes
 * of payload whose layout the operation defines. A request carries a call id the reply repeats; a
 * request with FLAG_NO_REPLY gets none (asynchronous calls: launches, copies to the device, memsets,
 * event records) and its error, if any, is returned by the next call that is answered. Replies
 * carry the CUDA error code in `status`.
 */
#ifndef GPUPOOL_REMOTE_PROTOCOL_H
#define GPUPOOL_REMOTE_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the remote GPU protocol is little-endian; this platform is not"
#endif

#define REMOTE_PROTOCOL_VERSION 1u
#define REMOTE_FLAG_NO_REPLY 1u
#define REMOTE_FLAG_HELLO_DEVICES 2u /* on a hello: this client reads the hello's third word, its device count */
#define REMOTE_MAX_SMALL_PAYLOAD (16u << 20) /* any payload but a copy's data and a module's or library's image */
#define REMOTE_MAX_MODULE (256u << 20) /* a module's or a library's image */
#define REMOTE_MAX_COPY (1u << 30)         /* a larger copy is sent as several */
#define REMOTE_MAX_TOKEN 256
#define REMOTE_MAX_PARAM_BYTES 32764u    /* CUDA's limit on a kernel's parameters (12.1+) */
#define REMOTE_MAX_DEVICES 16            /* cards of one share (the client's devices) the server takes */

struct remote_header {
    uint32_t length; /* payload bytes after the header */
    uint16_t op;
    uint16_t flags;
    uint32_t call;
    int32_t status; /* replies: the CUresult; requests: 0 */
};
_Static_assert(sizeof(struct remote_header) == 16, "the header is 16 bytes on the wire");

enum remote_op {
    OP_HELLO = 1,           /* u32 version, token bytes -> u64 version, u64 booked bytes (per card), and with
                               REMOTE_FLAG_HELLO_DEVICES u64 cards (a server from before answers two words) */
    OP_PING = 2,            /* -> nothing: a round trip */
    OP_DRIVER_VERSION = 3,  /* -> i32 */
    OP_DEVICE_NAME = 4,     /* -> name bytes */
    OP_DEVICE_ATTRIBUTE = 5, /* i32 attribute -> i32 */
    OP_DEVICE_UUID = 6,     /* -> 16 bytes */
    OP_CTX_SYNCHRONIZE = 7,
    OP_MEM_ALLOC = 8,       /* u64 bytes -> u64 pointer */
    OP_MEM_FREE = 9,        /* u64 pointer */
    OP_MEM_INFO = 10,       /* -> u64 free, u64 total (of the booked share) */
    OP_COPY_TO_DEVICE = 11, /* u64 dst, u64 stream, data */
    OP_COPY_TO_HOST = 12,   /* u64 src, u64 bytes, u64 stream -> data */
    OP_COPY_ON_DEVICE = 13, /* u64 dst, u64 src, u64 bytes, u64 stream */
    OP_MEMSET = 14,         /* u64 dst, u32 value, u32 element bytes (1, 4), u64 count, u64 stream */
    OP_MODULE_LOAD = 15,    /* image bytes -> u64 module */
    OP_MODULE_UNLOAD = 16,  /* u64 module */
    OP_MODULE_FUNCTION = 17, /* u64 module, name -> u64 function, u32 params (REMOTE_PARAMS_UNKNOWN), u32 offset+size each */
    OP_LAUNCH = 18,         /* u64 function, u32 grid[3], u32 block[3], u32 shared, u64 stream, parameter buffer */
    OP_STREAM_CREATE = 19,  /* u32 flags -> u64 stream */
    OP_STREAM_DESTROY = 20, /* u64 stream */
    OP_STREAM_SYNCHRONIZE = 21, /* u64 stream */
    OP_STREAM_QUERY = 22,   /* u64 stream */
    OP_STREAM_WAIT_EVENT = 23, /* u64 stream, u64 event, u32 flags */
    OP_EVENT_CREATE = 24,   /* u32 flags -> u64 event */
    OP_EVENT_RECORD = 25,   /* u64 event, u64 stream */
    OP_EVENT_SYNCHRONIZE = 26, /* u64 event */
    OP_EVENT_QUERY = 27,    /* u64 event */
    OP_EVENT_ELAPSED = 28,  /* u64 start, u64 end -> f32 milliseconds */
    OP_EVENT_DESTROY = 29,  /* u64 event */
    /* The CUDA 12 library API: a library is loaded as a module is; its kernels answer as functions do. */
    OP_LIBRARY_LOAD = 30,   /* image bytes -> u64 library */
    OP_LIBRARY_UNLOAD = 31, /* u64 library */
    OP_LIBRARY_KERNEL = 32, /* u64 library, name -> u64 kernel, u32 params (REMOTE_PARAMS_UNKNOWN), u32 offset+size each */
    OP_LIBRARY_MODULE = 33, /* u64 library -> u64 module */
    OP_KERNEL_FUNCTION = 34, /* u64 kernel -> u64 function, u32 params (REMOTE_PARAMS_UNKNOWN), u32 offset+size each */
    OP_LIBRARY_GLOBAL = 35, /* u64 library, name -> u64 pointer, u64 bytes */
    /* Attributes and occupancy of a function (a library's kernel cast to CUfunction too) or a kernel. */
    OP_FUNCTION_ATTRIBUTE = 36,     /* u64 function, i32 attribute -> i32 */
    OP_FUNCTION_SET_ATTRIBUTE = 37, /* u64 function, i32 attribute, i32 value */
    OP_FUNCTION_CACHE_CONFIG = 38,  /* u64 function, u32 config */
    OP_KERNEL_ATTRIBUTE = 39,       /* u64 kernel, i32 attribute -> i32 (on the client's card) */
    OP_KERNEL_SET_ATTRIBUTE = 40,   /* u64 kernel, i32 attribute, i32 value */
    OP_KERNEL_CACHE_CONFIG = 41,    /* u64 kernel, u32 config */
    OP_OCCUPANCY_BLOCKS = 42,       /* u64 function, i32 block size, u32 flags, u64 dynamic shared -> i32 blocks */
    OP_OCCUPANCY_BLOCK_SIZE = 43,   /* u64 function, u64 dynamic shared, i32 limit, u32 flags, u32 count,
                                       u64 shared[count]: the program's callback's answer for block sizes
                                       1..count (count 0: no callback) -> i32 min grid, i32 block size */
    OP_MODULE_GLOBAL = 44,          /* u64 module, name -> u64 pointer, u64 bytes */
    /* cuBLAS, run by the server's libcublas (docs/remote-gpu.md, "cuBLAS"): every reply's status is a
     * cublasStatus_t, never a CUDA error. GEMM and VECTOR may come with REMOTE_FLAG_NO_REPLY (a
     * VECTOR dot only into device memory): their error is then kept as a CUDA error for the next
     * answered call, and an answered cuBLAS call that finds one gets CUBLAS_STATUS_EXECUTION_FAILED. */
    OP_CUBLAS_CREATE = 45,          /* -> u64 handle; refused for want of a library: status 1, u32 1 */
    OP_CUBLAS_DESTROY = 46,         /* u64 handle */
    OP_CUBLAS_SET_STREAM = 47,      /* u64 handle, u64 stream */
    OP_CUBLAS_SET_MODE = 48,        /* u64 handle, u32 REMOTE_BLAS_POINTER_MODE or _MATH_MODE, i32 value */
    OP_CUBLAS_SET_WORKSPACE = 49,   /* u64 handle, u64 pointer, u64 bytes */
    OP_CUBLAS_PROPERTY = 50,        /* i32 property (0 major, 1 minor, 2 patch) -> i32 */
    OP_CUBLAS_GEMM = 51,            /* struct remote_gemm */
    OP_CUBLAS_VECTOR = 52,          /* struct remote_vector -> a host result: f64 (dot) */
    /* Shares of several cards of one GPU node (64 up: operations of shares of several cards). */
    OP_SET_DEVICE = 64,             /* u32 the client's device (0 .. cards-1): later calls run on that card */
    OP_LAST = 64,
};
#define REMOTE_BLAS_POINTER_MODE 0u
#define REMOTE_BLAS_MATH_MODE 1u
#define REMOTE_BLAS_NO_LIBRARY 1u /* OP_CUBLAS_CREATE's reason: the server cannot load cuBLAS */

/* One GEMM call of any of cuBLAS's forms (kind). Scalars: in host pointer mode their bytes (by the
 * compute type: 2 to 16), in device pointer mode the device pointers. */
enum remote_gemm_kind {
    GEMM_S = 0, GEMM_D, GEMM_EX, GEMM_S_STRIDED, GEMM_D_STRIDED, GEMM_EX_STRIDED, GEMM_KINDS
};
struct remote_gemm {
    uint64_t handle;
    int32_t kind, transa, transb, m, n, k, a_type, b_type, c_type, compute_type, algo, lda, ldb, ldc, batch, unused;
    int64_t stride_a, stride_b, stride_c;
    uint64_t a, b, c, alpha_pointer, beta_pointer;
    unsigned char alpha[16], beta[16];
};
_Static_assert(sizeof(struct remote_gemm) == 168, "a GEMM request is 168 bytes on the wire");

/* The level 1 and 2 calls carried: y = alpha op(A) x + beta y (gemv), y = alpha x + y (axpy),
 * x = alpha x (scal), x . y (dot: into result, a device pointer in device pointer mode). */
enum remote_vector_kind { VECTOR_SGEMV = 0, VECTOR_DGEMV, VECTOR_SAXPY, VECTOR_SSCAL, VECTOR_SDOT, VECTOR_KINDS };
struct remote_vector {
    uint64_t handle;
    int32_t kind, trans, m, n, lda, incx, incy, unused;
    uint64_t a, x, y, result, alpha_pointer, beta_pointer;
    unsigned char alpha[16], beta[16];
};
_Static_assert(sizeof(struct remote_vector) == 120, "a vector request is 120 bytes on the wire");
#define REMOTE_MAX_SHARED_TABLE 4096u /* block sizes an occupancy callback is asked for */

#define REMOTE_PARAMS_UNKNOWN 0xffffffffu /* the driver cannot say (no cuFuncGetParamInfo) */
#define REMOTE_MAX_PARAMS 1024u

/* CUDA error codes the protocol itself returns (values of the driver API). */
#define REMOTE_ERROR_INVALID_IMAGE 200
#define REMOTE_ERROR_NO_DEVICE 100
#define REMOTE_ERROR_DEVICE_UNAVAILABLE 46 /* connection lost or refused: the server is gone */
#define REMOTE_ERROR_NOT_PERMITTED 800    /* token refused */
#define REMOTE_ERROR_TIMEOUT 909          /* a call passed its deadline; the connection is closed */

#endif
