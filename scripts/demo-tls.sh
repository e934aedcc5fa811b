#!/usr/bin/env bash
# TLS termination in one command (`make demo-tls`): a wispd of its own in a
# network namespace of its own, a backend web server on its bridge's
# gateway, and two tenants, each with its own key in a tlsproxy VM of its
# own; curl checks each tenant's certificate and reaches the backend
# through it. Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$PWD/target/release/wisp
D=$PWD/target/release/wispd
work=$(mktemp -d)
ns=wisp-demo-tls-$$
pid=
servers=()
. "$PWD/scripts/demo-common.sh"
trap end_demo EXIT

echo "== wispd in network namespace $ns"
start_wispd "$ns" 10.125.0.0/24 16M=2
declare -A ip
for t in shop blog; do
    echo "== tenant $t: its own key (Ed25519) and a tlsproxy VM that holds it"
    openssl req -x509 -nodes -days 1 -newkey ed25519 -subj "/CN=$t.example" -addext "subjectAltName=DNS:$t.example" \
        -keyout "$work/$t.key" -out "$work/$t.crt" 2>/dev/null
    $W run -d --name "$t" --net --file "$work/$t.crt:/cert.pem" --file "$work/$t.key:/key.pem" tlsproxy -- 10.125.0.1:8080 >/dev/null
    for _ in $(seq 200); do $W logs "$t" | grep -q "listening" && break; sleep 0.05; done
    $W logs "$t"
    ip[$t]=$($W logs "$t" | sed -n 's/.*listening on \([0-9.]*\):.*/\1/p')
done

mkdir -p "$work/www" && echo "hello from the backend, over TLS" >"$work/www/index.html"
ip netns exec "$ns" python3 -m http.server 8080 --bind 10.125.0.1 --directory "$work/www" >/dev/null 2>&1 &
servers+=($!)
for _ in $(seq 200); do ip netns exec "$ns" ss -ltn | grep -q "10.125.0.1:8080" && break; sleep 0.05; done

for t in shop blog; do
    echo "== https://$t.example/ (curl checks $t's certificate)"
    ip netns exec "$ns" curl -s --cacert "$work/$t.crt" --resolve "$t.example:443:${ip[$t]}" "https://$t.example/"
done
echo "== blog's name at shop's VM: refused (shop's VM cannot prove it is blog)"
ip netns exec "$ns" curl -sS --cacert "$work/blog.crt" --resolve "blog.example:443:${ip[shop]}" https://blog.example/ 2>&1 | head -1 || true
echo "== the counters, as they stop"
$W stop shop blog >/dev/null
for t in shop blog; do
    for _ in $(seq 200); do $W logs "$t" | grep -q "counters" && break; sleep 0.05; done
    $W logs "$t" | grep counters
done
