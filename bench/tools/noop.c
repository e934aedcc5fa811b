/* Static no-op: the cheapest possible program to start. Built with
 * `cc -static -O2 -o noop noop.c` by bench/boot.py. */
int main(void) { return 0; }
