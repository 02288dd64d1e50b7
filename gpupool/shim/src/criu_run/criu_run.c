/* criu-run: a workload's entrypoint that turns gpupool's checkpoint signal into a CRIU dump of the
 * workload's processes, and a later start from such a dump into a CRIU restore (docs/lending.md,
 * "Process checkpoints with CRIU").
 *
 *   criu-run [--criu PATH] -- CMD [ARG...]
 *
 * Started without a dump to resume from, it runs CMD as its child and waits for it, passing on
 * SIGTERM, SIGINT, SIGHUP and SIGQUIT. On $GPUPOOL_CHECKPOINT_SIGNAL (SIGUSR1 when unset) it dumps
 * CMD's process tree with `criu dump` into $GPUPOOL_CHECKPOINT_DIR/.criu-<n> (CRIU ends the tree),
 * renames the directory to criu-<n> (the protocol's write-then-rename: a dump cut short keeps its dot
 * name and is never resumed from) and exits 0. Where the dump fails, the tree is still running
 * (CRIU resumes it) and the signal is passed on to CMD, which may write its own checkpoint.
 *
 * Each dump is as large as the workload's memory, so once a new one is renamed into place the
 * directory keeps only it (or the newest $GPUPOOL_CRIU_KEEP finished dumps, 1 when unset): older
 * criu-<n> directories, .criu-<n> dumps cut short and .criu-restore-* logs go, but only those
 * older than the new dump (lower numbered, and last changed before it was begun: nothing another
 * writer touched meanwhile). A failed dump removes nothing, so the dump a pod was restored from
 * stays until a newer one is complete. The workload's own checkpoints (other names) are its own.
 *
 * Started with $GPUPOOL_RESUME_FROM naming a criu-<n> directory, it runs `criu restore` instead of
 * CMD: the restored tree becomes its child (--restore-sibling) with the process ids it had, and is
 * waited for as CMD would have been. Those ids must be free, so criu itself is started with an id
 * above every id of the dumped namespace (clone3's set_tid; the dump records the highest in
 * `pids-max`). The container's standard streams are pipes of its runtime: the dump records which
 * pipe each of fds 0-2 was (`descriptors`) and the restore hands the new container's pipes in their
 * place (--inherit-fd), so the restored process writes to the new container's log.
 *
 * CUDA processes (NVIDIA's cuda-checkpoint, where it is found: $GPUPOOL_CUDA_CHECKPOINT, else a
 * `cuda-checkpoint` beside CRIU). CRIU cannot dump a process that maps the GPU, so before the dump
 * each process of CMD's tree is asked `--get-state`: one that fails it is no CUDA process and left
 * alone, `running` is toggled (`--toggle`: its device memory is copied into its host memory and the
 * GPU released), `checkpointed` is left as it is, `locked` or `failed` abort the dump. The pids
 * toggled are written into the dump (`cuda-pids`) before the rename; after a restore each of them is
 * toggled back (the restore keeps pids). An aborted or failed dump toggles back what it toggled, so
 * the workload goes on on the GPU and gets the signal as above. A process that cannot be toggled
 * back after a restore cannot go on (its CUDA calls fail or block): the restored tree is killed and
 * CMD started afresh, as after a failed restore. Each call of the tool is bounded
 * ($GPUPOOL_CUDA_CHECKPOINT_TIMEOUT seconds, 30 by default; a tool past it is killed).
 *
 * The exit status is CMD's (128 + the signal when a signal ended it). Where it is not the
 * namespace's init it makes itself a child subreaper, so orphans of the tree are still reaped.
 * Signals are taken synchronously (blocked, then sigwaitinfo; no handlers run): a namespace's init
 * ignores a signal it has no handler for, even the runtime's SIGTERM, but a blocked one is queued.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_CRIU "/var/run/gpupool/criu/criu"
#define PREFIX "criu-"
#define MAX_ARGS 32
#define KERNDAT_CACHE "criu.kdat"
#define CUDA_TOOL "cuda-checkpoint"
#define CUDA_PIDS "cuda-pids"
#define CUDA_TIMEOUT_S 30
#define MAX_CUDA 256
#define CANNOT_RUN "criu-run: cannot run cuda-checkpoint: " /* what its child says when exec fails */
#define MAX_PROCESSES 4096 /* of the namespace, read from /proc for a tree */
#define RESTORE_LOGS ".criu-restore-"
#define KEEP_ENV "GPUPOOL_CRIU_KEEP"
#define MAX_KEEP 64
#define MAX_DEPTH 32 /* of a directory removed: CRIU's images are flat, deeper is not ours */

static const char *criu_path = DEFAULT_CRIU;
static char cuda_tool[PATH_MAX]; /* empty: no cuda-checkpoint, nothing toggled */
static int cuda_timeout_ms = CUDA_TIMEOUT_S * 1000;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("criu-run: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* A signal by name (SIGUSR1 or USR1) or number; 0 when unknown. */
static int signal_named(const char *name)
{
	static const struct { const char *name; int sig; } known[] = {
		{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"INT", SIGINT},
		{"HUP", SIGHUP}, {"QUIT", SIGQUIT}, {"PWR", SIGPWR},
	};
	char *end;
	long number;
	if (name == NULL || *name == '\0')
		return SIGUSR1;
	number = strtol(name, &end, 10);
	if (*end == '\0')
		return number > 0 && number < NSIG ? (int)number : 0;
	if (strncmp(name, "SIG", 3) == 0)
		name += 3;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(name, known[i].name) == 0)
			return known[i].sig;
	return 0;
}

/* Point CRIU (in --unprivileged mode) at the kernel-feature cache the node wrote beside it.
 *
 * CRIU probes the kernel at start, and one probe mounts a tmpfs: without CAP_SYS_ADMIN it fails and
 * CRIU stops. With the cache (`criu check --unprivileged` run on the host, XDG_RUNTIME_DIR naming a
 * tmpfs directory: the file is gone at the next boot) it probes nothing, so the container needs only
 * CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE. */
static void use_kerndat_cache(void)
{
	char dir[PATH_MAX], cache[PATH_MAX + 16];
	char *slash;
	snprintf(dir, sizeof(dir), "%s", criu_path);
	slash = strrchr(dir, '/');
	if (slash == NULL)
		return;
	*slash = '\0';
	snprintf(cache, sizeof(cache), "%s/" KERNDAT_CACHE, dir);
	if (access(cache, R_OK) == 0)
		setenv("XDG_RUNTIME_DIR", dir, 1);
}

/* Run argv (criu) as a child, optionally with process id `pid` (0: any), and wait for it. */
static int run_criu(char *const argv[], pid_t pid)
{
	pid_t child = -1;
	int status;
	if (pid > 0) {
		struct clone_args args;
		pid_t want = pid;
		memset(&args, 0, sizeof(args));
		args.exit_signal = SIGCHLD;
		args.set_tid = (uint64_t)(uintptr_t)&want;
		args.set_tid_size = 1;
		child = (pid_t)syscall(SYS_clone3, &args, sizeof(args));
		if (child < 0)
			say("cannot start criu as process %d (%s); starting it with any id", (int)pid, strerror(errno));
	}
	if (child < 0)
		child = fork();
	if (child < 0) {
		say("fork: %s", strerror(errno));
		return -1;
	}
	if (child == 0) {
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		use_kerndat_cache();
		execv(argv[0], argv);
		say("cannot run %s: %s", argv[0], strerror(errno));
		_exit(127);
	}
	while (waitpid(child, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The next dump's number: one above every criu-<n> and .criu-<n> in dir. */
static unsigned long next_number(const char *dir)
{
	unsigned long highest = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	if (d == NULL)
		return 1;
	while ((e = readdir(d)) != NULL) {
		const char *name = e->d_name[0] == '.' ? e->d_name + 1 : e->d_name;
		char *end;
		unsigned long n;
		if (strncmp(name, PREFIX, strlen(PREFIX)) != 0)
			continue;
		n = strtoul(name + strlen(PREFIX), &end, 10);
		if (*end == '\0' && n > highest)
			highest = n;
	}
	closedir(d);
	return highest + 1;
}

/* The highest process id in this pid namespace now (the tree to dump is all there is, with us). */
static long highest_pid(void)
{
	long highest = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long n = strtol(e->d_name, &end, 10);
		if (*end == '\0' && n > highest)
			highest = n;
	}
	closedir(d);
	return highest;
}

static int write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	size_t left = strlen(text);
	if (fd < 0)
		return -1;
	while (left > 0) {
		ssize_t n = write(fd, text, left);
		if (n < 0) {
			close(fd);
			return -1;
		}
		text += n;
		left -= (size_t)n;
	}
	fsync(fd);
	return close(fd);
}

static void fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* Where cuda-checkpoint is: $GPUPOOL_CUDA_CHECKPOINT, else beside CRIU; none leaves CUDA alone. */
static void find_cuda_tool(void)
{
	const char *named = getenv("GPUPOOL_CUDA_CHECKPOINT");
	const char *timeout = getenv("GPUPOOL_CUDA_CHECKPOINT_TIMEOUT");
	char *slash;
	double seconds = timeout != NULL ? atof(timeout) : 0;
	if (seconds > 0) /* past INT_MAX ms the cast is undefined (x86: INT_MIN, every call "timed out") */
		cuda_timeout_ms = seconds < INT_MAX / 1000.0 ? (int)(seconds * 1000) : INT_MAX;
	if (named != NULL && *named != '\0') {
		if (access(named, X_OK) == 0)
			snprintf(cuda_tool, sizeof(cuda_tool), "%s", named);
		else
			say("GPUPOOL_CUDA_CHECKPOINT=%s cannot be run (%s): CUDA processes are not suspended", named,
			    strerror(errno));
		return;
	}
	snprintf(cuda_tool, sizeof(cuda_tool), "%s", criu_path);
	slash = strrchr(cuda_tool, '/');
	if (slash == NULL || (size_t)(slash + 1 - cuda_tool) + sizeof(CUDA_TOOL) > sizeof(cuda_tool)) {
		cuda_tool[0] = '\0';
		return;
	}
	strcpy(slash + 1, CUDA_TOOL);
	if (access(cuda_tool, X_OK) != 0)
		cuda_tool[0] = '\0';
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Run `cuda-checkpoint <action> --pid <pid>` within cuda_timeout_ms; its exit status (-1: killed at
 * the bound or not started; 127: it could not be run), with what it printed in out. */
static int cuda_call(const char *action, pid_t pid, char *out, size_t size)
{
	char pidarg[32];
	int pipefd[2], status = 0;
	size_t used = 0;
	long long deadline = now_ms() + cuda_timeout_ms;
	pid_t tool;
	out[0] = '\0';
	snprintf(pidarg, sizeof(pidarg), "%d", (int)pid);
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -1;
	tool = fork();
	if (tool < 0) {
		close(pipefd[0]);
		close(pipefd[1]);
		return -1;
	}
	if (tool == 0) {
		sigset_t none;
		int null = open("/dev/null", O_RDONLY);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (null >= 0)
			dup2(null, 0);
		dup2(pipefd[1], 1);
		dup2(pipefd[1], 2);
		execl(cuda_tool, cuda_tool, action, "--pid", pidarg, (char *)NULL);
		dprintf(1, CANNOT_RUN "%s\n", strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
		long long left = deadline - now_ms();
		ssize_t n;
		if (left <= 0)
			break;
		if (poll(&p, 1, (int)left) <= 0)
			continue;
		n = read(pipefd[0], out + used, size - 1 - used);
		if (n <= 0 || used + (size_t)n >= size - 1) {
			if (n > 0)
				used += (size_t)n;
			break;
		}
		used += (size_t)n;
	}
	out[used] = '\0';
	close(pipefd[0]);
	for (;;) {
		pid_t done = waitpid(tool, &status, WNOHANG);
		if (done == tool)
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		if (done < 0 && errno != EINTR)
			return -1;
		if (now_ms() >= deadline) {
			kill(tool, SIGKILL);
			waitpid(tool, &status, 0);
			say("%s %s --pid %d: no answer within %d ms; killed", cuda_tool, action, (int)pid, cuda_timeout_ms);
			return -1;
		}
		usleep(5000);
	}
}

enum cuda_state { NOT_CUDA, RUNNING, CHECKPOINTED, STUCK, UNKNOWN };

static enum cuda_state cuda_state(pid_t pid)
{
	static int told;
	char out[256];
	int rc = cuda_call("--get-state", pid, out, sizeof(out));
	if (rc == -1)
		return UNKNOWN;
	/* A tool that cannot run (an image without glibc) answers nothing: every process is taken for
	 * no CUDA process, as before, since a dump of a workload without CUDA must still go on; a CUDA
	 * process then fails CRIU's dump, whose log alone would not say why. */
	if (rc == 127 && strncmp(out, CANNOT_RUN, strlen(CANNOT_RUN)) == 0 && !told) {
		told = 1;
		say("cannot run %s (%.*s): CUDA processes are not suspended", cuda_tool,
		    (int)strcspn(out + strlen(CANNOT_RUN), "\n"), out + strlen(CANNOT_RUN));
	}
	if (rc != 0)
		return NOT_CUDA;
	if (strstr(out, "checkpointed") != NULL)
		return CHECKPOINTED;
	if (strstr(out, "running") != NULL)
		return RUNNING;
	if (strstr(out, "locked") != NULL || strstr(out, "failed") != NULL)
		return STUCK;
	return UNKNOWN;
}

static int cuda_toggle(pid_t pid)
{
	char out[256];
	int rc = cuda_call("--toggle", pid, out, sizeof(out));
	if (rc != 0)
		say("%s --toggle --pid %d failed (%d): %.200s", cuda_tool, (int)pid, rc, out);
	return rc == 0 ? 0 : -1;
}

/* The processes of the tree rooted at `root` (itself first, then by pid), at most `max`. */
static int tree_pids(pid_t root, pid_t *out, int max)
{
	static pid_t pid[MAX_PROCESSES], parent[MAX_PROCESSES];
	int all = 0, n = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL && all < MAX_PROCESSES) {
		char path[64], buf[512], *close_paren;
		int fd;
		ssize_t len;
		long p = strtol(e->d_name, &close_paren, 10);
		if (*close_paren != '\0' || p <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/stat", p);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		close_paren = strrchr(buf, ')');
		if (close_paren == NULL)
			continue;
		pid[all] = (pid_t)p;
		parent[all] = (pid_t)strtol(close_paren + 4, NULL, 10); /* ") S <ppid>" */
		all++;
	}
	closedir(d);
	out[n++] = root;
	for (int i = 0; i < n; i++) /* breadth first: children of out[i] */
		for (int j = 0; j < all && n < max; j++)
			if (parent[j] == out[i])
				out[n++] = pid[j];
	return n;
}

/* Toggle back each of `pids` that is checkpointed now; how many could not be. */
static int cuda_resume(const pid_t *pids, int n)
{
	int failed = 0;
	for (int i = n - 1; i >= 0; i--) {
		enum cuda_state state = cuda_state(pids[i]);
		if (state == CHECKPOINTED && cuda_toggle(pids[i]) == 0)
			continue;
		if (state != RUNNING) {
			say("process %d could not be put back on the GPU (state %d)", (int)pids[i], (int)state);
			failed++;
		}
	}
	return failed;
}

/* Before a dump: toggle every running CUDA process of the tree to checkpointed; 0 and the pids
 * toggled, or -1 (what was toggled is toggled back) when a process is locked, failed or would not. */
static int cuda_suspend(pid_t root, pid_t *toggled, int *count)
{
	pid_t tree[MAX_CUDA];
	int n = tree_pids(root, tree, MAX_CUDA);
	long long began = now_ms();
	*count = 0;
	for (int i = 0; i < n; i++) {
		enum cuda_state state = cuda_state(tree[i]);
		if (state == NOT_CUDA || state == CHECKPOINTED)
			continue;
		if (state == RUNNING) {
			toggled[(*count)++] = tree[i];
			if (cuda_toggle(tree[i]) == 0)
				continue;
		}
		say("process %d cannot be suspended (%s): no dump", (int)tree[i],
		    state == STUCK ? "locked or failed" : state == RUNNING ? "toggle failed" : "no answer");
		if (cuda_resume(toggled, *count) > 0)
			say("some CUDA processes stay checkpointed");
		*count = 0;
		return -1;
	}
	if (*count > 0)
		say("suspended %d CUDA process(es) with %s in %lld ms", *count, cuda_tool, now_ms() - began);
	return 0;
}

/* Remove `name` in the directory `parent` (a directory with everything in it, never following a
 * link); 0 when it is gone. An entry gone meanwhile (another remover) is no failure. */
static int remove_entry(int parent, const char *name, int depth)
{
	struct stat st;
	struct dirent *e;
	DIR *d;
	int fd, failed = 0;
	if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -1;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(parent, name, 0) < 0 && errno != ENOENT ? -1 : 0;
	if (depth >= MAX_DEPTH) {
		errno = ELOOP;
		return -1;
	}
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return -1;
	}
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
		    remove_entry(dirfd(d), e->d_name, depth + 1) < 0)
			failed = 1;
	closedir(d);
	if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		return -1;
	return failed ? -1 : 0;
}

/* The number of a dump's name ("criu-<n>", or ".criu-<n>" with `dot`), or 0 when it is no such name. */
static unsigned long dump_number(const char *name, int dot)
{
	char *end;
	unsigned long n;
	if (dot && *name++ != '.')
		return 0;
	if (strncmp(name, PREFIX, strlen(PREFIX)) != 0 || !isdigit((unsigned char)name[strlen(PREFIX)]))
		return 0;
	n = strtoul(name + strlen(PREFIX), &end, 10);
	return *end == '\0' ? n : 0;
}

static int older(const struct stat *st, const struct timespec *than)
{
	return st->st_mtim.tv_sec < than->tv_sec ||
	       (st->st_mtim.tv_sec == than->tv_sec && st->st_mtim.tv_nsec < than->tv_nsec);
}

/* How many finished dumps to keep ($GPUPOOL_CRIU_KEEP, 1 when unset); 0: remove none (a bad value). */
static int dumps_to_keep(void)
{
	const char *said = getenv(KEEP_ENV);
	char *end;
	long n;
	if (said == NULL || *said == '\0')
		return 1;
	n = strtol(said, &end, 10);
	if (*end != '\0' || n < 1) {
		say(KEEP_ENV "=%s is not a count of 1 or more: no older dump is removed", said);
		return 0;
	}
	return n > MAX_KEEP ? MAX_KEEP : (int)n;
}

/* After dir/criu-<kept> is in place (begun at `began`, the mtime its directory was created with):
 * remove what is older than it. Finished dumps beyond the newest `keep` (counting it), dumps cut
 * short and restore logs go; only entries numbered below it and last changed before `began`. */
static void remove_older(const char *dir, unsigned long kept, const struct timespec *began)
{
	unsigned long newest[MAX_KEEP];
	int keep = dumps_to_keep(), kept_more = 0, dumps = 0, logs = 0, fd;
	DIR *d;
	struct dirent *e;
	if (keep == 0)
		return;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		say("cannot read %s to remove older dumps: %s", dir, strerror(errno));
		return;
	}
	for (int pass = 0; pass < 2; pass++) {
		/* pass 0: the keep - 1 highest older finished dumps; pass 1: remove the rest */
		rewinddir(d);
		while ((e = readdir(d)) != NULL) {
			unsigned long n = dump_number(e->d_name, 0), cut = dump_number(e->d_name, 1);
			int log = strncmp(e->d_name, RESTORE_LOGS, strlen(RESTORE_LOGS)) == 0;
			char inventory[NAME_MAX + 32];
			struct stat st, inv;
			int finished, lowest = 0;
			if ((n == 0 || n >= kept) && (cut == 0 || cut >= kept) && !log)
				continue;
			if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode) || !older(&st, began))
				continue;
			snprintf(inventory, sizeof(inventory), "%s/inventory.img", e->d_name);
			finished = n != 0 && fstatat(fd, inventory, &inv, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(inv.st_mode) &&
				   inv.st_size > 0;
			if (pass == 0) {
				if (!finished || keep == 1)
					continue;
				if (kept_more < keep - 1) {
					newest[kept_more++] = n;
					continue;
				}
				for (int i = 1; i < kept_more; i++)
					if (newest[i] < newest[lowest])
						lowest = i;
				if (n > newest[lowest])
					newest[lowest] = n;
				continue;
			}
			if (finished) {
				int spared = 0;
				for (int i = 0; i < kept_more && !spared; i++)
					spared = newest[i] == n;
				if (spared)
					continue;
			}
			if (remove_entry(fd, e->d_name, 0) < 0)
				say("cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
			else if (log)
				logs++;
			else
				dumps++;
		}
	}
	closedir(d);
	if (dumps + logs > 0) {
		fsync_dir(dir);
		say("removed %d older dump(s) and %d restore log(s) from %s", dumps, logs, dir);
	}
}

/* Dump the tree rooted at `child` into dir/criu-<n>; 0 when it is there (the tree is gone). */
static int dump(pid_t child, const char *dir)
{
	char work[PATH_MAX], done[PATH_MAX], file[PATH_MAX + 32], pidarg[32];
	char text[3 * (PATH_MAX + 8)] = "";
	unsigned long n = next_number(dir);
	long highest = highest_pid();
	pid_t toggled[MAX_CUDA];
	struct stat created;
	int rc, cuda = 0;
	snprintf(work, sizeof(work), "%s/." PREFIX "%lu", dir, n);
	snprintf(done, sizeof(done), "%s/" PREFIX "%lu", dir, n);
	if (mkdir(work, 0755) < 0 || stat(work, &created) < 0) {
		say("cannot create %s: %s", work, strerror(errno));
		return -1;
	}
	for (int fd = 0; fd <= 2; fd++) {
		char link[64], target[PATH_MAX];
		ssize_t len;
		snprintf(link, sizeof(link), "/proc/%d/fd/%d", (int)child, fd);
		len = readlink(link, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		snprintf(text + strlen(text), sizeof(text) - strlen(text), "%d %s\n", fd, target);
	}
	snprintf(file, sizeof(file), "%s/descriptors", work);
	if (write_text(file, text) < 0)
		say("cannot write %s: %s", file, strerror(errno));
	snprintf(text, sizeof(text), "%ld\n", highest);
	snprintf(file, sizeof(file), "%s/pids-max", work);
	if (write_text(file, text) < 0)
		say("cannot write %s: %s", file, strerror(errno));
	if (cuda_tool[0] != '\0') {
		if (cuda_suspend(child, toggled, &cuda) < 0)
			return -1;
		text[0] = '\0';
		for (int i = 0; i < cuda; i++)
			snprintf(text + strlen(text), sizeof(text) - strlen(text), "%d\n", (int)toggled[i]);
		snprintf(file, sizeof(file), "%s/" CUDA_PIDS, work);
		if (write_text(file, text) < 0) { /* a restore would leave them checkpointed: no dump */
			say("cannot write %s: %s", file, strerror(errno));
			cuda_resume(toggled, cuda);
			return -1;
		}
	}
	snprintf(pidarg, sizeof(pidarg), "%d", (int)child);
	{
		char *argv[] = {(char *)criu_path, "dump", "-t", pidarg, "-D", work, "-o", "dump.log",
				"--manage-cgroups=ignore", "--unprivileged", NULL};
		rc = run_criu(argv, 0);
	}
	if (rc != 0) {
		say("criu dump of process %d failed (exit %d; %s/dump.log)", (int)child, rc, work);
		if (cuda > 0 && cuda_resume(toggled, cuda) == 0)
			say("%d CUDA process(es) back on the GPU", cuda);
		return -1;
	}
	if (rename(work, done) < 0) {
		say("cannot rename %s to %s: %s", work, done, strerror(errno));
		return -1;
	}
	fsync_dir(dir);
	say("dumped process %d and its children into %s", (int)child, done);
	remove_older(dir, n, &created.st_mtim);
	return 0;
}

/* Whether `path` names a finished dump of ours: a criu-<n> directory with CRIU's inventory. A
 * criu-<n> without it (a dump cut short, a path too long) is said on stderr: the command then
 * starts afresh, which the workload's owner should know; another name (the workload's own
 * checkpoint) is the command's to resume from, silently. */
static int is_dump(const char *path)
{
	const char *base = strrchr(path, '/');
	char inventory[PATH_MAX];
	struct stat st;
	base = base != NULL ? base + 1 : path;
	if (strncmp(base, PREFIX, strlen(PREFIX)) != 0)
		return 0;
	if ((size_t)snprintf(inventory, sizeof(inventory), "%s/inventory.img", path) < sizeof(inventory) &&
	    stat(inventory, &st) == 0 && S_ISREG(st.st_mode))
		return 1;
	say("GPUPOOL_RESUME_FROM=%s is not a finished CRIU dump (no inventory.img)", path);
	return 0;
}

static long read_long(const char *path)
{
	char buf[32] = "";
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return strtol(buf, NULL, 10);
}

/* Restore the dump at `path`; the restored tree's root (our child), or -1. */
static pid_t restore(const char *path, const char *dir)
{
	char file[PATH_MAX + 32], workdir[PATH_MAX], pidfile[PATH_MAX + 16], inherit[3][PATH_MAX + 16];
	char *argv[MAX_ARGS];
	int argc = 0, rc;
	long highest, max_pid;
	FILE *descriptors;
	snprintf(workdir, sizeof(workdir), "%s/.criu-restore-%d", dir, (int)time(NULL));
	if (mkdir(workdir, 0755) < 0 && errno != EEXIST) {
		say("cannot create %s: %s", workdir, strerror(errno));
		return -1;
	}
	snprintf(pidfile, sizeof(pidfile), "%s/root.pid", workdir);
	argv[argc++] = (char *)criu_path;
	argv[argc++] = "restore";
	argv[argc++] = "-D";
	argv[argc++] = (char *)path;
	argv[argc++] = "-W";
	argv[argc++] = workdir;
	argv[argc++] = "-o";
	argv[argc++] = "restore.log";
	argv[argc++] = "--restore-detached";
	argv[argc++] = "--restore-sibling";
	argv[argc++] = "--manage-cgroups=ignore";
	argv[argc++] = "--unprivileged";
	argv[argc++] = "--pidfile";
	argv[argc++] = pidfile;
	snprintf(file, sizeof(file), "%s/descriptors", path);
	descriptors = fopen(file, "re");
	if (descriptors != NULL) {
		int fd;
		char target[PATH_MAX];
		while (argc < MAX_ARGS - 3 && fscanf(descriptors, "%d %4095s", &fd, target) == 2) {
			if (fd < 0 || fd > 2 || strncmp(target, "pipe:", 5) != 0)
				continue;
			snprintf(inherit[fd], sizeof(inherit[fd]), "fd[%d]:%s", fd, target);
			argv[argc++] = "--inherit-fd";
			argv[argc++] = inherit[fd];
		}
		fclose(descriptors);
	}
	argv[argc] = NULL;
	snprintf(file, sizeof(file), "%s/pids-max", path);
	highest = read_long(file);
	max_pid = read_long("/proc/sys/kernel/pid_max");
	/* a damaged pids-max (LONG_MAX, a negative number) is no id: criu then starts with any */
	rc = run_criu(argv, highest > 0 && highest < INT_MAX && (max_pid <= 0 || highest + 1 < max_pid)
				    ? (pid_t)(highest + 1) : 0);
	if (rc != 0) {
		say("criu restore from %s failed (exit %d; %s/restore.log)", path, rc, workdir);
		return -1;
	}
	return (pid_t)read_long(pidfile);
}

/* After a restore from `path`: toggle back each process its dump checkpointed (cuda-pids; the
 * restore kept their pids). 0 when every one runs on the GPU again (or there was none). A damaged
 * list (a word that is no pid, more pids than a dump writes) is a failure: which processes stay
 * checkpointed is not known, and a checkpointed process cannot go on. */
static int resume_cuda(const char *path)
{
	char file[PATH_MAX + 16], word[32];
	pid_t pids[MAX_CUDA];
	int n = 0, failed, damaged = 0;
	long long began = now_ms();
	FILE *f;
	snprintf(file, sizeof(file), "%s/" CUDA_PIDS, path);
	f = fopen(file, "re");
	if (f == NULL)
		return 0;
	while (!damaged && fscanf(f, "%31s", word) == 1) {
		char *end;
		long pid;
		errno = 0;
		pid = strtol(word, &end, 10);
		damaged = *end != '\0' || errno != 0 || pid <= 0 || pid > INT_MAX || n == MAX_CUDA;
		if (!damaged)
			pids[n++] = (pid_t)pid;
	}
	fclose(f);
	if (damaged) {
		say("%s is damaged (\"%.31s\" is no process id, or more than %d of them)", file, word, MAX_CUDA);
		return -1;
	}
	if (n == 0)
		return 0;
	if (cuda_tool[0] == '\0') {
		say("%s lists %d checkpointed CUDA process(es) but there is no %s here", file, n, CUDA_TOOL);
		return -1;
	}
	failed = cuda_resume(pids, n);
	if (failed == 0)
		say("put %d CUDA process(es) back on the GPU in %lld ms", n, now_ms() - began);
	return failed;
}

/* SIGKILL the tree rooted at `root` and wait for `root` (its orphans are reaped by the main loop):
 * all of it, up to the processes tree_pids reads, not MAX_CUDA (a survivor would run beside the
 * command started afresh). */
static void end_tree(pid_t root)
{
	static pid_t tree[MAX_PROCESSES];
	int n = tree_pids(root, tree, MAX_PROCESSES), status;
	for (int i = 0; i < n; i++)
		kill(tree[i], SIGKILL);
	while (waitpid(root, &status, 0) < 0 && errno == EINTR)
		;
}

static pid_t start(char *const cmd[])
{
	pid_t child = fork();
	if (child == 0) {
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		setsid(); /* a session of its own: CRIU dumps a tree whose session leader is in it */
		execvp(cmd[0], cmd);
		say("cannot run %s: %s", cmd[0], strerror(errno));
		_exit(127);
	}
	if (child < 0)
		say("fork: %s", strerror(errno));
	return child;
}

int main(int argc, char *argv[])
{
	const char *dir = getenv("GPUPOOL_CHECKPOINT_DIR");
	const char *resume = getenv("GPUPOOL_RESUME_FROM");
	char resume_path[PATH_MAX];
	int checkpoint = signal_named(getenv("GPUPOOL_CHECKPOINT_SIGNAL"));
	int i = 1, status = 0;
	pid_t child;
	sigset_t set;

	if (getenv("GPUPOOL_CRIU") != NULL && *getenv("GPUPOOL_CRIU") != '\0')
		criu_path = getenv("GPUPOOL_CRIU");
	if (i + 1 < argc && strcmp(argv[i], "--criu") == 0) {
		criu_path = argv[i + 1];
		i += 2;
	}
	if (i < argc && strcmp(argv[i], "--") == 0)
		i++;
	if (i >= argc) {
		say("usage: criu-run [--criu PATH] -- CMD [ARG...]");
		return 2;
	}
	if (checkpoint == 0) {
		say("GPUPOOL_CHECKPOINT_SIGNAL=%s is not a signal", getenv("GPUPOOL_CHECKPOINT_SIGNAL"));
		return 2;
	}
	find_cuda_tool();
	if (getpid() != 1)
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGQUIT);
	sigaddset(&set, checkpoint);
	sigprocmask(SIG_BLOCK, &set, NULL);

	child = -1;
	if (resume != NULL && *resume != '\0') { /* "criu-3/" names criu-3 as well */
		size_t len = strlen(resume);
		while (len > 1 && resume[len - 1] == '/')
			len--;
		if (len < sizeof(resume_path)) {
			memcpy(resume_path, resume, len);
			resume_path[len] = '\0';
			resume = resume_path;
		}
	}
	if (resume != NULL && *resume != '\0' && is_dump(resume)) {
		child = restore(resume, dir != NULL && *dir != '\0' ? dir : "/tmp");
		if (child > 0) {
			say("restored process %d from %s", (int)child, resume);
			if (resume_cuda(resume) != 0) {
				say("the restored processes cannot use the GPU: ending them");
				end_tree(child);
				child = -1;
			}
		}
		if (child <= 0)
			say("starting %s afresh", argv[i]);
	}
	if (child <= 0)
		child = start(&argv[i]);
	if (child < 0)
		return 127;

	for (;;) {
		siginfo_t info;
		int sig = sigwaitinfo(&set, &info);
		if (sig < 0)
			continue;
		if (sig == SIGCHLD) {
			pid_t done;
			while ((done = waitpid(-1, &status, WNOHANG)) > 0)
				if (done == child)
					return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
			continue;
		}
		if (sig == checkpoint) {
			if (dir != NULL && *dir != '\0' && dump(child, dir) == 0)
				return 0;
			say("passing the signal on to process %d", (int)child);
		}
		kill(child, sig);
	}
}
