/* `compute [DIGITS]`: the `compute` wisp app (guest/apps/compute) as a
 * host process: the first DIGITS decimals of e (default 1,000) by the
 * spigot algorithm, integers only, printed on one line. Static:
 * `cc -static -O2`. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long digits = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
    if (digits < 0 || digits > 100000)
        return 2;
    long n = digits + 10;
    unsigned *a = malloc(n * sizeof *a);
    char *out = malloc(digits + 3);
    if (!a || !out)
        return 1;
    for (long i = 0; i < n; i++)
        a[i] = 1;
    long o = 0;
    out[o++] = '2';
    out[o++] = '.';
    for (long k = 0; k < digits; k++) {
        unsigned q = 0;
        for (long i = n - 1; i >= 0; i--) {
            unsigned x = a[i] * 10 + q, d = (unsigned)i + 2;
            a[i] = x % d;
            q = x / d;
        }
        out[o++] = (char)('0' + q);
    }
    out[o++] = '\n';
    fwrite(out, 1, o, stdout);
    return 0;
}
