#!/usr/bin/env bash
# The content cache in one command (`make demo-cache`): an SHFS volume
# filled from docs/, a cache VM serving it through a wispd of its own in a
# network namespace of its own (nothing on the host's network), and curl
# fetching objects by name and by digest. Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$PWD/target/release/wisp
D=$PWD/target/release/wispd
work=$(mktemp -d)
ns=wisp-demo-$$
pid=
. "$PWD/scripts/demo-common.sh"
trap end_demo EXIT

echo "== an SHFS volume filled from docs/"
$W shfs mkfs "$work/cache.img" --size 64M --label demo
$W shfs add "$work/cache.img" docs >/dev/null
$W shfs info "$work/cache.img"

echo "== a cache VM serving it (wispd in network namespace $ns)"
start_wispd "$ns" 10.123.0.0/24 64M=1
id=$($W run -d --net -p 8080:80 --volume "$work/cache.img:ro" --mem 64M cache)
for _ in $(seq 200); do $W logs "$id" | grep -q "cache: serving" && break; sleep 0.05; done
$W logs "$id"

echo "== curl by name"
ip netns exec "$ns" curl -s -D - -o "$work/got" http://127.0.0.1:8080/cache.md
cmp "$work/got" docs/cache.md && echo "(the body is docs/cache.md, byte for byte)"
echo "== curl by digest, and a range"
digest=$(sha256sum docs/shfs.md | cut -c1-64)
ip netns exec "$ns" curl -s -o /dev/null -w "GET /$digest: %{http_code}, %{size_download} bytes\n" "http://127.0.0.1:8080/$digest"
ip netns exec "$ns" curl -s -r 0-31 -w "\n(%{http_code})\n" http://127.0.0.1:8080/shfs.md
