/*
 * The argument checks of the carried cuBLAS calls (docs/remote-gpu.md, "cuBLAS"), compiled into both
 * gpupool's cuBLAS (cublas.c) and the GPU server (server.c), so that one rule decides what is
 * CUBLAS_STATUS_INVALID_VALUE. The client checks a call before it sends it: a GEMM, gemv, axpy,
 * scal or a dot into device memory is sent without a reply, so what cuBLAS would refuse at once
 * must be refused here at once. The server checks the same again (a frame may come from anyone)
 * and, besides, that every byte a call reaches is the client's: only it knows the allocations.
 */
#ifndef GPUPOOL_REMOTE_BLAS_CHECKS_H
#define GPUPOOL_REMOTE_BLAS_CHECKS_H
#include "protocol.h"

#define REMOTE_MAX_BLAS_HANDLES 1024 /* handles a client may hold at once (the server's table) */
#define BLAS_CHECK_INVALID_VALUE 7   /* CUBLAS_STATUS_INVALID_VALUE */

/* The bytes a column-major rows x cols matrix of leading dimension ld reaches, over batch matrices
 * stride elements apart; -1 when the shape is invalid or would overflow. */
static inline long long blas_matrix_bytes(long long rows, long long cols, long long ld, long long stride,
                                          long long batch, long long element) {
    long long reach, extent;
    if (rows < 0 || cols < 0 || batch < 0 || stride < 0 || ld < (rows > 1 ? rows : 1)) return -1;
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    if (__builtin_mul_overflow(cols - 1, ld, &reach) || __builtin_add_overflow(reach, rows, &reach) ||
        __builtin_mul_overflow(batch - 1, stride, &extent) || __builtin_add_overflow(extent, reach, &extent) ||
        __builtin_mul_overflow(extent, element, &extent))
        return -1;
    return extent;
}

/* A vector of n elements inc apart (a negative inc walks the same memory backwards). */
static inline long long blas_vector_bytes(long long n, long long inc, long long element) {
    return n <= 0 ? 0 : blas_matrix_bytes(1, n, inc < 0 ? -inc : (inc == 0 ? 1 : inc), 0, 1, element);
}

/* Bytes per element of a cudaDataType; 0 for one not known here. */
static inline long long blas_type_bytes(int type) {
    switch (type) {
    case 2: case 14: case 7: case 9: return 2; /* R_16F, R_16BF, C_8I, C_8U */
    case 3: case 8: case 28: case 29: return 1; /* R_8I, R_8U, R_8F_E4M3, R_8F_E5M2 */
    case 0: case 10: case 6: case 15: return 4; /* R_32F, R_32I, C_16F, C_16BF */
    case 1: case 4: case 11: return 8;         /* R_64F, C_32F, C_32I */
    case 5: return 16;                         /* C_64F */
    default: return 0;
    }
}

/* The bytes of one scalar (alpha, beta) of a cublasComputeType_t, complex when the output type is;
 * 0 for a compute type not known here. */
static inline long long blas_scalar_bytes(int compute, int c_type) {
    long long real;
    switch (compute) {
    case 64: case 65: real = 2; break;                                         /* 16F (pedantic) */
    case 68: case 69: case 74: case 75: case 77: case 72: case 73: real = 4; break; /* 32F, its fast forms, 32I */
    case 70: case 71: real = 8; break;                                         /* 64F */
    default: return 0;
    }
    int complex = c_type == 4 || c_type == 5 || c_type == 6 || c_type == 7 || c_type == 9 || c_type == 11 ||
                  c_type == 15;
    return complex ? 2 * real : real;
}

/* What a GEMM reaches: the bytes of A, B and C from their pointers. */
struct blas_reach {
    long long a, b, c;
};

/* 0 and the reach of a GEMM request, or CUBLAS_STATUS_INVALID_VALUE for a shape, transpose, type
 * or leading dimension cuBLAS refuses (or one whose reach overflows). */
static inline int blas_check_gemm(const struct remote_gemm *g, struct blas_reach *reach) {
    int strided = g->kind == GEMM_S_STRIDED || g->kind == GEMM_D_STRIDED || g->kind == GEMM_EX_STRIDED;
    long long batch = strided ? g->batch : 1;
    if (g->kind < 0 || g->kind >= GEMM_KINDS || g->transa < 0 || g->transa > 2 || g->transb < 0 || g->transb > 2 ||
        g->m < 0 || g->n < 0 || g->k < 0 || batch < 0)
        return BLAS_CHECK_INVALID_VALUE;
    long long a_rows = g->transa == 0 ? g->m : g->k, a_cols = g->transa == 0 ? g->k : g->m;
    long long b_rows = g->transb == 0 ? g->k : g->n, b_cols = g->transb == 0 ? g->n : g->k;
    long long a_size = blas_type_bytes(g->a_type), b_size = blas_type_bytes(g->b_type);
    long long c_size = blas_type_bytes(g->c_type);
    long long inner = g->k == 0 ? 0 : 1; /* with k 0, A and B are not read */
    reach->a = blas_matrix_bytes(a_rows * inner, a_cols * inner, g->lda, strided ? g->stride_a : 0, batch, a_size);
    reach->b = blas_matrix_bytes(b_rows * inner, b_cols * inner, g->ldb, strided ? g->stride_b : 0, batch, b_size);
    reach->c = blas_matrix_bytes(g->m, g->n, g->ldc, strided ? g->stride_c : 0, batch, c_size);
    if (a_size == 0 || b_size == 0 || c_size == 0 || g->lda < (a_rows > 1 ? a_rows : 1) ||
        g->ldb < (b_rows > 1 ? b_rows : 1) || reach->a < 0 || reach->b < 0 || reach->c < 0)
        return BLAS_CHECK_INVALID_VALUE;
    long long scalar = blas_scalar_bytes(g->compute_type, g->c_type);
    if (scalar <= 0 || scalar > 16) return BLAS_CHECK_INVALID_VALUE;
    return 0;
}

/* 0 and the reach of a level 1 or 2 request (a: the matrix, b: x, c: y; nothing for scal's y), or
 * CUBLAS_STATUS_INVALID_VALUE. */
static inline int blas_check_vector(const struct remote_vector *v, struct blas_reach *reach) {
    if (v->kind < 0 || v->kind >= VECTOR_KINDS || v->n < 0 || v->m < 0) return BLAS_CHECK_INVALID_VALUE;
    long long element = v->kind == VECTOR_DGEMV ? 8 : 4, x_length = v->n, y_length = v->n;
    reach->a = 0;
    if (v->kind == VECTOR_SGEMV || v->kind == VECTOR_DGEMV) {
        if (v->trans < 0 || v->trans > 2 || v->incx == 0 || v->incy == 0 || v->lda < (v->m > 1 ? v->m : 1))
            return BLAS_CHECK_INVALID_VALUE;
        x_length = v->trans == 0 ? v->n : v->m, y_length = v->trans == 0 ? v->m : v->n;
        reach->a = blas_matrix_bytes(v->m, v->n, v->lda, 0, 1, element);
    }
    reach->b = blas_vector_bytes(x_length, v->incx, element);
    reach->c = v->kind == VECTOR_SSCAL ? 0 : blas_vector_bytes(y_length, v->incy, element);
    if (reach->a < 0 || reach->b < 0 || reach->c < 0) return BLAS_CHECK_INVALID_VALUE;
    return 0;
}
#endif
