/*
 * warmtime: the client of wisp's warm path in bench/boot.py, in C like the
 * launcher of the other peers (bench/tools/spawntime.c), so that what is
 * timed is the toolstack, not a client's interpreter.
 *
 *   warmtime SOCKET JSON_BODY
 *
 * Connects to wispd's API socket first (an open connection, as a
 * keep-alive client has; the daemon's connection thread is then waiting),
 * then takes start_ns (CLOCK_MONOTONIC), sends POST /v1/vms?attach=true
 * with JSON_BODY, reads the response (its head, then the chunked console)
 * and takes line_ns when the console's first newline has arrived. Reads
 * on to the end of the stream and prints one line:
 *
 *   start_ns line_ns status vm_id
 *
 * (line_ns 0: the VM printed no line). Exit status 0 if the response was
 * 201 with a line, 1 otherwise.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static char buf[1 << 16];
static size_t have, at;

/* More bytes into buf (0 at the end of the stream). */
static ssize_t more(int fd) {
    if (at > 0) {
        memmove(buf, buf + at, have - at);
        have -= at;
        at = 0;
    }
    if (have == sizeof buf) return -1;
    ssize_t n = read(fd, buf + have, sizeof buf - have);
    if (n > 0) have += (size_t)n;
    return n;
}

/* A line ending in \r\n from buf (NUL-terminated in place), or NULL at the end. */
static char *line(int fd) {
    for (;;) {
        char *e = memmem(buf + at, have - at, "\r\n", 2);
        if (e) {
            char *l = buf + at;
            *e = 0;
            at = (size_t)(e - buf) + 2;
            return l;
        }
        if (more(fd) <= 0) return NULL;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: warmtime SOCKET JSON_BODY\n");
        return 2;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", argv[1]);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        return 1;
    }
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "POST /v1/vms?attach=true HTTP/1.1\r\nHost: wisp\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(argv[2]), argv[2]);
    /* Let the daemon's connection thread start and wait for the request. */
    usleep(2000);
    uint64_t start = now_ns(), line_ns = 0;
    if (write(fd, req, (size_t)n) != n) {
        perror("write");
        return 1;
    }
    char *l = line(fd);
    int status = l ? atoi(strchr(l, ' ') ? strchr(l, ' ') + 1 : "0") : 0;
    char id[64] = "-";
    while ((l = line(fd)) && *l) {
        if (strncasecmp(l, "X-Wisp-Vm-Id:", 13) == 0) snprintf(id, sizeof id, "%s", l + 13 + strspn(l + 13, " "));
    }
    /* Chunks: "<hex>\r\n<data>\r\n" ... "0\r\n\r\n"; the first newline in the data. */
    while ((l = line(fd))) {
        size_t size = strtoul(l, NULL, 16);
        if (size == 0) break;
        while (have - at < size + 2)
            if (more(fd) <= 0) goto end;
        if (!line_ns && memchr(buf + at, '\n', size)) line_ns = now_ns();
        at += size + 2;
    }
end:
    printf("%llu %llu %d %s\n", (unsigned long long)start, (unsigned long long)line_ns, status, id);
    return status == 201 && line_ns ? 0 : 1;
}
