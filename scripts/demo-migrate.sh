#!/usr/bin/env bash
# Live migration in one command (`make demo-migrate`): two hosts made of
# network namespaces (a wispd in each, their bridges joined by a veth pair
# into one Ethernet segment, a second pair for the daemons), an echo VM on
# the first, a client in a third namespace streaming through one TCP
# connection to it, and the VM moved to the second host mid-stream: the
# client's connection carries on. Nothing touches the host's network;
# everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$PWD/target/release/wisp
D=$PWD/target/release/wispd
work=$(mktemp -d)
a=wisp-demo-a-$$ b=wisp-demo-b-$$ c=wisp-demo-c-$$
pids=()
. "$PWD/scripts/demo-common.sh"
cleanup() {
    for s in a b; do WISP_SOCKET=$work/$s.sock $W rm -f --all >/dev/null 2>&1 || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
    end_pidns
    for n in $a $b $c; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
at() { local n=$1; shift; ip netns exec "$n" "$@"; }

echo "== two hosts: namespaces $a and $b, one segment, a shared migration key"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/key" && chmod 600 "$work/key"
for n in $a $b $c; do ip netns add "$n"; at "$n" ip link set lo up; done
for n in $a $b; do at "$n" ip link add name wisp0 type bridge; at "$n" ip link set wisp0 up; done
at $a ip link add name seg-a type veth peer name seg-b netns $b
at $a ip link set seg-a master wisp0 up
at $b ip link set seg-b master wisp0 up
at $a ip link add name mig-a type veth peer name mig-b netns $b
at $a ip addr add 10.78.9.1/30 dev mig-a && at $a ip link set mig-a up
at $b ip addr add 10.78.9.2/30 dev mig-b && at $b ip link set mig-b up
at $a ip link add name cli-a type veth peer name cli-c netns $c
at $a ip link set cli-a master wisp0 up
at $c ip addr add 10.77.9.250/24 dev cli-c && at $c ip link set cli-c up
for s in a b; do
    n=$a; extra=(); [ $s = b ] && { n=$b; extra=(--migrate-listen 10.78.9.2:7799); }
    [ $s = b ] && for _ in $(seq 100); do at $b ip -br addr show mig-b | grep -q 10.78.9.2 && break; sleep 0.05; done
    ip netns exec "$n" "$D" --socket "$work/$s.sock" --state-dir "$work/$s" --subnet 10.77.9.0/24 --bridge wisp0 \
        --pool 16M=1 --migrate-key "$work/key" "${extra[@]}" >"$work/$s.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do WISP_SOCKET=$work/$s.sock $W ps >/dev/null 2>&1 && break; sleep 0.05; done
done
# Bridges forward through a new port once its carrier is seen.
for x in "$a seg-a" "$b seg-b" "$a cli-a"; do
    set -- $x
    for _ in $(seq 200); do at "$1" bridge link show dev "$2" | grep -q "state forwarding" && break; sleep 0.05; done
done

echo "== an echo VM on the first host"
export WISP_SOCKET=$work/a.sock
$W run -d --name e --net echo >/dev/null
for _ in $(seq 200); do $W logs e | grep -q "echo: listening" && break; sleep 0.05; done
$W ps
ip=$($W ps | awk '$0 ~ / e / { for (i = 1; i <= NF; i++) if ($i ~ /^10\.77\.9\./) print $i }')

echo "== a client streaming through one TCP connection to $ip:7, and the move"
mkfifo "$work/moved"
at $c python3 -u - "$ip" "$work/moved" "$work/streaming" <<'PY' &
import select, socket, sys, time
s = socket.create_connection((sys.argv[1], 7), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
moved = open(sys.argv[2])
n, after, worst, last = 0, None, 0.0, time.monotonic()
while after is None or n < after + 50:
    line = b'%d\n' % n
    s.sendall(line)
    got = b''
    while len(got) < len(line):
        chunk = s.recv(64)
        if not chunk:
            sys.exit('client: the connection closed')
        got += chunk
    assert got == line, (got, line)
    now = time.monotonic(); worst = max(worst, now - last); last = now; n += 1
    if n == 20:
        print('client: %d round trips so far, streaming' % n)
        open(sys.argv[3], 'w').close()
    if n >= 20 and after is None and select.select([moved], [], [], 0.002)[0]:
        moved.readline(); after = n
print('client: %d round trips on one connection; the longest gap %.0f ms' % (n, worst * 1000))
PY
client=$!
exec 3>"$work/moved"
for _ in $(seq 200); do [ -e "$work/streaming" ] && break; sleep 0.05; done
$W migrate e --to 10.78.9.2:7799
echo moved >&3
wait $client
exec 3>&-
echo "== now on the second host, the same address"
WISP_SOCKET=$work/b.sock $W ps
