/*
 * The one header tests/remote/cudart_probe.c needs that the nvidia-cuda-runtime-cu12 wheel lacks:
 * its cuda_runtime_api.h includes crt/host_defines.h, which ships with the compiler (nvcc), not the
 * runtime.
 * For host code compiled by gcc the qualifiers it defines mean nothing: they are defined empty
 * here, alignment as GCC's attribute, default arguments (a C++ nicety) dropped.
 */
#ifndef GPUPOOL_TEST_HOST_DEFINES_H
#define GPUPOOL_TEST_HOST_DEFINES_H
#define __host__
#define __device__
#define __cudart_builtin__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define CUDA_CB
#define __dv(v)
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __align__(n)
#define __CUDA_ALIGN__(n) __align__(n)
#endif
