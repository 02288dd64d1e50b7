/*
 * The stand-in driver's computing part, so that a program's results can be checked (the remote GPU
 * tests read back what a kernel wrote): device memory an allocation names is backed by host memory
 * the first time a copy, a memset or a kernel touches it (zeroed, given back with the allocation),
 * and a module image the stand-in recognises names built-in kernels that compute on it.
 *
 * Module image: NUL-terminated text whose first line is STANDIN_MODULE_MAGIC, then one kernel name
 * per line out of the built-ins below. Any other image is CUDA_ERROR_INVALID_IMAGE. A function
 * handle of another kind (the interception library's tests launch made-up ones) computes nothing.
 * Built-ins (grid and block are ignored: one launch covers n elements):
 *   vector_add(const float *a, const float *b, float *c, unsigned n)   c[i] = a[i] + b[i]
 *   scale(float *x, float factor, unsigned n)                         x[i] *= factor
 * Their parameter layout is answered by cuFuncGetParamInfo, as the real driver (12.4+) does.
 *
 * Globals: a module's or a library's image may also have lines "global NAME BYTES": a global of
 * that many bytes (zeroed, at most MAX_GLOBALS), taken from the current card's memory when the
 * image loads and given back when it unloads, so a module or library left loaded is seen in the
 * card's used memory (cuModuleGetGlobal_v2, cuLibraryGetGlobal; a library's module has its
 * library's). A library's kernel (cuLibraryGetKernel) is a handle of its own that cuLaunchKernel
 * runs as the built-in's function; cuKernelGetFunction gives the built-in's function.
 *
 * Attributes and occupancy, so that what a GPU client forwards can be checked: each built-in has a
 * register count and the attributes below; cuFuncSetAttribute/cuKernelSetAttribute change the
 * built-in's maximum dynamic shared memory and carveout (for every handle of it: a process's
 * modules share their built-ins). Occupancy follows a card of STANDIN_SM_* limits per
 * multiprocessor, 8 multiprocessors (cuDeviceGetAttribute's), warps of 32 threads.
 *
 * Contexts, as strictly as a real driver: a module belongs to the card whose context was current
 * when it loaded, and each module has functions of its own. cuModuleGetFunction and
 * cuModuleGetGlobal_v2 of a module, and cuLaunchKernel, cuFuncGetAttribute, cuFuncSetAttribute,
 * cuFuncSetCacheConfig, cuFuncGetParamInfo and the occupancy calls of its function, answer
 * CUDA_ERROR_INVALID_HANDLE (400) while another card's context is current, as a real driver answers
 * a function used in another context than its module's (after cudaSetDevice, "invalid resource
 * handle"). A library's module and kernels, and cuKernelGetFunction's function (its module's),
 * belong to no card: CUDA 12 libraries are context-independent. cuModuleUnload takes a module from
 * any context.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#define STANDIN_MODULE_MAGIC "gpupool-standin-module"
#define MAX_BACKINGS 4096
#define MAX_PARAMS 4
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define MAX_GLOBALS 4
#define MAX_GLOBAL_NAME 64

typedef struct {
    char bytes[16];
} CUuuid;

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count);
API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count);
API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream);
API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream);
API CUresult cuModuleLoadData(CUmodule *module, const void *image);
API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, void *options, void **values);
API CUresult cuModuleUnload(CUmodule module);
API CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
API CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t *offset, size_t *size);
API CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
API CUresult cuStreamDestroy_v2(CUstream stream);
API CUresult cuStreamQuery(CUstream stream);
API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
API CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);
API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);

struct builtin {
    const char *name;
    int params;
    size_t offset[MAX_PARAMS], size[MAX_PARAMS];
    int registers; /* per thread */
};

static const struct builtin builtins[] = {
    {"vector_add", 4, {0, 8, 16, 24}, {8, 8, 8, 4}, 32},
    {"scale", 3, {0, 8, 12}, {8, 4, 4}, 64},
};
#define BUILTINS (sizeof builtins / sizeof *builtins)

struct global {
    char name[MAX_GLOBAL_NAME];
    CUdeviceptr pointer;
    uint64_t bytes;
};

/* A module's function: which built-in it runs (NULL: the module has no such kernel). */
struct function {
    const struct builtin *builtin;
};

struct module {
    int has[BUILTINS];
    int of_library; /* a library's module: unloaded with it, never by cuModuleUnload */
    int device;     /* the card of the context it loaded in; -1: a library's, of every context */
    struct function functions[BUILTINS];
    struct global globals[MAX_GLOBALS];
    int global_count;
    struct module *next;
};

struct kernel {
    const struct builtin *builtin; /* NULL: the library has no such kernel */
};

struct library {
    struct module *module; /* its globals are the library's */
    struct kernel kernels[BUILTINS];
    struct library *next;
};

static pthread_mutex_t libraries_lock = PTHREAD_MUTEX_INITIALIZER;
static struct library *libraries; /* loaded, so that a stale or made-up handle is refused */
static struct module *modules;     /* loaded (a library's too), so that a function handle is known */

/* A module taken into the loaded ones, or out of them (forget: 0, -1 when it was not loaded). */
static void remember_module(struct module *module) {
    pthread_mutex_lock(&libraries_lock);
    module->next = modules, modules = module;
    pthread_mutex_unlock(&libraries_lock);
}
static int forget_module(struct module *module) {
    pthread_mutex_lock(&libraries_lock);
    struct module **link = &modules;
    while (*link != NULL && *link != module) link = &(*link)->next;
    int found = *link != NULL;
    if (found) *link = module->next;
    pthread_mutex_unlock(&libraries_lock);
    return found ? 0 : -1;
}

/* Whether a handle of a card's context is used while another card's context is current. */
static int foreign(int device) { return device >= 0 && device != standin_current_device(); }

struct backing {
    uint64_t base, bytes;
    unsigned char *host;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct backing backings[MAX_BACKINGS];

/* Host memory behind [address, address + bytes) of one allocation, or NULL. */
static unsigned char *host_of(uint64_t address, uint64_t bytes) {
    uint64_t base, size;
    if (!standin_allocation_at(address, &base, &size) || address + bytes > base + size || address + bytes < address)
        return NULL;
    unsigned char *found = NULL;
    pthread_mutex_lock(&lock);
    int free_slot = -1;
    for (int i = 0; i < MAX_BACKINGS && found == NULL; i++) {
        if (backings[i].base == base) found = backings[i].host;
        else if (backings[i].base == 0 && free_slot < 0) free_slot = i;
    }
    if (found == NULL && free_slot >= 0 && (found = calloc(1, size)) != NULL)
        backings[free_slot] = (struct backing){base, size, found};
    pthread_mutex_unlock(&lock);
    return found == NULL ? NULL : found + (address - base);
}

void standin_backing_drop(uint64_t base) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BACKINGS; i++) {
        if (backings[i].base != base) continue;
        free(backings[i].host);
        backings[i] = (struct backing){0};
    }
    pthread_mutex_unlock(&lock);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    if (bytes == 0) return CUDA_SUCCESS;
    unsigned char *to = host_of(dst, bytes);
    if (to == NULL || src == NULL) return CUDA_ERROR_INVALID_VALUE;
    memcpy(to, src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return CUDA_SUCCESS;
    const unsigned char *from = host_of(src, bytes);
    if (from == NULL || dst == NULL) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, from, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return CUDA_SUCCESS;
    unsigned char *to = host_of(dst, bytes), *from = host_of(src, bytes);
    if (to == NULL || from == NULL) return CUDA_ERROR_INVALID_VALUE;
    memmove(to, from, bytes);
    return CUDA_SUCCESS;
}

/* The stand-in runs everything at once: the stream-ordered variants are the same copies. */
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    return (void)stream, cuMemcpyHtoD_v2(dst, src, bytes);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    return (void)stream, cuMemcpyDtoH_v2(dst, src, bytes);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    return (void)stream, cuMemcpyDtoD_v2(dst, src, bytes);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
    if (count == 0) return CUDA_SUCCESS;
    unsigned char *to = host_of(dst, count);
    if (to == NULL) return CUDA_ERROR_INVALID_VALUE;
    memset(to, value, count);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
    if (count == 0) return CUDA_SUCCESS;
    if (count > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *to = host_of(dst, count * 4);
    if (to == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) memcpy(to + 4 * i, &value, 4);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    return (void)stream, cuMemsetD8_v2(dst, value, count);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
    return (void)stream, cuMemsetD32_v2(dst, value, count);
}

/* Read an image's lines into module (its kernels, its globals' names and sizes); 0, or
 * CUDA_ERROR_INVALID_IMAGE for anything the stand-in cannot run. */
static CUresult parse_image(const char *text, struct module *module) {
    size_t magic = strlen(STANDIN_MODULE_MAGIC);
    if (strncmp(text, STANDIN_MODULE_MAGIC, magic) != 0 || (text[magic] != '\n' && text[magic] != '\0'))
        return CUDA_ERROR_INVALID_IMAGE;
    for (const char *line = text + magic; *line != '\0';) {
        line += *line == '\n';
        size_t length = strcspn(line, "\n");
        size_t i = 0;
        while (i < BUILTINS && (strlen(builtins[i].name) != length || strncmp(builtins[i].name, line, length) != 0)) i++;
        if (length > 0 && i == BUILTINS) {
            char name[MAX_GLOBAL_NAME];
            unsigned long long bytes = 0;
            int used = 0;
            if (module->global_count == MAX_GLOBALS ||
                sscanf(line, "global %63s %llu%n", name, &bytes, &used) != 2 || (size_t)used != length || bytes == 0)
                return CUDA_ERROR_INVALID_IMAGE; /* names a kernel the stand-in cannot run */
            struct global *global = &module->globals[module->global_count++];
            snprintf(global->name, sizeof global->name, "%s", name);
            global->bytes = bytes;
        } else if (length > 0) {
            module->has[i] = 1;
            module->functions[i].builtin = &builtins[i];
        }
        line += length;
    }
    return CUDA_SUCCESS;
}

static void release_globals(struct module *module) {
    for (int i = 0; i < module->global_count; i++)
        if (module->globals[i].pointer != 0) standin_release(module->globals[i].pointer);
}

/* A module's image read and its globals taken from the current card (else from card 0). */
static CUresult load_module(struct module *module, const char *image) {
    CUresult status = parse_image(image, module);
    int dev = standin_current_device() < 0 ? 0 : standin_current_device();
    for (int i = 0; status == CUDA_SUCCESS && i < module->global_count; i++) {
        unsigned long long pointer = 0;
        status = standin_allocate(dev, module->globals[i].bytes, &pointer);
        module->globals[i].pointer = status == CUDA_SUCCESS ? pointer : 0;
    }
    if (status != CUDA_SUCCESS) release_globals(module);
    return status;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (standin_current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct module *loaded = calloc(1, sizeof *loaded);
    if (loaded == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult status = load_module(loaded, image);
    if (status != CUDA_SUCCESS) {
        free(loaded);
        return status;
    }
    loaded->device = standin_current_device();
    remember_module(loaded);
    *module = (CUmodule)loaded;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, void *options, void **values) {
    return (void)n, (void)options, (void)values, cuModuleLoadData(module, image);
}

CUresult cuModuleUnload(CUmodule module) {
    if (module == NULL || ((struct module *)module)->of_library) return CUDA_ERROR_INVALID_HANDLE;
    if (forget_module((struct module *)module) != 0) return CUDA_ERROR_INVALID_HANDLE;
    release_globals((struct module *)module);
    free(module);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (function == NULL || module == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct module *loaded = (struct module *)module;
    if (foreign(loaded->device)) return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < BUILTINS; i++) {
        if (!loaded->has[i] || strcmp(builtins[i].name, name) != 0) continue;
        *function = (CUfunction)&loaded->functions[i];
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* The loaded library of a handle, NULL for a stale or made-up one; with libraries_lock held. */
static struct library *loaded_library(const void *handle) {
    for (struct library *library = libraries; library != NULL; library = library->next)
        if ((const void *)library == handle) return library;
    return NULL;
}

/* The built-in a loaded library's kernel runs, NULL when the handle is none such. */
static const struct builtin *kernel_builtin(const void *handle) {
    const struct builtin *found = NULL;
    pthread_mutex_lock(&libraries_lock);
    for (struct library *library = libraries; library != NULL && found == NULL; library = library->next)
        for (size_t i = 0; i < BUILTINS; i++)
            if (handle == (const void *)&library->kernels[i]) found = library->kernels[i].builtin;
    pthread_mutex_unlock(&libraries_lock);
    return found;
}

/* A loaded module's function's built-in and its module's card (-1: of every context), NULL when
 * the handle is none such. */
static const struct builtin *module_function(const void *handle, int *device) {
    const struct builtin *found = NULL;
    pthread_mutex_lock(&libraries_lock);
    for (struct module *module = modules; module != NULL && found == NULL; module = module->next)
        for (size_t i = 0; i < BUILTINS && found == NULL; i++)
            if (handle == (const void *)&module->functions[i])
                found = module->functions[i].builtin, *device = module->device;
    pthread_mutex_unlock(&libraries_lock);
    return found;
}

/* The built-in of a function (a module's, a library's module's, or a library's kernel launched as
 * one: CUDA 12 runtimes cast it) usable in the current context; NULL for a made-up or stale handle
 * (*foreign_context 0) or a function of another card's context (*foreign_context 1). */
static const struct builtin *builtin_in(CUfunction function, int *foreign_context) {
    int device = -1;
    *foreign_context = 0;
    const struct builtin *found = module_function(function, &device);
    if (found == NULL) return kernel_builtin(function);
    if (foreign(device)) return *foreign_context = 1, NULL;
    return found;
}

/* The built-in of a function usable in the current context, NULL for any other handle. */
static const struct builtin *builtin_of(CUfunction function) {
    int foreign_context;
    return builtin_in(function, &foreign_context);
}

CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t *offset, size_t *size) {
    const struct builtin *kernel = builtin_of(function);
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (index >= (size_t)kernel->params) return CUDA_ERROR_INVALID_VALUE;
    if (offset != NULL) *offset = kernel->offset[index];
    if (size != NULL) *size = kernel->size[index];
    return CUDA_SUCCESS;
}

/* A module's global by name (pointer and bytes may be NULL): 0, or CUDA_ERROR_NOT_FOUND. */
static CUresult module_global(const struct module *module, const char *name, CUdeviceptr *pointer, size_t *bytes) {
    for (int i = 0; i < module->global_count; i++) {
        if (strcmp(module->globals[i].name, name) != 0) continue;
        if (pointer != NULL) *pointer = module->globals[i].pointer;
        if (bytes != NULL) *bytes = (size_t)module->globals[i].bytes;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *pointer, size_t *bytes, CUmodule module, const char *name) {
    if (module == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (foreign(((const struct module *)module)->device)) return CUDA_ERROR_INVALID_HANDLE;
    return module_global((const struct module *)module, name, pointer, bytes);
}

/* ---------------------------------------------------------------------- libraries (CUDA 12) */

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned int jit_count, void *library_options, void **library_values,
                           unsigned int library_count) {
    (void)jit_options, (void)jit_values, (void)jit_count, (void)library_options, (void)library_values, (void)library_count;
    if (library == NULL || code == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct library *loaded = calloc(1, sizeof *loaded);
    if (loaded == NULL || (loaded->module = calloc(1, sizeof *loaded->module)) == NULL) {
        free(loaded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    loaded->module->of_library = 1;
    loaded->module->device = -1;
    CUresult status = load_module(loaded->module, code);
    if (status != CUDA_SUCCESS) {
        free(loaded->module);
        free(loaded);
        return status;
    }
    remember_module(loaded->module);
    for (size_t i = 0; i < BUILTINS; i++) loaded->kernels[i].builtin = loaded->module->has[i] ? &builtins[i] : NULL;
    pthread_mutex_lock(&libraries_lock);
    loaded->next = libraries, libraries = loaded;
    pthread_mutex_unlock(&libraries_lock);
    *library = (CUlibrary)loaded;
    return CUDA_SUCCESS;
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, void *jit_options, void **jit_values,
                               unsigned int jit_count, void *library_options, void **library_values,
                               unsigned int library_count) {
    if (library == NULL || path == NULL) return CUDA_ERROR_INVALID_VALUE;
    FILE *file = fopen(path, "re");
    if (file == NULL) return CUDA_ERROR_FILE_NOT_FOUND;
    static char image[1 << 16];
    size_t length = fread(image, 1, sizeof image - 1, file);
    fclose(file);
    image[length] = '\0';
    return cuLibraryLoadData(library, image, jit_options, jit_values, jit_count, library_options, library_values,
                             library_count);
}

CUresult cuLibraryUnload(CUlibrary library) {
    pthread_mutex_lock(&libraries_lock);
    struct library **link = &libraries;
    while (*link != NULL && (void *)*link != (void *)library) link = &(*link)->next;
    struct library *gone = *link;
    if (gone != NULL) *link = gone->next;
    pthread_mutex_unlock(&libraries_lock);
    if (gone == NULL) return CUDA_ERROR_INVALID_HANDLE;
    forget_module(gone->module);
    release_globals(gone->module);
    free(gone->module);
    free(gone);
    return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name) {
    if (kernel == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&libraries_lock);
    struct library *loaded = loaded_library(library);
    for (size_t i = 0; loaded != NULL && i < BUILTINS; i++) {
        status = CUDA_ERROR_NOT_FOUND;
        if (loaded->kernels[i].builtin == NULL || strcmp(builtins[i].name, name) != 0) continue;
        *kernel = (CUkernel)&loaded->kernels[i];
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&libraries_lock);
    return status;
}

CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library) {
    if (module == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (standin_current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&libraries_lock);
    struct library *loaded = loaded_library(library);
    if (loaded != NULL) *module = (CUmodule)loaded->module;
    pthread_mutex_unlock(&libraries_lock);
    return loaded != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuLibraryGetGlobal(CUdeviceptr *pointer, size_t *bytes, CUlibrary library, const char *name) {
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&libraries_lock);
    struct library *loaded = loaded_library(library);
    if (loaded != NULL) status = module_global(loaded->module, name, pointer, bytes);
    pthread_mutex_unlock(&libraries_lock);
    return status;
}

/* A library kernel's function: its library's module's (what cuModuleGetFunction gives from
 * cuLibraryGetModule's module), of every context as the library is. */
CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel) {
    if (function == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (standin_current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&libraries_lock);
    for (struct library *library = libraries; library != NULL && status != CUDA_SUCCESS; library = library->next)
        for (size_t i = 0; i < BUILTINS; i++)
            if ((const void *)kernel == (const void *)&library->kernels[i] && library->kernels[i].builtin != NULL) {
                *function = (CUfunction)&library->module->functions[i];
                status = CUDA_SUCCESS;
                break;
            }
    pthread_mutex_unlock(&libraries_lock);
    return status;
}

CUresult cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t *offset, size_t *size) {
    return kernel_builtin(kernel) == NULL ? CUDA_ERROR_INVALID_HANDLE
                                          : cuFuncGetParamInfo((CUfunction)kernel, index, offset, size);
}

/* ------------------------------------------------------------------- attributes and occupancy */
#define STANDIN_SM_THREADS 2048
#define STANDIN_SM_BLOCKS 32
#define STANDIN_SM_REGISTERS 65536
#define STANDIN_SM_SHARED 65536
#define STANDIN_SMS 8
#define STANDIN_BLOCK_THREADS 1024
#define STANDIN_WARP 32
#define DEFAULT_DYNAMIC_SHARED 49152
/* CUfunction_attribute values the stand-in answers (CU_FUNC_ATTRIBUTE_*) */
#define ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define ATTRIBUTE_NUM_REGS 4
#define ATTRIBUTE_PTX_VERSION 5
#define ATTRIBUTE_BINARY_VERSION 6
#define ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT 9
#define ATTRIBUTE_LAST 16
#define OCCUPANCY_DISABLE_CACHING_OVERRIDE 1u

/* The settable attributes, per built-in (a process's modules share their built-ins' functions). */
static int max_dynamic_shared[BUILTINS] = {DEFAULT_DYNAMIC_SHARED, DEFAULT_DYNAMIC_SHARED};
static int carveout[BUILTINS] = {-1, -1};
static int cache_config[BUILTINS];

CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function) {
    const struct builtin *kernel = builtin_of(function);
    if (value == NULL || attribute < 0 || attribute > ATTRIBUTE_LAST) return CUDA_ERROR_INVALID_VALUE;
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    size_t i = (size_t)(kernel - builtins);
    pthread_mutex_lock(&lock);
    switch (attribute) {
    case ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = STANDIN_BLOCK_THREADS; break;
    case ATTRIBUTE_NUM_REGS: *value = kernel->registers; break;
    case ATTRIBUTE_PTX_VERSION:
    case ATTRIBUTE_BINARY_VERSION: *value = 80; break;
    case ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = max_dynamic_shared[i]; break;
    case ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = carveout[i]; break;
    default: *value = 0; /* no static shared, constant or local memory, no clusters */
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value) {
    const struct builtin *kernel = builtin_of(function);
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    size_t i = (size_t)(kernel - builtins);
    CUresult status = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (attribute == ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && value >= 0 && value <= STANDIN_SM_SHARED)
        max_dynamic_shared[i] = value;
    else if (attribute == ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT && value >= -1 && value <= 100)
        carveout[i] = value;
    else
        status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuFuncSetCacheConfig(CUfunction function, int config) {
    const struct builtin *kernel = builtin_of(function);
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE; /* CU_FUNC_CACHE_PREFER_NONE..EQUAL */
    pthread_mutex_lock(&lock);
    cache_config[kernel - builtins] = config;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* A library's kernel on a card: the same answers as its function's. */
CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice dev) {
    CUresult status = standin_checked_device(dev);
    if (status != CUDA_SUCCESS) return status;
    return kernel_builtin(kernel) == NULL ? CUDA_ERROR_INVALID_HANDLE
                                          : cuFuncGetAttribute(value, attribute, (CUfunction)kernel);
}

CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice dev) {
    CUresult status = standin_checked_device(dev);
    if (status != CUDA_SUCCESS) return status;
    return kernel_builtin(kernel) == NULL ? CUDA_ERROR_INVALID_HANDLE
                                          : cuFuncSetAttribute((CUfunction)kernel, attribute, value);
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, CUdevice dev) {
    CUresult status = standin_checked_device(dev);
    if (status != CUDA_SUCCESS) return status;
    return kernel_builtin(kernel) == NULL ? CUDA_ERROR_INVALID_HANDLE : cuFuncSetCacheConfig((CUfunction)kernel, config);
}

/* Blocks of block_size threads one multiprocessor holds at once: the least of its thread, block,
 * register and shared memory limits; 0 past the block or dynamic shared memory limit. */
static int blocks_per_sm(const struct builtin *kernel, int block_size, size_t dynamic_shared) {
    pthread_mutex_lock(&lock);
    size_t shared_limit = (size_t)max_dynamic_shared[kernel - builtins];
    pthread_mutex_unlock(&lock);
    if (block_size <= 0 || block_size > STANDIN_BLOCK_THREADS || dynamic_shared > shared_limit) return 0;
    int blocks = STANDIN_SM_BLOCKS;
    int by_threads = STANDIN_SM_THREADS / block_size, by_registers = STANDIN_SM_REGISTERS / (kernel->registers * block_size);
    if (by_threads < blocks) blocks = by_threads;
    if (by_registers < blocks) blocks = by_registers;
    if (dynamic_shared > 0 && (int)(STANDIN_SM_SHARED / dynamic_shared) < blocks) blocks = (int)(STANDIN_SM_SHARED / dynamic_shared);
    return blocks;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction function, int block_size,
                                                              size_t dynamic_shared, unsigned int flags) {
    const struct builtin *kernel = builtin_of(function);
    if (blocks == NULL || block_size <= 0 || flags > OCCUPANCY_DISABLE_CACHING_OVERRIDE) return CUDA_ERROR_INVALID_VALUE;
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    *blocks = blocks_per_sm(kernel, block_size, dynamic_shared);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction function, int block_size,
                                                     size_t dynamic_shared) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, function, block_size, dynamic_shared, 0);
}

/* The block size with the most threads resident per multiprocessor (the largest such), trying
 * the limit and then every multiple of a warp below it, each with its dynamic shared memory
 * (shared_of's answer for it, else dynamic_shared); min_grid: enough blocks to fill the card. */
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size, CUfunction function,
                                                   size_t (*shared_of)(int), size_t dynamic_shared, int limit,
                                                   unsigned int flags) {
    const struct builtin *kernel = builtin_of(function);
    if (min_grid == NULL || block_size == NULL || limit < 0 || flags > OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernel == NULL) return CUDA_ERROR_INVALID_HANDLE;
    int top = limit == 0 || limit > STANDIN_BLOCK_THREADS ? STANDIN_BLOCK_THREADS : limit;
    int best_threads = 0, best_size = 0, best_blocks = 0;
    for (int size = top; size > 0; size = size == top && size % STANDIN_WARP != 0 ? size / STANDIN_WARP * STANDIN_WARP
                                                                                 : size - STANDIN_WARP) {
        int blocks = blocks_per_sm(kernel, size, shared_of != NULL ? shared_of(size) : dynamic_shared);
        if (blocks * size > best_threads) best_threads = blocks * size, best_size = size, best_blocks = blocks;
    }
    *min_grid = best_blocks * STANDIN_SMS;
    *block_size = best_size;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction function,
                                          size_t (*shared_of)(int), size_t dynamic_shared, int limit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, function, shared_of, dynamic_shared, limit, 0);
}

#define LAUNCH_PARAM_END ((void *)0)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

/* Parameter i of a launch, from kernelParams or the extra buffer; NULL when missing. */
static const void *param(const struct builtin *kernel, int i, void **params, void **extra) {
    if (params != NULL) return params[i];
    const unsigned char *buffer = NULL;
    size_t size = 0;
    for (int k = 0; extra != NULL && extra[k] != LAUNCH_PARAM_END; k += 2) {
        if (extra[k] == LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[k + 1];
        if (extra[k] == LAUNCH_PARAM_BUFFER_SIZE) size = *(const size_t *)extra[k + 1];
    }
    if (buffer == NULL || kernel->offset[i] + kernel->size[i] > size) return NULL;
    return buffer + kernel->offset[i];
}

CUresult standin_run_builtin(CUfunction function, void **params, void **extra) {
    int foreign_context;
    const struct builtin *kernel = builtin_in(function, &foreign_context);
    if (foreign_context) return CUDA_ERROR_INVALID_HANDLE;
    if (kernel == NULL) return CUDA_SUCCESS; /* a made-up handle of the interception library's tests */
    const void *values[MAX_PARAMS];
    for (int i = 0; i < kernel->params; i++)
        if ((values[i] = param(kernel, i, params, extra)) == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (kernel == &builtins[0]) {
        CUdeviceptr a, b, c;
        unsigned n;
        memcpy(&a, values[0], 8), memcpy(&b, values[1], 8), memcpy(&c, values[2], 8), memcpy(&n, values[3], 4);
        float *x = (float *)host_of(a, 4ull * n), *y = (float *)host_of(b, 4ull * n), *z = (float *)host_of(c, 4ull * n);
        if (n > 0 && (x == NULL || y == NULL || z == NULL)) return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < n; i++) z[i] = x[i] + y[i];
    } else {
        CUdeviceptr a;
        float factor;
        unsigned n;
        memcpy(&a, values[0], 8), memcpy(&factor, values[1], 4), memcpy(&n, values[2], 4);
        float *x = (float *)host_of(a, 4ull * n);
        if (n > 0 && x == NULL) return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < n; i++) x[i] *= factor;
    }
    return CUDA_SUCCESS;
}

/* Streams: everything runs in order at once, so a stream is only a handle. */
CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    (void)flags;
    if (stream == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (standin_current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *stream = calloc(1, 64);
    return *stream == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
    if (stream == NULL) return CUDA_ERROR_INVALID_HANDLE;
    free(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream stream) { return (void)stream, CUDA_SUCCESS; }

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    return (void)stream, (void)flags, event == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    CUresult status = standin_checked_device(dev);
    if (status != CUDA_SUCCESS || value == NULL) return status != CUDA_SUCCESS ? status : CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 1: *value = 1024; break;  /* max threads per block */
    case 16: *value = 8; break;    /* multiprocessors */
    case 75: *value = 8; break;    /* compute capability major */
    case 76: *value = 0; break;    /* minor */
    case 19: *value = 1; break;    /* can map host memory, as a real card */
    case 83: *value = 1; break;    /* managed memory, as a real card */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

/* The 16 bytes "standin-card-" and the ordinal; NVML's stand-in calls the card GPU-standin-<ordinal>. */
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    CUresult status = standin_checked_device(dev);
    if (status != CUDA_SUCCESS || uuid == NULL) return status != CUDA_SUCCESS ? status : CUDA_ERROR_INVALID_VALUE;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, "standin-card-", 13);
    uuid->bytes[13] = (char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }
