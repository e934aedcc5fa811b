#!/bin/sh
# Install the Debian packages bench/boot.py, bench/net.py and bench/fork.py need. Idempotent: installs only
# what is missing and runs `apt-get update` at most once, only if needed.
#
#   qemu-system-x86          linux_vm peer (QEMU TCG, -M microvm)
#   linux-image-cloud-amd64  the guest kernel (/boot/vmlinuz-*-cloud-amd64)
#   busybox-static           the guest's initramfs (/init)
#   crun                     container_crun peer
#   util-linux               unshare (container_unshare peer, crun's mount namespace)
#   gcc, libc6-dev           build bench/tools/*.c (static no-op, launcher)
#   libssl-dev, openssl      bench/tools/tlsload.c (the TLS client) and the tenants' certificates
#   python3, python3-matplotlib  the harness; the plot (optional)
#   iperf3                   bench/net.py's client and its container/native/Linux VM servers
#   wrk, nginx-light         bench/cache.py's client and its nginx peers, bench/usecases.py's TLS proxy and backend (the package's own service is not used)
#   time                     bench/cdnsim.py's peak memory (/usr/bin/time -v)
#   redis-server, redis-tools  bench/usecases.py's peer and its client (redis-benchmark; the package's own service is not used)
#   nftables                 bench/usecases.py's firewall peer (nft rules per client)
set -eu

PKGS="qemu-system-x86 linux-image-cloud-amd64 busybox-static crun util-linux gcc libc6-dev libssl-dev openssl python3 python3-matplotlib iperf3 wrk nginx-light time redis-server redis-tools nftables"

if [ "$(id -u)" -ne 0 ]; then
    echo "install-bench-deps: run as root" >&2
    exit 1
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "install-bench-deps: all present ($PKGS)"
    exit 0
fi

echo "install-bench-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
if ! apt-get install -y --no-install-recommends $missing; then
    apt-get update
    # shellcheck disable=SC2086
    apt-get install -y --no-install-recommends $missing
fi
