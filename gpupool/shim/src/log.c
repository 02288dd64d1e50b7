/* Messages on stderr, one line each, prefixed so they are found in a workload's own output. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

static int threshold = -1;

static int level_from_env(void) {
    const char *text = getenv("GPUPOOL_SHIM_LOG");
    if (text == NULL) return SHIM_LOG_WARN;
    if (strcmp(text, "debug") == 0) return SHIM_LOG_DEBUG;
    if (strcmp(text, "info") == 0) return SHIM_LOG_INFO;
    if (strcmp(text, "error") == 0) return SHIM_LOG_ERROR;
    return SHIM_LOG_WARN;
}

void shim_log(int level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    int current = __atomic_load_n(&threshold, __ATOMIC_RELAXED);
    if (current < 0) {
        current = level_from_env();
        __atomic_store_n(&threshold, current, __ATOMIC_RELAXED);
    }
    if (level < current) return;
    char line[512];
    int used = snprintf(line, sizeof line, "gpupool-shim[%d] %s: ", (int)getpid(), names[level & 3]);
    va_list args;
    va_start(args, fmt);
    vsnprintf(line + used, sizeof line - (size_t)used - 1, fmt, args);
    va_end(args);
    size_t length = strlen(line);
    line[length] = '\n';
    /* One write per line: lines of concurrent processes do not interleave. */
    ssize_t ignored = write(STDERR_FILENO, line, length + 1);
    (void)ignored;
}

void shim_sleep_ns(uint64_t ns) {
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}
