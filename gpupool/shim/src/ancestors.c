/*
 * The environments a process's ancestors were started with, for containers without the node's
 * grant (HAMi-style pods, whose limits are only environment variables). A child started with a
 * cleared or edited environment is still bound by what its parent, grandparent ... up to its pid
 * namespace's init were started with. The kernel keeps each process's initial environment
 * (/proc/<pid>/environ); no other process can rewrite it (only the process itself, or a debugger
 * attached to it), so a child cannot lift its limits by writing somewhere first: the container's
 * init got its environment from the container's spec before any of the container's code ran.
 * An ancestor whose environment cannot be read (another user's: the kernel asks for the rights a
 * debugger would need) is skipped; docs/isolation.md lists what that leaves open.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "region.h"

/* Longer environments are read in part (the container's init's, which matters most, is short). */
#define ENV_MAX_BYTES (1u << 20)
/* A chain deeper than this is not a container's process tree. */
#define MAX_DEPTH 128

static size_t read_environ(int pid, char *buffer, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        shim_log(SHIM_LOG_DEBUG, "cannot read the environment of ancestor %d: %s", pid, strerror(errno));
        return 0;
    }
    size_t got = 0;
    while (got < size - 1) {
        ssize_t n = read(fd, buffer + got, size - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    buffer[got] = '\0';
    return got;
}

const char *shim_env_block_get(const char *env, size_t length, const char *name) {
    size_t name_length = strlen(name);
    for (size_t at = 0; at < length;) {
        const char *entry = env + at;
        size_t entry_length = strnlen(entry, length - at);
        if (entry_length > name_length && strncmp(entry, name, name_length) == 0 && entry[name_length] == '=')
            return entry + name_length + 1; /* NUL-terminated: the block ends with one */
        at += entry_length + 1;
    }
    return NULL;
}

int shim_each_ancestor_env(void (*visit)(int pid, const char *env, size_t length, void *ctx), void *ctx) {
    /* Not malloc: this runs while the library reads its settings, possibly very early. */
    char *buffer = mmap(NULL, ENV_MAX_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED) return 0;
    int visited = 0;
    int pid = getppid();
    for (int depth = 0; pid > 0 && depth < MAX_DEPTH; depth++) {
        size_t length = read_environ(pid, buffer, ENV_MAX_BYTES);
        if (length > 0) {
            visit(pid, buffer, length, ctx);
            visited++;
        }
        char state;
        int parent;
        uint64_t start;
        if (pid == 1 || shim_read_proc_stat(pid, &state, &parent, &start) != 0) break;
        pid = parent; /* 0 past the namespace's init: the walk ends there */
    }
    munmap(buffer, ENV_MAX_BYTES);
    return visited;
}
