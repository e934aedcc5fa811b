#!/usr/bin/env bash
# Installs what building and testing wisp needs, idempotently:
# the Rust target for guest images and the Debian packages the tests use.
set -euo pipefail

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo not found; install Rust with rustup first" >&2
    exit 1
fi
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-none; then
    rustup target add x86_64-unknown-none
fi

# Debian packages used by the tests (a normal Linux executable and a 32-bit
# ELF as malformed images; a C compiler for test fixtures).
need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
[ -x /bin/busybox ] || need+=(busybox-static)   # also ping and nc for the network tests
command -v ip >/dev/null || need+=(iproute2)
command -v iperf3 >/dev/null || need+=(iperf3)   # the real client for the iperf app
command -v redis-cli >/dev/null || need+=(redis-tools)   # redis-cli and redis-benchmark against kvstore
command -v curl >/dev/null || need+=(curl)   # the content cache's, the API's and TLS termination's tests
command -v openssl >/dev/null || need+=(openssl)   # certificates and s_client in the TLS termination tests
command -v python3 >/dev/null || need+=(python3)   # small protocol clients in the tests
command -v podman >/dev/null || need+=(podman netavark aardvark-dns)   # wisp-oci under a real engine (conmon comes with it; netavark: its networks)
command -v iptables >/dev/null || need+=(iptables)   # podman publishing a port
command -v runc >/dev/null || need+=(runc)   # podman's default runtime, the OCI tests' peer
command -v containerd >/dev/null || need+=(containerd)   # wisp-oci under containerd (ctr and the runc v2 shim)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)   # text in cdnsim's plots
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
fi

if [ ! -e /dev/kvm ]; then
    echo "install-deps: warning: /dev/kvm is missing; VMs cannot run on this machine" >&2
fi
