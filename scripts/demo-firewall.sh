#!/usr/bin/env bash
# A personal firewall in one command (`make demo-firewall`): a wispd of its
# own in a network namespace of its own (the "internet": its bridge's
# gateway, where a web server listens on 80 and a shell on 22), a client
# namespace whose only interface is its firewall VM's link, rules that let
# the web through and nothing else. Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$PWD/target/release/wisp
D=$PWD/target/release/wispd
work=$(mktemp -d)
ns=wisp-demo-fw-$$
client=wisp-demo-client-$$
pid=
servers=()
. "$PWD/scripts/demo-common.sh"
cleanup() {
    end_demo
    ip netns del "$client" 2>/dev/null || true
}
trap cleanup EXIT

echo "== wispd in network namespace $ns; a client in $client"
start_wispd "$ns" 10.124.0.0/24 16M=1
ip netns add "$client"
ip netns exec "$client" ip link set lo up

cat >"$work/rules" <<'EOF'
# the client may browse, and nothing else
default deny
allow out tcp port 80
allow in tcp sport 80
allow icmp
EOF
echo "== the rules"
cat "$work/rules"
echo "== its firewall VM, on the client's path"
$W run -d --name fw --link "$client=10.200.9.1/30" --file "$work/rules:/rules" firewall >/dev/null
for _ in $(seq 200); do $W logs fw | grep -q "firewall: up" && break; sleep 0.05; done
$W logs fw
ip -n "$client" addr add 10.200.9.2/30 dev eth0
ip -n "$client" route add default via 10.200.9.1
echo "(the client's interfaces:)"; ip -n "$client" -br link

mkdir -p "$work/www" && echo "hello through the firewall" >"$work/www/index.html"
ip netns exec "$ns" python3 -m http.server 80 --bind 10.124.0.1 --directory "$work/www" >/dev/null 2>&1 &
servers+=($!)
ip netns exec "$ns" python3 -c "import socket,time; s=socket.socket(); s.bind(('10.124.0.1',22)); s.listen(); time.sleep(600)" &
servers+=($!)
for _ in $(seq 200); do ip netns exec "$ns" ss -ltn | grep -q "10.124.0.1:80" && break; sleep 0.05; done

echo "== the web: allowed"
ip netns exec "$client" curl -s --max-time 3 http://10.124.0.1/
echo "== port 22: denied"
ip netns exec "$client" curl -s --max-time 1 telnet://10.124.0.1:22 </dev/null || echo "(no answer: the firewall dropped it)"
echo "== ping: allowed"
ip netns exec "$client" busybox ping -c 2 10.124.0.1 | tail -2
echo "== its counters, as it stops"
$W stop fw >/dev/null
for _ in $(seq 200); do $W logs fw | grep -q "counters" && break; sleep 0.05; done
$W logs fw | grep counters
