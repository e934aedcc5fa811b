/*
 * echosrv [PORT]: the echo service (RFC 862) over TCP and UDP on port 7 (or
 * PORT), the same logic as wisp's guest app `echo` (guest/apps/echo): every
 * byte a TCP connection sends comes back until it closes (TCP_NODELAY, so
 * answers leave at once), every UDP datagram goes back to its sender.
 *
 * The one echo server bench/net.py runs for every peer that is not wisp —
 * container, native and the Linux VM (built static, put in its initramfs) —
 * so that request/response compares the network paths, not the servers.
 * One thread, epoll, non-blocking sockets; any number of connections.
 * Prints "echo: listening on 0.0.0.0:PORT" once both sockets are bound.
 *
 * Build: cc -O2 -Wall -static -o echosrv echosrv.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF (64 * 1024)
#define MAXEV 64

/* A TCP connection; `pend` holds what the peer has not taken yet (then we
 * stop reading from it until it is drained, as a blocking echo would). */
struct conn {
    int fd;
    char *pend;
    size_t off, len;
};

static char buf[BUF];
static int ep;

static void die(const char *what) {
    fprintf(stderr, "echo: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void drop(struct conn *c) {
    close(c->fd); /* also leaves the epoll set */
    free(c->pend);
    free(c);
}

static void watch(struct conn *c, unsigned events, int op) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(ep, op, c->fd, &ev) < 0)
        die("epoll_ctl");
}

/* Send buf[0..n) (or the pending rest); keep what the socket refuses.
 * Returns 0, or -1 if the connection is dead. */
static int flush(struct conn *c, const char *data, size_t n) {
    while (n > 0) {
        ssize_t w = send(c->fd, data, n, MSG_NOSIGNAL);
        if (w > 0) {
            data += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            char *p = malloc(n);
            if (!p)
                return -1;
            memcpy(p, data, n);
            free(c->pend);
            c->pend = p, c->off = 0, c->len = n;
            watch(c, EPOLLOUT, EPOLL_CTL_MOD);
            return 0;
        }
        return -1;
    }
    return 0;
}

static void on_conn(struct conn *c, unsigned events) {
    if (c->pend) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        char *p = c->pend;
        size_t off = c->off, len = c->len;
        c->pend = NULL;
        if (flush(c, p + off, len - off) < 0) {
            free(p);
            drop(c);
            return;
        }
        free(p);
        if (!c->pend)
            watch(c, EPOLLIN, EPOLL_CTL_MOD);
        return;
    }
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            if (flush(c, buf, (size_t)n) < 0) {
                drop(c);
                return;
            }
            if (c->pend || (size_t)n < sizeof buf)
                return; /* wait for more (level-triggered) */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        drop(c); /* 0: peer closed; or an error */
        return;
    }
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 7;
    if (port <= 0 || port > 65535) {
        fprintf(stderr, "usage: echosrv [PORT]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    int one = 1;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0)
        die("bind tcp");
    if (listen(lfd, 64) < 0)
        die("listen");
    int ufd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ufd < 0)
        die("socket");
    if (bind(ufd, (struct sockaddr *)&a, sizeof a) < 0)
        die("bind udp");
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    /* The two listening sockets are told apart by these markers. */
    static char lmark, umark;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &lmark};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
        die("epoll_ctl");
    ev.data.ptr = &umark;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ufd, &ev) < 0)
        die("epoll_ctl");
    printf("echo: listening on 0.0.0.0:%d\n", port);
    fflush(stdout);

    struct epoll_event evs[MAXEV];
    for (;;) {
        int n = epoll_wait(ep, evs, MAXEV, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &lmark) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *c = calloc(1, sizeof *c);
                    if (!c) {
                        close(fd);
                        continue;
                    }
                    c->fd = fd;
                    watch(c, EPOLLIN, EPOLL_CTL_ADD);
                }
            } else if (p == &umark) {
                struct sockaddr_in from;
                socklen_t fl;
                ssize_t m;
                while ((fl = sizeof from, m = recvfrom(ufd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl)) >= 0)
                    sendto(ufd, buf, (size_t)m, 0, (struct sockaddr *)&from, fl);
            } else {
                on_conn(p, evs[i].events);
            }
        }
    }
}
