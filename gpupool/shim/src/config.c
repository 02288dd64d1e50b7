/*
 * Limits and settings, read once so that every hook sees the same values for the life of the
 * process. In a gpupool container they come from the node's grant (grant.c), a read-only file the
 * node agent wrote: the environment (gpupool's contract first, HAMi-core's variables as a
 * fallback) may only lower them there, and GPUPOOL_SHIM_DISABLE is ignored. Without a grant (the
 * library used outside gpupool) the environment is all there is, as it always was.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

#define MIB (1024ull * 1024ull)
#define DEFAULT_DIR "/var/run/gpupool"
#define REGION_FILE "memory.region"
/* A value that cannot be read must not hand out the whole card: one byte refuses everything. */
#define REFUSE_ALL_BYTES 1ull

static struct shim_config config;
/* Where the list parsers below store: the process's config, or the grant's limits while it is read. */
static struct shim_config *into = &config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void copy_env(char *dest, size_t size, const char *name) {
    const char *value = getenv(name);
    if (value != NULL) snprintf(dest, size, "%s", value);
}

static int parse_uint(const char *text, size_t length, uint64_t *out) {
    uint64_t value = 0;
    if (length == 0 || length > 15) return -1;
    for (size_t i = 0; i < length; i++) {
        if (!isdigit((unsigned char)text[i])) return -1;
        value = value * 10 + (uint64_t)(text[i] - '0');
    }
    *out = value;
    return 0;
}

int shim_parse_size(const char *text, uint64_t *bytes) {
    size_t length = strlen(text);
    uint64_t unit = 1;
    if (length > 0) {
        switch (tolower((unsigned char)text[length - 1])) {
        case 'k': unit = 1024ull; length--; break;
        case 'm': unit = MIB; length--; break;
        case 'g': unit = 1024ull * MIB; length--; break;
        default: break;
        }
    }
    uint64_t value;
    if (parse_uint(text, length, &value) != 0) return -1;
    *bytes = value * unit;
    return 0;
}

/* A comma list, one entry per CUDA ordinal; calls store(ordinal, text, length) for each entry. */
static void each_entry(const char *list, const char *name, void (*store)(int, const char *, size_t, const char *)) {
    int ordinal = 0;
    const char *start = list;
    for (;;) {
        const char *end = strchr(start, ',');
        size_t length = end ? (size_t)(end - start) : strlen(start);
        if (ordinal >= SHIM_MAX_DEVICES) {
            shim_log(SHIM_LOG_WARN, "%s names more than %d cards; the rest are ignored", name, SHIM_MAX_DEVICES);
            return;
        }
        store(ordinal++, start, length, name);
        if (end == NULL) return;
        start = end + 1;
    }
}

static void store_memory_mib(int ordinal, const char *text, size_t length, const char *name) {
    uint64_t mib;
    if (parse_uint(text, length, &mib) != 0) {
        shim_log(SHIM_LOG_ERROR, "%s: entry %d (%.*s) is not a number of MiB; card %d refuses allocations",
                 name, ordinal, (int)length, text, ordinal);
        into->memory_limit[ordinal] = REFUSE_ALL_BYTES;
        return;
    }
    into->memory_limit[ordinal] = mib * MIB; /* 0 = no limit, like the compute share */
}

static void store_percent(int ordinal, const char *text, size_t length, const char *name) {
    uint64_t percent;
    if (parse_uint(text, length, &percent) != 0) {
        shim_log(SHIM_LOG_ERROR, "%s: entry %d (%.*s) is not a percentage; card %d gets 1 %%",
                 name, ordinal, (int)length, text, ordinal);
        percent = 1;
    }
    into->compute_percent[ordinal] = percent >= 100 ? 0 : (int)percent;
}

static void store_uuid(int ordinal, const char *text, size_t length, const char *name) {
    (void)name;
    snprintf(into->uuids[ordinal], SHIM_UUID_LEN, "%.*s", (int)length, text);
    into->uuid_count = ordinal + 1;
}

/* Where limit variables are read from: the process's own environment (env == NULL), or an
 * ancestor's, as ancestors.c reads it. */
struct env_source {
    const char *env;
    size_t length;
};

static const char *get(const struct env_source *from, const char *name) {
    return from->env == NULL ? getenv(name) : shim_env_block_get(from->env, from->length, name);
}

static void read_hami_memory(const struct env_source *from) {
    const char *all = get(from, "CUDA_DEVICE_MEMORY_LIMIT");
    for (int i = 0; i < SHIM_MAX_DEVICES; i++) {
        char name[64];
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        const char *text = get(from, name);
        if (text == NULL) {
            text = all;
            snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT");
        }
        if (text == NULL) continue;
        if (shim_parse_size(text, &into->memory_limit[i]) != 0) {
            shim_log(SHIM_LOG_ERROR, "%s=%s is not a size (like 4096m or 4g); card %d refuses allocations",
                     name, text, i);
            into->memory_limit[i] = REFUSE_ALL_BYTES;
        }
    }
}

/* The limit variables (gpupool's first, HAMi-core's as the fallback, per dimension) into `into`. */
static void read_limits(const struct env_source *from) {
    const char *list;
    if ((list = get(from, "GPUPOOL_MEMORY_LIMIT_MIB")) != NULL && *list != '\0')
        each_entry(list, "GPUPOOL_MEMORY_LIMIT_MIB", store_memory_mib);
    else
        read_hami_memory(from);
    if ((list = get(from, "GPUPOOL_COMPUTE_PERCENT")) != NULL && *list != '\0')
        each_entry(list, "GPUPOOL_COMPUTE_PERCENT", store_percent);
    else if ((list = get(from, "CUDA_DEVICE_SM_LIMIT")) != NULL && *list != '\0')
        for (int i = 0; i < SHIM_MAX_DEVICES; i++) store_percent(i, list, strlen(list), "CUDA_DEVICE_SM_LIMIT");
    const char *mode = get(from, "GPUPOOL_COMPUTE_MODE");
    into->mode = SHIM_MODE_HARD;
    if (mode != NULL && strcmp(mode, "soft") == 0) into->mode = SHIM_MODE_SOFT;
    else if (mode != NULL && strcmp(mode, "hard") != 0 && *mode != '\0')
        shim_log(SHIM_LOG_WARN, "GPUPOOL_COMPUTE_MODE=%s is neither hard nor soft; using hard", mode);
}

static int any_limit(void) {
    for (int i = 0; i < SHIM_MAX_DEVICES; i++)
        if (config.memory_limit[i] != 0 || config.compute_percent[i] != 0) return 1;
    return 0;
}

static int file_exists(const char *dir) {
    char path[PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, REGION_FILE);
    return stat(path, &st) == 0;
}

/* The lower of two limits where 0 means "none": a limit the environment sets can only shrink one. */
static uint64_t lower(uint64_t granted, uint64_t asked) {
    if (granted == 0) return asked;
    return asked != 0 && asked < granted ? asked : granted;
}

static void read_env(void) {
    const struct env_source own = {NULL, 0};
    const char *list;
    read_limits(&own);
    if ((list = getenv("GPUPOOL_CARD_UUIDS")) != NULL && *list != '\0')
        each_entry(list, "GPUPOOL_CARD_UUIDS", store_uuid);

    copy_env(config.socket_path, sizeof config.socket_path, "GPUPOOL_AGENT_SOCKET");
    copy_env(config.token, sizeof config.token, "GPUPOOL_SHIM_TOKEN");
    copy_env(config.pod, sizeof config.pod, "GPUPOOL_POD");
    copy_env(config.container, sizeof config.container, "GPUPOOL_CONTAINER");
}

/* What the ancestors' environments add without a grant: per card the lowest limit any of them
 * (up to the pid namespace's init) was started with, and the outermost one's region directory.
 * An ancestor started with GPUPOOL_SHIM_DISABLE=1 declared nothing. */
struct inherited {
    struct shim_config limits;
    int hard;              /* an ancestor with a compute limit asked for the hard mode */
    int pid;               /* the nearest ancestor that declared a limit; 0: none did */
    char dir[PATH_MAX];    /* GPUPOOL_SHIM_DIR of the outermost such ancestor */
};

static void visit_ancestor(int pid, const char *env, size_t length, void *ctx) {
    static struct shim_config theirs;
    struct inherited *in = ctx;
    const struct env_source from = {env, length};
    const char *disable = get(&from, "GPUPOOL_SHIM_DISABLE");
    if (disable != NULL && strcmp(disable, "1") == 0) return;
    memset(&theirs, 0, sizeof theirs);
    into = &theirs;
    read_limits(&from);
    into = &config;
    int declared = 0;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        declared |= theirs.memory_limit[d] != 0 || theirs.compute_percent[d] != 0;
        in->limits.memory_limit[d] = lower(in->limits.memory_limit[d], theirs.memory_limit[d]);
        in->limits.compute_percent[d] =
            (int)lower((uint64_t)in->limits.compute_percent[d], (uint64_t)theirs.compute_percent[d]);
        if (theirs.compute_percent[d] != 0 && theirs.mode == SHIM_MODE_HARD) in->hard = 1;
    }
    if (!declared) return;
    if (in->pid == 0) in->pid = pid;
    const char *dir = get(&from, "GPUPOOL_SHIM_DIR");
    if (dir != NULL && *dir != '\0') snprintf(in->dir, sizeof in->dir, "%s", dir); /* walking up: outermost last */
}

/* Lowers this process's limits to its ancestors'. Returns the nearest declaring ancestor, or 0. */
static int inherit(struct inherited *in) {
    memset(in, 0, sizeof *in);
    shim_each_ancestor_env(visit_ancestor, in);
    if (in->pid == 0) return 0;
    int raised = 0, lost = 0;
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        uint64_t memory = lower(in->limits.memory_limit[d], config.memory_limit[d]);
        int percent = (int)lower((uint64_t)in->limits.compute_percent[d], (uint64_t)config.compute_percent[d]);
        lost |= (memory != 0 && config.memory_limit[d] == 0) || (percent != 0 && config.compute_percent[d] == 0);
        raised |= (memory != config.memory_limit[d] && config.memory_limit[d] != 0) ||
                  (percent != config.compute_percent[d] && config.compute_percent[d] != 0);
        config.memory_limit[d] = memory;
        config.compute_percent[d] = percent;
    }
    if (in->hard) config.mode = SHIM_MODE_HARD;
    if (raised)
        shim_log(SHIM_LOG_WARN, "the environment asks for more than ancestor %d was started with; the lower limits hold",
                 in->pid);
    else if (lost)
        shim_log(SHIM_LOG_INFO, "limits taken from the environment ancestor %d was started with", in->pid);
    return in->pid;
}

/* Without a grant: the environment's limits (never above the ancestors'), its region directory
 * and its escape hatch. */
static void env_only(void) {
    static struct inherited inherited;
    int ancestor = inherit(&inherited);
    /* A process whose environment lost the limits still finds its container's region (the preload
     * file loads the library regardless) and takes the limits recorded there. The per-user
     * fallback directory is never adopted that way: it may hold a region of an unrelated run. */
    const char *dir = getenv("GPUPOOL_SHIM_DIR");
    if (ancestor != 0) { /* the ancestors' account, not a fresh one of the child's choosing */
        const char *theirs = inherited.dir[0] != '\0' ? inherited.dir : NULL;
        if (dir != NULL && *dir != '\0' && (theirs == NULL || strcmp(dir, theirs) != 0))
            shim_log(SHIM_LOG_WARN, "GPUPOOL_SHIM_DIR=%s is ignored: ancestor %d was started with limits and the "
                     "region in %s", dir, ancestor, theirs != NULL ? theirs : "the default directory");
        dir = theirs;
    }
    int adopt = 0;
    if (dir != NULL && *dir != '\0') {
        snprintf(config.dir, sizeof config.dir, "%s", dir);
        adopt = file_exists(config.dir);
    } else if (file_exists(DEFAULT_DIR)) {
        snprintf(config.dir, sizeof config.dir, "%s", DEFAULT_DIR);
        adopt = 1;
    } else {
        snprintf(config.dir, sizeof config.dir, "/tmp/gpupool-shim-%u", (unsigned)getuid());
    }
    snprintf(config.region_path, sizeof config.region_path, "%.*s/%s", PATH_MAX - 32, config.dir, REGION_FILE);
    config.enabled = any_limit() || adopt;
    const char *disable = getenv("GPUPOOL_SHIM_DISABLE");
    if (disable != NULL && strcmp(disable, "1") == 0) {
        if (ancestor != 0) {
            shim_log(SHIM_LOG_WARN, "GPUPOOL_SHIM_DISABLE=1 is ignored: ancestor %d was started with limits", ancestor);
        } else {
            if (config.enabled) shim_log(SHIM_LOG_WARN, "GPUPOOL_SHIM_DISABLE=1: limits are NOT enforced in this process");
            config.enabled = 0;
        }
    }
}

/* A virtual-card grant: card 0 (its limits already lowered by the environment, whose lists name
 * cards) presented as n ordinals, each with an even part of its memory and all of them sharing its
 * compute. A count that is not 1..SHIM_MAX_DEVICES, or a grant of more than one card, is the agent's
 * mistake: logged, and the card stays one device with its total, never more than was granted. */
static void split_card(const struct shim_grant *grant, int cards) {
    const char *text = grant->virtual_devices;
    if (text[0] == '\0') return;
    uint64_t n;
    if (parse_uint(text, strlen(text), &n) != 0 || n < 1 || n > SHIM_MAX_DEVICES) {
        shim_log(SHIM_LOG_ERROR, "the grant's virtual_devices=%s is not a device count (1 to %d); the card is one device",
                 text, SHIM_MAX_DEVICES);
        return;
    }
    if (n == 1) return;
    if (cards != 1) {
        shim_log(SHIM_LOG_ERROR, "the grant's virtual_devices=%s names one card, the grant has %d; each card is one device",
                 text, cards);
        return;
    }
    uint64_t total = config.memory_limit[0];
    config.virtual_devices = (int)n;
    config.virtual_share = total == 0 ? 0 : total / n != 0 ? total / n : REFUSE_ALL_BYTES;
    /* memory_limit[1..n-1] stay as for any card not granted (refusing): the region maps the
     * ordinals to card 0's records, and a path that did not would be refused, not unlimited */
    shim_log(SHIM_LOG_INFO, "card 0 is presented as %d devices of %llu bytes each", config.virtual_devices,
             (unsigned long long)config.virtual_share);
}

/* The grant's limits, each lowered by the environment's where that asks for less. A grant that
 * cannot be read refuses every allocation: it exists, so this is a gpupool container. */
static void apply_grant(const struct shim_grant *grant, int readable) {
    static struct shim_config granted;
    memset(&granted, 0, sizeof granted);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) granted.memory_limit[d] = REFUSE_ALL_BYTES; /* no card granted */
    if (!readable) {
        shim_log(SHIM_LOG_ERROR, "the node's grant %s cannot be read; every allocation is refused", shim_grant_path());
    } else {
        into = &granted;
        each_entry(grant->memory_mib, "the grant's memory_mib", store_memory_mib);
        if (grant->compute_percent[0] != '\0')
            each_entry(grant->compute_percent, "the grant's compute_percent", store_percent);
        if (grant->card_uuids[0] != '\0') each_entry(grant->card_uuids, "the grant's card_uuids", store_uuid);
        into = &config;
    }
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        uint64_t memory = lower(granted.memory_limit[d], config.memory_limit[d]);
        int percent = (int)lower((uint64_t)granted.compute_percent[d], (uint64_t)config.compute_percent[d]);
        if (memory != config.memory_limit[d] && config.memory_limit[d] != 0)
            shim_log(SHIM_LOG_WARN, "card %d: the environment asks for more memory than the node granted; "
                     "the grant holds", d);
        if (percent != config.compute_percent[d] && config.compute_percent[d] != 0)
            shim_log(SHIM_LOG_WARN, "card %d: the environment asks for more compute than the node granted; "
                     "the grant holds", d);
        config.memory_limit[d] = memory;
        config.compute_percent[d] = percent;
    }
    if (readable) {
        int cards = 1;
        for (const char *c = grant->memory_mib; *c != '\0'; c++) cards += *c == ',';
        split_card(grant, cards);
    }
    if (readable && strcmp(grant->compute_mode, "soft") != 0) config.mode = SHIM_MODE_HARD; /* env: soft only if granted */
    if (granted.uuid_count > 0) {
        memcpy(config.uuids, granted.uuids, sizeof config.uuids);
        config.uuid_count = granted.uuid_count;
    }
    snprintf(config.region_path, sizeof config.region_path, "%s", readable ? grant->region : "");
    snprintf(config.socket_path, sizeof config.socket_path, "%s", grant->socket_path);
    snprintf(config.token, sizeof config.token, "%s", grant->token);
    snprintf(config.pod, sizeof config.pod, "%s", grant->pod);
    snprintf(config.container, sizeof config.container, "%s", grant->container);
    config.granted = 1;
    config.enabled = 1;
    const char *disable = getenv("GPUPOOL_SHIM_DISABLE");
    if (disable != NULL && strcmp(disable, "1") == 0)
        shim_log(SHIM_LOG_WARN, "GPUPOOL_SHIM_DISABLE=1 is ignored: the node's grant is enforced");
}

static void read_config(void) {
    static struct shim_grant grant;
    int found = shim_read_grant(&grant);
    read_env();
    if (found == SHIM_GRANT_ABSENT) env_only();
    else apply_grant(&grant, found == SHIM_GRANT_PRESENT);
}

const struct shim_config *shim_config(void) {
    pthread_once(&config_once, read_config);
    return &config;
}
