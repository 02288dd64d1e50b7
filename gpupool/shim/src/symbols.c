/*
 * Where calls are caught: symbol interposition (the library is preloaded, so its definitions come
 * first), dlsym (for programs and runtimes that look entry points up by name) and
 * cuGetProcAddress (the CUDA runtime fetches most driver entry points through it). Both lookups
 * hand out the wrapper in place of the driver's function while limits are in force.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "shim.h"

enum { LIBRARY_CUDA = 0, LIBRARY_NVML = 1 };

/* dlsym runs before sanitizer runtimes finish starting (they look up libc through it), so the
 * code on its path must not be instrumented in sanitizer builds. */
#define EARLY __attribute__((no_sanitize("address", "undefined")))

struct hook {
    const char *name;
    const char *base;  /* the name cuGetProcAddress is asked for */
    int min_version;   /* the CUDA version from which base means this entry point */
    int ptds;          /* per-thread default stream variant */
    void *wrapper;     /* NULL for helpers */
    void *real;
};

#define HOOK_ENTRY(name, base, version, ptds) {#name, base, version, ptds, (void *)&name, NULL},
#define HELPER_ENTRY(name) {#name, NULL, 0, 0, NULL, NULL},
static struct hook hooks[SHIM_SYMBOL_COUNT] = {SHIM_HOOKS(HOOK_ENTRY) SHIM_HELPERS(HELPER_ENTRY)};

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;
static pthread_once_t library_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

EARLY static void find_real_dlsym(void) {
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions && real_dlsym == NULL; i++)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

EARLY static void *lookup_real(void *handle, const char *name) {
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlsym == NULL ? NULL : real_dlsym(handle, name);
}

static int library_of(const struct hook *h) { return h->name[0] == 'n' ? LIBRARY_NVML : LIBRARY_CUDA; }

static void resolve(int library) {
    const char *file = library == LIBRARY_NVML ? "libnvidia-ml.so.1" : "libcuda.so.1";
    void *handle = dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL) handle = dlopen(file, RTLD_LAZY);
    if (handle == NULL) {
        shim_log(library == LIBRARY_NVML ? SHIM_LOG_INFO : SHIM_LOG_ERROR, "cannot load %s: %s", file, dlerror());
        return;
    }
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++)
        if (library_of(&hooks[i]) == library)
            __atomic_store_n(&hooks[i].real, lookup_real(handle, hooks[i].name), __ATOMIC_RELEASE);
}
static void resolve_cuda(void) { resolve(LIBRARY_CUDA); }
static void resolve_nvml(void) { resolve(LIBRARY_NVML); }

void *shim_real(enum shim_symbol_id id) {
    int library = library_of(&hooks[id]);
    pthread_once(&library_once[library], library == LIBRARY_NVML ? resolve_nvml : resolve_cuda);
    return __atomic_load_n(&hooks[id].real, __ATOMIC_ACQUIRE);
}

EARLY static struct link_map *object_of(const void *address) {
    Dl_info info;
    struct link_map *map = NULL;
    if (address == NULL || !dladdr1(address, &info, (void **)&map, RTLD_DL_LINKMAP)) return NULL;
    return map;
}

/* dlsym(RTLD_NEXT) means "after the caller", and glibc finds the caller from the return address:
 * called from here it would mean "after this library". Walk the objects after the real caller. */
EARLY static void *next_after(const void *caller, const char *name) {
    struct link_map *from = object_of(caller), *self = object_of((const void *)&dlsym);
    if (from == NULL || self == NULL) return lookup_real(RTLD_NEXT, name);
    for (struct link_map *l = from; l != NULL; l = l->l_next)
        if (l == self) return lookup_real(RTLD_NEXT, name); /* the caller comes before this library */
    for (struct link_map *l = from->l_next; l != NULL; l = l->l_next) {
        void *handle = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle == NULL) continue;
        void *found = lookup_real(handle, name);
        dlclose(handle);
        if (found != NULL && object_of(found) == l) return found;
    }
    return NULL;
}

EARLY static const struct hook *wrapper_named(const char *name) {
    if (!((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v'))) return NULL;
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++)
        if (hooks[i].wrapper != NULL && strcmp(hooks[i].name, name) == 0) return &hooks[i];
    return NULL;
}

EARLY __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    const void *caller = __builtin_return_address(0);
    void *found;
    if (handle == RTLD_NEXT) found = next_after(caller, name);
    else found = lookup_real(handle, name);
    const struct hook *h = found != NULL ? wrapper_named(name) : NULL;
    return h != NULL && shim_config()->enabled ? h->wrapper : found;
}

/* The wrapper for what the driver returned: by address first, else by name and version. */
static void *substitute(const char *symbol, void *pfn, int version, cuuint64_t flags) {
    if (pfn == NULL || symbol == NULL || !shim_config()->enabled) return pfn;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct hook *best = NULL;
    int best_score = -1;
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++) {
        const struct hook *h = &hooks[i];
        if (h->wrapper == NULL || library_of(h) != LIBRARY_CUDA) continue;
        void *real = shim_real((enum shim_symbol_id)i);
        if (real == pfn || h->wrapper == pfn) return h->wrapper;
        if (real == NULL || strcmp(h->base, symbol) != 0 || version < h->min_version) continue;
        if (h->ptds && !per_thread) continue;
        int score = h->min_version * 2 + (h->ptds == per_thread);
        if (score > best_score) {
            best = h;
            best_score = score;
        }
    }
    return best != NULL ? best->wrapper : pfn;
}

/* At debug level every lookup is logged: which runtime asked for what, and whether it got a wrapper. */
static void *substitute_logged(const char *symbol, void *pfn, int version, cuuint64_t flags) {
    void *given = substitute(symbol, pfn, version, flags);
    if (given != pfn) shim_log(SHIM_LOG_DEBUG, "lookup %s (version %d, flags %llu): wrapped", symbol, version,
                               (unsigned long long)flags);
    else shim_log(SHIM_LOG_DEBUG, "lookup %s (version %d, flags %llu): the driver's", symbol == NULL ? "(null)" : symbol,
                  version, (unsigned long long)flags);
    return given;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (REAL(cuGetProcAddress) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (result == CUDA_SUCCESS && pfn != NULL) *pfn = substitute_logged(symbol, *pfn, cudaVersion, flags);
    return result;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (REAL(cuGetProcAddress_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (result == CUDA_SUCCESS && pfn != NULL) *pfn = substitute_logged(symbol, *pfn, cudaVersion, flags);
    return result;
}
