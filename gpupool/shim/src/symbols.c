/*
 * Where calls are caught: symbol interposition (the library is preloaded, so its definitions come
 * first), dlsym and dlvsym (for programs and runtimes that look entry points up by name) and
 * cuGetProcAddress (the CUDA runtime fetches most driver entry points through it). Every lookup
 * hands out the wrapper in place of the driver's function while limits are in force, and a lookup
 * of the lookups themselves (dlsym, dlvsym, dlmopen, through any handle: libc's own, RTLD_NEXT,
 * another namespace's libc) hands out this library's, so a program cannot fetch an unwrapped one.
 * A variant of a wrapped entry point newer than any the library wraps is refused (variants.c).
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
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static dlsym_fn real_dlsym;
static void *cuda_handle; /* the driver's, once resolved */
static dlvsym_fn real_dlvsym;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;
static pthread_once_t library_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

EARLY static struct link_map *object_of(const void *address) {
    Dl_info info;
    struct link_map *map = NULL;
    if (address == NULL || !dladdr1(address, &info, (void **)&map, RTLD_DL_LINKMAP)) return NULL;
    return map;
}

/* glibc's dlvsym, read from the dynamic table of the first object after this library that defines
 * it (else of any other): this library's own dlvsym would answer a call by name. Then glibc's
 * dlsym through it: RTLD_NEXT from here means "after this library". */
EARLY static void find_real_dlsym(void) {
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    struct link_map *self = object_of((const void *)&dlsym), *head = self;
    for (struct link_map *l = self != NULL ? self->l_next : NULL; l != NULL && real_dlvsym == NULL; l = l->l_next)
        real_dlvsym = (dlvsym_fn)shim_elf_symbol(l, "dlvsym");
    while (head != NULL && head->l_prev != NULL) head = head->l_prev;
    for (struct link_map *l = head; l != NULL && real_dlvsym == NULL; l = l->l_next)
        if (l != self) real_dlvsym = (dlvsym_fn)shim_elf_symbol(l, "dlvsym");
    for (size_t i = 0; real_dlvsym != NULL && i < sizeof versions / sizeof *versions && real_dlsym == NULL; i++)
        real_dlsym = (dlsym_fn)real_dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

EARLY static void *lookup_real(void *handle, const char *name) {
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlsym == NULL ? NULL : real_dlsym(handle, name);
}

EARLY static void *lookup_real_versioned(void *handle, const char *name, const char *version) {
    pthread_once(&dlsym_once, find_real_dlsym);
    return real_dlvsym == NULL ? NULL : real_dlvsym(handle, name, version);
}

void *shim_lookup_next(const char *name) { return lookup_real(RTLD_NEXT, name); }

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
    if (library == LIBRARY_CUDA) __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
}
static void resolve_cuda(void) { resolve(LIBRARY_CUDA); }
static void resolve_nvml(void) { resolve(LIBRARY_NVML); }

void *shim_real(enum shim_symbol_id id) {
    int library = library_of(&hooks[id]);
    pthread_once(&library_once[library], library == LIBRARY_NVML ? resolve_nvml : resolve_cuda);
    return __atomic_load_n(&hooks[id].real, __ATOMIC_ACQUIRE);
}

void *shim_driver_symbol(const char *name) {
    pthread_once(&library_once[LIBRARY_CUDA], resolve_cuda);
    void *handle = __atomic_load_n(&cuda_handle, __ATOMIC_ACQUIRE);
    return handle == NULL ? NULL : lookup_real(handle, name);
}

const char *shim_symbol_name(enum shim_symbol_id id) { return hooks[id].name; }

EARLY int shim_newest_wrapped(const char *base, size_t length, enum shim_symbol_id *newest) {
    int best = 0;
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++) {
        const struct hook *h = &hooks[i];
        if (h->wrapper == NULL || library_of(h) != LIBRARY_CUDA) continue;
        size_t hook_length, same = 0;
        int variant = shim_variant_of(h->name, &hook_length);
        while (same < length && same < hook_length && h->name[same] == base[same]) same++;
        if (same != length || hook_length != length || variant <= best) continue;
        best = variant;
        *newest = (enum shim_symbol_id)i;
    }
    return best;
}

/* dlsym(RTLD_NEXT) means "after the caller", and glibc finds the caller from the return address:
 * called from here it would mean "after this library". Walk the objects after the real caller. */
EARLY static void *next_after(const void *caller, const char *name, const char *version) {
    struct link_map *from = object_of(caller), *self = object_of((const void *)&dlsym);
    if (from == NULL || self == NULL) return version ? lookup_real_versioned(RTLD_NEXT, name, version)
                                                     : lookup_real(RTLD_NEXT, name);
    for (struct link_map *l = from; l != NULL; l = l->l_next)
        if (l == self) /* the caller is this library or comes before it */
            return version ? lookup_real_versioned(RTLD_NEXT, name, version) : lookup_real(RTLD_NEXT, name);
    for (struct link_map *l = from->l_next; l != NULL; l = l->l_next) {
        void *handle = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle == NULL) continue;
        void *found = version ? lookup_real_versioned(handle, name, version) : lookup_real(handle, name);
        dlclose(handle);
        if (found != NULL && object_of(found) == l) return found;
    }
    return NULL;
}

/* This library's own lookup functions by name, for a lookup of a lookup. */
EARLY static void *own_lookup(const char *name) {
    if (name[0] != 'd' || name[1] != 'l') return NULL;
    if (shim_same_name(name, "dlsym")) return (void *)&dlsym;
    if (shim_same_name(name, "dlvsym")) return (void *)&dlvsym;
    if (shim_same_name(name, "dlmopen")) return (void *)&dlmopen;
    return NULL;
}

EARLY static const struct hook *wrapper_named(const char *name) {
    if (!((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v'))) return NULL;
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++)
        if (hooks[i].wrapper != NULL && strcmp(hooks[i].name, name) == 0) return &hooks[i];
    return NULL;
}

/* What a lookup hands out for name, given what glibc found (found, NULL when nothing). */
EARLY static void *substitute_found(const char *name, void *found) {
    if (found == NULL || name == NULL) return found;
    const struct hook *h = wrapper_named(name);
    if (h != NULL) return shim_config()->enabled ? h->wrapper : found;
    if (shim_refuse_newer_named(name)) return NULL; /* cuMemAlloc_v3 beside the wrapped cuMemAlloc_v2 */
    /* Whoever asks, the main program or a library preloaded before this one: glibc's own would be
     * a lookup that never sees the wrappers. */
    void *own = own_lookup(name);
    return own != NULL && shim_config()->enabled ? own : found;
}

EARLY __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    const void *caller = __builtin_return_address(0);
    void *found = handle == RTLD_NEXT ? next_after(caller, name, NULL) : lookup_real(handle, name);
    return substitute_found(name, found);
}

/* dlvsym names a version; an object without symbol versions (the driver) answers any version. */
EARLY __attribute__((visibility("default"))) void *dlvsym(void *handle, const char *name, const char *version) {
    const void *caller = __builtin_return_address(0);
    void *found = handle == RTLD_NEXT ? next_after(caller, name, version)
                                      : lookup_real_versioned(handle, name, version);
    return substitute_found(name, found);
}

/* The wrapper for what the driver returned: by address first, else by name and version; NULL with
 * *refused set when it is a variant newer than the library wraps (variants.c). */
static void *substitute(const char *symbol, void *pfn, int version, cuuint64_t flags, shim_proc_lookup_fn ask,
                        int *refused) {
    if (pfn == NULL || symbol == NULL || !shim_config()->enabled) return pfn;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, best_score = -1;
    for (int i = 0; i < SHIM_SYMBOL_COUNT; i++) {
        const struct hook *h = &hooks[i];
        if (h->wrapper == NULL || library_of(h) != LIBRARY_CUDA) continue;
        void *real = shim_real((enum shim_symbol_id)i);
        if (real == pfn || h->wrapper == pfn) return h->wrapper;
        if (real == NULL || strcmp(h->base, symbol) != 0 || version < h->min_version) continue;
        if (h->ptds && !per_thread) continue;
        int score = h->min_version * 2 + (h->ptds == per_thread);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best < 0) return pfn;
    if (shim_refuse_newer_returned((enum shim_symbol_id)best, symbol, pfn, version, flags, ask)) {
        *refused = 1;
        return NULL;
    }
    return hooks[best].wrapper;
}

/* At debug level every lookup is logged: which runtime asked for what, and whether it got a wrapper. */
static void *substitute_logged(const char *symbol, void *pfn, int version, cuuint64_t flags, shim_proc_lookup_fn ask,
                               int *refused) {
    void *given = substitute(symbol, pfn, version, flags, ask, refused);
    if (*refused) return given; /* logged as an error, once */
    if (given != pfn) shim_log(SHIM_LOG_DEBUG, "lookup %s (version %d, flags %llu): wrapped", symbol, version,
                               (unsigned long long)flags);
    else shim_log(SHIM_LOG_DEBUG, "lookup %s (version %d, flags %llu): the driver's", symbol == NULL ? "(null)" : symbol,
                  version, (unsigned long long)flags);
    return given;
}

/* The real lookups, for variants.c to ask the driver at another version. */
static CUresult ask_driver(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
}
static CUresult ask_driver_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    CUdriverProcAddressQueryResult status;
    return REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, &status);
}

/* A refused lookup looks like the driver's answer to a name it does not know. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (REAL(cuGetProcAddress) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    int refused = 0;
    if (result == CUDA_SUCCESS && pfn != NULL) *pfn = substitute_logged(symbol, *pfn, cudaVersion, flags, ask_driver,
                                                                        &refused);
    return refused ? CUDA_ERROR_NOT_FOUND : result;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (REAL(cuGetProcAddress_v2) == NULL) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    int refused = 0;
    if (result == CUDA_SUCCESS && pfn != NULL) *pfn = substitute_logged(symbol, *pfn, cudaVersion, flags,
                                                                        ask_driver_v2, &refused);
    if (refused && symbolStatus != NULL) *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return refused ? CUDA_ERROR_NOT_FOUND : result;
}
