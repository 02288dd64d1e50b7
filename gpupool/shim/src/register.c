/*
 * Registration with the node agent (docs/isolation.md, "Registration"): once per process, at the
 * first cuInit, from a detached thread so the workload never waits on the agent. The limits do
 * not depend on it: an agent that is down, slow or refusing only costs a log line. The reply may
 * carry the pid the agent saw (hostPid), which the compute controller matches NVML's samples by.
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
#include <unistd.h>

#include "shim.h"

#define TIMEOUT_MS 200
#define MAX_LINE 4096
#define HOST_PID_KEY "\"hostPid\":"

static pthread_once_t register_once = PTHREAD_ONCE_INIT;

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

/* The reply's optional "hostPid": this process's pid as the agent sees it (SO_PEERCRED), which is
 * how NVML names it when the container has its own pid namespace. 0 when absent or malformed. */
static int reply_host_pid(const char *reply) {
    const char *at = strstr(reply, HOST_PID_KEY);
    if (at == NULL) return 0;
    at += strlen(HOST_PID_KEY);
    while (*at == ' ') at++;
    if (*at < '1' || *at > '9') return 0;
    char *end;
    errno = 0;
    long pid = strtol(at, &end, 10);
    if (errno != 0 || pid > INT_MAX || (*end != ',' && *end != '}' && *end != ' ')) return 0;
    return (int)pid;
}

static void exchange(int fd) {
    char line[MAX_LINE], reply[MAX_LINE];
    int length = request_line(line, sizeof line);
    if (length < 0 || wait_for(fd, POLLOUT, TIMEOUT_MS) != 0 ||
        send(fd, line, (size_t)length, MSG_NOSIGNAL) != length) {
        shim_log(SHIM_LOG_WARN, "could not send the registration to the node agent");
        return;
    }
    size_t got = 0;
    while (got < sizeof reply - 1 && memchr(reply, '\n', got) == NULL) {
        if (wait_for(fd, POLLIN, TIMEOUT_MS) != 0) break;
        ssize_t n = recv(fd, reply + got, sizeof reply - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    reply[got] = '\0';
    if (strstr(reply, "\"ok\":true") != NULL) {
        int host_pid = reply_host_pid(reply);
        if (host_pid > 0) shim_region_set_host_pid(host_pid);
        shim_log(SHIM_LOG_INFO, "registered with the node agent (host pid %d)", host_pid > 0 ? host_pid : (int)getpid());
    } else shim_log(SHIM_LOG_WARN, "the node agent did not register this process (limits still hold): %.200s",
                  got ? reply : "no answer");
}

static void *register_now(void *unused) {
    (void)unused;
    const struct shim_config *c = shim_config();
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "%s", c->socket_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    int rc = connect(fd, (struct sockaddr *)&address, sizeof address);
    if (rc != 0 && (errno == EINPROGRESS || errno == EAGAIN)) rc = wait_for(fd, POLLOUT, TIMEOUT_MS);
    if (rc != 0) shim_log(SHIM_LOG_WARN, "node agent unreachable at %s (limits still hold)", c->socket_path);
    else exchange(fd);
    close(fd);
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
