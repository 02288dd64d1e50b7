/*
 * gpupool's CUDA runtime over a remote share of two cards (tests/remote/test_remote_multicard.py):
 * cudaGetDeviceCount, cudaSetDevice per device, an allocation of the whole share on each device and
 * cudaMemGetInfo per current device. Argument: the booked MiB per card. One line per check.
 */
#include <stdio.h>
#include <stdlib.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *);
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaMemGetInfo(size_t *, size_t *);

int main(int argc, char **argv) {
    size_t booked = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20, free_bytes = 0, total = 0;
    int count = 0, device = -1;
    void *whole[2] = {NULL, NULL};
    cudaError_t counted = cudaGetDeviceCount(&count);
    printf("count %d %d\n", counted, count);
    printf("set 2: %d\n", cudaSetDevice(2));
    for (int i = 0; i < 2; i++) {
        cudaError_t set = cudaSetDevice(i), got = cudaGetDevice(&device), made = cudaMalloc(&whole[i], booked);
        cudaError_t info = cudaMemGetInfo(&free_bytes, &total);
        printf("device %d: set %d get %d malloc %d info %d free %zu total %zu\n", device, set, got, made, info,
               free_bytes, total);
    }
    cudaSetDevice(0);
    void *more = NULL;
    printf("one more on device 0: %d\n", cudaMalloc(&more, 1 << 20));
    return 0;
}
