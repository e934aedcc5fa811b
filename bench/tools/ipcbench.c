/* The UNIX side of `make bench-fork`: the same measurements the `family`
 * guest makes (`family bench ROUNDS`), between two processes, printed in the
 * same format ("bench NAME NS", mean ns per operation or round trip):
 *   fork            fork() until it returns in the parent
 *   fork_exit_wait  fork, child _exit(0), parent waitpid
 *   pipe            1-byte ping-pong over two pipes
 *   msgq            1-byte ping-pong over one System V queue (types 1, 2)
 *   shm             ping-pong on a word in System V shared memory (spinning)
 *   kill            SIGUSR1 to the child, SIGUSR2 back, sigsuspend between
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static volatile sig_atomic_t got;
static void on_sig(int s) { (void)s; got++; }

struct msg { long mtype; char c; };

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    long forks = rounds / 10 + 1;
    uint64_t fork_ns = 0, t0 = now();
    for (long i = 0; i < forks; i++) {
        uint64_t t = now();
        pid_t c = fork();
        if (c == 0) _exit(0);
        fork_ns += now() - t;
        waitpid(c, NULL, 0);
    }
    printf("bench fork_exit_wait %llu\n", (unsigned long long)((now() - t0) / forks));
    printf("bench fork %llu\n", (unsigned long long)(fork_ns / forks));

    int a[2], b[2];
    if (pipe(a) || pipe(b)) return 1;
    int q = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
    int sid = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    _Atomic uint64_t *w = shmat(sid, NULL, 0);
    shmctl(sid, IPC_RMID, NULL);
    if (q < 0 || w == (void *)-1) return 1;
    atomic_store(w, 0);
    sigset_t block, empty;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sigemptyset(&empty);
    signal(SIGUSR1, on_sig);
    signal(SIGUSR2, on_sig);
    pid_t parent = getpid();
    char ch;
    struct msg m;
    pid_t c = fork();
    if (c == 0) {
        for (long i = 0; i < rounds; i++) {
            if (read(a[0], &ch, 1) != 1 || write(b[1], &ch, 1) != 1) _exit(1);
        }
        for (long i = 0; i < rounds; i++) {
            msgrcv(q, &m, 1, 1, 0);
            m.mtype = 2;
            msgsnd(q, &m, 1, 0);
        }
        for (uint64_t i = 0; i < (uint64_t)rounds; i++) {
            while (atomic_load(w) != 2 * i + 1) {}
            atomic_store(w, 2 * i + 2);
        }
        for (long i = 0; i < rounds; i++) {
            while (got <= i) sigsuspend(&empty);
            kill(parent, SIGUSR2);
        }
        _exit(0);
    }
    t0 = now();
    for (long i = 0; i < rounds; i++) {
        if (write(a[1], "p", 1) != 1 || read(b[0], &ch, 1) != 1) return 1;
    }
    printf("bench pipe %llu\n", (unsigned long long)((now() - t0) / rounds));
    t0 = now();
    for (long i = 0; i < rounds; i++) {
        m.mtype = 1;
        m.c = 'm';
        msgsnd(q, &m, 1, 0);
        msgrcv(q, &m, 1, 2, 0);
    }
    printf("bench msgq %llu\n", (unsigned long long)((now() - t0) / rounds));
    t0 = now();
    for (uint64_t i = 0; i < (uint64_t)rounds; i++) {
        atomic_store(w, 2 * i + 1);
        while (atomic_load(w) != 2 * i + 2) {}
    }
    printf("bench shm %llu\n", (unsigned long long)((now() - t0) / rounds));
    t0 = now();
    for (long i = 0; i < rounds; i++) {
        kill(c, SIGUSR1);
        while (got <= i) sigsuspend(&empty);
    }
    printf("bench kill %llu\n", (unsigned long long)((now() - t0) / rounds));
    waitpid(c, NULL, 0);
    msgctl(q, IPC_RMID, NULL);
    return 0;
}
