/* Many paced TCP flows from many network namespaces, for the personal
 * firewall benchmark (bench/usecases_fw.py): one process stands for every
 * active client, so 1,000 clients cost one process, not 2,000 iperf3s.
 *
 *   flows sink PORT N
 *       Accept connections on PORT (any address) and read them until N of
 *       them closed, or until a line on standard input says the senders
 *       are done and every connection accepted has closed (2 s at most
 *       after that line); then print "sink BYTES FIRST_NS LAST_NS
 *       ACCEPTED": the bytes received, when the first and last of them
 *       came (monotonic), and how many connections came.
 *   flows send SECONDS BITS_PER_S ADDR PORT NETNS...
 *       One connection to ADDR:PORT from each network namespace named
 *       (/run/netns/NAME; the socket is made inside it), each paced at
 *       BITS_PER_S by the kernel (SO_MAX_PACING_RATE), written as fast as
 *       the pacing allows for SECONDS; then all are closed. Prints
 *       "send BYTES FAILED" (bytes written, connections that failed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static int die(const char *what) {
    perror(what);
    exit(1);
}

static int sink(int port, int n) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) die("sink: listen");
    printf("listening\n");
    fflush(stdout);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    struct epoll_event in = {.events = EPOLLIN, .data.fd = 0};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &in);
    static char buf[1 << 16];
    uint64_t bytes = 0, first = 0, last = 0, done_at = 0;
    int accepted = 0, closed = 0;
    struct epoll_event evs[256];
    while (closed < n && !(done_at && (closed == accepted || now() > done_at + 2000000000ull))) {
        int k = epoll_wait(ep, evs, 256, done_at ? 100 : -1);
        for (int i = 0; i < k; i++) {
            int fd = evs[i].data.fd;
            if (fd == 0) {
                char line[64];
                if (read(0, line, sizeof line) <= 0 || !done_at) done_at = now();
                epoll_ctl(ep, EPOLL_CTL_DEL, 0, NULL);
                continue;
            }
            if (fd == l) {
                int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
                if (c < 0) continue;
                accepted++;
                struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
                continue;
            }
            for (;;) {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) {
                    uint64_t t = now();
                    if (!first) first = t;
                    last = t;
                    bytes += r;
                    continue;
                }
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    close(fd);
                    closed++;
                }
                break;
            }
        }
    }
    printf("sink %llu %llu %llu %d\n", (unsigned long long)bytes, (unsigned long long)first, (unsigned long long)last, accepted);
    return 0;
}

static int send_flows(double seconds, uint64_t bps, const char *addr, int port, int nns, char **names) {
    int self = open("/proc/self/ns/net", O_RDONLY);
    if (self < 0) die("own netns");
    int *fds = calloc(nns, sizeof *fds);
    int failed = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, addr, &a.sin_addr);
    int ep = epoll_create1(0);
    uint64_t pace = bps / 8;
    for (int i = 0; i < nns; i++) {
        char path[300];
        snprintf(path, sizeof path, "/run/netns/%s", names[i]);
        int ns = open(path, O_RDONLY);
        if (ns < 0 || setns(ns, CLONE_NEWNET)) die(path);
        close(ns);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (setns(self, CLONE_NEWNET)) die("setns back");
        if (s < 0) die("socket");
        setsockopt(s, SOL_SOCKET, SO_MAX_PACING_RATE, &pace, sizeof pace);
        if (connect(s, (void *)&a, sizeof a) && errno != EINPROGRESS) {
            failed++;
            close(s);
            fds[i] = -1;
            continue;
        }
        fds[i] = s;
        struct epoll_event e = {.events = EPOLLOUT, .data.fd = s};
        epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    }
    static char buf[1 << 16];
    uint64_t bytes = 0, end = now() + (uint64_t)(seconds * 1e9);
    struct epoll_event evs[256];
    for (;;) {
        uint64_t t = now();
        if (t >= end) break;
        int k = epoll_wait(ep, evs, 256, (int)((end - t) / 1000000) + 1);
        for (int i = 0; i < k; i++) {
            int fd = evs[i].data.fd;
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                failed++;
                continue;
            }
            ssize_t w = write(fd, buf, sizeof buf);
            if (w > 0) bytes += w;
        }
    }
    for (int i = 0; i < nns; i++)
        if (fds[i] >= 0) close(fds[i]);
    printf("send %llu %d\n", (unsigned long long)bytes, failed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "sink")) return sink(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 7 && !strcmp(argv[1], "send"))
        return send_flows(atof(argv[2]), strtoull(argv[3], NULL, 10), argv[4], atoi(argv[5]), argc - 6, argv + 6);
    fprintf(stderr, "usage: flows sink PORT N | flows send SECONDS BITS_PER_S ADDR PORT NETNS...\n");
    return 2;
}
