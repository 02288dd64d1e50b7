/*
 * gpupool's GPU server (docs/remote-gpu.md): serves remote clients the CUDA driver of this node.
 *
 *   gpupool-remote-server --listen HOST:PORT --clients TABFILE [--driver PATH] [--allow-plain]
 *                         [--status-dir DIR] [--cublas PATH]
 *
 * The supervisor (`gpupool remote-gpu serve`) reads the node agent's JSON clients file and writes
 * TABFILE, one client a line: token TAB pod TAB card-uuid TAB memory-MiB TAB compute-percent.
 * Every accepted connection is served by its own forked process: its allocations, modules,
 * libraries and streams live in that process's context, so a client that disconnects or dies, or whose entry
 * leaves the file, is released by the process's exit, and one client can neither see nor corrupt
 * another's state. The process checks the file at most every CHECK_MS and leaves when its token
 * is no longer there. A client's live allocations never exceed its booked memory.
 * With --tls-cert/--tls-key, SIGHUP (or the files changing) loads them again for new connections.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "blas_checks.h"
#include "protocol.h"

#define CHECK_MS 100
#define MAX_CLIENT_PROCESSES 256 /* clients served at once (--max-clients), those still saying hello included */
#define HELLO_TIMEOUT_MS 5000
#define CHUNK (8u << 20)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *handle;

/* The driver's entry points the server calls, resolved by name from the dlopened driver. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*driver_version)(int *);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(int *, int);
    CUresult (*device_name)(char *, int, int);
    CUresult (*device_attribute)(int *, int, int);
    CUresult (*device_uuid)(unsigned char *, int);
    CUresult (*primary_retain)(handle *, int);
    CUresult (*ctx_set_current)(handle);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t, handle);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t, handle);
    CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t, handle);
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t, handle);
    CUresult (*memset32)(CUdeviceptr, unsigned, size_t, handle);
    CUresult (*stream_synchronize)(handle);
    CUresult (*module_load)(handle *, const void *);
    CUresult (*module_unload)(handle);
    CUresult (*module_function)(handle *, handle, const char *);
    CUresult (*param_info)(handle, size_t, size_t *, size_t *);
    CUresult (*launch)(handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, handle, void **,
                       void **);
    CUresult (*stream_create)(handle *, unsigned);
    CUresult (*stream_destroy)(handle);
    CUresult (*stream_query)(handle);
    CUresult (*stream_wait_event)(handle, handle, unsigned);
    CUresult (*event_create)(handle *, unsigned);
    CUresult (*event_record)(handle, handle);
    CUresult (*event_synchronize)(handle);
    CUresult (*event_query)(handle);
    CUresult (*event_elapsed)(float *, handle, handle);
    CUresult (*event_destroy)(handle);
    CUresult (*library_load)(handle *, const void *, void *, void **, unsigned, void *, void **, unsigned);
    CUresult (*library_unload)(handle);
    CUresult (*library_kernel)(handle *, handle, const char *);
    CUresult (*library_module)(handle *, handle);
    CUresult (*library_global)(CUdeviceptr *, size_t *, handle, const char *);
    CUresult (*kernel_function)(handle *, handle);
    CUresult (*kernel_param_info)(handle, size_t, size_t *, size_t *);
    CUresult (*module_global)(CUdeviceptr *, size_t *, handle, const char *);
    CUresult (*function_attribute)(int *, int, handle);
    CUresult (*function_set_attribute)(handle, int, int);
    CUresult (*function_cache_config)(handle, int);
    CUresult (*kernel_attribute)(int *, int, handle, int);
    CUresult (*kernel_set_attribute)(int, int, handle, int);
    CUresult (*kernel_cache_config)(handle, int, int);
    CUresult (*occupancy_blocks)(int *, handle, int, size_t, unsigned);
    CUresult (*occupancy_block_size)(int *, int *, handle, size_t (*)(int), size_t, int, unsigned);
} cu;

static void *driver;
static int standin; /* the stand-in driver names its cards GPU-standin-<ordinal> */

static void resolve(void **slot, const char *name) { *slot = dlsym(driver, name); }
#define RESOLVE(field, name) resolve((void **)&cu.field, name)

static int load_driver(const char *path) {
    driver = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (driver == NULL) {
        fprintf(stderr, "gpupool-remote-server: cannot load the driver %s: %s\n", path, dlerror());
        return -1;
    }
    RESOLVE(init, "cuInit"), RESOLVE(driver_version, "cuDriverGetVersion"), RESOLVE(device_count, "cuDeviceGetCount");
    RESOLVE(device_get, "cuDeviceGet"), RESOLVE(device_name, "cuDeviceGetName");
    RESOLVE(device_attribute, "cuDeviceGetAttribute"), RESOLVE(device_uuid, "cuDeviceGetUuid");
    RESOLVE(primary_retain, "cuDevicePrimaryCtxRetain"), RESOLVE(ctx_set_current, "cuCtxSetCurrent");
    RESOLVE(ctx_synchronize, "cuCtxSynchronize"), RESOLVE(mem_alloc, "cuMemAlloc_v2"), RESOLVE(mem_free, "cuMemFree_v2");
    RESOLVE(htod, "cuMemcpyHtoDAsync_v2"), RESOLVE(dtoh, "cuMemcpyDtoHAsync_v2"), RESOLVE(dtod, "cuMemcpyDtoDAsync_v2");
    RESOLVE(memset8, "cuMemsetD8Async"), RESOLVE(memset32, "cuMemsetD32Async");
    RESOLVE(stream_synchronize, "cuStreamSynchronize"), RESOLVE(module_load, "cuModuleLoadData");
    RESOLVE(module_unload, "cuModuleUnload"), RESOLVE(module_function, "cuModuleGetFunction");
    RESOLVE(param_info, "cuFuncGetParamInfo"), RESOLVE(launch, "cuLaunchKernel");
    RESOLVE(stream_create, "cuStreamCreate"), RESOLVE(stream_destroy, "cuStreamDestroy_v2");
    RESOLVE(stream_query, "cuStreamQuery"), RESOLVE(stream_wait_event, "cuStreamWaitEvent");
    RESOLVE(event_create, "cuEventCreate"), RESOLVE(event_record, "cuEventRecord");
    RESOLVE(event_synchronize, "cuEventSynchronize"), RESOLVE(event_query, "cuEventQuery");
    RESOLVE(event_elapsed, "cuEventElapsedTime"), RESOLVE(event_destroy, "cuEventDestroy_v2");
    RESOLVE(library_load, "cuLibraryLoadData"), RESOLVE(library_unload, "cuLibraryUnload");
    RESOLVE(library_kernel, "cuLibraryGetKernel"), RESOLVE(library_module, "cuLibraryGetModule");
    RESOLVE(library_global, "cuLibraryGetGlobal"), RESOLVE(kernel_function, "cuKernelGetFunction");
    RESOLVE(kernel_param_info, "cuKernelGetParamInfo"), RESOLVE(module_global, "cuModuleGetGlobal_v2");
    RESOLVE(function_attribute, "cuFuncGetAttribute"), RESOLVE(function_set_attribute, "cuFuncSetAttribute");
    RESOLVE(function_cache_config, "cuFuncSetCacheConfig"), RESOLVE(kernel_attribute, "cuKernelGetAttribute");
    RESOLVE(kernel_set_attribute, "cuKernelSetAttribute"), RESOLVE(kernel_cache_config, "cuKernelSetCacheConfig");
    RESOLVE(occupancy_blocks, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
    RESOLVE(occupancy_block_size, "cuOccupancyMaxPotentialBlockSizeWithFlags");
    standin = dlsym(driver, "gpupoolStandinUsedBytes") != NULL;
    if (cu.init == NULL || cu.device_get == NULL || cu.primary_retain == NULL || cu.ctx_set_current == NULL) {
        fprintf(stderr, "gpupool-remote-server: %s is not a CUDA driver (no cuInit/cuDeviceGet/...)\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------- the clients file */
struct client_entry {
    char token[REMOTE_MAX_TOKEN + 1];
    char pod[512];
    char card[128 * REMOTE_MAX_DEVICES]; /* one UUID, or a share of several cards': their UUIDs, comma-separated */
    unsigned long long memory_mib;
    int compute_percent;
};

static const char *clients_path;

/* Constant time in the token's length: a wrong guess learns nothing from the time it took. */
static int same_token(const char *a, size_t a_length, const char *b) {
    size_t b_length = strlen(b);
    unsigned char diff = (unsigned char)(a_length != b_length);
    for (size_t i = 0; i < REMOTE_MAX_TOKEN; i++) {
        unsigned char x = i < a_length ? (unsigned char)a[i] : 0, y = i < b_length ? (unsigned char)b[i] : 0;
        diff |= x ^ y;
    }
    return diff == 0;
}

/* Find the token's entry in the clients file: 1 found, 0 not there, -1 the file is unreadable. */
static int find_client(const char *token, size_t length, struct client_entry *out) {
    FILE *file = fopen(clients_path, "re");
    if (file == NULL) return -1;
    char line[2048 + 128 * REMOTE_MAX_DEVICES];
    int found = 0;
    while (fgets(line, sizeof line, file) != NULL) {
        struct client_entry entry = {0};
        char *fields[5], *cursor = line;
        int n = 0;
        for (; n < 5 && cursor != NULL; n++) fields[n] = strsep(&cursor, "\t\n");
        if (n < 5 || strlen(fields[0]) > REMOTE_MAX_TOKEN) continue;
        snprintf(entry.token, sizeof entry.token, "%s", fields[0]);
        snprintf(entry.pod, sizeof entry.pod, "%s", fields[1]);
        snprintf(entry.card, sizeof entry.card, "%s", fields[2]);
        entry.memory_mib = strtoull(fields[3], NULL, 10);
        entry.compute_percent = atoi(fields[4]);
        if (same_token(token, length, entry.token) && !found) *out = entry, found = 1;
    }
    fclose(file);
    return found;
}

/* ------------------------------------------------------------------------------------ socket I/O */
static int sock = -1;
static SSL *tls; /* the connection's TLS session; NULL: plain TCP (loopback, or --allow-plain) */

/* Received bytes not yet read: small frames (launches, memsets) come many to one recv. */
static unsigned char in_buffer[1u << 16];
static size_t in_start, in_end;

static int read_all(void *buffer, size_t bytes) {
    if (bytes == 0) return 0;
    size_t done = in_end - in_start < bytes ? in_end - in_start : bytes;
    memcpy(buffer, in_buffer + in_start, done);
    in_start += done;
    if (done < bytes && bytes - done < sizeof in_buffer && tls == NULL) { /* refill, then take the rest */
        in_start = in_end = 0;
        while (in_end < bytes - done) {
            ssize_t n = recv(sock, in_buffer + in_end, sizeof in_buffer - in_end, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return -1;
            in_end += (size_t)n;
        }
        memcpy((char *)buffer + done, in_buffer, bytes - done);
        in_start = bytes - done;
        return 0;
    }
    for (; done < bytes;) {
        size_t want = bytes - done < (1u << 30) ? bytes - done : (1u << 30);
        ssize_t n = tls != NULL ? SSL_read(tls, (char *)buffer + done, (int)want)
                                : recv(sock, (char *)buffer + done, want, 0);
        if (n < 0 && errno == EINTR && tls == NULL) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static int write_all(const void *buffer, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
        size_t want = bytes - done < (1u << 30) ? bytes - done : (1u << 30);
        ssize_t n = tls != NULL ? SSL_write(tls, (const char *)buffer + done, (int)want)
                                : send(sock, (const char *)buffer + done, want, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR && tls == NULL) continue;
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

/* Whether a request is waiting: bytes TLS has decrypted already count, the socket may be empty. */
static int waiting_request(int timeout_ms) {
    if (in_end > in_start || (tls != NULL && SSL_pending(tls) > 0)) return 1;
    struct pollfd waiting = {.fd = sock, .events = POLLIN};
    return poll(&waiting, 1, timeout_ms);
}

static SSL_CTX *tls_context;

/* Server-side TLS from a certificate chain and key (PEM); the client checks it against its CA.
 * NULL (with OpenSSL's reasons on stderr) when the files do not load or do not match. */
static SSL_CTX *tls_context_from(const char *certificate, const char *key) {
    SSL_CTX *context = SSL_CTX_new(TLS_server_method());
    if (context == NULL || SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) != 1 ||
        SSL_CTX_use_certificate_chain_file(context, certificate) != 1 ||
        SSL_CTX_use_PrivateKey_file(context, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(context) != 1) {
        fprintf(stderr, "gpupool-remote-server: TLS certificate %s / key %s: ", certificate, key);
        ERR_print_errors_fp(stderr);
        SSL_CTX_free(context);
        return NULL;
    }
    return context;
}

/* Renewal (docs/remote-gpu.md, "Certificates per GPU node"): the files are loaded again, for new
 * connections only, when SIGHUP asks or when accept finds them changed (a mounted Secret rotated by
 * kubelet says nothing). A connection's process forked earlier keeps its own copy of the context and
 * its TLS session, so its client never notices. Files that do not load keep the context in use. */
static const char *tls_certificate_path, *tls_key_path;
static volatile sig_atomic_t tls_reload_asked;
static struct tls_files_seen {
    dev_t device[2];
    ino_t inode[2];
    off_t size[2];
    struct timespec modified[2];
} tls_seen;

static struct tls_files_seen tls_files_now(void) {
    struct tls_files_seen now;
    memset(&now, 0, sizeof now);
    const char *paths[2] = {tls_certificate_path, tls_key_path};
    for (int i = 0; i < 2; i++) {
        struct stat info;
        if (stat(paths[i], &info) != 0) continue; /* gone for a moment: all zero, looked at again later */
        now.device[i] = info.st_dev, now.inode[i] = info.st_ino, now.size[i] = info.st_size;
        now.modified[i] = info.st_mtim;
    }
    return now;
}

static int same_tls_files(const struct tls_files_seen *a, const struct tls_files_seen *b) {
    for (int i = 0; i < 2; i++)
        if (a->device[i] != b->device[i] || a->inode[i] != b->inode[i] || a->size[i] != b->size[i] ||
            a->modified[i].tv_sec != b->modified[i].tv_sec || a->modified[i].tv_nsec != b->modified[i].tv_nsec)
            return 0;
    return 1;
}

static void ask_tls_reload(int signal_number) {
    (void)signal_number;
    tls_reload_asked = 1;
}

static void log_served_certificate(const char *what) {
    X509 *leaf = SSL_CTX_get0_certificate(tls_context);
    BIO *err = BIO_new_fp(stderr, BIO_NOCLOSE);
    if (leaf == NULL || err == NULL) {
        BIO_free(err);
        return;
    }
    BIGNUM *serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
    char *hex = serial != NULL ? BN_bn2hex(serial) : NULL;
    BIO_printf(err, "gpupool-remote-server: %s TLS certificate %s (serial %s, not after ", what, tls_certificate_path,
               hex != NULL ? hex : "?");
    ASN1_TIME_print(err, X509_get0_notAfter(leaf));
    BIO_printf(err, ") for new connections\n");
    OPENSSL_free(hex);
    BN_free(serial);
    BIO_free(err);
}

static int load_tls(const char *certificate, const char *key) {
    tls_certificate_path = certificate, tls_key_path = key;
    tls_seen = tls_files_now();
    tls_context = tls_context_from(certificate, key);
    if (tls_context == NULL) return -1;
    log_served_certificate("serving");
    return 0;
}

/* Load the files again when asked or changed since last looked at; each change is tried once (a
 * half-written pair is tried again when the rest of it lands, a broken one is logged once). */
static void refresh_tls(void) {
    if (tls_context == NULL) return;
    struct tls_files_seen now = tls_files_now();
    int asked = tls_reload_asked;
    tls_reload_asked = 0;
    if (!asked && same_tls_files(&now, &tls_seen)) return;
    tls_seen = now;
    SSL_CTX *renewed = tls_context_from(tls_certificate_path, tls_key_path);
    if (renewed == NULL) {
        fprintf(stderr, "gpupool-remote-server: keeping the TLS certificate in use\n");
        return;
    }
    SSL_CTX_free(tls_context);
    tls_context = renewed;
    log_served_certificate("reloaded");
}

/* Replies are gathered in one buffer and sent when the next request would block (or it fills). */
static unsigned char *out_buffer;
static size_t out_used, out_size = 1u << 16;

static int flush_out(void) {
    int status = write_all(out_buffer, out_used);
    out_used = 0;
    return status;
}

static int reply(const struct remote_header *request, CUresult status, const void *payload, size_t bytes) {
    struct remote_header header = {.length = (uint32_t)bytes, .op = request->op, .call = request->call, .status = status};
    if (out_used + sizeof header + bytes > out_size && flush_out() != 0) return -1;
    if (sizeof header + bytes > out_size) return write_all(&header, sizeof header) || write_all(payload, bytes);
    memcpy(out_buffer + out_used, &header, sizeof header);
    if (bytes > 0) memcpy(out_buffer + out_used + sizeof header, payload, bytes);
    out_used += sizeof header + bytes;
    return 0;
}

/* ------------------------------------------------------------------------------- serving a client */
struct allocation {
    CUdeviceptr pointer;
    unsigned long long bytes;
    int card; /* the index, among the client's cards, of the card it was made on */
};

/* A share of several cards of this node (docs/remote-gpu.md, "Several cards"): the client's device
 * i is card i of its entry; OP_SET_DEVICE makes card i's primary context current here. The booked
 * memory holds on each card, counted against what the client holds on that card. */
static struct client_entry me;
static char first_card[128]; /* the status line names the client's first card, as the agent keys it */
static int device; /* the driver's ordinal of the current card */
static int cards = 1, card_now;
static int ordinals[REMOTE_MAX_DEVICES];
static handle card_contexts[REMOTE_MAX_DEVICES];
static unsigned long long booked, held, held_on[REMOTE_MAX_DEVICES];
static struct allocation *allocations;
static size_t allocation_count, allocation_capacity;
static CUresult pending; /* the first error of a call nobody waited for */

static void format_uuid(const unsigned char u[16], char *out, size_t size) {
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* The ordinal of the card the client's share is booked on, -1 when this node has none such. */
static int card_ordinal(const char *uuid) {
    int count = 0;
    if (cu.device_count == NULL || cu.device_count(&count) != 0) return -1;
    for (int i = 0; i < count; i++) {
        char name[64];
        unsigned char bytes[16];
        if (standin) snprintf(name, sizeof name, "GPU-standin-%d", i);
        else if (cu.device_uuid == NULL || cu.device_uuid(bytes, i) != 0) continue;
        else format_uuid(bytes, name, sizeof name);
        if (strcmp(name, uuid) == 0) return i;
    }
    return -1;
}

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* With --status-dir, an authenticated connection's process names its client (pod and card, never
 * the token) in <status-dir>/<pid> and removes it when it ends; the supervisor drops the file of a
 * process that died without removing it (killed), so it reports what is connected now. The line:
 *   pod TAB card TAB connected-since (unix seconds) TAB held bytes TAB ordinal TAB region
 * held: the bytes of the client's live allocations (what its memory limit counts), rewritten at most
 * every CHECK_MS when it changed. Under --shim the executor rewrites its connection's file
 * (--status-file) and adds the card's ordinal and the interception library's region, where the
 * library records the client's measured SM use; otherwise the ordinal is -1 and the region empty. */
static const char *status_dir;
static char status_file[4096];
static long long connected_since;
static unsigned long long reported_held = ~0ull; /* none reported yet */
static int executor_mode;

static void write_status(void) {
    if (status_file[0] == 0) return;
    char staged[sizeof status_file + 16];
    const char *slash = strrchr(status_file, '/');
    int directory = slash == NULL ? 0 : (int)(slash - status_file) + 1;
    snprintf(staged, sizeof staged, "%.*s.%d", directory, status_file, (int)getpid());
    const char *shim_dir = executor_mode ? getenv("GPUPOOL_SHIM_DIR") : NULL;
    FILE *file = fopen(staged, "we");
    int written = file != NULL && fprintf(file, "%s\t%s\t%lld\t%llu\t%d\t%s%s\n", me.pod, first_card, connected_since,
                                          held, shim_dir != NULL ? device : -1, shim_dir != NULL ? shim_dir : "",
                                          shim_dir != NULL ? "/memory.region" : "") > 0;
    if (file == NULL || fclose(file) != 0 || !written || rename(staged, status_file) != 0) {
        unlink(staged);
        return;
    }
    reported_held = held;
}

static void mark_connected(void) {
    if (status_dir == NULL) return;
    snprintf(status_file, sizeof status_file, "%s/%d", status_dir, (int)getpid());
    connected_since = (long long)time(NULL);
    write_status();
    if (reported_held == ~0ull) status_file[0] = 0; /* not written: nothing to remove or rewrite */
}

static void mark_gone(void) {
    if (status_file[0] != 0) unlink(status_file);
    status_file[0] = 0;
}

/* Leave when the client's entry left the clients file (a file that cannot be read changes nothing). */
static void check_entry(void) {
    static struct timespec seen;
    static uint64_t last_ms;
    uint64_t now = now_ms();
    if (now - last_ms < CHECK_MS) return;
    last_ms = now;
    if (held != reported_held) write_status();
    struct stat info;
    if (stat(clients_path, &info) != 0) return;
    if (info.st_mtim.tv_sec == seen.tv_sec && info.st_mtim.tv_nsec == seen.tv_nsec) return;
    seen = info.st_mtim;
    struct client_entry entry;
    int found = find_client(me.token, strlen(me.token), &entry);
    if (found == 0) {
        fprintf(stderr, "gpupool-remote-server: client %s is no longer in the clients file: disconnected\n", me.pod);
        mark_gone();
        _exit(0);
    }
    if (found == 1) booked = entry.memory_mib << 20;
}

#define NEED(bytes)                                                                                     \
    do {                                                                                                \
        if (length < (bytes)) return reply(h, 1 /* CUDA_ERROR_INVALID_VALUE */, NULL, 0);               \
    } while (0)
#define U64(offset) load64(payload + (offset))
#define U32(offset) load32(payload + (offset))
#define H(offset) ((handle)(uintptr_t)U64(offset))
#define INVALID_HANDLE 400

/* Payload fields sit at any offset: read through memcpy, never through a misaligned pointer. */
static uint64_t load64(const unsigned char *at) {
    uint64_t value;
    memcpy(&value, at, sizeof value);
    return value;
}
static uint32_t load32(const unsigned char *at) {
    uint32_t value;
    memcpy(&value, at, sizeof value);
    return value;
}

/* The handles the driver gave this client: a handle the client names that is not one of them
 * (a stray or forged number) is refused with CUDA_ERROR_INVALID_HANDLE before the driver sees it.
 * Stream 0, the default stream, is always valid. A handle that came from another (a function from
 * its module or kernel, a kernel or module from its library) names its owner, and goes with it; the
 * same function got through two owners is known once per owner. */
enum kind { KIND_STREAM = 1, KIND_EVENT, KIND_MODULE, KIND_FUNCTION, KIND_LIBRARY, KIND_KERNEL };
struct known_handle {
    uint64_t value, owner; /* owner: 0, or the handle this one came from */
    int kind, owner_kind;
};
static struct known_handle *handles;
static size_t handle_count, handle_capacity;

static int known(uint64_t value, int kind) {
    if (value == 0) return kind == KIND_STREAM;
    for (size_t i = 0; i < handle_count; i++)
        if (handles[i].value == value && handles[i].kind == kind) return 1;
    return 0;
}

static int remember(uint64_t value, int kind, uint64_t owner, int owner_kind) {
    for (size_t i = 0; i < handle_count; i++)
        if (handles[i].value == value && handles[i].kind == kind && handles[i].owner == owner &&
            handles[i].owner_kind == owner_kind)
            return 0;
    if (handle_count == handle_capacity) {
        size_t capacity = handle_capacity ? 2 * handle_capacity : 64;
        struct known_handle *grown = realloc(handles, capacity * sizeof *grown);
        if (grown == NULL) return -1;
        handles = grown, handle_capacity = capacity;
    }
    handles[handle_count++] = (struct known_handle){value, owner, kind, owner_kind};
    return 0;
}

/* Whether the client got this handle from an owner of that kind (a library's module). */
static int owned_by(uint64_t value, int kind, int owner_kind) {
    for (size_t i = 0; i < handle_count; i++)
        if (handles[i].value == value && handles[i].kind == kind && handles[i].owner_kind == owner_kind) return 1;
    return 0;
}

/* Forget what came from an owner (a module's functions; a library's kernels and module, and theirs). */
static void forget_owned(uint64_t owner, int owner_kind) {
    for (size_t i = 0; i < handle_count;) {
        if (handles[i].owner != owner || handles[i].owner_kind != owner_kind) {
            i++;
            continue;
        }
        struct known_handle gone = handles[i];
        handles[i] = handles[--handle_count];
        if (!known(gone.value, gone.kind)) forget_owned(gone.value, gone.kind);
        i = 0; /* the table changed under the loop */
    }
}

/* Forget a handle, and everything that came from it. */
static void forget(uint64_t value, int kind) {
    for (size_t i = 0; i < handle_count;) {
        if (handles[i].value == value && handles[i].kind == kind) handles[i] = handles[--handle_count];
        else i++;
    }
    forget_owned(value, kind);
}
#define CALL(fn, ...) ((fn) == NULL ? 801 /* CUDA_ERROR_NOT_SUPPORTED */ : (fn)(__VA_ARGS__))

/* Answer a request; an error of one that wants no reply is kept for the next answered call. */
static int answer(const struct remote_header *h, CUresult status, const void *payload, size_t bytes) {
    if (h->flags & REMOTE_FLAG_NO_REPLY) {
        if (status != 0 && pending == 0) pending = status;
        return 0;
    }
    if (status == 0 && pending != 0) status = pending, bytes = 0;
    pending = 0;
    return reply(h, status, payload, bytes);
}

static int copy_to_device(const struct remote_header *h, unsigned char *chunk) {
    uint64_t args[2];
    if (h->length < sizeof args || read_all(args, sizeof args) != 0) return -1;
    CUresult status = known(args[1], KIND_STREAM) ? 0 : INVALID_HANDLE; /* the bytes are read either way */
    for (uint64_t done = 0, total = h->length - sizeof args; done < total;) {
        size_t n = total - done < CHUNK ? (size_t)(total - done) : CHUNK;
        if (read_all(chunk, n) != 0) return -1;
        if (status == 0) status = CALL(cu.htod, args[0] + done, chunk, n, (handle)(uintptr_t)args[1]);
        if (status == 0 && cu.stream_synchronize != NULL) status = cu.stream_synchronize((handle)(uintptr_t)args[1]);
        done += n;
    }
    return answer(h, status, NULL, 0);
}

static int copy_to_host(const struct remote_header *h, const unsigned char *payload, size_t length,
                        unsigned char *chunk) {
    NEED(24);
    uint64_t source = U64(0), bytes = U64(8);
    handle stream = H(16);
    if (bytes > REMOTE_MAX_COPY) return answer(h, 1, NULL, 0);
    if (!known(U64(16), KIND_STREAM)) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = pending;
    if (status == 0) status = CALL(cu.dtoh, chunk, source, bytes < CHUNK ? (size_t)bytes : CHUNK, stream);
    if (status == 0 && cu.stream_synchronize != NULL) status = cu.stream_synchronize(stream);
    pending = 0;
    if (status != 0) return reply(h, status, NULL, 0);
    struct remote_header header = {.length = (uint32_t)bytes, .op = h->op, .call = h->call};
    if (flush_out() != 0 || write_all(&header, sizeof header) != 0) return -1;
    for (uint64_t done = 0; done < bytes;) {
        size_t n = bytes - done < CHUNK ? (size_t)(bytes - done) : CHUNK;
        /* A later chunk's error cannot change the header sent: the client gets zeros and the
         * error at its next call. */
        if (done > 0) {
            CUresult later = CALL(cu.dtoh, chunk, source + done, n, stream);
            if (later == 0 && cu.stream_synchronize != NULL) later = cu.stream_synchronize(stream);
            if (later != 0) memset(chunk, 0, n), pending = pending ? pending : later;
        }
        if (write_all(chunk, n) != 0) return -1;
        done += n;
    }
    return 0;
}

static int mem_alloc(const struct remote_header *h, uint64_t bytes) {
    if (bytes == 0 || bytes > booked || held_on[card_now] > booked - bytes)
        return answer(h, 2 /* OUT_OF_MEMORY */, NULL, 0);
    CUdeviceptr pointer = 0;
    CUresult status = CALL(cu.mem_alloc, &pointer, (size_t)bytes);
    if (status == 0 && allocation_count == allocation_capacity) {
        size_t capacity = allocation_capacity ? 2 * allocation_capacity : 64;
        struct allocation *grown = realloc(allocations, capacity * sizeof *grown);
        if (grown == NULL) cu.mem_free(pointer), status = 2;
        else allocations = grown, allocation_capacity = capacity;
    }
    if (status == 0)
        allocations[allocation_count++] = (struct allocation){pointer, bytes, card_now}, held += bytes,
        held_on[card_now] += bytes;
    uint64_t out = pointer;
    return answer(h, status, &out, status == 0 ? sizeof out : 0);
}

static int mem_free(const struct remote_header *h, uint64_t pointer) {
    for (size_t i = 0; i < allocation_count; i++) {
        if (allocations[i].pointer != pointer) continue;
        CUresult status = CALL(cu.mem_free, pointer);
        if (status == 0)
            held -= allocations[i].bytes, held_on[allocations[i].card] -= allocations[i].bytes,
                allocations[i] = allocations[--allocation_count];
        return answer(h, status, NULL, 0);
    }
    return answer(h, 1 /* not one of this client's allocations */, NULL, 0);
}

/* The NUL-terminated name after a request's 8-byte handle (a longer one is cut at 4095 bytes). */
static void name_after_handle(const unsigned char *payload, size_t length, char name[4096]) {
    size_t name_length = length - 8 < 4095 ? length - 8 : 4095;
    memcpy(name, payload + 8, name_length);
    name[name_length] = '\0';
}

/* The answer to a function or kernel the client got: its handle, and its parameters' offsets and
 * sizes as the driver tells them (info: cuFuncGetParamInfo, cuKernelGetParamInfo). */
static int describe(const struct remote_header *h, handle function,
                    CUresult (*info)(handle, size_t, size_t *, size_t *)) {
    static uint32_t out[2 + 2 + 2 * REMOTE_MAX_PARAMS];
    uint64_t value = (uintptr_t)function;
    memcpy(out, &value, 8);
    uint32_t count = 0;
    if (info == NULL) count = REMOTE_PARAMS_UNKNOWN;
    for (size_t offset, size;
         count != REMOTE_PARAMS_UNKNOWN && count < REMOTE_MAX_PARAMS && info(function, count, &offset, &size) == 0;
         count++)
        out[3 + 2 * count] = (uint32_t)offset, out[4 + 2 * count] = (uint32_t)size;
    out[2] = count;
    return answer(h, 0, out, 12 + (count == REMOTE_PARAMS_UNKNOWN ? 0 : 8u * count));
}

static int module_function(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(9);
    char name[4096];
    name_after_handle(payload, length, name);
    handle function = NULL;
    if (!known(U64(0), KIND_MODULE)) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = CALL(cu.module_function, &function, H(0), name);
    if (status == 0 && remember((uintptr_t)function, KIND_FUNCTION, U64(0), KIND_MODULE) != 0) status = 2;
    if (status != 0) return answer(h, status, NULL, 0);
    return describe(h, function, cu.param_info);
}

/* A library's kernel: a function of no context yet (CUDA 12), launched as one by cuLaunchKernel. */
static int library_kernel(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(9);
    char name[4096];
    name_after_handle(payload, length, name);
    handle kernel = NULL;
    if (!known(U64(0), KIND_LIBRARY)) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = CALL(cu.library_kernel, &kernel, H(0), name);
    if (status == 0 && remember((uintptr_t)kernel, KIND_KERNEL, U64(0), KIND_LIBRARY) != 0) status = 2;
    if (status != 0) return answer(h, status, NULL, 0);
    return describe(h, kernel, cu.kernel_param_info);
}

static int kernel_function(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(8);
    handle function = NULL;
    if (!known(U64(0), KIND_KERNEL)) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = CALL(cu.kernel_function, &function, H(0));
    if (status == 0 && remember((uintptr_t)function, KIND_FUNCTION, U64(0), KIND_KERNEL) != 0) status = 2;
    if (status != 0) return answer(h, status, NULL, 0);
    return describe(h, function, cu.param_info);
}

/* A library's or a module's global (op: OP_LIBRARY_GLOBAL, OP_MODULE_GLOBAL): memory the driver
 * took when the image loaded, not an allocation of the client's, so it is not counted in held and
 * cuMemFree refuses it; it goes with its library or module. */
static int image_global(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(9);
    char name[4096];
    name_after_handle(payload, length, name);
    CUdeviceptr pointer = 0;
    size_t bytes = 0;
    int library = h->op == OP_LIBRARY_GLOBAL;
    if (!known(U64(0), library ? KIND_LIBRARY : KIND_MODULE)) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = library ? CALL(cu.library_global, &pointer, &bytes, H(0), name)
                              : CALL(cu.module_global, &pointer, &bytes, H(0), name);
    uint64_t out[2] = {pointer, bytes};
    return answer(h, status, out, status == 0 ? sizeof out : 0);
}

/* A handle cuLaunchKernel takes: a function, or a library's kernel cast to one (CUDA 12). */
static int launchable(uint64_t value) { return known(value, KIND_FUNCTION) || known(value, KIND_KERNEL); }

/* Attributes and cache preference of a function (or a kernel cast to one), or of a kernel on the
 * client's card: the driver's answers for the handle, once the handle is the client's. */
static int attribute(const struct remote_header *h, const unsigned char *payload, size_t length) {
    int kernel = h->op == OP_KERNEL_ATTRIBUTE || h->op == OP_KERNEL_SET_ATTRIBUTE || h->op == OP_KERNEL_CACHE_CONFIG;
    int value = 0;
    CUresult status;
    NEED(h->op == OP_FUNCTION_SET_ATTRIBUTE || h->op == OP_KERNEL_SET_ATTRIBUTE ? 16 : 12);
    if (kernel ? !known(U64(0), KIND_KERNEL) : !launchable(U64(0))) return answer(h, INVALID_HANDLE, NULL, 0);
    int which = (int)U32(8);
    switch (h->op) {
    case OP_FUNCTION_ATTRIBUTE: status = CALL(cu.function_attribute, &value, which, H(0)); break;
    case OP_FUNCTION_SET_ATTRIBUTE: status = CALL(cu.function_set_attribute, H(0), which, (int)U32(12)); break;
    case OP_FUNCTION_CACHE_CONFIG: status = CALL(cu.function_cache_config, H(0), which); break;
    case OP_KERNEL_ATTRIBUTE: status = CALL(cu.kernel_attribute, &value, which, H(0), device); break;
    case OP_KERNEL_SET_ATTRIBUTE: status = CALL(cu.kernel_set_attribute, which, (int)U32(12), H(0), device); break;
    default: status = CALL(cu.kernel_cache_config, H(0), which, device); break;
    }
    int answers = h->op == OP_FUNCTION_ATTRIBUTE || h->op == OP_KERNEL_ATTRIBUTE;
    return answer(h, status, &value, status == 0 && answers ? sizeof value : 0);
}

static int occupancy_blocks(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(24);
    int blocks = 0;
    if (!launchable(U64(0))) return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = CALL(cu.occupancy_blocks, &blocks, H(0), (int)U32(8), (size_t)U64(16), U32(12));
    return answer(h, status, &blocks, status == 0 ? sizeof blocks : 0);
}

/* cuOccupancyMaxPotentialBlockSize's callback (dynamic shared memory for a block size) runs in the
 * program, so the client sends its answers for every block size the driver may try (1 up to the
 * function's or the caller's limit), and the server's callback looks them up. A block size outside
 * the table (a driver trying more than the function's limit) fails the call: its answer is unknown. */
static uint64_t shared_table[REMOTE_MAX_SHARED_TABLE];
static uint32_t shared_count;
static int shared_missed;

static size_t shared_for(int block_size) {
    if (block_size >= 1 && (uint32_t)block_size <= shared_count) return (size_t)shared_table[block_size - 1];
    shared_missed = 1;
    return (size_t)1 << 40; /* no block fits: the driver passes over this size */
}

static int occupancy_block_size(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(28);
    uint32_t count = U32(24);
    if (count > REMOTE_MAX_SHARED_TABLE || length < 28 + 8ull * count) return answer(h, 1, NULL, 0);
    if (!launchable(U64(0))) return answer(h, INVALID_HANDLE, NULL, 0);
    memcpy(shared_table, payload + 28, 8ull * count);
    shared_count = count, shared_missed = 0;
    int out[2] = {0, 0};
    CUresult status = CALL(cu.occupancy_block_size, &out[0], &out[1], H(0), count > 0 ? shared_for : NULL,
                           (size_t)U64(8), (int)U32(16), U32(20));
    if (status == 0 && shared_missed) status = 801; /* CUDA_ERROR_NOT_SUPPORTED */
    return answer(h, status, out, status == 0 ? sizeof out : 0);
}

/* An image, NUL-terminated after the bytes received: the driver reads it up to its own end, and a
 * truncated text image (PTX, the stand-in's) must not run past them. NULL: no memory. */
static unsigned char *terminated(const unsigned char *payload, size_t length) {
    unsigned char *image = malloc(length + 1);
    if (image == NULL) return NULL;
    if (length > 0) memcpy(image, payload, length);
    image[length] = 0;
    return image;
}

static int launch(const struct remote_header *h, const unsigned char *payload, size_t length) {
    NEED(44);
    size_t size = length - 44;
    void *buffer = (void *)(payload + 44);
    void *extra[] = {LAUNCH_PARAM_BUFFER_POINTER, buffer, LAUNCH_PARAM_BUFFER_SIZE, &size, NULL};
    /* A library's kernel is launched as a function (CUDA 12 runtimes cast the CUkernel). */
    if (!launchable(U64(0)) || !known(U64(36), KIND_STREAM))
        return answer(h, INVALID_HANDLE, NULL, 0);
    CUresult status = CALL(cu.launch, H(0), U32(8), U32(12), U32(16), U32(20), U32(24), U32(28), U32(32), H(36),
                           NULL, extra);
    return answer(h, status, NULL, 0);
}

/* ------------------------------------------------------------------------------------------ cuBLAS */
/* The client's cuBLAS calls (docs/remote-gpu.md, "cuBLAS"), run by the real libcublas, loaded at
 * the first one (--cublas, else GPUPOOL_REMOTE_CUBLAS, else the soname). Replies carry a
 * cublasStatus_t. Every device pointer a call names must lie, with all it reaches, inside one of the
 * client's allocations, every stream be the client's and every handle one made for this client:
 * anything else is refused before cuBLAS sees it. cuBLAS's own workspace (the default one, which
 * it allocates at a handle's first calls) is outside the client's share; one the client gives with
 * cublasSetWorkspace_v2 is its own memory, counted. A handle's pointer mode is kept here: it decides
 * whether the scalars come by value or as device pointers.
 *
 * A GEMM, gemv, axpy, scal or a dot into device memory may come without a reply
 * (REMOTE_FLAG_NO_REPLY): its refusal or cuBLAS's failure is then kept as the connection's pending
 * CUDA error (blas_late_error), as a fault of an asynchronous kernel is, and the next answered call
 * gets it: a driver call the CUDA error itself, an answered cuBLAS call
 * CUBLAS_STATUS_EXECUTION_FAILED, without being run. */
#define BLAS_NOT_INITIALIZED 1
#define BLAS_ALLOC_FAILED 3
#define BLAS_INVALID_VALUE BLAS_CHECK_INVALID_VALUE
#define BLAS_NOT_SUPPORTED 15
#define BLAS_EXECUTION_FAILED 13
typedef int blas_status;
static struct {
    blas_status (*create)(handle *);
    blas_status (*destroy)(handle);
    blas_status (*set_stream)(handle, handle);
    blas_status (*set_pointer_mode)(handle, int);
    blas_status (*set_math_mode)(handle, int);
    blas_status (*set_workspace)(handle, void *, size_t);
    blas_status (*get_property)(int, int *);
    blas_status (*sgemm)(handle, int, int, int, int, int, const void *, const void *, int, const void *, int,
                         const void *, void *, int);
    blas_status (*dgemm)(handle, int, int, int, int, int, const void *, const void *, int, const void *, int,
                         const void *, void *, int);
    blas_status (*gemm_ex)(handle, int, int, int, int, int, const void *, const void *, int, int, const void *, int,
                           int, const void *, void *, int, int, int, int);
    blas_status (*sgemm_strided)(handle, int, int, int, int, int, const void *, const void *, int, long long,
                                 const void *, int, long long, const void *, void *, int, long long, int);
    blas_status (*dgemm_strided)(handle, int, int, int, int, int, const void *, const void *, int, long long,
                                 const void *, int, long long, const void *, void *, int, long long, int);
    blas_status (*gemm_strided_ex)(handle, int, int, int, int, int, const void *, const void *, int, int, long long,
                                   const void *, int, int, long long, const void *, void *, int, int, long long, int,
                                   int, int);
    blas_status (*sgemv)(handle, int, int, int, const void *, const void *, int, const void *, int, const void *,
                         void *, int);
    blas_status (*dgemv)(handle, int, int, int, const void *, const void *, int, const void *, int, const void *,
                         void *, int);
    blas_status (*saxpy)(handle, int, const void *, const void *, int, void *, int);
    blas_status (*sscal)(handle, int, const void *, void *, int);
    blas_status (*sdot)(handle, int, const void *, int, const void *, int, void *);
} blas;
static void *blas_library;
static int blas_tried;
static const char *blas_path = "libcublas.so.12";
static struct blas_handle {
    uint64_t value;
    int device_scalars; /* CUBLAS_POINTER_MODE_DEVICE */
} blas_handles[REMOTE_MAX_BLAS_HANDLES];
static size_t blas_handle_count;

/* 0 when cuBLAS is loaded (now or before); said once on stderr when it cannot be. */
static int load_blas(void) {
    if (blas_library != NULL) return 0;
    if (blas_tried) return -1;
    blas_tried = 1;
    const char *named = getenv("GPUPOOL_REMOTE_CUBLAS");
    if (named != NULL && named[0] != '\0') blas_path = named;
    void *library = dlopen(blas_path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "gpupool-remote-server: cannot load cuBLAS %s (%s): the client's cuBLAS calls get "
                        "CUBLAS_STATUS_NOT_INITIALIZED\n", blas_path, dlerror());
        return -1;
    }
    void **slots[] = {(void **)&blas.create, (void **)&blas.destroy, (void **)&blas.set_stream,
                      (void **)&blas.set_pointer_mode, (void **)&blas.set_math_mode, (void **)&blas.set_workspace,
                      (void **)&blas.get_property, (void **)&blas.sgemm, (void **)&blas.dgemm, (void **)&blas.gemm_ex,
                      (void **)&blas.sgemm_strided, (void **)&blas.dgemm_strided, (void **)&blas.gemm_strided_ex,
                      (void **)&blas.sgemv, (void **)&blas.dgemv, (void **)&blas.saxpy, (void **)&blas.sscal,
                      (void **)&blas.sdot};
    const char *names[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetPointerMode_v2",
                           "cublasSetMathMode", "cublasSetWorkspace_v2", "cublasGetProperty", "cublasSgemm_v2",
                           "cublasDgemm_v2", "cublasGemmEx", "cublasSgemmStridedBatched",
                           "cublasDgemmStridedBatched", "cublasGemmStridedBatchedEx", "cublasSgemv_v2",
                           "cublasDgemv_v2", "cublasSaxpy_v2", "cublasSscal_v2", "cublasSdot_v2"};
    _Static_assert(sizeof slots / sizeof *slots == sizeof names / sizeof *names, "one name per entry point");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) *slots[i] = dlsym(library, names[i]);
    if (blas.create == NULL || blas.destroy == NULL) {
        fprintf(stderr, "gpupool-remote-server: %s is not cuBLAS (no cublasCreate_v2): the client's cuBLAS calls "
                        "get CUBLAS_STATUS_NOT_INITIALIZED\n", blas_path);
        dlclose(library);
        return -1;
    }
    blas_library = library;
    return 0;
}
#define BLAS_CALL(fn, ...) ((fn) == NULL ? BLAS_NOT_SUPPORTED : (fn)(__VA_ARGS__))

static struct blas_handle *blas_handle_of(uint64_t value) {
    for (size_t i = 0; i < blas_handle_count; i++)
        if (value != 0 && blas_handles[i].value == value) return &blas_handles[i];
    return NULL;
}

/* Whether [pointer, pointer + bytes) lies inside one of the client's allocations (nothing to
 * reach, bytes 0, is always inside: cuBLAS reads nothing there). */
static int inside_allocation(uint64_t pointer, uint64_t bytes) {
    if (bytes == 0) return 1;
    for (size_t i = 0; i < allocation_count; i++) {
        uint64_t base = allocations[i].pointer, size = allocations[i].bytes;
        if (pointer >= base && bytes <= size && pointer - base <= size - bytes) return 1;
    }
    return 0;
}

static int device_range(uint64_t pointer, long long bytes) { return bytes >= 0 && inside_allocation(pointer, (uint64_t)bytes); }

/* The scalars a call uses: the request's bytes (host pointer mode, copied to aligned memory) or its
 * device pointers, each inside the client's memory (device pointer mode). */
static int blas_scalars(const struct blas_handle *owner, const unsigned char alpha_bytes[16],
                        const unsigned char beta_bytes[16], uint64_t alpha_pointer, uint64_t beta_pointer,
                        long long bytes, int uses_beta, void *alpha_value, void *beta_value, const void **alpha,
                        const void **beta) {
    if (bytes <= 0 || bytes > 16) return -1;
    if (owner->device_scalars) {
        if (!device_range(alpha_pointer, bytes) || (uses_beta && !device_range(beta_pointer, bytes))) return -1;
        *alpha = (const void *)(uintptr_t)alpha_pointer, *beta = (const void *)(uintptr_t)beta_pointer;
        return 0;
    }
    memcpy(alpha_value, alpha_bytes, 16), memcpy(beta_value, beta_bytes, 16);
    *alpha = alpha_value, *beta = beta_value;
    return 0;
}

/* The CUDA error a cuBLAS call sent without a reply leaves for the next answered call: memory
 * outside the client's allocations is CUDA_ERROR_ILLEGAL_ADDRESS (700), as a kernel's stray access
 * is found at the next synchronisation on a GPU; a handle not the client's CUDA_ERROR_INVALID_HANDLE
 * (400); a refused argument CUDA_ERROR_INVALID_VALUE (1); cuBLAS's own failures the nearest CUDA
 * error (a missing function 801, memory 2, anything else CUDA_ERROR_LAUNCH_FAILED 719). */
#define BLAS_OUTSIDE (-1) /* not a cublasStatus_t: a range outside the client's memory */
static CUresult blas_late_error(blas_status status) {
    switch (status) {
    case BLAS_OUTSIDE: return 700;
    case BLAS_NOT_INITIALIZED: return INVALID_HANDLE;
    case BLAS_INVALID_VALUE: return 1;
    case BLAS_ALLOC_FAILED: return 2;
    case BLAS_NOT_SUPPORTED: return 801;
    default: return 719;
    }
}

/* The end of a GEMM or level 1/2 call: its reply, or (sent without one) its error kept as pending.
 * Answered, a range outside the client's memory is CUBLAS_STATUS_INVALID_VALUE, as before. */
static int blas_done(const struct remote_header *h, blas_status status, const void *payload, size_t bytes) {
    if (h->flags & REMOTE_FLAG_NO_REPLY) {
        if (status != 0 && pending == 0) pending = blas_late_error(status);
        return 0;
    }
    return reply(h, status == BLAS_OUTSIDE ? BLAS_INVALID_VALUE : status, payload, bytes);
}

static int blas_gemm(const struct remote_header *h, const unsigned char *payload, size_t length) {
    struct remote_gemm g;
    struct blas_reach reach;
    if (length < sizeof g) return blas_done(h, BLAS_INVALID_VALUE, NULL, 0);
    memcpy(&g, payload, sizeof g);
    struct blas_handle *owner = blas_handle_of(g.handle);
    if (owner == NULL) return blas_done(h, BLAS_NOT_INITIALIZED, NULL, 0);
    if (blas_check_gemm(&g, &reach) != 0) return blas_done(h, BLAS_INVALID_VALUE, NULL, 0);
    if (!device_range(g.a, reach.a) || !device_range(g.b, reach.b) || !device_range(g.c, reach.c))
        return blas_done(h, BLAS_OUTSIDE, NULL, 0);
    long double alpha_value, beta_value; /* 16 aligned bytes each */
    const void *alpha, *beta;
    if (blas_scalars(owner, g.alpha, g.beta, g.alpha_pointer, g.beta_pointer, blas_scalar_bytes(g.compute_type, g.c_type),
                     1, &alpha_value, &beta_value, &alpha, &beta) != 0)
        return blas_done(h, BLAS_OUTSIDE, NULL, 0); /* the size is checked: device scalars outside */
    handle on = (handle)(uintptr_t)g.handle;
    const void *a = (const void *)(uintptr_t)g.a, *b = (const void *)(uintptr_t)g.b;
    void *c = (void *)(uintptr_t)g.c;
    blas_status status;
    switch (g.kind) {
    case GEMM_S: status = BLAS_CALL(blas.sgemm, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.lda, b, g.ldb, beta, c, g.ldc); break;
    case GEMM_D: status = BLAS_CALL(blas.dgemm, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.lda, b, g.ldb, beta, c, g.ldc); break;
    case GEMM_EX:
        status = BLAS_CALL(blas.gemm_ex, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.a_type, g.lda, b, g.b_type,
                           g.ldb, beta, c, g.c_type, g.ldc, g.compute_type, g.algo);
        break;
    case GEMM_S_STRIDED:
        status = BLAS_CALL(blas.sgemm_strided, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.lda, g.stride_a, b,
                           g.ldb, g.stride_b, beta, c, g.ldc, g.stride_c, g.batch);
        break;
    case GEMM_D_STRIDED:
        status = BLAS_CALL(blas.dgemm_strided, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.lda, g.stride_a, b,
                           g.ldb, g.stride_b, beta, c, g.ldc, g.stride_c, g.batch);
        break;
    default:
        status = BLAS_CALL(blas.gemm_strided_ex, on, g.transa, g.transb, g.m, g.n, g.k, alpha, a, g.a_type, g.lda,
                           g.stride_a, b, g.b_type, g.ldb, g.stride_b, beta, c, g.c_type, g.ldc, g.stride_c, g.batch,
                           g.compute_type, g.algo);
    }
    return blas_done(h, status, NULL, 0);
}

static int blas_vector(const struct remote_header *h, const unsigned char *payload, size_t length) {
    struct remote_vector v;
    struct blas_reach reach;
    if (length < sizeof v) return blas_done(h, BLAS_INVALID_VALUE, NULL, 0);
    memcpy(&v, payload, sizeof v);
    struct blas_handle *owner = blas_handle_of(v.handle);
    if (owner == NULL) return blas_done(h, BLAS_NOT_INITIALIZED, NULL, 0);
    if (blas_check_vector(&v, &reach) != 0) return blas_done(h, BLAS_INVALID_VALUE, NULL, 0);
    int gemv = v.kind == VECTOR_SGEMV || v.kind == VECTOR_DGEMV;
    long long element = v.kind == VECTOR_DGEMV ? 8 : 4;
    if (!device_range(v.a, reach.a) || !device_range(v.x, reach.b) || !device_range(v.y, reach.c))
        return blas_done(h, BLAS_OUTSIDE, NULL, 0);
    if (v.kind == VECTOR_SDOT && !owner->device_scalars && (h->flags & REMOTE_FLAG_NO_REPLY))
        return blas_done(h, BLAS_INVALID_VALUE, NULL, 0); /* a host result needs its reply */
    long double alpha_value, beta_value;
    const void *alpha = NULL, *beta = NULL;
    if (v.kind != VECTOR_SDOT && blas_scalars(owner, v.alpha, v.beta, v.alpha_pointer, v.beta_pointer, element, gemv,
                                              &alpha_value, &beta_value, &alpha, &beta) != 0)
        return blas_done(h, BLAS_OUTSIDE, NULL, 0);
    handle on = (handle)(uintptr_t)v.handle;
    const void *a = (const void *)(uintptr_t)v.a, *x = (const void *)(uintptr_t)v.x;
    void *y = (void *)(uintptr_t)v.y;
    float dot = 0;
    blas_status status;
    switch (v.kind) {
    case VECTOR_SGEMV: status = BLAS_CALL(blas.sgemv, on, v.trans, v.m, v.n, alpha, a, v.lda, x, v.incx, beta, y, v.incy); break;
    case VECTOR_DGEMV: status = BLAS_CALL(blas.dgemv, on, v.trans, v.m, v.n, alpha, a, v.lda, x, v.incx, beta, y, v.incy); break;
    case VECTOR_SAXPY: status = BLAS_CALL(blas.saxpy, on, v.n, alpha, x, v.incx, y, v.incy); break;
    case VECTOR_SSCAL: status = BLAS_CALL(blas.sscal, on, v.n, alpha, (void *)(uintptr_t)v.x, v.incx); break;
    default:
        if (owner->device_scalars && !device_range(v.result, 4)) return blas_done(h, BLAS_OUTSIDE, NULL, 0);
        status = BLAS_CALL(blas.sdot, on, v.n, x, v.incx, y, v.incy,
                           owner->device_scalars ? (void *)(uintptr_t)v.result : (void *)&dot);
    }
    double value = dot;
    int host_result = v.kind == VECTOR_SDOT && !owner->device_scalars && status == 0;
    return blas_done(h, status, &value, host_result ? sizeof value : 0);
}

static int serve_blas(const struct remote_header *h, const unsigned char *payload, size_t length) {
    if (!(h->flags & REMOTE_FLAG_NO_REPLY) && pending != 0) { /* an earlier call's fault: not run */
        pending = 0;
        return reply(h, BLAS_EXECUTION_FAILED, NULL, 0);
    }
    if (load_blas() != 0) {
        if (h->flags & REMOTE_FLAG_NO_REPLY) return blas_done(h, BLAS_NOT_INITIALIZED, NULL, 0);
        uint32_t why = REMOTE_BLAS_NO_LIBRARY;
        return reply(h, BLAS_NOT_INITIALIZED, &why, h->op == OP_CUBLAS_CREATE ? sizeof why : 0);
    }
    struct blas_handle *owner = NULL;
    blas_status status;
    if (h->op != OP_CUBLAS_CREATE && h->op != OP_CUBLAS_PROPERTY && h->op != OP_CUBLAS_GEMM &&
        h->op != OP_CUBLAS_VECTOR) {
        if (length < 8) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        if ((owner = blas_handle_of(U64(0))) == NULL) return reply(h, BLAS_NOT_INITIALIZED, NULL, 0);
    }
    switch (h->op) {
    case OP_CUBLAS_CREATE: {
        handle made = NULL;
        if (blas_handle_count == REMOTE_MAX_BLAS_HANDLES) return reply(h, BLAS_ALLOC_FAILED, NULL, 0);
        status = blas.create(&made);
        if (status == 0 && made == NULL) status = BLAS_NOT_INITIALIZED;
        if (status != 0) return reply(h, status, NULL, 0);
        blas_handles[blas_handle_count++] = (struct blas_handle){(uintptr_t)made, 0};
        uint64_t out = (uintptr_t)made;
        return reply(h, 0, &out, sizeof out);
    }
    case OP_CUBLAS_DESTROY:
        status = blas.destroy((handle)(uintptr_t)owner->value);
        *owner = blas_handles[--blas_handle_count]; /* gone from this client either way */
        return reply(h, status, NULL, 0);
    case OP_CUBLAS_SET_STREAM:
        if (length < 16 || !known(U64(8), KIND_STREAM)) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        return reply(h, BLAS_CALL(blas.set_stream, (handle)(uintptr_t)owner->value, H(8)), NULL, 0);
    case OP_CUBLAS_SET_MODE:
        if (length < 16) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        if (U32(8) == REMOTE_BLAS_POINTER_MODE) {
            int mode = (int)U32(12);
            if (mode != 0 && mode != 1) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
            status = BLAS_CALL(blas.set_pointer_mode, (handle)(uintptr_t)owner->value, mode);
            if (status == 0) owner->device_scalars = mode;
            return reply(h, status, NULL, 0);
        }
        if (U32(8) != REMOTE_BLAS_MATH_MODE) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        return reply(h, BLAS_CALL(blas.set_math_mode, (handle)(uintptr_t)owner->value, (int)U32(12)), NULL, 0);
    case OP_CUBLAS_SET_WORKSPACE:
        if (length < 24 || (U64(16) > 0 && !inside_allocation(U64(8), U64(16))))
            return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        return reply(h, BLAS_CALL(blas.set_workspace, (handle)(uintptr_t)owner->value, (void *)(uintptr_t)U64(8),
                                  (size_t)U64(16)), NULL, 0);
    case OP_CUBLAS_PROPERTY: {
        int value = 0;
        if (length < 4 || (int)U32(0) < 0 || (int)U32(0) > 2) return reply(h, BLAS_INVALID_VALUE, NULL, 0);
        status = BLAS_CALL(blas.get_property, (int)U32(0), &value);
        return reply(h, status, &value, status == 0 ? sizeof value : 0);
    }
    case OP_CUBLAS_GEMM: return blas_gemm(h, payload, length);
    default: return blas_vector(h, payload, length);
    }
}

/* The client's handles, destroyed when it leaves (its process ends next). */
static void release_blas(void) {
    while (blas_handle_count > 0) blas.destroy((handle)(uintptr_t)blas_handles[--blas_handle_count].value);
}

static int serve_request(const struct remote_header *h, const unsigned char *payload, size_t length,
                         unsigned char *chunk) {
    int value = 0;
    handle made = NULL;
    uint64_t wide[2];
    CUresult status;
    switch (h->op) {
    case OP_PING: return answer(h, 0, NULL, 0);
    case OP_DRIVER_VERSION: status = CALL(cu.driver_version, &value); return answer(h, status, &value, 4);
    case OP_DEVICE_NAME: {
        char name[256] = "";
        status = CALL(cu.device_name, name, (int)sizeof name, device);
        return answer(h, status, name, strnlen(name, sizeof name));
    }
    case OP_DEVICE_ATTRIBUTE:
        NEED(4);
        status = CALL(cu.device_attribute, &value, (int)U32(0), device);
        return answer(h, status, &value, 4);
    case OP_DEVICE_UUID: {
        unsigned char uuid[16] = {0};
        status = CALL(cu.device_uuid, uuid, device);
        return answer(h, status, uuid, sizeof uuid);
    }
    case OP_CTX_SYNCHRONIZE: return answer(h, CALL(cu.ctx_synchronize), NULL, 0);
    case OP_MEM_ALLOC: NEED(8); return mem_alloc(h, U64(0));
    case OP_MEM_FREE: NEED(8); return mem_free(h, U64(0));
    case OP_MEM_INFO: wide[0] = booked - held_on[card_now], wide[1] = booked; return answer(h, 0, wide, sizeof wide);
    case OP_SET_DEVICE:
        NEED(4);
        if (U32(0) >= (uint32_t)cards) return answer(h, 101 /* CUDA_ERROR_INVALID_DEVICE */, NULL, 0);
        status = cu.ctx_set_current(card_contexts[U32(0)]);
        if (status == 0) card_now = (int)U32(0), device = ordinals[card_now];
        return answer(h, status, NULL, 0);
    case OP_COPY_TO_HOST: return copy_to_host(h, payload, length, chunk);
    case OP_COPY_ON_DEVICE:
        NEED(32);
        if (!known(U64(24), KIND_STREAM)) return answer(h, INVALID_HANDLE, NULL, 0);
        return answer(h, CALL(cu.dtod, U64(0), U64(8), (size_t)U64(16), H(24)), NULL, 0);
    case OP_MEMSET:
        NEED(32);
        if (!known(U64(24), KIND_STREAM)) status = INVALID_HANDLE;
        else if (U32(12) == 1) status = CALL(cu.memset8, U64(0), (unsigned char)U32(8), (size_t)U64(16), H(24));
        else if (U32(12) == 4) status = CALL(cu.memset32, U64(0), U32(8), (size_t)U64(16), H(24));
        else status = 1;
        return answer(h, status, NULL, 0);
    case OP_MODULE_LOAD:
    case OP_LIBRARY_LOAD: {
        unsigned char *image = terminated(payload, length);
        if (image == NULL) return answer(h, 2, NULL, 0);
        int kind = h->op == OP_MODULE_LOAD ? KIND_MODULE : KIND_LIBRARY;
        status = kind == KIND_MODULE ? CALL(cu.module_load, &made, image)
                                     : CALL(cu.library_load, &made, image, NULL, NULL, 0, NULL, NULL, 0);
        free(image);
        if (status == 0 && remember((uintptr_t)made, kind, 0, 0) != 0) status = 2;
        wide[0] = (uintptr_t)made;
        return answer(h, status, wide, status == 0 ? 8 : 0);
    }
    case OP_MODULE_UNLOAD:
        NEED(8);
        /* A library's module goes with its library (cuLibraryUnload), never on its own. */
        if (!known(U64(0), KIND_MODULE) || owned_by(U64(0), KIND_MODULE, KIND_LIBRARY))
            return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.module_unload, H(0));
        if (status == 0) forget(U64(0), KIND_MODULE);
        return answer(h, status, NULL, 0);
    case OP_MODULE_FUNCTION: return module_function(h, payload, length);
    case OP_LIBRARY_UNLOAD:
        NEED(8);
        if (!known(U64(0), KIND_LIBRARY)) return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.library_unload, H(0));
        if (status == 0) forget(U64(0), KIND_LIBRARY);
        return answer(h, status, NULL, 0);
    case OP_LIBRARY_KERNEL: return library_kernel(h, payload, length);
    case OP_LIBRARY_MODULE:
        NEED(8);
        if (!known(U64(0), KIND_LIBRARY)) return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.library_module, &made, H(0));
        if (status == 0 && remember((uintptr_t)made, KIND_MODULE, U64(0), KIND_LIBRARY) != 0) status = 2;
        wide[0] = (uintptr_t)made;
        return answer(h, status, wide, status == 0 ? 8 : 0);
    case OP_KERNEL_FUNCTION: return kernel_function(h, payload, length);
    case OP_LIBRARY_GLOBAL:
    case OP_MODULE_GLOBAL: return image_global(h, payload, length);
    case OP_FUNCTION_ATTRIBUTE:
    case OP_FUNCTION_SET_ATTRIBUTE:
    case OP_FUNCTION_CACHE_CONFIG:
    case OP_KERNEL_ATTRIBUTE:
    case OP_KERNEL_SET_ATTRIBUTE:
    case OP_KERNEL_CACHE_CONFIG: return attribute(h, payload, length);
    case OP_OCCUPANCY_BLOCKS: return occupancy_blocks(h, payload, length);
    case OP_OCCUPANCY_BLOCK_SIZE: return occupancy_block_size(h, payload, length);
    case OP_LAUNCH: return launch(h, payload, length);
    case OP_CUBLAS_CREATE:
    case OP_CUBLAS_DESTROY:
    case OP_CUBLAS_SET_STREAM:
    case OP_CUBLAS_SET_MODE:
    case OP_CUBLAS_SET_WORKSPACE:
    case OP_CUBLAS_PROPERTY:
    case OP_CUBLAS_GEMM:
    case OP_CUBLAS_VECTOR: return serve_blas(h, payload, length);
    case OP_STREAM_CREATE:
    case OP_EVENT_CREATE:
        NEED(4);
        status = h->op == OP_STREAM_CREATE ? CALL(cu.stream_create, &made, U32(0)) : CALL(cu.event_create, &made, U32(0));
        if (status == 0 && remember((uintptr_t)made, h->op == OP_STREAM_CREATE ? KIND_STREAM : KIND_EVENT, 0, 0) != 0)
            status = 2;
        wide[0] = (uintptr_t)made;
        return answer(h, status, wide, status == 0 ? 8 : 0);
    case OP_STREAM_DESTROY:
        NEED(8);
        if (U64(0) == 0 || !known(U64(0), KIND_STREAM)) return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.stream_destroy, H(0));
        if (status == 0) forget(U64(0), KIND_STREAM);
        return answer(h, status, NULL, 0);
    case OP_STREAM_SYNCHRONIZE:
        NEED(8);
        return answer(h, known(U64(0), KIND_STREAM) ? CALL(cu.stream_synchronize, H(0)) : INVALID_HANDLE, NULL, 0);
    case OP_STREAM_QUERY:
        NEED(8);
        return answer(h, known(U64(0), KIND_STREAM) ? CALL(cu.stream_query, H(0)) : INVALID_HANDLE, NULL, 0);
    case OP_STREAM_WAIT_EVENT:
        NEED(20);
        if (!known(U64(0), KIND_STREAM) || !known(U64(8), KIND_EVENT)) return answer(h, INVALID_HANDLE, NULL, 0);
        return answer(h, CALL(cu.stream_wait_event, H(0), H(8), U32(16)), NULL, 0);
    case OP_EVENT_RECORD:
        NEED(16);
        if (!known(U64(0), KIND_EVENT) || !known(U64(8), KIND_STREAM)) return answer(h, INVALID_HANDLE, NULL, 0);
        return answer(h, CALL(cu.event_record, H(0), H(8)), NULL, 0);
    case OP_EVENT_SYNCHRONIZE:
        NEED(8);
        return answer(h, known(U64(0), KIND_EVENT) ? CALL(cu.event_synchronize, H(0)) : INVALID_HANDLE, NULL, 0);
    case OP_EVENT_QUERY:
        NEED(8);
        return answer(h, known(U64(0), KIND_EVENT) ? CALL(cu.event_query, H(0)) : INVALID_HANDLE, NULL, 0);
    case OP_EVENT_ELAPSED: {
        NEED(16);
        float ms = 0;
        if (!known(U64(0), KIND_EVENT) || !known(U64(8), KIND_EVENT)) return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.event_elapsed, &ms, H(0), H(8));
        return answer(h, status, &ms, 4);
    }
    case OP_EVENT_DESTROY:
        NEED(8);
        if (!known(U64(0), KIND_EVENT)) return answer(h, INVALID_HANDLE, NULL, 0);
        status = CALL(cu.event_destroy, H(0));
        if (status == 0) forget(U64(0), KIND_EVENT);
        return answer(h, status, NULL, 0);
    default: return answer(h, 801 /* CUDA_ERROR_NOT_SUPPORTED */, NULL, 0);
    }
}

/* The first frame, within its deadline: the protocol version and the client's token. */
static int read_hello(struct remote_header *h, uint32_t *version, char *token, size_t *length) {
    if (waiting_request(HELLO_TIMEOUT_MS) != 1 || read_all(h, sizeof *h) != 0 || h->op != OP_HELLO ||
        h->length < 4 || h->length > 4 + REMOTE_MAX_TOKEN || read_all(version, 4) != 0 ||
        read_all(token, h->length - 4) != 0)
        return -1;
    *length = h->length - 4;
    return 0;
}

/* The client's cards (its entry's comma-separated UUIDs): their ordinals and primary contexts, the
 * first current; REMOTE_ERROR_NO_DEVICE when this node lacks one of them or lists one twice. */
static CUresult open_cards(void) {
    char list[sizeof me.card];
    snprintf(list, sizeof list, "%s", me.card);
    char *cursor = list, *uuid;
    cards = 0;
    while ((uuid = strsep(&cursor, ",")) != NULL) {
        if (cards == REMOTE_MAX_DEVICES || (ordinals[cards] = card_ordinal(uuid)) < 0) return REMOTE_ERROR_NO_DEVICE;
        for (int i = 0; i < cards; i++)
            if (ordinals[i] == ordinals[cards]) return REMOTE_ERROR_NO_DEVICE;
        if (cards == 0) snprintf(first_card, sizeof first_card, "%s", uuid);
        CUresult status = cu.primary_retain(&card_contexts[cards], ordinals[cards]);
        if (status != 0) return status;
        cards++;
    }
    device = ordinals[0], card_now = 0;
    return cards > 0 ? 0 : REMOTE_ERROR_NO_DEVICE;
}

/* The first frame: the client's token, checked against the clients file. */
static int hello(void) {
    struct remote_header h;
    char token[REMOTE_MAX_TOKEN];
    uint32_t version;
    size_t length;
    if (read_hello(&h, &version, token, &length) != 0) return -1;
    CUresult status = 0;
    int found = find_client(token, length, &me);
    if (version != REMOTE_PROTOCOL_VERSION) status = 801;
    else if (found != 1) status = REMOTE_ERROR_NOT_PERMITTED;
    else if ((status = cu.init(0)) == 0) status = open_cards();
    if (status == 0) status = cu.ctx_set_current(card_contexts[0]);
    booked = me.memory_mib << 20;
    /* The third word (the client's device count) only for a client that asks for it: a client from
     * before gets the two words it knows (and its device 0 is the share's first card). */
    uint64_t out[3] = {REMOTE_PROTOCOL_VERSION, booked, (uint64_t)cards};
    size_t words = h.flags & REMOTE_FLAG_HELLO_DEVICES ? 3 : 2;
    if (status != 0)
        fprintf(stderr, "gpupool-remote-server: client refused (%s): CUDA error %d\n",
                found == 1 ? me.pod : "unknown token", status);
    h.flags = 0;
    if (reply(&h, status, out, words * sizeof *out) != 0 || flush_out() != 0) return -1;
    return status == 0 ? 0 : -1;
}

/* ------------------------------------------------------------- clients under the interception library */
/* With --shim, a client's driver calls run in an executor: this program again, started with the
 * interception library preloaded and the client's limits in its environment (memory and compute,
 * as in a container), so the library's compute share holds the client to its compute_percent. The
 * connection's process keeps the connection (and its TLS) and relays bytes both ways. */
static const char *shim_path, *driver_path_used, *self_path;

static int relay(int pair) {
    unsigned char *buffer = malloc(1u << 18);
    if (buffer == NULL) return -1;
    if (in_end > in_start && send(pair, in_buffer + in_start, in_end - in_start, MSG_NOSIGNAL) < 0) goto out;
    in_start = in_end = 0;
    for (;;) {
        if (out_used > 0 && flush_out() != 0) break;
        struct pollfd fds[2] = {{.fd = sock, .events = POLLIN}, {.fd = pair, .events = POLLIN}};
        int pending = tls != NULL && SSL_pending(tls) > 0;
        if (!pending && poll(fds, 2, CHECK_MS) < 0 && errno != EINTR) break;
        if (pending || (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = tls != NULL ? SSL_read(tls, buffer, 1 << 18) : recv(sock, buffer, 1u << 18, 0);
            if (n <= 0) break;
            for (ssize_t done = 0, k; done < n; done += k)
                if ((k = send(pair, buffer + done, (size_t)(n - done), MSG_NOSIGNAL)) <= 0) goto out;
        }
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(pair, buffer, 1u << 18, 0);
            if (n <= 0 || write_all(buffer, (size_t)n) != 0) break;
        }
    }
out:
    free(buffer);
    return 0;
}

/* Start the executor for an authenticated client and hand it the hello; returns its socket. */
static int start_executor(const struct remote_header *h, uint32_t version, const char *token, size_t length,
                          char *shim_dir) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || mkdtemp(shim_dir) == NULL) return -1;
    pid_t child = fork();
    if (child == 0) {
        close(pair[0]);
        char fd[16], memory[32], compute[16], entry[REMOTE_MAX_TOKEN + 1], since[24];
        snprintf(fd, sizeof fd, "%d", pair[1]);
        snprintf(since, sizeof since, "%lld", connected_since);
        snprintf(memory, sizeof memory, "%llu", me.memory_mib);
        snprintf(compute, sizeof compute, "%d", me.compute_percent);
        snprintf(entry, sizeof entry, "%.*s", (int)length, token);
        setenv("LD_PRELOAD", shim_path, 1);
        setenv("GPUPOOL_MEMORY_LIMIT_MIB", memory, 1);
        setenv("GPUPOOL_COMPUTE_PERCENT", compute, 1);
        setenv("GPUPOOL_COMPUTE_MODE", "hard", 1);
        setenv("GPUPOOL_SHIM_DIR", shim_dir, 1);
        setenv("GPUPOOL_POD", me.pod, 1);
        char *args[] = {(char *)self_path, "--executor", fd, "--clients", (char *)clients_path, "--driver",
                        (char *)driver_path_used, "--since", since, "--status-file", status_file, NULL};
        if (status_file[0] == 0) args[9] = NULL; /* no --status-dir: nothing to report */
        execv(self_path, args);
        _exit(127);
    }
    close(pair[1]);
    if (child < 0) return close(pair[0]), -1;
    if (send(pair[0], h, sizeof *h, MSG_NOSIGNAL) != (ssize_t)sizeof *h ||
        send(pair[0], &version, 4, MSG_NOSIGNAL) != 4 || send(pair[0], token, length, MSG_NOSIGNAL) != (ssize_t)length)
        return close(pair[0]), -1;
    return pair[0];
}

static void serve_through_executor(void) {
    struct remote_header h;
    char token[REMOTE_MAX_TOKEN];
    uint32_t version;
    size_t length;
    if (read_hello(&h, &version, token, &length) != 0) return;
    if (find_client(token, length, &me) != 1) {
        fprintf(stderr, "gpupool-remote-server: client refused (unknown token): CUDA error %d\n",
                REMOTE_ERROR_NOT_PERMITTED);
        h.flags = 0;
        if (reply(&h, REMOTE_ERROR_NOT_PERMITTED, NULL, 0) == 0) flush_out();
        return;
    }
    char shim_dir[] = "/tmp/gpupool-remote-client-XXXXXX";
    mark_connected(); /* before the executor starts: it rewrites this file as its client's memory changes */
    int pair = start_executor(&h, version, token, length, shim_dir);
    if (pair >= 0) relay(pair), close(pair);
    char region[sizeof shim_dir + 32];
    snprintf(region, sizeof region, "%s/memory.region", shim_dir);
    while (wait(NULL) > 0) {
    }
    unlink(region);
    rmdir(shim_dir);
}

static void serve_client(void) {
    out_buffer = malloc(out_size);
    unsigned char *chunk = malloc(CHUNK);
    unsigned char *payload = NULL;
    size_t payload_capacity = 0;
    if (out_buffer == NULL || chunk == NULL) return;
    if (tls_context != NULL) { /* the handshake within the hello's deadline */
        struct timeval limit = {.tv_sec = HELLO_TIMEOUT_MS / 1000};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        tls = SSL_new(tls_context);
        if (tls == NULL || SSL_set_fd(tls, sock) != 1 || SSL_accept(tls) != 1) return;
        limit.tv_sec = 0;
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    }
    if (shim_path != NULL) {
        serve_through_executor();
        return;
    }
    if (hello() != 0) return;
    mark_connected();
    fprintf(stderr, "gpupool-remote-server: serving %s on card%s %s (%llu MiB%s)\n", me.pod, cards > 1 ? "s" : "",
            me.card, me.memory_mib, cards > 1 ? " each" : "");
    for (;;) {
        int ready = waiting_request(0);
        if (ready == 0) { /* nothing more queued: send what is gathered, then wait */
            if (out_used > 0 && flush_out() != 0) return;
            while ((ready = waiting_request(CHECK_MS)) == 0) check_entry();
        }
        if (ready < 0 && errno != EINTR) return;
        check_entry();
        struct remote_header h;
        if (read_all(&h, sizeof h) != 0) return;
        if (h.op == OP_COPY_TO_DEVICE) {
            if (copy_to_device(&h, chunk) != 0) return;
            continue;
        }
        size_t limit = h.op == OP_MODULE_LOAD || h.op == OP_LIBRARY_LOAD ? REMOTE_MAX_MODULE : REMOTE_MAX_SMALL_PAYLOAD;
        if (h.length > limit) return; /* not a client of this protocol: hang up */
        if (h.length > payload_capacity) {
            free(payload);
            payload_capacity = h.length < 65536 ? 65536 : h.length;
            if ((payload = malloc(payload_capacity)) == NULL) return;
        }
        if (read_all(payload, h.length) != 0) return;
        if (serve_request(&h, payload, h.length, chunk) != 0) return;
    }
}

/* ----------------------------------------------------------------------------------- listening */
static int is_loopback(const struct sockaddr *address) {
    if (address->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)address)->sin_addr.s_addr) >> 24) == 127;
    if (address->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)address)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static int listen_on(const char *endpoint, int allow_plain) {
    char host[256];
    const char *colon = strrchr(endpoint, ':');
    if (colon == NULL || colon == endpoint || (size_t)(colon - endpoint) >= sizeof host) {
        fprintf(stderr, "gpupool-remote-server: --listen %s: expected HOST:PORT\n", endpoint);
        return -1;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - endpoint), endpoint);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') memmove(host, host + 1, strlen(host)), host[strlen(host) - 1] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *found;
    int error = getaddrinfo(host, colon + 1, &hints, &found);
    if (error != 0) {
        fprintf(stderr, "gpupool-remote-server: --listen %s: %s\n", endpoint, gai_strerror(error));
        return -1;
    }
    if (!allow_plain && tls_context == NULL && !is_loopback(found->ai_addr)) {
        fprintf(stderr, "gpupool-remote-server: --listen %s is not a loopback address: plain TCP there is refused "
                        "without --allow-plain (give --tls-cert and --tls-key)\n", endpoint);
        freeaddrinfo(found);
        return -1;
    }
    int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        fprintf(stderr, "gpupool-remote-server: --listen %s: %s\n", endpoint, strerror(errno));
        freeaddrinfo(found);
        return -1;
    }
    freeaddrinfo(found);
    struct sockaddr_storage bound;
    socklen_t size = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &size);
    int port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                : ((struct sockaddr_in6 *)&bound)->sin6_port);
    printf("listening on port %d\n", port);
    fflush(stdout);
    return fd;
}

static volatile sig_atomic_t live; /* client processes running */

/* Reaped at once: a client process's end is its release, and a zombie would still count. */
static void reap_clients(int signal_number) {
    (void)signal_number;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) live--;
    errno = saved;
}

int main(int argc, char **argv) {
    const char *listen_address = NULL, *driver_path = "libcuda.so.1";
    int allow_plain = 0, max_clients = MAX_CLIENT_PROCESSES;
    const char *tls_certificate = NULL, *tls_key = NULL;
    int executor_fd = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) listen_address = argv[++i];
        else if (strcmp(argv[i], "--clients") == 0 && i + 1 < argc) clients_path = argv[++i];
        else if (strcmp(argv[i], "--driver") == 0 && i + 1 < argc) driver_path = argv[++i];
        else if (strcmp(argv[i], "--cublas") == 0 && i + 1 < argc) /* the executor inherits it */
            setenv("GPUPOOL_REMOTE_CUBLAS", argv[++i], 1);
        else if (strcmp(argv[i], "--allow-plain") == 0) allow_plain = 1;
        else if (strcmp(argv[i], "--shim") == 0 && i + 1 < argc) shim_path = argv[++i];
        else if (strcmp(argv[i], "--executor") == 0 && i + 1 < argc) executor_fd = atoi(argv[++i]);
        else if (strcmp(argv[i], "--status-dir") == 0 && i + 1 < argc) status_dir = argv[++i];
        else if (strcmp(argv[i], "--status-file") == 0 && i + 1 < argc) /* the executor's */
            snprintf(status_file, sizeof status_file, "%s", argv[++i]);
        else if (strcmp(argv[i], "--since") == 0 && i + 1 < argc) connected_since = atoll(argv[++i]);
        else if (strcmp(argv[i], "--tls-cert") == 0 && i + 1 < argc) tls_certificate = argv[++i];
        else if (strcmp(argv[i], "--tls-key") == 0 && i + 1 < argc) tls_key = argv[++i];
        else if (strcmp(argv[i], "--max-clients") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) max_clients = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpupool-remote-server --listen HOST:PORT --clients FILE [--driver PATH] "
                            "[--allow-plain] [--max-clients N] [--tls-cert PEM --tls-key PEM] [--shim LIBRARY] "
                            "[--status-dir DIR] [--cublas PATH]\n");
            return 2;
        }
    }
    driver_path_used = driver_path;
    self_path = "/proc/self/exe";
    if (executor_fd >= 0 && clients_path != NULL) { /* one client's calls, handed over by its connection */
        executor_mode = 1;
        if (load_driver(driver_path) != 0) return 1;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        sock = executor_fd;
        serve_client();
        release_blas();
        return 0;
    }
    if (listen_address == NULL || clients_path == NULL) {
        fprintf(stderr, "gpupool-remote-server: --listen and --clients are required\n");
        return 2;
    }
    if ((tls_certificate == NULL) != (tls_key == NULL)) {
        fprintf(stderr, "gpupool-remote-server: --tls-cert and --tls-key go together\n");
        return 2;
    }
    struct sigaction reload = {.sa_handler = ask_tls_reload}; /* no SA_RESTART: accept returns, the reload is now */
    sigaction(SIGHUP, &reload, NULL);
    if (tls_certificate != NULL && load_tls(tls_certificate, tls_key) != 0) return 1;
    if (load_driver(driver_path) != 0) return 1;
    signal(SIGPIPE, SIG_IGN); /* a client gone while TLS writes to it: an error, not the end of the server */
    int listener = listen_on(listen_address, allow_plain);
    if (listener < 0) return 1;
    struct sigaction reap = {.sa_handler = reap_clients, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &reap, NULL);
    for (;;) {
        if (tls_reload_asked) refresh_tls();
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
            perror("gpupool-remote-server: accept");
            return 1;
        }
        if (live >= max_clients) { /* a flood of connections must not fork without end */
            fprintf(stderr, "gpupool-remote-server: %d client processes already: connection refused\n", live);
            close(client);
            continue;
        }
        refresh_tls(); /* the connection gets the certificate the files hold now */
        pid_t child = fork();
        if (child > 0) live++;
        if (child == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* the server going means its clients go */
            signal(SIGHUP, SIG_IGN); /* a reload is the server's: the connection's reads go on */
            close(listener);
            sock = client;
            int one = 1, idle = 10, interval = 5, count = 3;
            setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(sock, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
            setsockopt(sock, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
            setsockopt(sock, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
            setsockopt(sock, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
            serve_client();
            release_blas();
            mark_gone();
            _exit(0);
        }
        if (child < 0) perror("gpupool-remote-server: fork");
        close(client);
    }
}
