/*
 * spawntime: the common launcher for every peer of bench/boot.py.
 *
 *   spawntime [-n RUNS] [-w WARMUP] [-d DIR] [-t SECS] [-v] [-l] -- PROG [ARGS...]
 *
 * Runs PROG N times, one after another, with fork() + execvp() and
 * waitpid(), and prints one line per measured run on stdout:
 *
 *   spawn_ns reap_ns exit_status
 *
 * spawn_ns is CLOCK_MONOTONIC just before fork(), reap_ns just after
 * waitpid() returned; exit_status is the exit code, or 128+signal if the
 * child was killed by a signal. WARMUP unrecorded runs come first.
 *
 * The child's stdin is /dev/null. Its stdout and stderr go to
 * DIR/<i>.out and DIR/<i>.err (i = measured run index, warm-ups are
 * w<i>) if -d is given, else to /dev/null (or are inherited with -v).
 * The files are opened before spawn_ns is taken, so every peer pays
 * exactly the same launcher cost inside the timed window: fork, dup2 x3,
 * exec.
 *
 * With -l, the child's stdout is a pipe the launcher reads (copying it
 * to the .out file, if any), and each line gets a fourth field,
 * line_ns: CLOCK_MONOTONIC just after the first newline arrived (0 if
 * none did) — "spawn until the first line of output", the stop point of
 * wisp's warm path (API request to the guest's first console line).
 *
 * With -t, a child still running after SECS seconds is killed with SIGKILL
 * (its status is then 137), so a hung peer cannot stall the benchmark.
 *
 * Any argument containing the literal "{i}" has it replaced by the run
 * index (warm-ups: "w0", "w1", ...) before timing starts, so a peer can
 * be given unique names per run (e.g. crun container ids).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static volatile sig_atomic_t timed_out;
static void on_alarm(int sig) { (void)sig; timed_out = 1; }

static char *subst(const char *arg, const char *idx) {
    const char *p = strstr(arg, "{i}");
    if (!p) return (char *)arg;
    size_t n = strlen(arg) - 3 + strlen(idx) + 1;
    char *out = malloc(n);
    if (!out) { perror("malloc"); exit(2); }
    snprintf(out, n, "%.*s%s%s", (int)(p - arg), arg, idx, p + 3);
    return out;
}

static int open_out(const char *dir, const char *idx, const char *ext) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, idx, ext);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { perror(path); exit(2); }
    return fd;
}

static void usage(void) {
    fprintf(stderr, "usage: spawntime [-n RUNS] [-w WARMUP] [-d DIR] [-t SECS] [-v] [-l] -- PROG [ARGS...]\n");
    exit(2);
}

int main(int argc, char **argv) {
    long runs = 10, warmup = 0, timeout_s = 0;
    const char *dir = NULL;
    int verbose = 0, first_line = 0, opt;
    while ((opt = getopt(argc, argv, "+n:w:d:t:vl")) != -1) {
        switch (opt) {
        case 'n': runs = strtol(optarg, NULL, 10); break;
        case 'w': warmup = strtol(optarg, NULL, 10); break;
        case 'd': dir = optarg; break;
        case 't': timeout_s = strtol(optarg, NULL, 10); break;
        case 'v': verbose = 1; break;
        case 'l': first_line = 1; break;
        default: usage();
        }
    }
    if (optind >= argc || runs < 0 || warmup < 0) usage();
    int cargc = argc - optind;
    char **tmpl = argv + optind;
    char **cargv = calloc((size_t)cargc + 1, sizeof *cargv);
    if (!cargv) { perror("calloc"); return 2; }

    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) { perror("/dev/null"); return 2; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (timeout_s > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm; /* no SA_RESTART: waitpid returns EINTR */
        sigaction(SIGALRM, &sa, NULL);
    }

    for (long r = -warmup; r < runs; r++) {
        char idx[32];
        if (r < 0) snprintf(idx, sizeof idx, "w%ld", r + warmup);
        else snprintf(idx, sizeof idx, "%ld", r);
        for (int a = 0; a < cargc; a++) cargv[a] = subst(tmpl[a], idx);
        int ofd = devnull, efd = devnull;
        if (dir) { ofd = open_out(dir, idx, "out"); efd = open_out(dir, idx, "err"); }
        else if (verbose) { ofd = 1; efd = 2; }

        int pfd[2] = {-1, -1};
        if (first_line && pipe2(pfd, O_CLOEXEC) < 0) { perror("pipe2"); return 2; }
        timed_out = 0;
        if (timeout_s > 0) alarm((unsigned)timeout_s);
        uint64_t t0 = now_ns();
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) {
            dup2(devnull, 0);
            if (first_line) dup2(pfd[1], 1);
            else if (ofd != 1) dup2(ofd, 1);
            if (efd != 2) dup2(efd, 2);
            execvp(cargv[0], cargv);
            _exit(127);
        }
        uint64_t tl = 0;
        if (first_line) {
            close(pfd[1]);
            char buf[4096];
            for (;;) {
                ssize_t n = read(pfd[0], buf, sizeof buf);
                if (n < 0 && errno == EINTR) {
                    if (timed_out) { kill(pid, SIGKILL); timed_out = 0; }
                    continue;
                }
                if (n <= 0) break;
                if (!tl && memchr(buf, '\n', (size_t)n)) tl = now_ns();
                if (ofd != devnull && write(ofd, buf, (size_t)n) < 0) { /* the copy is best effort */ }
            }
            close(pfd[0]);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0) {
            if (errno != EINTR) { perror("waitpid"); return 2; }
            if (timed_out) { kill(pid, SIGKILL); timed_out = 0; }
        }
        uint64_t t1 = now_ns();
        if (timeout_s > 0) alarm(0);

        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r >= 0 && first_line)
            printf("%llu %llu %d %llu\n", (unsigned long long)t0, (unsigned long long)t1, code, (unsigned long long)tl);
        else if (r >= 0)
            printf("%llu %llu %d\n", (unsigned long long)t0, (unsigned long long)t1, code);
        if (dir) { close(ofd); close(efd); }
        for (int a = 0; a < cargc; a++) if (cargv[a] != tmpl[a]) free(cargv[a]);
    }
    return 0;
}
