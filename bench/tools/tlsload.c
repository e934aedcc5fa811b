/* tlsload: a closed-loop HTTPS client for TLS termination benchmarks
 * (bench/usecases_tls.py): CONC connections in flight, spread round-robin
 * over the endpoints; each connects, makes a full TLS 1.3 handshake
 * (OpenSSL, no session resumption, no certificate check: as wrk), sends
 * one `GET / HTTP/1.1` with `Connection: close`, reads the answer until
 * the server closes, and is replaced by a new connection. One thread, one
 * epoll loop; the same for every peer.
 *
 *   tlsload WARMUP_S SECONDS CONC HOST:PORT [HOST:PORT ...]
 *
 * Prints one line after WARMUP_S + SECONDS:
 *   done N errors E seconds S p50_ms A p90_ms B p99_ms C
 * counting only requests that ended after the warm-up (latency: connect
 * to the answer's last byte). An answer must start with "HTTP/1." and end
 * with the benchmark backend's body, "hello\n"; a request not done in
 * 10 s is an error (and its connection replaced). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum state { CONNECTING, HANDSHAKE, WRITING, READING };

struct conn {
    int fd;
    SSL *ssl;
    enum state st;
    double start;
    size_t got;
    char head[8];
    char tail[6];
    int failed_at_once;
};

static struct sockaddr_in *eps;
static int neps, next_ep;
static SSL_CTX *ctx;
static int ep_fd;
static double t_measure, t_end;
static long done, errors;
static double *lat;
static long nlat, cap_lat;
static const char REQ[] = "GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
static const char BODY[] = "hello\n";
/* A request not answered in this long is an error. */
#define REQUEST_TIMEOUT_S 10.0

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void arm(struct conn *c, unsigned ev) {
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(ep_fd, EPOLL_CTL_MOD, c->fd, &e) < 0) {
        perror("epoll_ctl");
        exit(1);
    }
}

static void start(struct conn *c) {
    struct sockaddr_in *a = &eps[next_ep];
    next_ep = (next_ep + 1) % neps;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        perror("socket");
        exit(1);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->ssl = NULL;
    c->got = 0;
    c->failed_at_once = 0;
    c->start = now();
    c->st = CONNECTING;
    struct epoll_event e = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(ep_fd, EPOLL_CTL_ADD, c->fd, &e) < 0) {
        perror("epoll_ctl add");
        exit(1);
    }
    if (connect(c->fd, (struct sockaddr *)a, sizeof *a) < 0 && errno != EINPROGRESS)
        c->failed_at_once = 1; /* counted at its first event (EPOLLOUT comes at once) */
}

static void finish(struct conn *c, int ok) {
    double t = now();
    if (t >= t_measure && t < t_end) {
        if (ok) {
            done++;
            if (nlat == cap_lat) {
                cap_lat = cap_lat ? cap_lat * 2 : 65536;
                lat = realloc(lat, cap_lat * sizeof *lat);
                if (!lat) {
                    perror("tlsload: realloc");
                    exit(1);
                }
            }
            lat[nlat++] = (t - c->start) * 1e3;
        } else {
            errors++;
        }
    }
    if (c->ssl)
        SSL_free(c->ssl);
    close(c->fd);
    c->ssl = NULL;
    if (t < t_end)
        start(c);
    else
        c->fd = -1;
}

/* Move `c` on as far as it goes without blocking. */
static void step(struct conn *c) {
    if (c->fd < 0)
        return; /* ended; a stale event */
    for (;;) {
        int r = 0, e;
        switch (c->st) {
        case CONNECTING: {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err || c->failed_at_once) {
                finish(c, 0);
                return;
            }
            c->ssl = SSL_new(ctx);
            SSL_set_fd(c->ssl, c->fd);
            SSL_set_connect_state(c->ssl);
            c->st = HANDSHAKE;
            continue;
        }
        case HANDSHAKE:
            r = SSL_do_handshake(c->ssl);
            if (r == 1) {
                c->st = WRITING;
                continue;
            }
            break;
        case WRITING:
            r = SSL_write(c->ssl, REQ, sizeof REQ - 1);
            if (r > 0) {
                c->st = READING;
                continue;
            }
            break;
        case READING: {
            char buf[16384];
            r = SSL_read(c->ssl, buf, sizeof buf);
            if (r > 0) {
                for (size_t i = 0; i < (size_t)r && c->got + i < sizeof c->head; i++)
                    c->head[c->got + i] = buf[i];
                /* The last bytes so far, for the body's check. */
                if ((size_t)r >= sizeof c->tail) {
                    memcpy(c->tail, buf + r - sizeof c->tail, sizeof c->tail);
                } else {
                    memmove(c->tail, c->tail + r, sizeof c->tail - r);
                    memcpy(c->tail + sizeof c->tail - r, buf, r);
                }
                c->got += r;
                continue;
            }
            e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
                ERR_clear_error();
                finish(c, c->got >= 7 + sizeof c->tail && memcmp(c->head, "HTTP/1.", 7) == 0 &&
                              memcmp(c->tail, BODY, sizeof c->tail) == 0);
                return;
            }
            break;
        }
        }
        e = SSL_get_error(c->ssl, r);
        if (e == SSL_ERROR_WANT_READ) {
            arm(c, EPOLLIN);
            return;
        }
        if (e == SSL_ERROR_WANT_WRITE) {
            arm(c, EPOLLOUT);
            return;
        }
        ERR_clear_error();
        finish(c, 0);
        return;
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p) {
    if (!nlat)
        return 0;
    long i = (long)(p / 100.0 * (nlat - 1) + 0.5);
    return lat[i];
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: tlsload WARMUP_S SECONDS CONC HOST:PORT [HOST:PORT ...]\n");
        return 2;
    }
    double warm = atof(argv[1]), secs = atof(argv[2]);
    int conc = atoi(argv[3]);
    neps = argc - 4;
    eps = calloc(neps, sizeof *eps);
    for (int i = 0; i < neps; i++) {
        char host[64];
        int port;
        if (sscanf(argv[4 + i], "%63[^:]:%d", host, &port) != 2 || inet_pton(AF_INET, host, &eps[i].sin_addr) != 1) {
            fprintf(stderr, "tlsload: bad endpoint %s\n", argv[4 + i]);
            return 2;
        }
        eps[i].sin_family = AF_INET;
        eps[i].sin_port = htons(port);
    }
    signal(SIGPIPE, SIG_IGN); /* a write to a reset connection is an error, not the end */
    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    ep_fd = epoll_create1(0);
    double t0 = now();
    t_measure = t0 + warm;
    t_end = t_measure + secs;
    struct conn *cs = calloc(conc, sizeof *cs);
    for (int i = 0; i < conc; i++)
        start(&cs[i]);
    struct epoll_event evs[256];
    int live = conc;
    while (live > 0) {
        int n = epoll_wait(ep_fd, evs, 256, 100);
        for (int i = 0; i < n; i++)
            step(evs[i].data.ptr);
        double t = now();
        for (int i = 0; i < conc; i++)
            if (cs[i].fd >= 0 && t - cs[i].start > REQUEST_TIMEOUT_S)
                finish(&cs[i], 0);
        if (t >= t_end + REQUEST_TIMEOUT_S) /* stragglers: counted as errors */
            break;
        live = 0;
        for (int i = 0; i < conc; i++)
            live += cs[i].fd >= 0;
    }
    for (int i = 0; i < conc; i++)
        if (cs[i].fd >= 0)
            errors++;
    qsort(lat, nlat, sizeof *lat, cmp);
    printf("done %ld errors %ld seconds %.3f p50_ms %.3f p90_ms %.3f p99_ms %.3f\n", done, errors, secs, pct(50), pct(90), pct(99));
    return 0;
}
