/*
 * Registration with the node agent (docs/isolation.md, "Registration"): once per process, at the
 * first cuInit, from a detached thread so the workload never waits on the agent. The limits do
 * not depend on it: an agent that is down, slow or refusing only costs log lines. An agent that
 * does not answer (restarting, or its socket busy) is tried again with growing pauses and growing
 * per-try timeouts until START_BUDGET_MS has passed, because an unregistered process is one whose
 * compute share the agent cannot attribute; an agent that answers "no" is not asked again. The
 * reply may carry the pid the agent saw (hostPid), which the compute controller matches NVML's
 * samples by.
 *
 * The heartbeat: a reply that carries "renewS" asks the same thread to send the same line again
 * every that many seconds for as long as the process lives (the agent records each renewal as the
 * container's heartbeat; a process that stops renewing while it holds a card is reported). Renewals
 * are quiet: a renewal the agent does not answer (restarting) is just tried at the next interval;
 * one it refuses (it forgot the token: the container is being removed) ends the renewals. A stopped
 * or frozen process renews nothing, which is the point; a process whose other threads hang still
 * renews (the heartbeat says the process runs with the library in it, not that it makes progress).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define FIRST_TIMEOUT_MS 200   /* one try's connect, send and reply; doubled per try */
#define MAX_TIMEOUT_MS 3200
#define FIRST_PAUSE_MS 50      /* between tries; doubled per try */
#define MAX_PAUSE_MS 2000
#define START_BUDGET_MS 30000  /* no try starts after this long */
#define MAX_LINE 4096
#define HOST_PID_KEY "\"hostPid\":"
#define RENEW_KEY "\"renewS\":"
#define MAX_RENEW_S 3600
#define RENEW_TIMEOUT_MS 1000  /* one renewal's connect, send and reply */

static pthread_once_t register_once = PTHREAD_ONCE_INIT;
static int renew_every_s;  /* the last accepted reply's renewS; 0: no renewals */
static int registered;     /* logged once; renewals are quiet */

/* Appends text as a JSON string body (quotes, backslashes and control characters escaped). */
static size_t json_string(char *out, size_t at, size_t size, const char *text) {
    for (const unsigned char *c = (const unsigned char *)text; *c != '\0' && at + 7 < size; c++) {
        if (*c == '"' || *c == '\\') at += (size_t)snprintf(out + at, size - at, "\\%c", *c);
        else if (*c < 0x20) at += (size_t)snprintf(out + at, size - at, "\\u%04x", *c);
        else out[at++] = (char)*c;
    }
    out[at] = '\0';
    return at;
}

static int wait_for(int fd, short events, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = events};
    int ready;
    do ready = poll(&p, 1, timeout_ms);
    while (ready < 0 && errno == EINTR);
    return ready == 1 ? 0 : -1;
}

static int request_line(char *line, size_t size) {
    const struct shim_config *c = shim_config();
    size_t at = (size_t)snprintf(line, size, "{\"v\":1,\"op\":\"register\",\"token\":\"");
    at = json_string(line, at, size, c->token);
    at += (size_t)snprintf(line + at, size - at, "\",\"pid\":%d,\"pod\":\"", (int)getpid());
    at = json_string(line, at, size, c->pod);
    at += (size_t)snprintf(line + at, size - at, "\",\"container\":\"");
    at = json_string(line, at, size, c->container);
    at += (size_t)snprintf(line + at, size - at, "\"}\n");
    return at < size ? (int)at : -1;
}

/* A reply's optional positive integer field named by key (with its quotes and colon), at most
 * max; 0 when absent or malformed. */
static int reply_number(const char *reply, const char *key, long max) {
    const char *at = strstr(reply, key);
    if (at == NULL) return 0;
    at += strlen(key);
    while (*at == ' ') at++;
    if (*at < '1' || *at > '9') return 0;
    char *end;
    errno = 0;
    long pid = strtol(at, &end, 10);
    if (errno != 0 || pid > max || (*end != ',' && *end != '}' && *end != ' ')) return 0;
    return (int)pid;
}

/* The reply's optional "hostPid": this process's pid as the agent sees it (SO_PEERCRED), which is
 * how NVML names it when the container has its own pid namespace. 0 when absent or malformed. */
static int reply_host_pid(const char *reply) { return reply_number(reply, HOST_PID_KEY, INT_MAX); }

enum { TRY_REGISTERED, TRY_REFUSED, TRY_FAILED };

static int exchange(int fd, int timeout_ms, int quiet) {
    char line[MAX_LINE], reply[MAX_LINE];
    int length = request_line(line, sizeof line);
    if (length < 0 || wait_for(fd, POLLOUT, timeout_ms) != 0 ||
        send(fd, line, (size_t)length, MSG_NOSIGNAL) != length) {
        if (!quiet) shim_log(SHIM_LOG_WARN, "could not send the registration to the node agent");
        return TRY_FAILED;
    }
    size_t got = 0;
    while (got < sizeof reply - 1 && memchr(reply, '\n', got) == NULL) {
        if (wait_for(fd, POLLIN, timeout_ms) != 0) break;
        ssize_t n = recv(fd, reply + got, sizeof reply - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    reply[got] = '\0';
    if (strstr(reply, "\"ok\":true") != NULL) {
        int host_pid = reply_host_pid(reply);
        if (host_pid > 0) shim_region_set_host_pid(host_pid);
        renew_every_s = reply_number(reply, RENEW_KEY, MAX_RENEW_S);
        if (!registered)
            shim_log(SHIM_LOG_INFO, "registered with the node agent (host pid %d, renewing every %d s)",
                     host_pid > 0 ? host_pid : (int)getpid(), renew_every_s);
        registered = 1;
        return TRY_REGISTERED;
    }
    if (memchr(reply, '\n', got) != NULL && strstr(reply, "\"retry\":true") != NULL) {
        /* the agent's socket is busy (silent connections): its state, not ours; ask again */
        if (!quiet) shim_log(SHIM_LOG_INFO, "the node agent's registration socket is busy; trying again");
        return TRY_FAILED;
    }
    if (memchr(reply, '\n', got) != NULL) { /* a whole answer that is not a yes: asking again changes nothing */
        shim_log(SHIM_LOG_WARN, "the node agent did not register this process (limits still hold): %.200s", reply);
        return TRY_REFUSED;
    }
    if (!quiet) shim_log(SHIM_LOG_WARN, "the node agent did not answer the registration in %d ms (limits still hold)",
                         timeout_ms);
    return TRY_FAILED;
}

/* One try: connect, send, read the answer, each step within timeout_ms. */
static int try_once(const char *socket_path, int timeout_ms, int quiet) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "%s", socket_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return TRY_FAILED;
    int rc = connect(fd, (struct sockaddr *)&address, sizeof address);
    if (rc != 0 && (errno == EINPROGRESS || errno == EAGAIN)) rc = wait_for(fd, POLLOUT, timeout_ms);
    int outcome = TRY_FAILED;
    if (rc != 0) {
        if (!quiet) shim_log(SHIM_LOG_WARN, "node agent unreachable at %s (limits still hold)", socket_path);
    } else outcome = exchange(fd, timeout_ms, quiet);
    close(fd);
    return outcome;
}

static void pause_ms(int ms) {
    struct timespec pause = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) continue;
}

/* The heartbeat: the same line every renew_every_s (which each accepted reply may change) until
 * the agent refuses it or asks for no more. */
static void renew(const char *socket_path) {
    while (renew_every_s > 0) {
        pause_ms(renew_every_s * 1000);
        if (try_once(socket_path, RENEW_TIMEOUT_MS, 1) == TRY_REFUSED) {
            shim_log(SHIM_LOG_INFO, "the node agent refused a renewal: no more renewals");
            return;
        }
    }
}

static void *register_now(void *unused) {
    (void)unused;
    const struct shim_config *c = shim_config();
    uint64_t started = shim_now_ns(), budget = (uint64_t)START_BUDGET_MS * 1000000ull;
    int timeout_ms = FIRST_TIMEOUT_MS, wait_ms = FIRST_PAUSE_MS, tries = 0;
    for (;;) {
        int outcome = try_once(c->socket_path, timeout_ms, tries > 0); /* the first failure is logged */
        tries++;
        if (outcome == TRY_REGISTERED) renew(c->socket_path);
        if (outcome != TRY_FAILED) return NULL;
        if (tries == 1) shim_log(SHIM_LOG_INFO, "trying to register again for up to %d s", START_BUDGET_MS / 1000);
        if (shim_now_ns() - started + (uint64_t)wait_ms * 1000000ull >= budget) break;
        pause_ms(wait_ms);
        wait_ms = wait_ms * 2 > MAX_PAUSE_MS ? MAX_PAUSE_MS : wait_ms * 2;
        timeout_ms = timeout_ms * 2 > MAX_TIMEOUT_MS ? MAX_TIMEOUT_MS : timeout_ms * 2;
    }
    shim_log(SHIM_LOG_WARN, "not registered with the node agent after %d tries in %d s (limits still hold)", tries,
             START_BUDGET_MS / 1000);
    return NULL;
}

static void start_registration(void) {
    const struct shim_config *c = shim_config();
    if (c->token[0] == '\0' || c->socket_path[0] == '\0') {
        shim_log(SHIM_LOG_DEBUG, "no token or agent socket in the environment: not registering");
        return;
    }
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attributes, register_now, NULL) != 0)
        shim_log(SHIM_LOG_WARN, "cannot start registration with the node agent");
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
}

void shim_register_once(void) { pthread_once(&register_once, start_registration); }

CUresult cuInit(unsigned int flags) {
    if (REAL(cuInit) == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult status = REAL(cuInit)(flags);
    if (status == CUDA_SUCCESS) shim_register_once(); /* also unlimited shares: the agent tracks them */
    return status;
}
