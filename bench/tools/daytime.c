/* The daytime service (RFC 867) as a socket-activated process: started per
 * connection with the connection as its standard input and output
 * (`systemd-socket-activate --accept --inetd`, inetd's `nowait`), it writes
 * the current UTC time as one line in the C `ctime` layout, as the
 * `daytime` wisp app does, and exits. Static, like the other peers of
 * bench/usecases.py: `cc -static -O2 -o daytime daytime.c`. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    char line[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    size_t n = strftime(line, sizeof line, "%a %b %e %H:%M:%S %Y\r\n", &tm);
    return write(1, line, n) == (ssize_t)n ? 0 : 1;
}
