/*
 * The node's grant: what the node agent allows this container, read from a file the agent writes
 * and mounts read-only at a path compiled into the library (SHIM_GRANT_PATH), never taken from
 * the environment, so a process cannot point the library elsewhere or make the file "absent".
 * The format (docs/isolation.md, "The node's grant") is one key=value per line; lines starting
 * with '#' and unknown keys are skipped so that a newer agent can add keys.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

#ifndef SHIM_GRANT_PATH
#define SHIM_GRANT_PATH "/etc/gpupool/grant"
#endif
#define GRANT_MAX_BYTES 8192

const char *shim_grant_path(void) { return SHIM_GRANT_PATH; }

static void copy_value(char *dest, size_t size, const char *value, size_t length) {
    snprintf(dest, size, "%.*s", (int)(length < size ? length : size - 1), value);
}

/* Stores one line; returns 0, or -1 for a known key whose value does not fit. */
static int store(struct shim_grant *g, const char *key, size_t key_length, const char *value, size_t length) {
    struct {
        const char *name;
        char *dest;
        size_t size;
    } fields[] = {
        {"memory_mib", g->memory_mib, sizeof g->memory_mib},
        {"compute_percent", g->compute_percent, sizeof g->compute_percent},
        {"compute_mode", g->compute_mode, sizeof g->compute_mode},
        {"card_uuids", g->card_uuids, sizeof g->card_uuids},
        {"region", g->region, sizeof g->region},
        {"socket", g->socket_path, sizeof g->socket_path},
        {"token", g->token, sizeof g->token},
        {"pod", g->pod, sizeof g->pod},
        {"container", g->container, sizeof g->container},
        {"version", g->version, sizeof g->version},
        {"remote_endpoint", g->remote_endpoint, sizeof g->remote_endpoint},
        {"remote_token", g->remote_token, sizeof g->remote_token},
        {"virtual_devices", g->virtual_devices, sizeof g->virtual_devices},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (strlen(fields[i].name) != key_length || strncmp(fields[i].name, key, key_length) != 0) continue;
        if (length >= fields[i].size) return -1;
        copy_value(fields[i].dest, fields[i].size, value, length);
        return 0;
    }
    return 0;
}

static int parse(struct shim_grant *g, const char *text) {
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t length = end != NULL ? (size_t)(end - line) : strlen(line);
        const char *equals = memchr(line, '=', length);
        if (length > 0 && line[0] != '#') {
            if (equals == NULL) return -1;
            if (store(g, line, (size_t)(equals - line), equals + 1, length - (size_t)(equals - line) - 1) != 0)
                return -1;
        }
        if (end == NULL) break;
        line = end + 1;
    }
    return strcmp(g->version, "1") == 0 && g->memory_mib[0] != '\0' && g->region[0] != '\0' ? 0 : -1;
}

int shim_read_grant(struct shim_grant *g) {
    memset(g, 0, sizeof *g);
    int fd = open(SHIM_GRANT_PATH, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        /* Only "there is no such file" means "not a gpupool container"; any other failure (a file
         * the process may not read, an I/O error) is a grant that exists and cannot be read. */
        return errno == ENOENT || errno == ENOTDIR ? SHIM_GRANT_ABSENT : SHIM_GRANT_UNREADABLE;
    }
    char text[GRANT_MAX_BYTES + 1];
    size_t got = 0;
    ssize_t n;
    while (got < GRANT_MAX_BYTES && (n = read(fd, text + got, GRANT_MAX_BYTES - got)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            return SHIM_GRANT_UNREADABLE;
        }
        got += (size_t)n;
    }
    close(fd);
    text[got] = '\0';
    if (got == GRANT_MAX_BYTES || strlen(text) != got || parse(g, text) != 0) return SHIM_GRANT_UNREADABLE;
    return SHIM_GRANT_PRESENT;
}
