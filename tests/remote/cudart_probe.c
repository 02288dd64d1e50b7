/*
 * A program on NVIDIA's CUDA runtime (libcudart.so.12 of the nvidia-cuda-runtime-cu12 wheel), for
 * tests/remote/test_remote_cudart.py: compiled by gcc against the wheel's cuda_runtime_api.h, run
 * with the GPU client as libcuda.so.1 (the runtime loads the driver by that name). It prints one
 * line saying what each call returned.
 *
 *   cudart_probe version   "version driver <cudaError_t> <version> runtime <cudaError_t> <version>"
 *   cudart_probe calls     the calls a CUDA program makes first, in order, whatever each returns:
 *                          "calls <name>=<cudaError_t> ..." (device count, set device, cudaFree(0),
 *                          properties, malloc, copies both ways, memset, memory info, a stream, two
 *                          events and their elapsed time, device synchronize, cudaMallocHost, free,
 *                          last error), then "values <count> <bytes read back ok: 1/0>"
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

static void say(const char *name, cudaError_t status) { printf(" %s=%d", name, (int)status); }

static int version(void) {
    int driver = -1, runtime = -1;
    cudaError_t d = cudaDriverGetVersion(&driver), r = cudaRuntimeGetVersion(&runtime);
    printf("version driver %d %d runtime %d %d\n", (int)d, driver, (int)r, runtime);
    return 0;
}

static int calls(void) {
    int count = -1;
    float host[256], back[256];
    for (int i = 0; i < 256; i++) host[i] = (float)i, back[i] = -1.0f;
    void *device = NULL, *pinned = NULL;
    size_t free_bytes = 0, total = 0;
    struct cudaDeviceProp properties;
    cudaStream_t stream = NULL;
    cudaEvent_t start = NULL, end = NULL;
    float ms = -1.0f;
    printf("calls");
    say("getDeviceCount", cudaGetDeviceCount(&count));
    say("setDevice", cudaSetDevice(0));
    say("free0", cudaFree(0));
    say("getDeviceProperties", cudaGetDeviceProperties(&properties, 0));
    say("malloc", cudaMalloc(&device, sizeof host));
    say("memcpyToDevice", cudaMemcpy(device, host, sizeof host, cudaMemcpyHostToDevice));
    say("memcpyToHost", cudaMemcpy(back, device, sizeof back, cudaMemcpyDeviceToHost));
    say("memset", cudaMemset(device, 0, sizeof host));
    say("memGetInfo", cudaMemGetInfo(&free_bytes, &total));
    say("streamCreate", cudaStreamCreate(&stream));
    say("eventCreate", cudaEventCreate(&start));
    say("eventRecord", cudaEventRecord(start, stream));
    say("eventCreate2", cudaEventCreate(&end));
    say("eventRecord2", cudaEventRecord(end, stream));
    say("eventSynchronize", cudaEventSynchronize(end));
    say("eventElapsedTime", cudaEventElapsedTime(&ms, start, end));
    say("streamSynchronize", cudaStreamSynchronize(stream));
    say("streamDestroy", cudaStreamDestroy(stream));
    say("deviceSynchronize", cudaDeviceSynchronize());
    say("mallocHost", cudaMallocHost(&pinned, 4096));
    say("freeHost", cudaFreeHost(pinned));
    say("free", cudaFree(device));
    say("getLastError", cudaGetLastError());
    printf("\nvalues %d %d\n", count, memcmp(host, back, sizeof host) == 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "version") == 0) return version();
    if (argc == 2 && strcmp(argv[1], "calls") == 0) return calls();
    fprintf(stderr, "usage: cudart_probe version | calls\n");
    return 2;
}
