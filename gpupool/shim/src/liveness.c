/*
 * Whether the process behind a record of memory.region still runs. Two witnesses:
 *   - a lock: each process holds an open-file-description lock (F_OFD_SETLK) on one byte of the
 *     region file (its slot's first byte, or the shared overflow byte). The kernel drops it when
 *     the process dies, and at exec (the descriptor is close-on-exec), whatever pid namespace the
 *     process or the one asking is in, and a reused pid cannot hold it. Other processes of the
 *     container, and the node agent, ask with F_OFD_GETLK.
 *   - the pid and its start time (/proc/<pid>/stat field 22): what the region always recorded,
 *     meaningful only inside one pid namespace, and the only witness where locks cannot be used
 *     (a private region, a file system without them).
 * A record is given up only when both say "gone", so a live process is never reclaimed because
 * its pid means something else to the one looking (a nested pid namespace), nor because it
 * closed the library's descriptor (a program closing every descriptor it did not open).
 *
 * An OFD lock belongs to the open file description and lasts until its last reference goes, and a
 * shared mapping of the file is one: the region's mapping (region.c) holds the description the
 * locks are taken through, so a program that closes the descriptor does not drop them, and the
 * allocation path need not check the descriptor (an fstat per charge cost ~1 us). A description
 * opened here again (the program closed ours) is pinned by a page of its own once a lock is taken
 * through it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "region.h"

static int lock_fd = -1;
static int lock_fd_pinned; /* a mapping holds lock_fd's description: its locks outlive the descriptor */
static dev_t lock_dev;
static ino_t lock_ino;
static char lock_path[PATH_MAX];

int shim_read_proc_stat(int pid, char *state, int *ppid, uint64_t *start_time) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t length = read(fd, text, sizeof text - 1);
    close(fd);
    if (length <= 0) return -1;
    text[length] = '\0';
    char *cursor = strrchr(text, ')'); /* the command name may hold spaces and parentheses */
    if (cursor == NULL || cursor[1] != ' ') return -1;
    cursor += 2;
    *state = *cursor;
    for (int field = 3; field < 22; field++) {
        cursor = strchr(cursor, ' ');
        if (cursor == NULL) return -1;
        cursor++;
        if (field == 3) *ppid = atoi(cursor); /* field 4 */
    }
    *start_time = strtoull(cursor, NULL, 10);
    return 0;
}

uint64_t shim_own_start_time(void) {
    char state;
    int ppid;
    uint64_t start = 0;
    shim_read_proc_stat(getpid(), &state, &ppid, &start);
    return start;
}

/* The pid witness: a zombie counts as gone (its driver context is). */
int shim_pid_alive(int pid, uint64_t start_time) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state;
    int ppid;
    uint64_t start;
    if (shim_read_proc_stat(pid, &state, &ppid, &start) != 0) return 1; /* no /proc: trust kill() */
    return start == start_time && state != 'Z' && state != 'X';
}

static int same_file(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == lock_dev && st.st_ino == lock_ino;
}

void shim_live_init(int fd, const char *path) {
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return;
    lock_fd = fd;
    lock_fd_pinned = 1; /* the region is mapped through it */
    lock_dev = st.st_dev;
    lock_ino = st.st_ino;
    snprintf(lock_path, sizeof lock_path, "%s", path);
}

/* The descriptor, opened again when the program closed ours (its number may now be another
 * file's: never lock through it). Only the rare paths that take or ask about a lock come here: a
 * lock already held needs nothing, the description it lives on stays mapped (the old description
 * keeps its locks, so taking one of them again through a new one reports it taken). */
static int ensure(void) {
    if (lock_path[0] == '\0') return -1;
    if (same_file(lock_fd)) return 0;
    int fd = open(lock_path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    if (!same_file(fd)) { /* another file under the path now: locks there would witness nothing */
        close(fd);
        return -1;
    }
    lock_fd = fd;
    lock_fd_pinned = 0;
    return 1;
}

/* After a lock was taken through a description no mapping holds yet (opened by ensure): a page of
 * it, never unmapped, so the lock outlives the descriptor as the region's own do. At most once per
 * description, and a process takes a lock at its start and when it leaves the overflow account. */
static void pin(void) {
    if (lock_fd_pinned) return;
    if (mmap(NULL, 1, PROT_READ, MAP_SHARED, lock_fd, 0) == MAP_FAILED) {
        shim_log(SHIM_LOG_DEBUG, "mapping %s: %s; its lock lasts only while the descriptor does", lock_path,
                 strerror(errno));
        return;
    }
    lock_fd_pinned = 1;
}

static int set_lock(short type, off_t offset) {
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1, .l_pid = 0};
    return fcntl(lock_fd, F_OFD_SETLK, &lock);
}

int shim_live_hold(off_t offset, int shared) {
    if (ensure() < 0) return SHIM_LIVE_UNUSABLE;
    if (set_lock(shared ? F_RDLCK : F_WRLCK, offset) == 0) {
        pin();
        return SHIM_LIVE_HELD;
    }
    if (errno == EAGAIN || errno == EACCES) return SHIM_LIVE_TAKEN;
    shim_log(SHIM_LOG_DEBUG, "locking %s at %lld: %s", lock_path, (long long)offset, strerror(errno));
    return SHIM_LIVE_UNUSABLE;
}

void shim_live_drop(off_t offset) {
    if (same_file(lock_fd)) set_lock(F_UNLCK, offset);
}

int shim_live_held_by_other(off_t offset) {
    if (ensure() < 0) return -1;
    /* Asking for a write lock reports any lock another open file description holds there. */
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1, .l_pid = 0};
    if (fcntl(lock_fd, F_OFD_GETLK, &lock) != 0) return -1;
    return lock.l_type != F_UNLCK;
}

/* The child shares the parent's open file description, so its locks: a lock the child took through
 * it would outlive the child while the parent lives. The child opens its own when it needs one. The
 * mapping the child inherited still holds the parent's description, so a parent killed while a
 * child forked without exec runs counts as alive by its lock until that child exits or execs. */
void shim_live_after_fork(void) {
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = -1;
    lock_fd_pinned = 0;
}
