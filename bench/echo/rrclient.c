/*
 * rrclient [-w WARMUP] [-t MAXSECS] [-c] [-r FILE] HOST PORT SIZE COUNT
 *
 * TCP request/response against an echo server: one connection
 * (TCP_NODELAY), WARMUP unrecorded round trips (default 200), then COUNT
 * recorded ones of SIZE bytes each: send SIZE bytes, read until SIZE bytes
 * have come back. Each round trip is timed with CLOCK_MONOTONIC from just
 * before the first send() to just after the last recv(). Stops early at
 * MAXSECS (default 30) of recorded time; COUNT 0 means "until MAXSECS or
 * SIGTERM/SIGINT" (bench/net.py uses that to keep a VM busy while it pings
 * it). With -c the reply is checked against the request (after the clock
 * stops). With -r every round trip's time (ns, one a line, in the order
 * measured) is written to FILE at the end (bench/net.py pools several runs).
 *
 * Prints "rrclient: running" on stderr when the warm-up is over, and one
 * JSON object on stdout at the end: round trips, min/p50/p90/p99/p99.9/max/
 * mean in microseconds, the rate, and "cdf_us" (the latency at the
 * percentiles 0, 1, ..., 99, 99.5, 99.9, 100; nearest rank) for plotting.
 * On failure: {"error": "..."} and exit status 1.
 *
 * The same compiled client for every peer of bench/net.py (wisp, container,
 * native, Linux VM), so none pays an interpreter's overhead.
 *
 * Build: cc -O2 -Wall -static -o rrclient rrclient.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fail(const char *what, int err) {
    printf("{\"error\": \"%s: %s\"}\n", what, err ? strerror(err) : "unexpected");
    fflush(stdout);
    exit(1);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const uint64_t *v, size_t n, double p) {
    double k = p / 100.0 * (double)n;
    size_t r = (size_t)k;
    if ((double)r < k)
        r++;
    if (r < 1)
        r = 1;
    if (r > n)
        r = n;
    return (double)v[r - 1] / 1000.0;
}

/* One round trip; 0 on success, else an errno (or -1: connection closed). */
static int round_trip(int fd, const char *out, char *in, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t w = send(fd, out + done, size - done, MSG_NOSIGNAL);
        if (w < 0)
            return errno;
        done += (size_t)w;
    }
    done = 0;
    while (done < size) {
        ssize_t r = recv(fd, in + done, size - done, 0);
        if (r < 0)
            return errno;
        if (r == 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

int main(int argc, char **argv) {
    long warmup = 200;
    double maxsecs = 30;
    int check = 0, opt;
    const char *raw = NULL;
    while ((opt = getopt(argc, argv, "w:t:cr:")) != -1) {
        if (opt == 'w')
            warmup = atol(optarg);
        else if (opt == 't')
            maxsecs = atof(optarg);
        else if (opt == 'c')
            check = 1;
        else if (opt == 'r')
            raw = optarg;
        else
            goto usage;
    }
    if (argc - optind != 4) {
    usage:
        fprintf(stderr, "usage: rrclient [-w WARMUP] [-t MAXSECS] [-c] [-r FILE] HOST PORT SIZE COUNT\n");
        return 2;
    }
    const char *host = argv[optind];
    int port = atoi(argv[optind + 1]);
    long size = atol(argv[optind + 2]);
    long count = atol(argv[optind + 3]);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1 || port <= 0 || port > 65535 || size <= 0 ||
        size > (1 << 20) || count < 0 || warmup < 0 || maxsecs <= 0)
        goto usage;

    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: a signal ends a blocked recv */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    /* Connect with a 5 s deadline, then back to a blocking socket: the loop
     * waits in recv() like any simple client. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        fail("socket", errno);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (errno != EINPROGRESS)
            fail("connect", errno);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 5000) != 1)
            fail("connect", ETIMEDOUT);
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err)
            fail("connect", err);
    }
    int one = 1;
    struct timeval tv = {.tv_sec = 5}; /* a lost reply ends the run instead of hanging it */
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        fail("fcntl", errno);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

    char *out = malloc((size_t)size), *in = malloc((size_t)size);
    size_t cap = count ? (size_t)count : 1 << 16, n = 0;
    uint64_t *lat = malloc(cap * sizeof *lat);
    if (!out || !in || !lat)
        fail("malloc", ENOMEM);
    for (long i = 0; i < size; i++)
        out[i] = (char)('a' + i % 26);

    for (long i = 0; i < warmup && !stop; i++) {
        int e = round_trip(fd, out, in, (size_t)size);
        if (e)
            fail("warm-up round trip", e < 0 ? 0 : e);
    }
    fprintf(stderr, "rrclient: running\n");
    fflush(stderr);

    uint64_t start = now_ns(), deadline = start + (uint64_t)(maxsecs * 1e9), end = start;
    while (!stop && (count == 0 || n < (size_t)count)) {
        uint64_t t0 = now_ns();
        int e = round_trip(fd, out, in, (size_t)size);
        uint64_t t1 = now_ns();
        end = t1;
        if (e) {
            if (stop && e == EINTR)
                break; /* told to stop while waiting: not a round trip */
            fail("round trip", e < 0 ? 0 : e);
        }
        if (check && memcmp(out, in, (size_t)size) != 0)
            fail("reply differs from the request", 0);
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof *lat);
            if (!lat)
                fail("realloc", ENOMEM);
        }
        lat[n++] = t1 - t0;
        if (t1 >= deadline)
            break;
    }
    close(fd);
    if (n == 0)
        fail("no round trips", 0);

    if (raw) {
        FILE *f = fopen(raw, "w");
        if (!f)
            fail("open -r file", errno);
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%llu\n", (unsigned long long)lat[i]);
        if (fclose(f) != 0)
            fail("write -r file", errno);
    }
    double secs = (double)(end - start) / 1e9, sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)lat[i];
    qsort(lat, n, sizeof *lat, cmp_u64);
    printf("{\"size\": %ld, \"round_trips\": %zu, \"secs\": %.4f, \"rps\": %.1f, "
           "\"min_us\": %.3f, \"p50_us\": %.3f, \"p90_us\": %.3f, \"p99_us\": %.3f, \"p999_us\": %.3f, "
           "\"max_us\": %.3f, \"mean_us\": %.3f, \"cdf_pct\": [",
           size, n, secs, secs > 0 ? (double)n / secs : 0.0, (double)lat[0] / 1000.0, pct(lat, n, 50),
           pct(lat, n, 90), pct(lat, n, 99), pct(lat, n, 99.9), (double)lat[n - 1] / 1000.0, sum / (double)n / 1000.0);
    static const double extra[] = {99.5, 99.9, 100};
    for (int p = 0; p < 100; p++)
        printf("%d, ", p);
    printf("99.5, 99.9, 100], \"cdf_us\": [");
    for (int p = 0; p < 100; p++)
        printf("%.3f, ", p == 0 ? (double)lat[0] / 1000.0 : pct(lat, n, p));
    for (int i = 0; i < 3; i++)
        printf("%.3f%s", pct(lat, n, extra[i]), i < 2 ? ", " : "]}\n");
    return 0;
}
