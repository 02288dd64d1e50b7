/*
 * gpupool's GPU client (docs/remote-gpu.md): a libcuda.so.1 that forwards the CUDA driver API to a
 * GPU server over the network, for a container on a node without GPUs. Mount it as libcuda.so.1.
 *
 * Where the server is: GPUPOOL_REMOTE_ENDPOINT and GPUPOOL_REMOTE_TOKEN, else the files
 * remote_endpoint and remote_token of the directory GPUPOOL_REMOTE_DIR (the pod's grant Secret, as
 * the webhook mounts it), else the keys remote_endpoint and remote_token of the node's grant file
 * (/etc/gpupool/grant). Every call has
 * a deadline (GPUPOOL_REMOTE_DEADLINE_MS, default 60000): a server that is gone or silent gives
 * the program a CUDA error code, never a hang. Calls whose result the program does not wait for
 * (launches, copies to the device, memsets, event records) are gathered and sent together; their
 * errors come back with the next call that waits for an answer. Calls this library does not
 * forward return CUDA_ERROR_NOT_SUPPORTED (GPUPOOL_REMOTE_TRACE=1 names them on stderr). NVIDIA's
 * CUDA runtime cannot start on this library: see cuGetExportTable.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../cuda_types.h"
#include "protocol.h"

#define API __attribute__((visibility("default")))
static int trace_on(void); /* GPUPOOL_REMOTE_TRACE is set (cuGetProcAddress_v2's section) */
#ifndef SHIM_GRANT_PATH
#define SHIM_GRANT_PATH "/etc/gpupool/grant"
#endif
#define SEND_BUFFER (256u << 10)
#define DIRECT_BYTES (64u << 10) /* larger payloads go from the caller's memory, not through the buffer */
#define MAX_FUNCTIONS 4096
#define CUDA_ERROR_INVALID_IMAGE_ 200
#define CUDA_ERROR_NO_DEVICE_ 100
#define CUDA_ERROR_FILE_NOT_FOUND_ 301

typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct {
    char bytes[16];
} CUuuid;

/* ------------------------------------------------------------------------------------------ TLS */
/* OpenSSL is loaded only when the client is given a CA (remote_tls_ca): a container without it can
 * still use a plain server, and this library needs no OpenSSL at link time. */
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
static struct {
    void *(*client_method)(void);
    SSL_CTX *(*ctx_new)(void *);
    int (*load_verify)(SSL_CTX *, const char *, const char *);
    void (*set_verify)(SSL_CTX *, int, void *);
    SSL *(*new_session)(SSL_CTX *);
    int (*set_fd)(SSL *, int);
    int (*set1_host)(SSL *, const char *);
    long (*ctrl)(SSL *, int, long, void *);
    void *(*get0_param)(SSL *);
    int (*set1_ip_asc)(void *, const char *);
    int (*connect)(SSL *);
    int (*read)(SSL *, void *, int);
    int (*write)(SSL *, const void *, int);
    int (*get_error)(const SSL *, int);
} ossl;
static SSL *tls;
#define SSL_VERIFY_PEER_ 1
#define SSL_ERROR_WANT_READ_ 2
#define SSL_ERROR_WANT_WRITE_ 3
#define SSL_CTRL_SET_TLSEXT_HOSTNAME_ 55

static int load_openssl(void) {
    void *ssl = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (ssl == NULL) ssl = dlopen("libssl.so", RTLD_NOW | RTLD_LOCAL);
    if (ssl == NULL) return -1;
    void **slots[] = {(void **)&ossl.client_method, (void **)&ossl.ctx_new, (void **)&ossl.load_verify,
                      (void **)&ossl.set_verify, (void **)&ossl.new_session, (void **)&ossl.set_fd,
                      (void **)&ossl.set1_host, (void **)&ossl.ctrl, (void **)&ossl.get0_param,
                      (void **)&ossl.set1_ip_asc, (void **)&ossl.connect, (void **)&ossl.read, (void **)&ossl.write,
                      (void **)&ossl.get_error};
    const char *names[] = {"TLS_client_method", "SSL_CTX_new", "SSL_CTX_load_verify_locations", "SSL_CTX_set_verify",
                           "SSL_new", "SSL_set_fd", "SSL_set1_host", "SSL_ctrl", "SSL_get0_param",
                           "X509_VERIFY_PARAM_set1_ip_asc", "SSL_connect", "SSL_read", "SSL_write", "SSL_get_error"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((*slots[i] = dlsym(ssl, names[i])) == NULL) return -1;
    return 0;
}

/* ------------------------------------------------------------------------------------ connection */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int sock = -1;
static CUresult broken; /* why the connection is gone (0 while it works) */
static int connected_once;
static uint32_t next_call = 1;
static uint64_t deadline_ms = 60000;
static unsigned char send_buffer[SEND_BUFFER];
static size_t send_used;
static uint64_t booked_bytes;

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static CUresult hang_up(CUresult why) {
    tls = NULL; /* the session is dropped with the connection (its memory is not worth the risk of a free here) */
    if (sock >= 0) close(sock);
    sock = -1;
    if (broken == 0) broken = why;
    return why;
}

/* Wait until the socket is ready for events; 0, or the error the call returns. */
static CUresult wait_ready(short events, uint64_t deadline) {
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline) return hang_up(REMOTE_ERROR_TIMEOUT);
        struct pollfd waiting = {.fd = sock, .events = events};
        int n = poll(&waiting, 1, (int)(deadline - now));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
        if (n > 0) return 0;
    }
}

/* One TLS read or write (write: 1), errno-style: > 0 bytes, -1 with errno EAGAIN to wait for
 * events, else the connection is gone. SIGPIPE of a write to a closed socket (OpenSSL writes with
 * write(2)) is blocked and consumed, never delivered to the program. */
static ssize_t tls_io(int write, void *data, size_t bytes, short *events) {
    int n, error;
    sigset_t pipe_only, old;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    n = write ? ossl.write(tls, data, (int)(bytes < (1u << 30) ? bytes : (1u << 30)))
              : ossl.read(tls, data, (int)(bytes < (1u << 30) ? bytes : (1u << 30)));
    error = n > 0 ? 0 : ossl.get_error(tls, n);
    struct timespec none = {0, 0};
    while (sigtimedwait(&pipe_only, NULL, &none) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (n > 0) return n;
    if (error == SSL_ERROR_WANT_READ_ || error == SSL_ERROR_WANT_WRITE_) {
        *events = error == SSL_ERROR_WANT_READ_ ? POLLIN : POLLOUT;
        errno = EAGAIN;
        return -1;
    }
    errno = EPIPE;
    return 0;
}

static CUresult send_bytes(const void *data, size_t bytes, uint64_t deadline) {
    for (size_t done = 0; done < bytes;) {
        short events = POLLOUT;
        ssize_t n = tls != NULL ? tls_io(1, (char *)(uintptr_t)data + done, bytes - done, &events)
                                : send(sock, (const char *)data + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            CUresult status = wait_ready(events, deadline);
            if (status != 0) return status;
            continue;
        }
        return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
    }
    return 0;
}

static CUresult receive_bytes(void *data, size_t bytes, uint64_t deadline) {
    for (size_t done = 0; done < bytes;) {
        short events = POLLIN;
        ssize_t n = tls != NULL ? tls_io(0, (char *)data + done, bytes - done, &events)
                                : recv(sock, (char *)data + done, bytes - done, MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            CUresult status = wait_ready(events, deadline);
            if (status != 0) return status;
            continue;
        }
        return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE); /* closed (0) or reset */
    }
    return 0;
}

static CUresult flush(uint64_t deadline) {
    CUresult status = send_used > 0 ? send_bytes(send_buffer, send_used, deadline) : 0;
    send_used = 0;
    return status;
}

static int answered; /* the last call's reply came (its status is the server's, not the connection's) */

/* A share of several cards (docs/remote-gpu.md, "Several cards"): the client sees one device per
 * booked card, ordinal i being the i-th card of its share. A context names its device in its handle
 * (CONTEXT_BASE + CONTEXTS_PER_SERIAL * serial + device; serial 0 is the device's primary
 * context), and before a call the server is told, with OP_SET_DEVICE, the device of the calling
 * thread's current context when it is not the one the server runs on now. With one card nothing
 * is ever sent for it, so servers from before several cards serve one-card clients unchanged. */
#define CONTEXT_BASE ((uintptr_t)0x6770000)
#define CONTEXTS_PER_SERIAL 64u
static int device_total = 1;   /* from the hello: the share's cards */
static int server_device;      /* the device the server runs calls on now */
static __thread CUcontext current;

static int device_of(CUcontext context) {
    uintptr_t value = (uintptr_t)context;
    if (value < CONTEXT_BASE) return 0; /* none current: device 0 */
    return (int)((value - CONTEXT_BASE) % CONTEXTS_PER_SERIAL);
}

static int valid_device(CUdevice device) { return device >= 0 && device < device_total; }

static CUresult exchange(uint16_t op, uint16_t flags, const void *payload, size_t length, const void *data,
                         size_t data_length, void *answer, size_t capacity, size_t *got);

/* Make the server run the next calls on device (under the lock); 0, or why not. */
static CUresult select_device(int device) {
    if (device == server_device || device_total == 1) return 0;
    uint32_t which = (uint32_t)device;
    CUresult status = exchange(OP_SET_DEVICE, REMOTE_FLAG_NO_REPLY, &which, 4, NULL, 0, NULL, 0, NULL);
    if (status == 0) server_device = device;
    return status;
}

/* A call on the calling thread's current device (every call but the hello and a device query). */
static CUresult call(uint16_t op, uint16_t flags, const void *payload, size_t length, const void *data,
                     size_t data_length, void *answer, size_t capacity, size_t *got) {
    CUresult status = op == OP_HELLO ? 0 : select_device(device_of(current));
    if (status != 0) return status;
    return exchange(op, flags, payload, length, data, data_length, answer, capacity, got);
}

/* A call about device (its name, attributes, UUID), whichever device is current. */
static CUresult call_on(int device, uint16_t op, const void *payload, size_t length, void *answer, size_t capacity,
                        size_t *got) {
    CUresult status = select_device(device);
    if (status != 0) return status;
    return exchange(op, 0, payload, length, NULL, 0, answer, capacity, got);
}

/*
 * One call: the request (payload, then data from the caller's memory), and unless it wants no
 * reply, the reply's payload into answer (at most capacity bytes; *got says how many came).
 */
static CUresult exchange(uint16_t op, uint16_t flags, const void *payload, size_t length, const void *data,
                         size_t data_length, void *answer, size_t capacity, size_t *got) {
    if (sock < 0) return broken ? REMOTE_ERROR_DEVICE_UNAVAILABLE : CUDA_ERROR_NOT_INITIALIZED;
    uint64_t deadline = now_ms() + deadline_ms;
    struct remote_header h = {.length = (uint32_t)(length + data_length), .op = op, .flags = flags,
                              .call = next_call++};
    size_t whole = sizeof h + length + data_length;
    CUresult status;
    if ((flags & REMOTE_FLAG_NO_REPLY) && whole <= DIRECT_BYTES) {
        if (send_used + whole > sizeof send_buffer && (status = flush(deadline)) != 0) return status;
        memcpy(send_buffer + send_used, &h, sizeof h);
        if (length > 0) memcpy(send_buffer + send_used + sizeof h, payload, length); /* payload may be NULL */
        if (data_length > 0) memcpy(send_buffer + send_used + sizeof h + length, data, data_length);
        send_used += whole;
        return 0;
    }
    if (send_used + sizeof h + length <= sizeof send_buffer) { /* the header goes with what is gathered */
        memcpy(send_buffer + send_used, &h, sizeof h);
        if (length > 0) memcpy(send_buffer + send_used + sizeof h, payload, length);
        send_used += sizeof h + length;
        if ((status = flush(deadline)) != 0) return status;
    } else if ((status = flush(deadline)) != 0 || (status = send_bytes(&h, sizeof h, deadline)) != 0 ||
               (status = send_bytes(payload, length, deadline)) != 0) {
        return status;
    }
    if (data_length > 0 && (status = send_bytes(data, data_length, deadline)) != 0) return status;
    if (flags & REMOTE_FLAG_NO_REPLY) return 0;
    struct remote_header r;
    if ((status = receive_bytes(&r, sizeof r, deadline)) != 0) return status;
    if (r.call != h.call || r.op != h.op) return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE); /* out of step */
    size_t keep = r.length < capacity ? r.length : capacity;
    if ((status = receive_bytes(answer, keep, deadline)) != 0) return status;
    for (size_t left = r.length - keep; left > 0;) { /* more than asked for: read past it */
        unsigned char sink[4096];
        size_t n = left < sizeof sink ? left : sizeof sink;
        if ((status = receive_bytes(sink, n, deadline)) != 0) return status;
        left -= n;
    }
    if (got != NULL) *got = keep;
    answered = 1;
    return r.status;
}

static CUresult simple(uint16_t op, const void *payload, size_t length, void *answer, size_t capacity) {
    pthread_mutex_lock(&lock);
    CUresult status = call(op, 0, payload, length, NULL, 0, answer, capacity, NULL);
    pthread_mutex_unlock(&lock);
    return status;
}

/* For gpupool's other libraries beside the client (cublas.c): one answered call of op through this
 * process's connection, whose reply status is not a CUresult (cuBLAS's). Returns 0 when the server
 * answered (*status: the reply's status, *got: the answer's bytes), else the CUresult why it could
 * not (not initialised, the connection lost, the deadline passed). Not part of the driver API. */
API CUresult gpupoolRemoteCall(uint16_t op, const void *payload, size_t length, void *answer, size_t capacity,
                               size_t *got, int32_t *status) {
    if (status == NULL || got == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    answered = 0;
    *got = 0;
    CUresult result = call(op, 0, payload, length, NULL, 0, answer, capacity, got);
    int came = answered;
    pthread_mutex_unlock(&lock);
    if (!came) return result != 0 ? result : REMOTE_ERROR_DEVICE_UNAVAILABLE;
    *status = result;
    return 0;
}

static CUresult later(uint16_t op, const void *payload, size_t length) {
    pthread_mutex_lock(&lock);
    CUresult status = call(op, REMOTE_FLAG_NO_REPLY, payload, length, NULL, 0, NULL, 0, NULL);
    pthread_mutex_unlock(&lock);
    return status;
}

/* For gpupool's cuBLAS (cublas.c): one call of op sent without a reply (REMOTE_FLAG_NO_REPLY),
 * gathered with the launches and copies; its error, if any, comes with the next answered call.
 * Returns 0, or the CUresult why it could not be sent. Not part of the driver API. */
API CUresult gpupoolRemoteSend(uint16_t op, const void *payload, size_t length) { return later(op, payload, length); }

/* The value of key from, in order: the environment's variable; the directory GPUPOOL_REMOTE_DIR
 * names (the pod's mounted grant Secret: a file per key, its first line; remote_tls_ca is the path of
 * remote_tls_ca.pem there, when it exists); the grant file; else "". */
static void setting(const char *variable, const char *key, char *out, size_t size) {
    const char *value = getenv(variable), *directory = getenv("GPUPOOL_REMOTE_DIR");
    out[0] = '\0';
    if (value != NULL && value[0] != '\0') {
        snprintf(out, size, "%s", value);
        return;
    }
    if (directory != NULL && directory[0] != '\0') {
        char path[1024];
        int ca = strcmp(key, "remote_tls_ca") == 0;
        snprintf(path, sizeof path, "%s/%s%s", directory, key, ca ? ".pem" : "");
        if (ca) {
            if (access(path, R_OK) == 0) snprintf(out, size, "%s", path);
            return;
        }
        FILE *file = fopen(path, "re");
        if (file == NULL) return;
        if (fgets(out, (int)size, file) == NULL) out[0] = '\0';
        out[strcspn(out, "\r\n")] = '\0';
        fclose(file);
        return;
    }
    FILE *grant = fopen(SHIM_GRANT_PATH, "re");
    if (grant == NULL) return;
    char line[1024];
    size_t key_length = strlen(key);
    while (fgets(line, sizeof line, grant) != NULL)
        if (strncmp(line, key, key_length) == 0 && line[key_length] == '=')
            snprintf(out, size, "%.*s", (int)strcspn(line + key_length + 1, "\r\n"), line + key_length + 1);
    fclose(grant);
}

/* The GPU node the pod was scheduled to, when the certificate must name it too: GPUPOOL_REMOTE_SERVER_NAME,
 * else the first line of remote_server_name beside this library (what `gpupool remote-gpu
 * install-client --check-server-name` writes from the pod's remote-share-v1, never from the grant
 * Secret, which the serving node's agent writes); else "" (no name checked). */
static void server_name(char *out, size_t size) {
    const char *value = getenv("GPUPOOL_REMOTE_SERVER_NAME");
    out[0] = '\0';
    if (value != NULL && value[0] != '\0') {
        snprintf(out, size, "%s", value);
        return;
    }
    Dl_info self;
    if (dladdr((void *)server_name, &self) == 0 || self.dli_fname == NULL) return;
    const char *slash = strrchr(self.dli_fname, '/');
    if (slash == NULL) return;
    char path[1024];
    snprintf(path, sizeof path, "%.*s/remote_server_name", (int)(slash - self.dli_fname), self.dli_fname);
    FILE *file = fopen(path, "re");
    if (file == NULL) return;
    if (fgets(out, (int)size, file) == NULL) out[0] = '\0';
    out[strcspn(out, "\r\n")] = '\0';
    fclose(file);
}

/* TLS over the connected socket: the server's certificate must chain to the CA file and name the
 * host dialled (its IP address, or DNS name), and also ``name`` (a DNS name) when it is not "". */
static CUresult start_tls(const char *ca, const char *host, const char *name, uint64_t deadline) {
    if (load_openssl() != 0) {
        fprintf(stderr, "gpupool remote GPU: remote_tls_ca is set but libssl.so.3 cannot be loaded\n");
        return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    }
    SSL_CTX *context = ossl.ctx_new(ossl.client_method());
    if (context == NULL || ossl.load_verify(context, ca, NULL) != 1) return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    ossl.set_verify(context, SSL_VERIFY_PEER_, NULL);
    SSL *session = ossl.new_session(context);
    if (session == NULL || ossl.set_fd(session, sock) != 1) return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    unsigned char address[16];
    int numeric = inet_pton(AF_INET, host, address) == 1 || inet_pton(AF_INET6, host, address) == 1;
    if (numeric ? ossl.set1_ip_asc(ossl.get0_param(session), host) != 1 : ossl.set1_host(session, host) != 1)
        return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    /* OpenSSL checks every identity set: the dialled IP and this name (a DNS endpoint: the name only) */
    if (name[0] != '\0' && ossl.set1_host(session, name) != 1) return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    if (!numeric) ossl.ctrl(session, SSL_CTRL_SET_TLSEXT_HOSTNAME_, 0 /* host_name */, (void *)host);
    for (;;) {
        int n = ossl.connect(session), error = n == 1 ? 0 : ossl.get_error(session, n);
        if (n == 1) break;
        if (error != SSL_ERROR_WANT_READ_ && error != SSL_ERROR_WANT_WRITE_) return REMOTE_ERROR_DEVICE_UNAVAILABLE;
        CUresult status = wait_ready(error == SSL_ERROR_WANT_READ_ ? POLLIN : POLLOUT, deadline);
        if (status != 0) return status;
    }
    tls = session;
    return 0;
}

#define CONNECT_RETRY_MS 10000u /* how long a refused connection is tried again */

/* One connection attempt to ``found`` (``sock`` is its socket, open whatever the outcome); 0 when
 * connected, else the CUDA error, with ``*refused`` set when nobody listened there (worth another
 * try). The wait for the connection is bounded by the call's deadline. */
static CUresult dial(const struct addrinfo *found, uint64_t deadline_at, int *refused) {
    *refused = 0;
    sock = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0) return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    if (connect(sock, found->ai_addr, found->ai_addrlen) != 0 && errno != EINPROGRESS) {
        *refused = errno == ECONNREFUSED;
        return REMOTE_ERROR_DEVICE_UNAVAILABLE;
    }
    CUresult status = wait_ready(POLLOUT, deadline_at);
    if (status != 0) return status;
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(sock, SOL_SOCKET, SO_ERROR, &error, &size);
    *refused = error == ECONNREFUSED;
    return error != 0 ? REMOTE_ERROR_DEVICE_UNAVAILABLE : 0;
}

static CUresult open_connection(void) {
    char endpoint[300], token[REMOTE_MAX_TOKEN + 1], host[256], deadline[32], ca[1024], name[256];
    setting("GPUPOOL_REMOTE_TLS_CA", "remote_tls_ca", ca, sizeof ca);
    server_name(name, sizeof name);
    setting("GPUPOOL_REMOTE_ENDPOINT", "remote_endpoint", endpoint, sizeof endpoint);
    setting("GPUPOOL_REMOTE_TOKEN", "remote_token", token, sizeof token);
    setting("GPUPOOL_REMOTE_DEADLINE_MS", "remote_deadline_ms", deadline, sizeof deadline);
    if (deadline[0] != '\0' && strtoull(deadline, NULL, 10) > 0) deadline_ms = strtoull(deadline, NULL, 10);
    const char *colon = strrchr(endpoint, ':');
    if (endpoint[0] == '\0' || token[0] == '\0' || colon == NULL || (size_t)(colon - endpoint) >= sizeof host) {
        fprintf(stderr, "gpupool remote GPU: no server configured (remote_endpoint, remote_token)\n");
        return CUDA_ERROR_NO_DEVICE_;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - endpoint), endpoint);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') memmove(host, host + 1, strlen(host)), host[strlen(host) - 1] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &found) != 0) return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
    uint64_t deadline_at = now_ms() + deadline_ms;
    /* Nobody listening yet (the GPU node's agent starting its server beside the pod): try again,
     * every 100 ms to 1 s, for CONNECT_RETRY_MS or the deadline, whichever is shorter. */
    uint64_t retry_until = now_ms() + (deadline_ms < CONNECT_RETRY_MS ? deadline_ms : CONNECT_RETRY_MS);
    unsigned pause_ms = 100;
    CUresult status;
    int refused;
    while ((status = dial(found, deadline_at, &refused)) != 0 && refused && now_ms() + pause_ms < retry_until) {
        close(sock);
        sock = -1;
        struct timespec pause = {.tv_sec = pause_ms / 1000, .tv_nsec = (long)(pause_ms % 1000) * 1000000L};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR) continue;
        pause_ms = pause_ms * 2 > 1000 ? 1000 : pause_ms * 2;
    }
    freeaddrinfo(found);
    if (status != 0) return hang_up(status);
    int one = 1, idle = 10, interval = 5, count = 3;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(sock, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(sock, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(sock, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(sock, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    if (ca[0] != '\0' && (status = start_tls(ca, host, name, deadline_at)) != 0) {
        fprintf(stderr, "gpupool remote GPU: TLS with %s failed (CA %s%s%s)\n", endpoint, ca,
                name[0] != '\0' ? ", node " : "", name);
        return hang_up(status);
    }
    unsigned char hello[4 + REMOTE_MAX_TOKEN];
    uint32_t version = REMOTE_PROTOCOL_VERSION;
    memcpy(hello, &version, 4);
    memcpy(hello + 4, token, strlen(token));
    uint64_t answer[3] = {0, 0, 1}; /* a server from before several cards answers two words: one card */
    status = call(OP_HELLO, REMOTE_FLAG_HELLO_DEVICES, hello, 4 + strlen(token), NULL, 0, answer, sizeof answer, NULL);
    if (status != 0) {
        fprintf(stderr, "gpupool remote GPU: the server at %s refused this client: CUDA error %d\n", endpoint, status);
        return hang_up(status);
    }
    booked_bytes = answer[1];
    if (answer[2] < 1 || answer[2] > REMOTE_MAX_DEVICES) return hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
    device_total = (int)answer[2];
    return 0;
}

/* ----------------------------------------------------------------------------- init and devices */
static CUresult init_status = -1;

API CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!connected_once) connected_once = 1, init_status = open_connection();
    CUresult status = init_status != 0 ? init_status : broken ? REMOTE_ERROR_DEVICE_UNAVAILABLE : 0;
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult ready(void) {
    if (init_status == -1) return CUDA_ERROR_NOT_INITIALIZED;
    return init_status != 0 ? init_status : broken ? REMOTE_ERROR_DEVICE_UNAVAILABLE : 0;
}

#define READY()                                                                                          \
    do {                                                                                                 \
        CUresult ready_status = ready();                                                                 \
        if (ready_status != 0) return ready_status;                                                      \
    } while (0)

/* The server's driver's version. A driver answers it before cuInit (the CUDA runtime asks first,
 * to see whether the driver is new enough): here that connects, as cuInit would. */
API CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (init_status == -1) cuInit(0);
    READY();
    return simple(OP_DRIVER_VERSION, NULL, 0, version, sizeof *version);
}

/* The client sees one device per card of its share, ordinal i the i-th card (one card: ordinal 0). */
API CUresult cuDeviceGetCount(int *count) {
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    *count = device_total;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult device_call(int device, uint16_t op, const void *payload, size_t length, void *answer,
                            size_t capacity, size_t *got) {
    pthread_mutex_lock(&lock);
    CUresult status = call_on(device, op, payload, length, answer, capacity, got);
    pthread_mutex_unlock(&lock);
    return status;
}

API CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    if (name == NULL || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    char got[256];
    size_t n = 0;
    CUresult status = device_call(device, OP_DEVICE_NAME, NULL, 0, got, sizeof got - 1, &n);
    if (status == 0) got[n] = '\0', snprintf(name, (size_t)length, "%s", got);
    return status;
}

API CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    uint32_t which = (uint32_t)attribute;
    return device_call(device, OP_DEVICE_ATTRIBUTE, &which, 4, value, sizeof *value, NULL);
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = booked_bytes; /* the share on each card, not the card */
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    return device_call(device, OP_DEVICE_UUID, NULL, 0, uuid->bytes, sizeof uuid->bytes, NULL);
}
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) { return cuDeviceGetUuid(uuid, device); }

/* ------------------------------------------------------------------------------------- contexts */
/* The server holds one context per card of the client (each card's primary context); the contexts a
 * program makes here are names for the one of their device. */
static __thread CUcontext stack[16];
static __thread int depth;
static uintptr_t next_serial = 1;

static CUresult device_ready(CUdevice device) {
    CUresult status = ready();
    return status != 0 ? status : valid_device(device) ? 0 : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *context = (CUcontext)(CONTEXT_BASE + (uintptr_t)device);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) { return device_ready(device); }
API CUresult cuDevicePrimaryCtxRelease(CUdevice device) { return cuDevicePrimaryCtxRelease_v2(device); }
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
    return (void)flags, device_ready(device);
}
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) { return device_ready(device); }
API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active) {
    if (ready() == 0 && !valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags != NULL) *flags = 0;
    if (active != NULL) *active = 1;
    return ready();
}

API CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    (void)flags;
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    *context = (CUcontext)(CONTEXT_BASE + CONTEXTS_PER_SERIAL * next_serial++ + (uintptr_t)device);
    pthread_mutex_unlock(&lock);
    current = *context;
    return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy_v2(CUcontext context) {
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (current == context) current = NULL;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext context) {
    current = context;
    return ready();
}

API CUresult cuCtxGetCurrent(CUcontext *context) {
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    *context = current;
    return ready();
}

API CUresult cuCtxPushCurrent_v2(CUcontext context) {
    if (depth == (int)(sizeof stack / sizeof *stack)) return CUDA_ERROR_INVALID_VALUE;
    stack[depth++] = current;
    current = context;
    return ready();
}

API CUresult cuCtxPopCurrent_v2(CUcontext *context) {
    if (depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (context != NULL) *context = current;
    current = stack[--depth];
    return ready();
}

API CUresult cuCtxGetDevice(CUdevice *device) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    *device = device_of(current);
    return ready();
}

API CUresult cuCtxSynchronize(void) {
    READY();
    return simple(OP_CTX_SYNCHRONIZE, NULL, 0, NULL, 0);
}

/* --------------------------------------------------------------------------------------- memory */
API CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    if (pointer == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t size = bytes, got = 0;
    CUresult status = simple(OP_MEM_ALLOC, &size, 8, &got, sizeof got);
    if (status == 0) *pointer = got;
    return status;
}

API CUresult cuMemFree_v2(CUdeviceptr pointer) {
    READY();
    uint64_t which = pointer;
    return simple(OP_MEM_FREE, &which, 8, NULL, 0);
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t got[2] = {0, 0};
    CUresult status = simple(OP_MEM_INFO, NULL, 0, got, sizeof got);
    if (status == 0) *free_bytes = got[0], *total = got[1];
    return status;
}

/* The bytes are on their way when this returns (the caller may reuse its buffer); the copy's own
 * error, if any, comes back with the next call that waits for an answer. */
static CUresult copy_to_device(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    if (src == NULL && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
    READY();
    CUresult status = 0;
    pthread_mutex_lock(&lock);
    for (size_t done = 0; status == 0 && (done < bytes || bytes == 0);) {
        size_t n = bytes - done < REMOTE_MAX_COPY ? bytes - done : REMOTE_MAX_COPY;
        uint64_t args[2] = {dst + done, (uintptr_t)stream};
        status = call(OP_COPY_TO_DEVICE, REMOTE_FLAG_NO_REPLY, args, sizeof args, (const char *)src + done, n, NULL, 0,
                      NULL);
        done += n;
        if (bytes == 0) break;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult copy_to_host(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    if (dst == NULL && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
    READY();
    CUresult status = 0;
    pthread_mutex_lock(&lock);
    for (size_t done = 0; status == 0 && (done < bytes || bytes == 0);) {
        size_t n = bytes - done < REMOTE_MAX_COPY ? bytes - done : REMOTE_MAX_COPY, got = 0;
        uint64_t args[3] = {src + done, n, (uintptr_t)stream};
        status = call(OP_COPY_TO_HOST, 0, args, sizeof args, NULL, 0, (char *)dst + done, n, &got);
        if (status == 0 && got != n) status = hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
        done += n;
        if (bytes == 0) break;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult copy_on_device(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    READY();
    uint64_t args[4] = {dst, src, bytes, (uintptr_t)stream};
    return later(OP_COPY_ON_DEVICE, args, sizeof args);
}

static CUresult memset_n(CUdeviceptr dst, uint32_t value, uint32_t element, size_t count, CUstream stream) {
    READY();
    struct {
        uint64_t dst;
        uint32_t value, element;
        uint64_t count, stream;
    } args = {dst, value, element, count, (uintptr_t)stream};
    _Static_assert(sizeof args == 32, "memset arguments are 32 bytes");
    return later(OP_MEMSET, &args, sizeof args);
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return copy_to_device(dst, src, n, NULL); }
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return copy_to_host(dst, src, n, NULL); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy_on_device(dst, src, n, NULL); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy_to_device(dst, src, n, s);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { return copy_to_host(dst, src, n, s); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_on_device(dst, src, n, s);
}
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) { return memset_n(dst, value, 1, n, NULL); }
API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) { return memset_n(dst, value, 4, n, NULL); }
API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
    return memset_n(dst, value, 1, n, s);
}
API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
    return memset_n(dst, value, 4, n, s);
}

/* ------------------------------------------------------------------------------ page-locked host memory */
/* Page-locked memory makes local DMA fast; here every copy crosses the network from ordinary memory
 * anyway, so "pinned" memory is plain memory and registering memory changes nothing. Mapping host
 * memory into the device's address space (DEVICEMAP) cannot be done over the network: refused. */
#define MEMHOSTALLOC_DEVICEMAP 0x02
#define MEMHOSTREGISTER_DEVICEMAP 0x02

API CUresult cuMemHostAlloc(void **pointer, size_t bytes, unsigned int flags) {
    if (pointer == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (flags & MEMHOSTALLOC_DEVICEMAP) return CUDA_ERROR_NOT_SUPPORTED;
    READY();
    *pointer = malloc(bytes > 0 ? bytes : 1);
    return *pointer == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
API CUresult cuMemAllocHost_v2(void **pointer, size_t bytes) { return cuMemHostAlloc(pointer, bytes, 0); }
API CUresult cuMemFreeHost(void *pointer) {
    free(pointer);
    return ready();
}
API CUresult cuMemHostRegister_v2(void *pointer, size_t bytes, unsigned int flags) {
    if (pointer == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return flags & MEMHOSTREGISTER_DEVICEMAP ? CUDA_ERROR_NOT_SUPPORTED : ready();
}
API CUresult cuMemHostUnregister(void *pointer) { return pointer == NULL ? CUDA_ERROR_INVALID_VALUE : ready(); }

/* -------------------------------------------------------------------------------------- modules */
/* How many bytes an image the driver would take holds: a fatbin's header says, an ELF cubin's
 * sections do, PTX and the stand-in's images are NUL-terminated text. */
static size_t image_bytes(const unsigned char *image) {
    uint32_t magic;
    if (image == NULL) return 0;
    memcpy(&magic, image, 4);
    if (magic == 0xBA55ED50u) {
        uint16_t header;
        uint64_t body;
        memcpy(&header, image + 6, 2), memcpy(&body, image + 8, 8);
        return header + body;
    }
    if (memcmp(image, "\177ELF", 4) == 0 && image[4] == 2) {
        uint64_t sections, end = 0;
        uint16_t entry, count;
        memcpy(&sections, image + 0x28, 8), memcpy(&entry, image + 0x3a, 2), memcpy(&count, image + 0x3c, 2);
        end = sections + (uint64_t)entry * count;
        for (uint16_t i = 0; i < count; i++) {
            const unsigned char *section = image + sections + (uint64_t)i * entry;
            uint32_t type;
            uint64_t offset, size;
            memcpy(&type, section + 4, 4), memcpy(&offset, section + 0x18, 8), memcpy(&size, section + 0x20, 8);
            if (type != 8 /* SHT_NOBITS */ && offset + size > end) end = offset + size;
        }
        return (size_t)end;
    }
    return strlen((const char *)image) + 1;
}

/* Ship an image's bytes (op: OP_MODULE_LOAD, OP_LIBRARY_LOAD); *loaded gets the server's handle. */
static CUresult load_image(uint16_t op, void **loaded, const void *image, size_t bytes) {
    if (loaded == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    if (bytes == 0 || bytes > REMOTE_MAX_MODULE) return CUDA_ERROR_INVALID_IMAGE_;
    uint64_t got = 0;
    pthread_mutex_lock(&lock);
    CUresult status = call(op, 0, NULL, 0, image, bytes, &got, sizeof got, NULL);
    pthread_mutex_unlock(&lock);
    if (status == 0) *loaded = (void *)(uintptr_t)got;
    return status;
}

/* An image in memory: the wrapper nvcc emits is followed to the fatbin its data field points to. */
static CUresult load_data(uint16_t op, void **loaded, const void *image) {
    if (image == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint32_t magic;
    memcpy(&magic, image, 4);
    if (magic == 0x466243b1u) memcpy(&image, (const unsigned char *)image + 8, sizeof image);
    return load_image(op, loaded, image, image_bytes(image));
}

/* An image in a file: its bytes, whatever they hold (the server's driver judges them). */
static CUresult load_file(uint16_t op, void **loaded, const char *path) {
    if (path == NULL) return CUDA_ERROR_INVALID_VALUE;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || fstat(fd, &info) != 0 || info.st_size <= 0 || (uint64_t)info.st_size > REMOTE_MAX_MODULE) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_FILE_NOT_FOUND_;
    }
    unsigned char *image = calloc(1, (size_t)info.st_size + 1);
    size_t got = 0;
    for (ssize_t n; image != NULL && got < (size_t)info.st_size && (n = read(fd, image + got, (size_t)info.st_size - got)) > 0;)
        got += (size_t)n;
    close(fd);
    CUresult status = image == NULL ? CUDA_ERROR_OUT_OF_MEMORY : load_image(op, loaded, image, got);
    free(image);
    return status;
}

API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    return load_data(OP_MODULE_LOAD, (void **)module, image);
}
API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n, void *options, void **values) {
    return (void)n, (void)options, (void)values, cuModuleLoadData(module, image);
}
API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *image) { return cuModuleLoadData(module, image); }
API CUresult cuModuleLoad(CUmodule *module, const char *path) { return load_file(OP_MODULE_LOAD, (void **)module, path); }

API CUresult cuModuleUnload(CUmodule module) {
    READY();
    uint64_t which = (uintptr_t)module;
    return simple(OP_MODULE_UNLOAD, &which, 8, NULL, 0);
}

/* What the client knows of each function: its parameters' offsets and sizes in the buffer. */
struct function {
    uint64_t handle;
    uint32_t params; /* REMOTE_PARAMS_UNKNOWN: neither the driver nor GPUPOOL_REMOTE_KERNEL_PARAMS said */
    uint32_t *layout; /* offset, size per parameter */
};
static struct function functions[MAX_FUNCTIONS];
static size_t function_count;

/* GPUPOOL_REMOTE_KERNEL_PARAMS="name:8,8,8,4;other:8,4": sizes in order, each at its natural alignment. */
static uint32_t explicit_layout(const char *name, uint32_t *layout) {
    const char *spec = getenv("GPUPOOL_REMOTE_KERNEL_PARAMS");
    size_t length = strlen(name);
    for (const char *entry = spec; entry != NULL && *entry != '\0'; entry = strchr(entry, ';') ? strchr(entry, ';') + 1 : NULL) {
        if (strncmp(entry, name, length) != 0 || entry[length] != ':') continue;
        uint32_t count = 0, offset = 0;
        for (const char *p = entry + length + 1; *p != '\0' && *p != ';' && count < REMOTE_MAX_PARAMS;) {
            char *end;
            unsigned long size = strtoul(p, &end, 10);
            if (end == p || size == 0 || size > REMOTE_MAX_PARAM_BYTES) return REMOTE_PARAMS_UNKNOWN;
            uint32_t align = size >= 8 ? 8 : size >= 4 ? 4 : size >= 2 ? 2 : 1;
            offset = (offset + align - 1) / align * align;
            layout[2 * count] = offset, layout[2 * count + 1] = (uint32_t)size;
            offset += (uint32_t)size, count++;
            p = *end == ',' ? end + 1 : end;
        }
        return count;
    }
    return REMOTE_PARAMS_UNKNOWN;
}

static struct function *function_of(uint64_t handle) {
    for (size_t i = 0; i < function_count; i++)
        if (functions[i].handle == handle) return &functions[i];
    return NULL;
}

/*
 * Ask the server for a function or a kernel (op: OP_MODULE_FUNCTION, OP_LIBRARY_KERNEL,
 * OP_KERNEL_FUNCTION; request: the owner's handle, then the name if any) and keep its parameter
 * layout for launches. When the server's driver cannot say, the layout is the one of from (a
 * kernel's, for its function), else GPUPOOL_REMOTE_KERNEL_PARAMS's for name. Called with lock held.
 */
static CUresult learn(uint16_t op, uint64_t owner, const char *name, uint64_t from, uint64_t *out) {
    size_t name_length = name == NULL ? 0 : strnlen(name, 4096);
    unsigned char *request = malloc(8 + name_length), *answer = malloc(12 + 8u * REMOTE_MAX_PARAMS);
    if (request == NULL || answer == NULL) return free(request), free(answer), CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(request, &owner, 8);
    if (name_length > 0) memcpy(request + 8, name, name_length);
    size_t got = 0;
    CUresult status = call(op, 0, request, 8 + name_length, NULL, 0, answer, 12 + 8u * REMOTE_MAX_PARAMS, &got);
    if (status == 0 && got >= 12) {
        uint64_t handle;
        uint32_t params;
        memcpy(&handle, answer, 8), memcpy(&params, answer + 8, 4);
        struct function *slot = function_of(handle), *source = from != 0 ? function_of(from) : NULL;
        if (slot == NULL && function_count < MAX_FUNCTIONS) slot = &functions[function_count++];
        if (slot == NULL) status = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            uint32_t *layout = calloc(2 * REMOTE_MAX_PARAMS, sizeof *layout);
            if (layout == NULL) params = REMOTE_PARAMS_UNKNOWN;
            else if (params != REMOTE_PARAMS_UNKNOWN && got >= 12 + 8ull * params) memcpy(layout, answer + 12, 8ull * params);
            else if (source != NULL && source->params != REMOTE_PARAMS_UNKNOWN && source->layout != NULL)
                params = source->params, memcpy(layout, source->layout, 8ull * params);
            else params = name == NULL ? REMOTE_PARAMS_UNKNOWN : explicit_layout(name, layout);
            free(slot->layout);
            slot->handle = handle, slot->layout = layout, slot->params = params;
            *out = handle;
        }
    } else if (status == 0) {
        status = hang_up(REMOTE_ERROR_DEVICE_UNAVAILABLE);
    }
    free(request), free(answer);
    return status;
}

API CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (function == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t handle = 0;
    pthread_mutex_lock(&lock);
    CUresult status = learn(OP_MODULE_FUNCTION, (uintptr_t)module, name, 0, &handle);
    pthread_mutex_unlock(&lock);
    if (status == 0) *function = (CUfunction)(uintptr_t)handle;
    return status;
}

API CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t *offset, size_t *size) {
    CUresult status = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < function_count; i++) {
        if (functions[i].handle != (uintptr_t)function) continue;
        status = functions[i].params == REMOTE_PARAMS_UNKNOWN ? CUDA_ERROR_NOT_SUPPORTED
                 : index >= functions[i].params              ? CUDA_ERROR_INVALID_VALUE
                                                             : CUDA_SUCCESS;
        if (status == 0 && offset != NULL) *offset = functions[i].layout[2 * index];
        if (status == 0 && size != NULL) *size = functions[i].layout[2 * index + 1];
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* ---------------------------------------------------------------------- libraries (CUDA 12) */
/* A library is loaded as a module is (its image shipped; JIT and library options ignored, as
 * cuModuleLoadDataEx's are); its kernels are kept as functions are, so that cuLaunchKernel takes a
 * CUkernel cast to CUfunction, as CUDA 12 runtimes pass them. */
API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                               unsigned int jit_count, void *library_options, void **library_values,
                               unsigned int library_count) {
    (void)jit_options, (void)jit_values, (void)jit_count, (void)library_options, (void)library_values, (void)library_count;
    return load_data(OP_LIBRARY_LOAD, (void **)library, code);
}

API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, void *jit_options, void **jit_values,
                                   unsigned int jit_count, void *library_options, void **library_values,
                                   unsigned int library_count) {
    (void)jit_options, (void)jit_values, (void)jit_count, (void)library_options, (void)library_values, (void)library_count;
    return load_file(OP_LIBRARY_LOAD, (void **)library, path);
}

API CUresult cuLibraryUnload(CUlibrary library) {
    READY();
    uint64_t which = (uintptr_t)library;
    return simple(OP_LIBRARY_UNLOAD, &which, 8, NULL, 0);
}

API CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name) {
    if (kernel == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t handle = 0;
    pthread_mutex_lock(&lock);
    CUresult status = learn(OP_LIBRARY_KERNEL, (uintptr_t)library, name, 0, &handle);
    pthread_mutex_unlock(&lock);
    if (status == 0) *kernel = (CUkernel)(uintptr_t)handle;
    return status;
}

API CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel) {
    if (function == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t handle = 0;
    pthread_mutex_lock(&lock);
    CUresult status = learn(OP_KERNEL_FUNCTION, (uintptr_t)kernel, NULL, (uintptr_t)kernel, &handle);
    pthread_mutex_unlock(&lock);
    if (status == 0) *function = (CUfunction)(uintptr_t)handle;
    return status;
}

API CUresult cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t *offset, size_t *size) {
    return cuFuncGetParamInfo((CUfunction)kernel, index, offset, size);
}

API CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library) {
    if (module == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t which = (uintptr_t)library, got = 0;
    CUresult status = simple(OP_LIBRARY_MODULE, &which, 8, &got, sizeof got);
    if (status == 0) *module = (CUmodule)(uintptr_t)got;
    return status;
}

/* A library's or module's global (op: OP_LIBRARY_GLOBAL, OP_MODULE_GLOBAL): a device pointer into
 * the image's memory on the server, which copies take like any device pointer. */
static CUresult image_global(uint16_t op, CUdeviceptr *pointer, size_t *bytes, uint64_t owner, const char *name) {
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    size_t name_length = strnlen(name, 4096);
    unsigned char request[8 + 4096];
    uint64_t got[2] = {0, 0};
    memcpy(request, &owner, 8), memcpy(request + 8, name, name_length);
    CUresult status = simple(op, request, 8 + name_length, got, sizeof got);
    if (status == 0 && pointer != NULL) *pointer = got[0];
    if (status == 0 && bytes != NULL) *bytes = (size_t)got[1];
    return status;
}

API CUresult cuLibraryGetGlobal(CUdeviceptr *pointer, size_t *bytes, CUlibrary library, const char *name) {
    return image_global(OP_LIBRARY_GLOBAL, pointer, bytes, (uintptr_t)library, name);
}

API CUresult cuModuleGetGlobal_v2(CUdeviceptr *pointer, size_t *bytes, CUmodule module, const char *name) {
    return image_global(OP_MODULE_GLOBAL, pointer, bytes, (uintptr_t)module, name);
}

/* ------------------------------------------------------------------ attributes and occupancy */
/* Answered by the server's driver for the handle (a function, a library's kernel cast to one, or a
 * kernel on one of the client's devices: on_device, else -1), synchronously: a refused value is the
 * caller's error. */
static CUresult handle_call(uint16_t op, uint64_t handle, uint32_t first, uint32_t second, size_t length, int *value,
                            int on_device) {
    READY();
    unsigned char request[16];
    memcpy(request, &handle, 8), memcpy(request + 8, &first, 4), memcpy(request + 12, &second, 4);
    if (on_device >= 0) return device_call(on_device, op, request, length, value, value != NULL ? sizeof *value : 0, NULL);
    return simple(op, request, length, value, value != NULL ? sizeof *value : 0);
}

API CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    return handle_call(OP_FUNCTION_ATTRIBUTE, (uintptr_t)function, (uint32_t)attribute, 0, 12, value, -1);
}
API CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value) {
    return handle_call(OP_FUNCTION_SET_ATTRIBUTE, (uintptr_t)function, (uint32_t)attribute, (uint32_t)value, 16, NULL,
                       -1);
}
API CUresult cuFuncSetCacheConfig(CUfunction function, int config) {
    return handle_call(OP_FUNCTION_CACHE_CONFIG, (uintptr_t)function, (uint32_t)config, 0, 12, NULL, -1);
}
API CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice device) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ready() == 0 && !valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    return handle_call(OP_KERNEL_ATTRIBUTE, (uintptr_t)kernel, (uint32_t)attribute, 0, 12, value, device);
}
API CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice device) {
    if (ready() == 0 && !valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    return handle_call(OP_KERNEL_SET_ATTRIBUTE, (uintptr_t)kernel, (uint32_t)attribute, (uint32_t)value, 16, NULL,
                       device);
}
API CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, CUdevice device) {
    if (ready() == 0 && !valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    return handle_call(OP_KERNEL_CACHE_CONFIG, (uintptr_t)kernel, (uint32_t)config, 0, 12, NULL, device);
}

API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction function, int block_size,
                                                                  size_t dynamic_shared, unsigned int flags) {
    if (blocks == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    unsigned char request[24];
    uint64_t handle = (uintptr_t)function, shared = dynamic_shared;
    memcpy(request, &handle, 8), memcpy(request + 8, &block_size, 4), memcpy(request + 12, &flags, 4);
    memcpy(request + 16, &shared, 8);
    return simple(OP_OCCUPANCY_BLOCKS, request, sizeof request, blocks, sizeof *blocks);
}
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction function, int block_size,
                                                         size_t dynamic_shared) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, function, block_size, dynamic_shared, 0);
}

/* The program's callback (dynamic shared memory for a block size) cannot run on the server: it is
 * asked here for every block size the driver may try, 1 up to the card's maximum threads per block
 * (or the caller's lower limit; a function's own maximum, from __launch_bounds__, is never more),
 * and the answers travel with the call. */
typedef size_t (*CUoccupancyB2DSize)(int block_size);
API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size, CUfunction function,
                                                       CUoccupancyB2DSize shared_of, size_t dynamic_shared,
                                                       int limit, unsigned int flags) {
    if (min_grid == NULL || block_size == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    int top = 0;
    CUresult status;
    if (shared_of != NULL) {
        if ((status = cuDeviceGetAttribute(&top, 1 /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK */, 0)) != 0)
            return status;
        if (limit > 0 && limit < top) top = limit;
        if (top < 0 || (uint32_t)top > REMOTE_MAX_SHARED_TABLE) return CUDA_ERROR_NOT_SUPPORTED;
    }
    unsigned char *request = malloc(28 + 8u * (size_t)top);
    if (request == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t handle = (uintptr_t)function, shared = dynamic_shared;
    uint32_t count = (uint32_t)top;
    memcpy(request, &handle, 8), memcpy(request + 8, &shared, 8), memcpy(request + 16, &limit, 4);
    memcpy(request + 20, &flags, 4), memcpy(request + 24, &count, 4);
    for (int size = 1; size <= top; size++) {
        uint64_t bytes = shared_of(size);
        memcpy(request + 28 + 8u * (size_t)(size - 1), &bytes, 8);
    }
    int got[2] = {0, 0};
    status = simple(OP_OCCUPANCY_BLOCK_SIZE, request, 28 + 8u * (size_t)top, got, sizeof got);
    free(request);
    if (status == 0) *min_grid = got[0], *block_size = got[1];
    return status;
}
API CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction function,
                                              CUoccupancyB2DSize shared_of, size_t dynamic_shared, int limit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, function, shared_of, dynamic_shared, limit, 0);
}

/* ------------------------------------------------------------------------------------- launches */
#define LAUNCH_PARAM_END ((void *)0)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                            void **extra) {
    READY();
    unsigned char request[44 + REMOTE_MAX_PARAM_BYTES];
    uint64_t handle = (uintptr_t)f, stream_handle = (uintptr_t)stream;
    uint32_t dims[7] = {gx, gy, gz, bx, by, bz, shared};
    memcpy(request, &handle, 8), memcpy(request + 8, dims, sizeof dims), memcpy(request + 36, &stream_handle, 8);
    size_t size = 0;
    CUresult status = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (params == NULL) { /* the caller packed the buffer itself */
        const void *buffer = NULL;
        for (int k = 0; extra != NULL && extra[k] != LAUNCH_PARAM_END; k += 2) {
            if (extra[k] == LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[k + 1];
            if (extra[k] == LAUNCH_PARAM_BUFFER_SIZE) size = *(const size_t *)extra[k + 1];
        }
        if (size > REMOTE_MAX_PARAM_BYTES || (size > 0 && buffer == NULL)) status = CUDA_ERROR_INVALID_VALUE;
        else if (size > 0) memcpy(request + 44, buffer, size);
    } else {
        struct function *known = NULL;
        for (size_t i = 0; i < function_count && known == NULL; i++)
            if (functions[i].handle == handle) known = &functions[i];
        if (known == NULL) status = CUDA_ERROR_INVALID_HANDLE;
        else if (known->params == REMOTE_PARAMS_UNKNOWN) status = CUDA_ERROR_NOT_SUPPORTED;
        for (uint32_t i = 0; status == 0 && i < known->params; i++) {
            uint32_t offset = known->layout[2 * i], bytes = known->layout[2 * i + 1];
            if (offset + bytes > REMOTE_MAX_PARAM_BYTES) status = CUDA_ERROR_INVALID_VALUE;
            else memcpy(request + 44 + offset, params[i], bytes), size = offset + bytes > size ? offset + bytes : size;
        }
    }
    if (status == 0) status = call(OP_LAUNCH, REMOTE_FLAG_NO_REPLY, request, 44 + size, NULL, 0, NULL, 0, NULL);
    pthread_mutex_unlock(&lock);
    return status;
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,
                                 void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

/* ------------------------------------------------------------------------------ streams, events */
static CUresult make(uint16_t op, void **out, unsigned int flags) {
    if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint32_t which = flags;
    uint64_t got = 0;
    CUresult status = simple(op, &which, 4, &got, sizeof got);
    if (status == 0) *out = (void *)(uintptr_t)got;
    return status;
}

static CUresult on(uint16_t op, const void *a, const void *b, int wait) {
    READY();
    uint64_t args[2] = {(uintptr_t)a, (uintptr_t)b};
    return wait ? simple(op, args, b == (void *)-1 ? 8 : sizeof args, NULL, 0) : later(op, args, sizeof args);
}

API CUresult cuStreamCreate(CUstream *stream, unsigned int flags) { return make(OP_STREAM_CREATE, (void **)stream, flags); }
API CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority) {
    return (void)priority, cuStreamCreate(stream, flags);
}
API CUresult cuStreamDestroy_v2(CUstream stream) { return on(OP_STREAM_DESTROY, stream, (void *)-1, 1); }
API CUresult cuStreamSynchronize(CUstream stream) { return on(OP_STREAM_SYNCHRONIZE, stream, (void *)-1, 1); }
API CUresult cuStreamQuery(CUstream stream) { return on(OP_STREAM_QUERY, stream, (void *)-1, 1); }
API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    READY();
    struct {
        uint64_t stream, event;
        uint32_t flags;
    } __attribute__((packed)) args = {(uintptr_t)stream, (uintptr_t)event, flags};
    return later(OP_STREAM_WAIT_EVENT, &args, sizeof args);
}
API CUresult cuEventCreate(CUevent *event, unsigned int flags) { return make(OP_EVENT_CREATE, (void **)event, flags); }
API CUresult cuEventRecord(CUevent event, CUstream stream) { return on(OP_EVENT_RECORD, event, stream, 0); }
API CUresult cuEventSynchronize(CUevent event) { return on(OP_EVENT_SYNCHRONIZE, event, (void *)-1, 1); }
API CUresult cuEventQuery(CUevent event) { return on(OP_EVENT_QUERY, event, (void *)-1, 1); }
API CUresult cuEventDestroy_v2(CUevent event) { return on(OP_EVENT_DESTROY, event, (void *)-1, 1); }
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
    READY();
    uint64_t args[2] = {(uintptr_t)start, (uintptr_t)end};
    return simple(OP_EVENT_ELAPSED, args, sizeof args, ms, sizeof *ms);
}

/* ------------------------------------------------------------------------------ errors, lookups */
API CUresult cuGetErrorName(CUresult error, const char **text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case 0: *text = "CUDA_SUCCESS"; break;
    case REMOTE_ERROR_DEVICE_UNAVAILABLE: *text = "CUDA_ERROR_DEVICE_UNAVAILABLE"; break;
    case REMOTE_ERROR_TIMEOUT: *text = "CUDA_ERROR_TIMEOUT"; break;
    case REMOTE_ERROR_NOT_PERMITTED: *text = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *text = "CUDA_ERROR (see the CUDA driver API's CUresult)";
    }
    return CUDA_SUCCESS;
}
API CUresult cuGetErrorString(CUresult error, const char **text) { return cuGetErrorName(error, text); }

/* When a runtime should load its modules: answered by the client, LAZY (the driver's default since
 * CUDA 12.2). Either way the client ships an image when the program loads it. */
#define MODULE_LAZY_LOADING 2
API CUresult cuModuleGetLoadingMode(int *mode) {
    if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
    *mode = MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

/* The driver's private tables, each named by a UUID (cuGetExportTable is not in CUDA's headers).
 * NVIDIA's CUDA runtime (12.9) asks for seven at its start and stops at the first of five of them
 * that is refused: they are undocumented tables of functions over the program's own memory, and one
 * is a check that the driver is NVIDIA's (answered by anything else, the runtime fails with
 * cudaErrorSoftwareValidityNotEstablished). None can be forwarded to a server: refused, and the
 * first refusal says so on stderr, since the runtime then reports only "operation not supported"
 * for every call (docs/remote-gpu.md, "NVIDIA's CUDA runtime (libcudart)"). */
API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    static int told;
    if (table == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
    *table = NULL;
    const unsigned char *b = (const unsigned char *)id->bytes;
    char uuid[40];
    snprintf(uuid, sizeof uuid, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "gpupool remote GPU: cuGetExportTable(%s) refused: the driver's private tables cannot be forwarded "
                "to a GPU server, and NVIDIA's CUDA runtime (libcudart) cannot start without them; its calls fail "
                "with cudaErrorNotSupported. Programs using the GPU client must call the CUDA driver API.\n",
                uuid);
    else if (trace_on())
        fprintf(stderr, "gpupool remote GPU: cuGetExportTable(%s) refused\n", uuid);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Everything else a CUDA program may call: refused, so it fails with an error it can report. */
static CUresult unsupported(void) { return CUDA_ERROR_NOT_SUPPORTED; }
#define UNSUPPORTED(name) \
    API CUresult name(void) { return unsupported(); }
UNSUPPORTED(cuMemAllocManaged) UNSUPPORTED(cuMemAllocPitch_v2)
UNSUPPORTED(cuMemAllocAsync) UNSUPPORTED(cuMemFreeAsync) UNSUPPORTED(cuMemAllocFromPoolAsync)
UNSUPPORTED(cuMemCreate) UNSUPPORTED(cuMemMap) UNSUPPORTED(cuMemAddressReserve) UNSUPPORTED(cuMemRelease)
UNSUPPORTED(cuMemcpy) UNSUPPORTED(cuMemcpyAsync) UNSUPPORTED(cuMemcpy2D_v2) UNSUPPORTED(cuMemcpy3D_v2)
UNSUPPORTED(cuMemcpyPeer) UNSUPPORTED(cuMemsetD16_v2) UNSUPPORTED(cuMemPrefetchAsync)
UNSUPPORTED(cuPointerGetAttribute) UNSUPPORTED(cuPointerGetAttributes) UNSUPPORTED(cuMemGetAddressRange_v2)
UNSUPPORTED(cuArrayCreate_v2) UNSUPPORTED(cuArray3DCreate_v2) UNSUPPORTED(cuArrayDestroy)
UNSUPPORTED(cuGraphCreate) UNSUPPORTED(cuGraphLaunch) UNSUPPORTED(cuGraphInstantiateWithFlags)
UNSUPPORTED(cuStreamBeginCapture_v2) UNSUPPORTED(cuStreamEndCapture) UNSUPPORTED(cuLaunchHostFunc)
UNSUPPORTED(cuIpcGetMemHandle) UNSUPPORTED(cuIpcOpenMemHandle_v2) UNSUPPORTED(cuLaunchCooperativeKernel)
UNSUPPORTED(cuLaunchKernelEx) UNSUPPORTED(cuLinkCreate_v2)
UNSUPPORTED(cuCtxEnablePeerAccess) UNSUPPORTED(cuDeviceCanAccessPeer) UNSUPPORTED(cuLibraryGetManaged)
UNSUPPORTED(cuTexObjectCreate) UNSUPPORTED(cuSurfObjectCreate) UNSUPPORTED(cuImportExternalMemory)

/* A name looked up through cuGetProcAddress that is not forwarded gets one of these stubs, each
 * knowing the name it was handed out for, so that GPUPOOL_REMOTE_TRACE=1 can say which refused
 * call a program made (a runtime looks up hundreds of names at start and calls few of them). Past
 * REFUSED_SLOTS names the plain unsupported() is handed out. GPUPOOL_REMOTE_TRACE=1 also prints
 * every lookup, forwarded or not. */
#define REFUSED_SLOTS 512 /* CUDA 12.9's runtime looks up 333 names, 260 of them not forwarded */
static pthread_mutex_t lookups_lock = PTHREAD_MUTEX_INITIALIZER;
static char refused_names[REFUSED_SLOTS][96];
static size_t refused_count;
static int tracing = -1;

static int trace_on(void) {
    if (tracing < 0) {
        const char *value = getenv("GPUPOOL_REMOTE_TRACE");
        tracing = value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
    }
    return tracing;
}

/* The stubs read the first four integer arguments whatever the call had (harmless on x86-64 and
 * aarch64: registers), so that the trace shows them. */
typedef uintptr_t word;
static CUresult refuse(size_t slot, word a, word b, word c, word d) {
    if (trace_on())
        fprintf(stderr,
                "gpupool remote GPU: called %s(%#lx, %#lx, %#lx, %#lx ...), not forwarded: CUDA_ERROR_NOT_SUPPORTED\n",
                refused_names[slot], (unsigned long)a, (unsigned long)b, (unsigned long)c, (unsigned long)d);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define REFUSED(x) \
    static CUresult refused_##x(word a, word b, word c, word d) { return refuse(0x##x, a, b, c, d); }
#define REFUSED16(h)                                                                                               \
    REFUSED(h##0) REFUSED(h##1) REFUSED(h##2) REFUSED(h##3) REFUSED(h##4) REFUSED(h##5) REFUSED(h##6) REFUSED(h##7) \
    REFUSED(h##8) REFUSED(h##9) REFUSED(h##a) REFUSED(h##b) REFUSED(h##c) REFUSED(h##d) REFUSED(h##e) REFUSED(h##f)
#define REFUSED256(h)                                                                                           \
    REFUSED16(h##0) REFUSED16(h##1) REFUSED16(h##2) REFUSED16(h##3) REFUSED16(h##4) REFUSED16(h##5) REFUSED16(h##6) \
    REFUSED16(h##7) REFUSED16(h##8) REFUSED16(h##9) REFUSED16(h##a) REFUSED16(h##b) REFUSED16(h##c) REFUSED16(h##d) \
    REFUSED16(h##e) REFUSED16(h##f)
REFUSED256(0) REFUSED256(1)
#define STUB(x) refused_##x,
#define STUB16(h)                                                                                          \
    STUB(h##0) STUB(h##1) STUB(h##2) STUB(h##3) STUB(h##4) STUB(h##5) STUB(h##6) STUB(h##7) STUB(h##8) \
    STUB(h##9) STUB(h##a) STUB(h##b) STUB(h##c) STUB(h##d) STUB(h##e) STUB(h##f)
static CUresult (*const refused_stubs[REFUSED_SLOTS])(word, word, word, word) = {
#define STUB256(h)                                                                                              \
    STUB16(h##0) STUB16(h##1) STUB16(h##2) STUB16(h##3) STUB16(h##4) STUB16(h##5) STUB16(h##6) STUB16(h##7)       \
    STUB16(h##8) STUB16(h##9) STUB16(h##a) STUB16(h##b) STUB16(h##c) STUB16(h##d) STUB16(h##e) STUB16(h##f)
    STUB256(0) STUB256(1)
};

/* The stub that refuses ``name`` (the same one for every lookup of it). */
static void *refused_entry(const char *name) {
    void *stub = (void *)&unsupported;
    pthread_mutex_lock(&lookups_lock);
    size_t slot = 0;
    while (slot < refused_count && strcmp(refused_names[slot], name) != 0) slot++;
    if (slot == refused_count && refused_count < REFUSED_SLOTS)
        snprintf(refused_names[refused_count++], sizeof refused_names[0], "%s", name);
    if (slot < refused_count) stub = (void *)refused_stubs[slot];
    pthread_mutex_unlock(&lookups_lock);
    return stub;
}

#define ENTRY(name) {#name, (void *)&name},
static const struct {
    const char *name;
    void *function;
} entry_points[] = {
    ENTRY(cuInit) ENTRY(cuDriverGetVersion) ENTRY(cuDeviceGetCount) ENTRY(cuDeviceGet) ENTRY(cuDeviceGetName)
    ENTRY(cuDeviceGetAttribute) ENTRY(cuDeviceTotalMem_v2) ENTRY(cuDeviceGetUuid) ENTRY(cuDeviceGetUuid_v2)
    ENTRY(cuDevicePrimaryCtxRetain) ENTRY(cuDevicePrimaryCtxRelease_v2) ENTRY(cuDevicePrimaryCtxRelease)
    ENTRY(cuDevicePrimaryCtxSetFlags_v2) ENTRY(cuDevicePrimaryCtxReset_v2) ENTRY(cuDevicePrimaryCtxGetState)
    ENTRY(cuCtxCreate_v2) ENTRY(cuCtxDestroy_v2) ENTRY(cuCtxSetCurrent) ENTRY(cuCtxGetCurrent)
    ENTRY(cuCtxPushCurrent_v2) ENTRY(cuCtxPopCurrent_v2) ENTRY(cuCtxGetDevice) ENTRY(cuCtxSynchronize)
    ENTRY(cuMemAlloc_v2) ENTRY(cuMemFree_v2) ENTRY(cuMemGetInfo_v2) ENTRY(cuMemcpyHtoD_v2) ENTRY(cuMemcpyDtoH_v2)
    ENTRY(cuMemcpyDtoD_v2) ENTRY(cuMemcpyHtoDAsync_v2) ENTRY(cuMemcpyDtoHAsync_v2) ENTRY(cuMemcpyDtoDAsync_v2)
    ENTRY(cuMemsetD8_v2) ENTRY(cuMemsetD32_v2) ENTRY(cuMemsetD8Async) ENTRY(cuMemsetD32Async)
    ENTRY(cuModuleLoadData) ENTRY(cuModuleLoadDataEx) ENTRY(cuModuleLoadFatBinary) ENTRY(cuModuleLoad)
    ENTRY(cuModuleUnload) ENTRY(cuModuleGetFunction) ENTRY(cuFuncGetParamInfo) ENTRY(cuLaunchKernel)
    ENTRY(cuLaunchKernel_ptsz) ENTRY(cuStreamCreate) ENTRY(cuStreamCreateWithPriority) ENTRY(cuStreamDestroy_v2)
    ENTRY(cuStreamSynchronize) ENTRY(cuStreamQuery) ENTRY(cuStreamWaitEvent) ENTRY(cuEventCreate)
    ENTRY(cuEventRecord) ENTRY(cuEventSynchronize) ENTRY(cuEventQuery) ENTRY(cuEventDestroy_v2)
    ENTRY(cuEventElapsedTime) ENTRY(cuGetErrorName) ENTRY(cuGetErrorString) ENTRY(cuGetExportTable)
    ENTRY(cuModuleGetLoadingMode) ENTRY(cuMemHostAlloc)
    ENTRY(cuMemAllocHost_v2) ENTRY(cuMemFreeHost) ENTRY(cuMemHostRegister_v2) ENTRY(cuMemHostUnregister)
    ENTRY(cuLibraryLoadData) ENTRY(cuLibraryLoadFromFile) ENTRY(cuLibraryUnload) ENTRY(cuLibraryGetKernel)
    ENTRY(cuLibraryGetModule) ENTRY(cuLibraryGetGlobal) ENTRY(cuKernelGetFunction) ENTRY(cuKernelGetParamInfo)
    ENTRY(cuModuleGetGlobal_v2) ENTRY(cuFuncGetAttribute) ENTRY(cuFuncSetAttribute) ENTRY(cuFuncSetCacheConfig)
    ENTRY(cuKernelGetAttribute) ENTRY(cuKernelSetAttribute) ENTRY(cuKernelSetCacheConfig)
    ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor) ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)
    ENTRY(cuOccupancyMaxPotentialBlockSize) ENTRY(cuOccupancyMaxPotentialBlockSizeWithFlags)
};

static void *entry_named(const char *name) {
    for (size_t i = 0; i < sizeof entry_points / sizeof *entry_points; i++)
        if (strcmp(entry_points[i].name, name) == 0) return entry_points[i].function;
    return NULL;
}

/* A base name means its newest variant (_v2), its _ptsz variant where asked and there is one; a
 * name this library does not forward gets an entry point that returns CUDA_ERROR_NOT_SUPPORTED,
 * so a runtime that looks up every entry at start still starts. */
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbol_status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbol_status) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(symbol, "cuGetProcAddress") == 0) { /* _v2 (a fifth argument) from CUDA 12.0 */
        *pfn = version >= 12000 ? (void *)&cuGetProcAddress_v2 : (void *)&cuGetProcAddress;
        if (symbol_status != NULL) *symbol_status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    char name[160];
    void *found = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        found = entry_named(name);
    }
    snprintf(name, sizeof name, "%s_v2", symbol);
    if (found == NULL) found = entry_named(name);
    if (found == NULL) found = entry_named(symbol);
    if (trace_on()) /* "forwarded": the rows of docs/remote-gpu.md's "What is forwarded" */
        fprintf(stderr, "gpupool remote GPU: looked up %s (version %d, flags %llu): %s\n", symbol, version,
                (unsigned long long)flags,
                found != NULL && found != (void *)&cuGetExportTable ? "forwarded" : "not forwarded");
    if (found == NULL) found = refused_entry(symbol);
    *pfn = found;
    if (symbol_status != NULL) *symbol_status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
