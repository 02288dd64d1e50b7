/*
 * Entry-point variants newer than any this library wraps. The driver adds a variant when an entry
 * point's arguments change (cuMemAlloc_v2 took 64-bit sizes; a cuMemAlloc_v3 would take something
 * else) and exports it under the base name with the next _vN suffix; cuGetProcAddress hands it to
 * programs built for the CUDA version that introduced it. A library that does not know that variant
 * must hand out neither its older wrapper (called with the wrong arguments: a crash, or a limit
 * applied to the wrong size) nor the driver's function (unwrapped: past the memory limit). So while
 * limits are in force such a lookup is refused, the way the driver refuses a name it does not know,
 * and an error naming the entry point is logged once:
 *   - cuGetProcAddress(_v2) of a base name the library wraps, whose answer is no entry point the
 *     library resolved, when the driver exports a newer variant (cuMemAlloc_v3 beside the wrapped
 *     cuMemAlloc_v2) and either the answer is that variant's address, or (a driver that answers with
 *     internal addresses, not its exported ones) the program's CUDA version is past the newest the
 *     table was checked against and the driver answers differently at that checked version;
 *   - dlsym/dlvsym of such a newer variant by its suffixed name (cuMemAlloc_v3): NULL.
 * The exported newer variants of a base name are looked up once per hook (a few dlsym calls) and
 * only when an answer matched no resolved entry point, so the common lookup costs nothing more.
 */
#include <pthread.h>
#include <stdio.h>

#include "shim.h"

#define EARLY __attribute__((no_sanitize("address", "undefined")))

#define NEWER_SPAN 3   /* variants looked for past the newest wrapped: _v(n+1) .. _v(n+3) */
#define NEWER_SLOTS (NEWER_SPAN * 3) /* each plain, _ptsz and _ptds */

static const char *const per_thread_suffixes[] = {"", "_ptsz", "_ptds"};

struct newer_exports {
    int state;                 /* 0: not looked up yet, 1: looked up (atomic) */
    int count;
    void *address[NEWER_SLOTS];
    char first[160];           /* the first one's name, for the log line */
};

static struct newer_exports exports[SHIM_SYMBOL_COUNT];
static int refusal_logged[2][SHIM_SYMBOL_COUNT]; /* by dlsym, by cuGetProcAddress */
static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;

EARLY static size_t length_of(const char *text) {
    size_t n = 0;
    while (text[n] != '\0') n++;
    return n;
}

/* The variant number a name spells: cuMemAlloc 1, cuMemAlloc_v2 2, cuMemAlloc_v3_ptsz 3; *base_length:
 * the length of its base name (cuMemAlloc), a per-thread suffix (_ptsz, _ptds) left off. */
EARLY int shim_variant_of(const char *name, size_t *base_length) {
    size_t end = length_of(name);
    if (end > 5 && (shim_same_name(name + end - 5, "_ptsz") || shim_same_name(name + end - 5, "_ptds"))) end -= 5;
    size_t digits = end;
    while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') digits--;
    *base_length = end;
    if (digits == end || end - digits > 4 || digits < 3 || name[digits - 1] != 'v' || name[digits - 2] != '_') return 1;
    int number = 0;
    for (size_t i = digits; i < end; i++) number = number * 10 + (name[i] - '0');
    *base_length = digits - 2;
    return number;
}

/* Once per entry point: an error line, the only sign a program gets besides the failed lookup. */
static void log_refusal(enum shim_symbol_id newest, const char *how, const char *asked, int version, const char *newer) {
    if (__atomic_exchange_n(&refusal_logged[version > 0][newest], 1, __ATOMIC_ACQ_REL)) return;
    char at[48] = "";
    if (version > 0) snprintf(at, sizeof at, " at CUDA version %d", version);
    shim_log(SHIM_LOG_ERROR, "%s of %s%s refused: the driver has %s, newer than %s, the newest variant this "
             "library wraps; its older wrapper would get the wrong arguments and the driver's own would pass "
             "the limits. The program needs a gpupool that knows %s", how, asked, at, newer,
             shim_symbol_name(newest), newer);
}

EARLY int shim_refuse_newer_named(const char *name) {
    if (name[0] != 'c' || name[1] != 'u' || !shim_config()->enabled) return 0;
    size_t base_length;
    int variant = shim_variant_of(name, &base_length);
    enum shim_symbol_id newest;
    int known = variant > 1 ? shim_newest_wrapped(name, base_length, &newest) : 0;
    if (known == 0 || variant <= known) return 0;
    log_refusal(newest, "dlsym", name, 0, name);
    return 1;
}

/* The driver's exports of base name's variants past the newest the library wraps (looked up once). */
static const struct newer_exports *newer_exports_of(enum shim_symbol_id picked) {
    struct newer_exports *found = &exports[picked];
    if (__atomic_load_n(&found->state, __ATOMIC_ACQUIRE)) return found;
    pthread_mutex_lock(&exports_lock);
    if (!found->state) {
        const char *base = shim_symbol_name(picked);
        size_t base_length;
        shim_variant_of(base, &base_length);
        enum shim_symbol_id newest;
        int known = shim_newest_wrapped(base, base_length, &newest);
        char name[160];
        for (int variant = known + 1; known > 0 && variant <= known + NEWER_SPAN; variant++)
            for (size_t s = 0; s < sizeof per_thread_suffixes / sizeof *per_thread_suffixes; s++) {
                snprintf(name, sizeof name, "%.*s_v%d%s", (int)base_length, base, variant, per_thread_suffixes[s]);
                void *address = shim_driver_symbol(name);
                if (address == NULL) continue;
                if (found->count == 0) snprintf(found->first, sizeof found->first, "%s", name);
                found->address[found->count++] = address;
            }
        __atomic_store_n(&found->state, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&exports_lock);
    return found;
}

int shim_refuse_newer_returned(enum shim_symbol_id picked, const char *symbol, void *pfn, int version,
                               cuuint64_t flags, shim_proc_lookup_fn ask) {
    const struct newer_exports *newer = newer_exports_of(picked);
    if (newer->count == 0) return 0;
    int refuse = 0;
    for (int i = 0; i < newer->count && !refuse; i++) refuse = newer->address[i] == pfn;
    if (!refuse && version > SHIM_CUDA_CHECKED_VERSION) {
        /* An internal address: the same function as at the newest version the table was checked
         * against, or another one (the newer variant) the library cannot tell apart by address. */
        void *checked = NULL;
        refuse = ask(symbol, &checked, SHIM_CUDA_CHECKED_VERSION, flags) != CUDA_SUCCESS || checked != pfn;
    }
    if (refuse) {
        enum shim_symbol_id newest;
        size_t base_length;
        shim_variant_of(shim_symbol_name(picked), &base_length);
        shim_newest_wrapped(shim_symbol_name(picked), base_length, &newest);
        log_refusal(newest, "cuGetProcAddress", symbol, version, newer->first);
    }
    return refuse;
}
