/*
 * dlmopen: a link-map namespace other than the base one does not have this library (preloading
 * applies to the base namespace only), so a driver loaded there, and any lookup through that
 * namespace's own dlsym, would reach the card unwrapped. While limits are in force:
 *   - a driver (libcuda, libnvidia-ml) asked for in another namespace by its usual name is loaded
 *     in the base one instead, where every lookup of it goes through this library (never in the
 *     other namespace first: its constructors would run there, and a sanitizer runtime cannot);
 *   - any other object whose loading brought a driver into another namespace (a renamed copy, or a
 *     library that links the driver) is unloaded again and the call fails, with a log line saying
 *     why. There a driver is recognised by what it defines (cuInit, nvmlInit_v2), not its name.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "shim.h"

typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

/* The file names of the drivers' sonames, the way a program asks for them ("libcuda.so.1", a path). */
static int named_driver(const char *file) {
    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    return strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libnvidia-ml.so", 15) == 0;
}

static int is_driver(const struct link_map *map) {
    return shim_elf_symbol(map, "cuInit") != NULL || shim_elf_symbol(map, "nvmlInit_v2") != NULL;
}

/* Whether the namespace of handle holds a driver (walks its whole link map). */
static int namespace_has_driver(void *handle) {
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) return 0;
    while (map->l_prev != NULL) map = map->l_prev;
    for (; map != NULL; map = map->l_next)
        if (is_driver(map)) return 1;
    return 0;
}

__attribute__((visibility("default"))) void *dlmopen(Lmid_t lmid, const char *file, int mode) {
    static dlmopen_fn real;
    if (real == NULL) real = (dlmopen_fn)shim_lookup_next("dlmopen");
    if (real == NULL) return NULL;
    if (lmid == LM_ID_BASE || file == NULL || !shim_config()->enabled) return real(lmid, file, mode);
    if (named_driver(file)) {
        shim_log(SHIM_LOG_INFO, "dlmopen of the driver %s into another namespace: loaded in the base namespace, "
                 "where the limits apply", file);
        return dlopen(file, mode);
    }
    void *handle = real(lmid, file, mode);
    if (handle == NULL || !namespace_has_driver(handle)) return handle;
    dlclose(handle);
    shim_log(SHIM_LOG_WARN, "dlmopen of %s refused: it loads a GPU driver into another namespace, where the "
             "limits would not apply", file);
    return NULL;
}
