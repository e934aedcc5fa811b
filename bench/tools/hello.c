/* Static hello: one line on stdout, then exit 0 — the fork+exec peer of
 * wisp's warm path, which stops at the guest's first console line.
 * Built with `cc -static -O2 -o hello hello.c` by bench/boot.py. */
#include <unistd.h>

int main(void) {
    static const char line[] = "hello from a process\n";
    return write(1, line, sizeof line - 1) == (ssize_t)(sizeof line - 1) ? 0 : 1;
}
